"""`specsweep crossover`: a variant's crossover, plots and policy (`specsweep.analysis.report`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specsweep.analysis.report import report_variant
from specsweep.analysis.table import format_table
from specsweep.config import load_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", required=True, help="variant name (a key of config 'variants')")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--cells-root", type=Path, help="directory holding <arm>/c<C>/summary.json")
    src.add_argument("--summaries", type=Path, nargs="+", help="explicit summary.json paths (one per cell)")
    parser.add_argument("--config", help="resolved config: a YAML/JSON file or inline JSON (arms, levels, analysis)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where crossover.json, plots, policy go")
    parser.add_argument("--experiment", help="experiment name (default: config, else the cells' summaries)")
    parser.add_argument("--baseline-arm", help="default: the config arm with speculative: false")
    parser.add_argument("--spec-arms", nargs="+", help="default: the config arms with speculative: true")
    parser.add_argument("--replicates", type=int, help="bootstrap replicates (overrides config)")
    parser.add_argument("--seed", type=int, help="bootstrap seed (overrides config)")
    parser.add_argument("--include-invalid", action="store_true", help="use cells marked invalid")
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")
    parser.add_argument("--schedule", type=Path, help="schedule.json the policy arms served (default: derive it)")


def run(args: argparse.Namespace) -> int:
    result = report_variant(
        load_arg(args.config),
        args.variant,
        args.out_dir,
        args.summaries,
        args.cells_root,
        experiment=args.experiment,
        baseline_arm=args.baseline_arm,
        spec_arms=args.spec_arms,
        replicates=args.replicates,
        seed=args.seed,
        include_invalid=args.include_invalid,
        plots=not args.no_plots,
        schedule=args.schedule,
    )
    print(format_table(result))
    return 0
