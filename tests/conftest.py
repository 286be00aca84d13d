"""Shared test helpers: the repository root, the project's interpreter, process hygiene."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SNAKEMAKE = [PYTHON, "-m", "snakemake"]


def sim_server_processes(workdir: Path | None = None) -> list[psutil.Process]:
    """Simulated-engine server processes, those started from `workdir` (its cwd) when given."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = p.info.get("cmdline") or []
        if "specsweep.sim.server" not in cmd:
            continue
        cwd = p.info.get("cwd") or ""
        if workdir is None or cwd == str(workdir) or cwd.startswith(str(workdir) + "/"):
            out.append(p)
    return out


@pytest.fixture
def no_leftover_servers():
    """Fail a test that leaves a simulated server behind; kill it anyway so later tests start clean."""
    yield
    left = sim_server_processes()
    for p in left:
        with contextlib.suppress(psutil.Error):  # already gone
            p.kill()
    assert not left, f"server processes left behind: {[p.pid for p in left]}"
