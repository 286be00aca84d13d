"""The example configs build a valid DAG (dry run): the user's 8-GPU SGLang box and the vLLM CPU tier."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, SNAKEMAKE

pytestmark = pytest.mark.pipeline


@pytest.mark.parametrize(
    ("name", "jobs"),
    [
        # 3 variants x 8 levels x 2 fixed arms x 2 instances (pairing.instances), each level merged from them after
        # the segment rule's checkpoint (precision.max_instances) says whether it needs another instance pair
        ("kimi-k25-8gpu", {"instance_cell": 96, "segment_need": 24, "merge_segments": 24, "schedule": 3}),
        # 4 levels, each one job measuring the 3 fixed arms in interleaved blocks
        ("vllm-cpu-tiny", {"paired_level": 4, "schedule": 1}),
        ("vllm-cpu-tiny-aa", {"paired_level": 4}),
    ],
)
def test_example_dry_run(tmp_path, name: str, jobs: dict[str, int]) -> None:
    """The fixed arms' measuring jobs, then per variant the `schedule` checkpoint that the policy arm's cells
    follow (their server commands, SGLang's adaptive flags included: tests/unit/test_engines_golden.py)."""
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
    assert {k: counts.get(k) for k in jobs} == jobs, counts
    assert "cell" not in counts, counts  # every fixed arm is measured paired: interleaved or in segments
    assert "variant=sim" not in proc.stdout  # the example replaces the default config, it does not merge into it
