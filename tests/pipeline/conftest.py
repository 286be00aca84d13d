"""One pipeline run on a tiny config, shared by the pipeline tier's tests (it takes about 40 s)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, SNAKEMAKE

EXP = "tiny"


def snakemake(
    workdir: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None, cores: int = 1
) -> subprocess.CompletedProcess[str]:
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", str(cores), *args, "--configfile", "config.yaml"]
    full_env = {**os.environ, **env} if env else None
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=full_env)


def server_events(workdir: Path) -> list[str]:
    log = workdir / "results" / EXP / ".servers" / "servers.log"
    return log.read_text().splitlines() if log.exists() else []


def starts(events: list[str]) -> list[str]:
    return [e for e in events if " start " in e]


def mlflow_runs(run_dir: Path) -> pd.DataFrame:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{run_dir / 'results' / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=[EXP])


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("pipeline")
    shutil.copy(REPO / "tests" / "pipeline" / "tiny.yaml", workdir / "config.yaml")
    proc = snakemake(workdir, "crossover")
    (workdir / "first_run.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir
