"""`specsweep build-model`: build a model locally in a variant's environment (`specsweep.stack.modelbuild`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsweep.io import read_json
from specsweep.stack.modelbuild import BUILDERS, build


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, type=Path, help="the variant's fingerprint JSON (its interpreter)")
    parser.add_argument("--builder", required=True, choices=sorted(BUILDERS))
    parser.add_argument("--out", required=True, type=Path, help="model folder to create")


def run(args: argparse.Namespace) -> int:
    python = read_json(args.env).get("python_executable") or sys.executable
    build(python, args.builder, args.out)
    print(f"built {args.builder} model at {args.out}")
    return 0
