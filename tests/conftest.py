"""Shared test helpers: the repository root, the project's interpreter, process hygiene, and the CI rule that a
test which cannot run fails (naming what is missing) instead of skipping."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SNAKEMAKE = [PYTHON, "-m", "snakemake"]

# A skip whose reason starts with this is about the host's state during a measurement (another process stole the
# measured CPUs), not about something missing: CI lets it stand, reported by `pytest -ra`.
HOST_DISTURBED = "host disturbed:"


def in_ci() -> bool:
    """CI=true (or 1/yes), as CI services and .ci/run set it."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(what: str) -> NoReturn:
    """Stop a test whose package, service or simulator is absent: a failure naming it in CI, a skip elsewhere."""
    if in_ci():
        pytest.fail(f"CI=true and this test cannot run: {what}", pytrace=False)
    pytest.skip(what)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """In CI no test skips silently: any skip (a `skipif` marker, a fixture's `pytest.skip`) becomes a failure that
    names its reason, so a tier whose package did not install cannot leave CI green. Outside CI a skip stays a
    skip, reported by `pytest -ra`."""
    outcome = yield
    report = outcome.get_result()
    if not (in_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith(HOST_DISTURBED):
        return
    report.outcome = "failed"
    report.longrepr = f"CI=true: a test may not skip, and this one would have: {reason}"


def sim_server_processes(workdir: Path | None = None) -> list[psutil.Process]:
    """Simulated-engine server processes, those started from `workdir` (its cwd) when given."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = p.info.get("cmdline") or []
        if not any(cmd[i : i + 3] == ["-m", "specsweep", "serve-sim"] for i in range(len(cmd))):
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


@pytest.fixture(autouse=True)
def keeps_the_cpus_it_was_given() -> Iterator[None]:
    """A test that pins this process (a cell or `bench` run in-process) must give its CPUs back: a test runner left
    on one core ran every later tier there, and the SLURM tier's node came up with 1 CPU, too few for its jobs."""
    before = os.sched_getaffinity(0)
    yield
    after = os.sched_getaffinity(0)
    if after != before:
        os.sched_setaffinity(0, before)
        pytest.fail(f"the test left the test process on CPUs {sorted(after)} (it had {sorted(before)})")
