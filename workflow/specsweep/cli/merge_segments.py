"""`specsweep merge-segments`: merge each fixed arm's instance cells at a level into its cell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specsweep.measure.segments import instance_log, merge_level
from specsweep.records import SegmentDecision, read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant-root", required=True, type=Path, help="the variant's results folder")
    parser.add_argument("--level", required=True, help="the level's folder name (c<C>)")
    parser.add_argument("--arms", required=True, nargs="+", help="the fixed arms, the baseline first")
    parser.add_argument("--instances", required=True, type=int, help="server instances per arm")
    parser.add_argument(
        "--decisions",
        nargs="*",
        type=Path,
        default=[],
        help="the segment rule's answers after each instance pair (`segment-need` files), kept in the pairing block",
    )
    parser.add_argument("--target", type=float, help="with --decisions: precision.target")
    parser.add_argument("--max-instances", type=int, help="with --decisions: precision.max_instances")


def run(args: argparse.Namespace) -> int:
    log = None
    if args.decisions:
        if args.target is None or args.max_instances is None:
            print("merge failed: --decisions needs --target and --max-instances", file=sys.stderr)
            return 2
        fix = "rerun the level's segment-need job (snakemake --forcerun <that file>)"
        answers = [read(SegmentDecision, p, fix)[0] for p in args.decisions]
        log = instance_log(answers, args.target, args.max_instances, args.instances)
    try:
        out = merge_level(args.variant_root, args.level, args.arms, args.instances, log)
    except FileNotFoundError as e:
        print(f"merge failed: an instance's cell is missing ({e.filename}); rerun its instance cell", file=sys.stderr)
        return 1
    print(json.dumps({arm: s["cell"]["key"] for arm, s in out.items()}, indent=2))
    return 0
