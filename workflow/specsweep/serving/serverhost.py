"""Where a cluster job's servers are started from: the job's batch step, not the cell's own job step.

On SLURM, Snakemake runs one group job per server (variant x arm): the batch step runs Snakemake, which runs each
cell in a job step of its own (`srun`). SLURM ends every process of a step when the step ends (with
proctrack/cgroup, also processes that left the step's process tree), so a server a cell started from its step
would die with that cell, and every cell would start the server again. A server host, started by the job's
first Snakemake process (specsweep.serving.jobenv), runs in the batch step for the whole job: a cell leaves a request in
its inbox (a node-local folder) and the host starts the server's supervisor, which then lives as long as the job.
The host ends when its owner (that Snakemake process) does; each supervisor watches the same owner and stops its
server, and SLURM ends what is left when the job ends, is cancelled (scancel) or hits its time limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from specsweep.io import atomic_write_json
from specsweep.serving.liveness import owner_alive

HOST_ENV = "SPECSWEEP_SERVER_HOST"  # the inbox folder of this job's server host
POLL_S = 0.05

__all__ = ["HOST_ENV", "inbox", "request", "start_host"]


def inbox() -> Path | None:
    """This job's server-host inbox, if there is a live one on this node."""
    path = os.environ.get(HOST_ENV)
    return Path(path) if path and Path(path).is_dir() else None


def start_host(owner_pid: int, owner_started: float, job: str) -> Path:
    """Start the job's server host as a child of the calling (batch-step) process; returns its inbox."""
    box = Path(tempfile.mkdtemp(prefix=f"specsweep-servers-job{job}-"))
    subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specsweep",
            "server-host",
            "--inbox",
            str(box),
            "--owner-pid",
            str(owner_pid),
            "--owner-started",
            repr(owner_started),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(box / "host.log", "a"),  # noqa: SIM115 - the child holds it
        close_fds=True,
    )
    return box


def request(box: Path, argv: list[str], log_path: Path) -> None:
    """Ask the host to start `argv` (a supervisor) with its output appended to `log_path`."""
    atomic_write_json(box / f"{uuid.uuid4().hex}.json", {"argv": argv, "log_path": str(log_path)})


def serve(box: Path, owner_pid: int, owner_started: float) -> int:
    """Start what the inbox asks for until the owner is gone or a stop is asked."""
    stop = {"asked": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["asked"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    children: list[subprocess.Popen[bytes]] = []
    while not stop["asked"] and owner_alive(owner_pid, owner_started):
        for path in sorted(box.glob("*.json")):
            try:
                job = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                print(f"server host: unreadable request {path.name}: {e}", file=sys.stderr, flush=True)
                path.unlink(missing_ok=True)
                continue
            path.unlink(missing_ok=True)
            with open(job["log_path"], "a") as log:
                children.append(
                    subprocess.Popen(
                        job["argv"],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        start_new_session=True,
                        close_fds=True,
                    )
                )
        children = [c for c in children if c.poll() is None]  # reap the supervisors that ended
        time.sleep(POLL_S)
    # The supervisors watch the owner themselves and stop their servers; the host only leaves.
    with contextlib.suppress(OSError):
        shutil.rmtree(box)
    return 0
