"""`specsweep build-env`: build (or reuse) a recipe's environment and print its interpreter."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsweep.stack.envbuild import EnvBuildError, RecipeError, ensure_env_logged


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", required=True, type=Path, help="pip requirements file under envs/")
    p.add_argument("--envs-root", type=Path, default=Path("results/_envs"), help="where environments live")
    p.add_argument("--log", type=Path, default=None, help="append the build log here (default: stderr)")


def run(args: argparse.Namespace) -> int:
    try:
        py = ensure_env_logged(args.recipe, args.envs_root, args.log)
    except (RecipeError, EnvBuildError) as e:
        print(f"specsweep build-env: {e}", file=sys.stderr)
        return 1
    print(py)
    return 0
