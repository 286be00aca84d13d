"""Build a model locally in the variant's environment (no downloads), atomically: `specsweep build-model`.

The builder runs with the variant's interpreter (it needs torch/transformers, which the project's own
environment does not have); the model appears at --out only once it is complete.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# builder -> (its `specsweep` subcommand, run with the variant's interpreter; the module whose source makes the model)
BUILDERS = {"tiny-llama": ("tiny-model", "specsweep.stack.tiny_model")}
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds `specsweep`


def builder_source(builder: str) -> Path:
    """The builder's source file: an input of the model job, so a changed builder rebuilds the model."""
    if builder not in BUILDERS:
        raise ValueError(f"unknown model builder '{builder}'; known builders: {', '.join(BUILDERS)}")
    return PACKAGE_ROOT.joinpath(*BUILDERS[builder][1].split(".")).with_suffix(".py")


def build(python: str, builder: str, out: Path) -> None:
    if builder not in BUILDERS:
        raise ValueError(f"unknown model builder '{builder}'; known builders: {', '.join(BUILDERS)}")
    tmp = out.with_name(f".{out.name}.building")
    shutil.rmtree(tmp, ignore_errors=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
    }
    subprocess.run([python, "-m", "specsweep", BUILDERS[builder][0], "--out", str(tmp)], check=True, env=env)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
