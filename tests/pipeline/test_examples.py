"""The example configs build a valid DAG (dry run): the user's 8-GPU SGLang box and the vLLM CPU tier."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, SNAKEMAKE

pytestmark = pytest.mark.pipeline


@pytest.mark.parametrize(("name", "cells", "schedules"), [("kimi-k25-8gpu", 48, 3), ("vllm-cpu-tiny", 12, 1)])
def test_example_dry_run(tmp_path, name: str, cells: int, schedules: int) -> None:
    """The fixed arms' cells, then per variant the `schedule` checkpoint that the policy arm's cells follow
    (their server commands, SGLang's adaptive flags included: tests/unit/test_engines_golden.py)."""
    cmd = [
        *SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "-n",
        "--cores",
        "1",
        "crossover",
        "--configfile",
        str(REPO / "config" / "examples" / f"{name}.yaml"),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = {}
    for line in (proc.stdout + proc.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    assert counts.get("cell") == cells, counts
    assert counts.get("schedule") == schedules, counts
    assert "variant=sim" not in proc.stdout  # the example replaces the default config, it does not merge into it
