"""What the workflow's jobs inherit from the Snakemake process: called once by the Snakefile.

Why a function in the package rather than lines in the Snakefile: the jobs' environment is part of how the
workflow runs (which code, which interpreter, who owns the servers), and one place states it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specsweep.serving.serverhost import HOST_ENV, start_host
from specsweep.serving.servers import OWNER_ENV, OWNER_JOB_ENV, process_started

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
      In a SLURM job, the owner is the job's first Snakemake process (its batch step; a job inherits the
      submitting process's environment, whose owner runs elsewhere), which also starts the job's server host
      (specsweep.serving.serverhost): the job's cells run in job steps of their own, which end with each cell.
    """
    _prepend("PYTHONPATH", str(package_root))
    _prepend("PATH", str(Path(sys.executable).parent))
    job = os.environ.get("SLURM_JOB_ID")
    if job and os.environ.get(OWNER_JOB_ENV) != job:
        pid = os.getpid()
        os.environ[OWNER_ENV] = str(pid)
        os.environ[OWNER_JOB_ENV] = job
        os.environ[HOST_ENV] = str(start_host(pid, process_started(pid) or 0.0, job))
    os.environ.setdefault(OWNER_ENV, str(os.getpid()))
