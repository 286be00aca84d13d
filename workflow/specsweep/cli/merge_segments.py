"""`specsweep merge-segments`: merge each fixed arm's instance cells at a level into its cell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specsweep.measure.segments import merge_level


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant-root", required=True, type=Path, help="the variant's results folder")
    parser.add_argument("--level", required=True, help="the level's folder name (c<C>)")
    parser.add_argument("--arms", required=True, nargs="+", help="the fixed arms, the baseline first")
    parser.add_argument("--instances", required=True, type=int, help="server instances per arm")


def run(args: argparse.Namespace) -> int:
    try:
        out = merge_level(args.variant_root, args.level, args.arms, args.instances)
    except FileNotFoundError as e:
        print(f"merge failed: an instance's cell is missing ({e.filename}); rerun its instance cell", file=sys.stderr)
        return 1
    print(json.dumps({arm: s["cell"]["key"] for arm, s in out.items()}, indent=2))
    return 0
