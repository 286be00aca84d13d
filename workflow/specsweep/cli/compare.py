"""`specsweep compare`: the same arm across variants, level by level (`specsweep.analysis.compare`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsweep.analysis.compare import compare_experiment, format_compare
from specsweep.config import load_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--experiment-dir",
        "--results-root",
        dest="results_root",
        type=Path,
        required=True,
        help="results/<experiment>, holding <variant>/<arm>/c<C>/ and <variant>/crossover.json",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        help="variants to compare, the first is the reference (default: the config's, in order)",
    )
    parser.add_argument("--arms", nargs="+", help="arms to compare (default: every arm the variants share)")
    parser.add_argument("--config", help="resolved config: a YAML/JSON file or inline JSON")
    parser.add_argument("--out-dir", type=Path, required=True, help="where comparison.json, table and plots go")
    parser.add_argument("--replicates", type=int, help="bootstrap replicates (overrides config)")
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")


def run(args: argparse.Namespace) -> int:
    try:
        result = compare_experiment(
            load_arg(args.config),
            args.results_root,
            args.out_dir,
            args.variants,
            args.arms,
            args.replicates,
            plots=not args.no_plots,
        )
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    except LookupError as e:
        print(e, file=sys.stderr)
        return 1
    print(format_compare(result))
    return 0
