"""`specsweep refine`: choose the levels an adaptive round adds (`specsweep.analysis.adaptive`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specsweep.analysis.adaptive import refine_round
from specsweep.config import load_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", required=True)
    parser.add_argument(
        "--adaptive", required=True, help="the decision's settings: adaptive, concurrency (grid), arms (JSON)"
    )
    parser.add_argument(
        "--judging", required=True, help="how cells are judged: gates, slo, analysis, arms, variants (JSON)"
    )
    parser.add_argument("--round", type=int, required=True, help="the refinement round (1, 2, ...)")
    parser.add_argument("--summaries", type=Path, nargs="+", required=True, help="every cell measured so far")
    parser.add_argument("--out", type=Path, required=True, help="the round's levels JSON")


def run(args: argparse.Namespace) -> int:
    plan, kept = refine_round(
        args.variant, load_arg(args.adaptive), load_arg(args.judging), args.round, args.summaries, args.out
    )
    if kept:  # decided before on the same cells and settings (analysis/decisions.py)
        print(f"{args.variant} round {args.round}: decision kept (same cells and adaptive settings): {plan['add']}")
        return 0
    what = f"adding C={', '.join(map(str, plan['add']))}" if plan["add"] else f"no level added: {plan['stop']}"
    print(f"{args.variant} round {args.round}: measured C={', '.join(map(str, plan['measured']))}; {what}")
    for arm, p in plan["arms"].items():
        lo, hi = p["lo"], p["hi"]
        shown = "-" if lo is None or hi is None else f"[{lo:.3g}, {hi:.3g}]"
        print(f"  {arm}: verdict {p['verdict']}, crossover interval {shown}; {p['settled'] or 'narrowing'}")
    return 0
