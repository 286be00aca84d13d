"""Build a model locally in the variant's environment (no downloads), atomically: `specsweep build-model`.

The builder runs with the variant's interpreter (it needs torch/transformers, which the project's own
environment does not have); the model appears at --out only once it is complete.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from specsweep.io import read_json

BUILDERS = {"tiny-llama": "specsweep.tiny_model"}
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder that holds `specsweep`


def builder_source(builder: str) -> Path:
    """The builder's source file: an input of the model job, so a changed builder rebuilds the model."""
    if builder not in BUILDERS:
        raise ValueError(f"unknown model builder '{builder}'; known builders: {', '.join(BUILDERS)}")
    return PACKAGE_ROOT.joinpath(*BUILDERS[builder].split(".")).with_suffix(".py")


def build(python: str, builder: str, out: Path) -> None:
    if builder not in BUILDERS:
        raise ValueError(f"unknown model builder '{builder}'; known builders: {', '.join(BUILDERS)}")
    tmp = out.with_name(f".{out.name}.building")
    shutil.rmtree(tmp, ignore_errors=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
    }
    subprocess.run([python, "-m", BUILDERS[builder], "--out", str(tmp)], check=True, env=env)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, type=Path, help="the variant's fingerprint JSON (its interpreter)")
    parser.add_argument("--builder", required=True, choices=sorted(BUILDERS))
    parser.add_argument("--out", required=True, type=Path, help="model folder to create")


def run(args: argparse.Namespace) -> int:
    python = read_json(args.env).get("python_executable") or sys.executable
    build(python, args.builder, args.out)
    print(f"built {args.builder} model at {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specsweep.modelbuild", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
