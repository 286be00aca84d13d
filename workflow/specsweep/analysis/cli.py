"""`specsweep crossover`: a variant's crossover.json, crossover_table.csv, plots and policy.yaml.

Runs standalone too: `python -m specsweep.analysis.cli --variant V --cells-root DIR --out-dir DIR`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specsweep.analysis.analyze import AnalysisSettings
from specsweep.analysis.policy import dump_yaml, policy_document, schedule_entries
from specsweep.analysis.proof import policy_proof
from specsweep.analysis.schedule import derive_schedules
from specsweep.analysis.table import format_table, table_csv
from specsweep.analysis.variant import analyze_cells
from specsweep.config import load_arg, server_args
from specsweep.io import atomic_write_text, read_json

__all__ = ["add_arguments", "main", "run", "run_crossover", "server_args"]


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


def run_crossover(args: argparse.Namespace) -> dict[str, Any]:
    """Everything `specsweep crossover` does; returns the crossover.json body."""
    config = load_arg(args.config)
    settings = AnalysisSettings.from_config(config)
    if args.replicates is not None:
        settings.replicates = args.replicates
    if args.seed is not None:
        settings.seed = args.seed
    if args.include_invalid:
        settings.include_invalid = True
    result, cells = analyze_cells(
        config,
        args.variant,
        args.summaries,
        args.cells_root,
        settings,
        args.baseline_arm,
        args.spec_arms,
        args.experiment,
    )
    spec_arms = list(result["arms"])
    engine = result["engine"]
    variant_cfg = (config.get("variants") or {}).get(args.variant) or {}
    result["policy_rule"] = settings.policy_rule
    out: Path = args.out_dir
    arms_cfg = {a: server_args(config, args.variant, a) for a in spec_arms}
    policy = policy_document(result, engine, arms_cfg, variant_cfg, settings.policy_rule)
    result["policy"] = {
        a: {"threshold": p["threshold"], "rule": p["rule"], "verdict": p["verdict"]} for a, p in policy["arms"].items()
    }
    for a, p in policy["arms"].items():
        result["arms"][a]["threshold"] = p["threshold"]
    arms_all = config.get("arms") or {}
    if args.schedule is not None:
        schedules = read_json(args.schedule)
    else:
        schedules = derive_schedules(config, args.variant, result, cells, settings, out / "policy")
    result["schedules"] = schedules["families"]
    result["policy_proof"] = policy_proof(cells, arms_all, result["baseline_arm"], settings, schedules)
    argvs = {}
    for family in schedules["families"]:
        member = next((a for a, c in arms_all.items() if c.get("family") == family and not c.get("policy")), None)
        argvs[family] = server_args(config, args.variant, member)["server_args"] if member else []
    policy["schedules"] = schedule_entries(schedules, result["policy_proof"], engine, argvs)
    if not args.no_plots:
        from specsweep.analysis.plots import plot_variant

        files = plot_variant(result, cells, out / "plots")
        result["plots"] = [str(p.relative_to(out)) for p in files]
    atomic_write_text(out / "crossover.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
    atomic_write_text(out / "crossover_table.csv", table_csv(result))
    atomic_write_text(out / "policy.yaml", dump_yaml(policy))
    return result


def run(args: argparse.Namespace) -> int:
    result = run_crossover(args)
    print(format_table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specsweep crossover", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
