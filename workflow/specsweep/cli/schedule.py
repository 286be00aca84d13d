"""`specsweep schedule`: derive each speculative arm's schedule (`specsweep.analysis.schedule`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specsweep.analysis.schedule import schedule_job
from specsweep.config import load_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", required=True)
    parser.add_argument("--decision", required=True, help="what the schedule depends on: policy, arms, rule (JSON)")
    parser.add_argument("--judging", required=True, help="how cells are judged: gates, slo, analysis, arms, variants")
    parser.add_argument("--summaries", type=Path, nargs="+", required=True, help="the fixed arms' cells")
    parser.add_argument("--out", type=Path, required=True, help="schedule.json")


def run(args: argparse.Namespace) -> int:
    doc, kept = schedule_job(args.variant, load_arg(args.decision), load_arg(args.judging), args.summaries, args.out)
    how = "kept (same cells and policy settings)" if kept else "derived"
    print(f"{args.variant}: schedules {how}")
    for family, entry in doc["families"].items():
        print(f"  {family}: {entry.get('schedule')}  ({entry.get('rule', '')}; {entry.get('reason', '')})")
        if u := entry.get("unmeasured"):  # never shown as if measured (analysis/unmeasured.py)
            print(f"    NOT MEASURED: {u['note']}; to measure:\n      {u['command']}")
    return 0
