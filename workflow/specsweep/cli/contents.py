"""`specsweep contents`: a variant's answer per content class and for the traffic mix (`analysis.contents`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specsweep.analysis.contents import contents_summary, format_contents
from specsweep.io import atomic_write_text
from specsweep.records import CROSSOVER_FIX, Contents, Crossover, check, read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", required=True, help="the variant (stack) whose classes are compared")
    parser.add_argument(
        "--crossovers", type=Path, nargs="+", required=True, help="each unit's crossover.json (<variant>@<class>/...)"
    )
    parser.add_argument("--mix", help="the mix's shares as JSON (class -> share); omit without a mix")
    parser.add_argument("--out", type=Path, required=True, help="contents.json to write")


def run(args: argparse.Namespace) -> int:
    crossovers = {p.parent.name: read(Crossover, p, CROSSOVER_FIX)[1] for p in args.crossovers}
    summary = contents_summary(args.variant, crossovers, json.loads(args.mix) if args.mix else None)
    check(Contents, summary, f"the contents of {args.out}", "this is a bug in the analysis: report it")
    atomic_write_text(args.out, json.dumps(summary, indent=1, allow_nan=False) + "\n")
    print(format_contents(summary))
    return 0
