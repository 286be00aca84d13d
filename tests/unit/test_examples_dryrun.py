"""Every shipped config builds its DAG: `snakemake -n --cores 1 crossover --configfile <it>` succeeds for the
embedded default and every file in config/examples/ (a new example is picked up by the glob), on a machine without
GPUs, engines or models. It runs in a temporary folder that links the checkout's Snakefile, workflow, envs and config,
so neither Snakemake's `.snakemake/` nor any result is written into the repository. What the DAGs hold is checked by
tests/pipeline/test_examples.py and tests/unit/test_segments_dag.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, SNAKEMAKE

pytestmark = pytest.mark.unit

EXAMPLES = sorted(p.relative_to(REPO) for p in (REPO / "config" / "examples").glob("*.yaml"))
CONFIGS = [Path("config/config.yaml"), *EXAMPLES]
LINKED = ("Snakefile", "workflow", "envs", "config")  # what a config names relative to the checkout


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_dry_runs(tmp_path: Path, config: Path) -> None:
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    cmd = [*SNAKEMAKE, "-n", "--cores", "1", "crossover", "--configfile", str(config)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{config}: the dry run failed\n" + proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "This was a dry-run" in proc.stdout + proc.stderr, f"{config}: no DAG was built"
    assert not (tmp_path / "results").exists(), f"{config}: a dry run wrote results"
