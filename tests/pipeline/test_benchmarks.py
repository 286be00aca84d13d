"""Every script in benchmarks/ runs in its smoke mode (seconds, tiny sizes), so a changed signature or config key
fails here instead of rotting until someone needs the figure. The scripts that read a finished run get the
pipeline tier's tiny run; their figures are not asserted (benchmarks print, they do not judge), their answer's
shape is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.engine_args.conftest import ENVS_DIR
from tests.pipeline.conftest import EXP

SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))

# What each smoke run must print: a line of its answer, not only that it started (not its figures: whether the
# tiny run's cells were valid, or the client kept up for one second, is the host's doing).
EXPECT = {
    "client_capacity.py": "smoke: one step measured",
    "content_acceptance.py": "smoke: templated config valid",
    "default_run.py": "finished run: 4 cells",
    "host_noise.py": "smoke: host timed: ",
    "open_closed_consistency.py": "arm eagle3 (speculative): 1 runs",
    "output_referral.py": "swapped tokens referred where they were swapped: 8 of 8",
    "precision_coverage.py": "sequential segments: coverage of the 95% intervals",
    "repeatability.py": "tiny/sim: eagle3 vs baseline",
    "round_cost.py": "all levels' blocks (",
    "sglang_args_newest.py": "command lines, 0 with findings",
    "sim_fidelity.py": "max |aggregate error|",
    "sim_timing.py": "drift = achieved / model - 1",
    "sim_validation.py": "leave-level-out: ",
    "time_to_answer.py": "kimi-k25-cu128 (calibrated), virtual time, 1 seeds",
}


@pytest.mark.pipeline
@pytest.mark.timeout(180)
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke(script: str, run_dir: Path) -> None:
    assert script in EXPECT, f"benchmarks/{script} has no smoke expectation: add its --smoke mode and a line here"
    extra = {
        "default_run.py": ["--results", str(run_dir)],
        "repeatability.py": ["--results", str(run_dir / "results" / EXP)],
        "round_cost.py": ["--results", str(run_dir / "results" / EXP)],
        # the engine_args tier's environment (built there first, reused here)
        "sglang_args_newest.py": ["--envs-root", str(ENVS_DIR)],
    }.get(script, [])
    cmd = [sys.executable, str(REPO / "benchmarks" / script), "--smoke", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=170)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} --smoke failed:\n{out[-4000:]}"
    assert EXPECT[script] in out, f"{script} --smoke did not print {EXPECT[script]!r}:\n{out[-4000:]}"
