"""In CI a test that cannot run fails naming what is missing; outside CI it skips with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

CASES = """
import pytest
from conftest import HOST_DISTURBED, missing

def test_missing_package():
    missing("the frobnicator package is not installed: pip install frobnicator")

@pytest.mark.skipif(True, reason="needs a quantum host")
def test_marker():
    pass

def test_host_disturbed():
    pytest.skip(f"{HOST_DISTURBED} other processes used the measured CPUs")
"""


def run_cases(tmp_path: Path, ci: str | None) -> str:
    """The cases above, under the project's own conftest, in a separate pytest; its -ra report."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    cmd = [sys.executable, "-m", "pytest", "-ra", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    out = subprocess.run([*cmd, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def test_ci_turns_skips_into_failures_naming_what_is_missing(tmp_path: Path) -> None:
    out = run_cases(tmp_path, "true")
    assert "1 failed" in out and "1 error" in out and "1 skipped" in out, out  # the marker's skip is a setup error
    assert "cannot run: the frobnicator package is not installed: pip install frobnicator" in out
    assert "a test may not skip, and this one would have: needs a quantum host" in out
    assert "SKIPPED [1] test_cases.py" in out and "host disturbed: other processes used the measured CPUs" in out


def test_outside_ci_a_missing_requirement_skips_with_its_reason(tmp_path: Path) -> None:
    out = run_cases(tmp_path, None)
    assert "3 skipped" in out, out
    assert "the frobnicator package is not installed" in out and "needs a quantum host" in out
