"""`specsweep fingerprint`: write a stack fingerprint JSON (`specsweep.stack.fingerprint`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsweep.stack import envbuild
from specsweep.stack.fingerprint import fingerprint, write_json_atomic


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, choices=["sim", "sglang", "vllm"])
    p.add_argument("--out", required=True, type=Path, help="JSON file to write (atomically)")
    p.add_argument("--python", default=None, help="the variant's interpreter (default: built from --recipe)")
    p.add_argument("--recipe", type=Path, default=None, help="the variant's envs/ recipe")
    p.add_argument("--envs-root", type=Path, default=Path("results/_envs"), help="where environments live")
    p.add_argument("--gpus", default=None, help="the variant's GPU list (CUDA_VISIBLE_DEVICES)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="variant env_vars")
    p.add_argument("--log", type=Path, default=None, help="environment build log (default: stderr)")


def run(args: argparse.Namespace) -> int:
    python = args.python
    if python is None:
        if args.engine == "sim" or args.recipe is None:
            if args.engine != "sim":
                print(
                    "specsweep fingerprint: --python or --recipe is required for a real engine",
                    file=sys.stderr,
                )
                return 2
            python = sys.executable
        else:
            try:
                python = str(envbuild.ensure_env_logged(args.recipe, args.envs_root, args.log))
            except (envbuild.RecipeError, envbuild.EnvBuildError) as e:
                print(f"specsweep fingerprint: {e}", file=sys.stderr)
                return 1
    env_vars = dict(kv.split("=", 1) for kv in args.env)
    data = fingerprint(python, args.engine, recipe=args.recipe, gpus=args.gpus, env_vars=env_vars)
    write_json_atomic(args.out, data)
    return 0
