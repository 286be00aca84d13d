"""What the workflow's jobs inherit from the Snakemake process: called once by the Snakefile.

Why a function in the package rather than lines in the Snakefile: the jobs' environment is part of how the
workflow runs (which code, which interpreter, who owns the servers), and one place states it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specsweep.servers import OWNER_ENV

__all__ = ["prepare"]


def _prepend(name: str, value: str) -> None:
    os.environ[name] = os.pathsep.join(p for p in (value, os.environ.get(name)) if p)


def prepare(package_root: str | Path) -> None:
    """Set up the environment every job inherits.

    - PYTHONPATH: this checkout's package first, so jobs (and the servers they start) run this code, installed
      or not;
    - PATH: this interpreter's folder first, so a job's `python` is the one running Snakemake (under
      `--sdm conda` Snakemake puts the rule's environment, workflow/envs/specsweep.yaml, before it);
    - SPECSWEEP_OWNER_PID: this Snakemake process owns the servers (their supervisors stop them when it goes).
    """
    _prepend("PYTHONPATH", str(package_root))
    _prepend("PATH", str(Path(sys.executable).parent))
    os.environ.setdefault(OWNER_ENV, str(os.getpid()))
