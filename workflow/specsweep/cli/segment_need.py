"""`specsweep segment-need`: after a sequential level's first N instance pairs, is its answer known, or does it
measure another pair (precision.max_instances, and within the run's budget, budget.run_s)? Writes the answer (a
`SegmentDecision`) for the DAG's checkpoint."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsweep.io import atomic_write_json
from specsweep.measure import budget as run_budget
from specsweep.measure.segments import pair_seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant-root", required=True, type=Path, help="the variant's results folder")
    parser.add_argument("--level", required=True, help="the level's folder name (c<C>)")
    parser.add_argument("--arms", required=True, nargs="+", help="the fixed arms, the baseline first")
    parser.add_argument("--instances", required=True, type=int, help="instance pairs measured so far")
    parser.add_argument("--target", required=True, type=float, help="precision.target (0.05: +-5%%)")
    parser.add_argument("--max-instances", required=True, type=int, help="precision.max_instances")
    parser.add_argument(
        "--decide-margin", type=float, default=None, help="precision.decide_margin (default: the width alone stops)"
    )
    parser.add_argument("--out", required=True, type=Path, help="where the answer goes (JSON)")


def run(args: argparse.Namespace) -> int:
    from specsweep.analysis.precision import next_pair  # scipy and the bootstrap: only when a level asks

    try:
        answer = next_pair(
            args.variant_root,
            args.level,
            args.arms,
            args.instances,
            args.target,
            args.max_instances,
            args.decide_margin,
        )
    except FileNotFoundError as e:
        print(f"no answer: an instance's cell is missing ({e.filename}); rerun its instance cell", file=sys.stderr)
        return 1
    budget = run_budget.RunBudget.from_env()
    if budget is not None and answer.more:  # GPU time: another pair only where the run's budget has room for it
        answer = run_budget.bound_pair(
            answer, budget, pair_seconds(args.variant_root, args.level, args.arms, args.instances)
        )
    atomic_write_json(args.out, answer.model_dump())
    print(f"{args.level} after {args.instances} instance pairs: {answer.decision}")
    return 0
