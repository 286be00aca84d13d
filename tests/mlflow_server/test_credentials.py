"""The server's password: needed (the server runs basic auth), taken from MLflow's variables or from inside
the tracking URI, and written nowhere: no file of the run (results/, summaries, markers, logs, Snakemake's
metadata) and no captured output holds it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.mlflow_server.conftest import MlflowServer, active_runs, base_env, snakemake, track_sweep

pytestmark = [pytest.mark.mlflow_server, pytest.mark.timeout(300)]

EXP = "tiny"


def _files_holding(root: Path, secret: str, skip: set[Path] = frozenset()) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p not in skip and secret.encode() in p.read_bytes()]


def _run_ids(client: Any) -> set[str]:
    return {r.info.run_id for r in active_runs(client, EXP)}


def test_the_password_from_the_environment_is_written_nowhere(
    tiny_run: dict[str, Any], mlflow_server: MlflowServer
) -> None:
    workdir = tiny_run["workdir"]
    assert (workdir / "results" / EXP / "sim" / "eagle3" / "mlflow_sweep.json").is_file()  # it did log
    assert _files_holding(workdir, mlflow_server.password) == []
    assert mlflow_server.password not in tiny_run["stdout"] + tiny_run["stderr"]


def test_without_credentials_the_server_refuses_and_the_job_says_how_to_fix_it(
    tiny_run: dict[str, Any], mlflow_server: MlflowServer
) -> None:
    """The credential is really needed: a tracking job without one fails at once, naming the server and the
    variables to set."""
    workdir = tiny_run["workdir"]
    proc, elapsed = track_sweep(workdir, EXP, "sim", workdir / "no-credentials.json", base_env())
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert elapsed < 30
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"specsweep track: the MLflow server at {mlflow_server.url} refused this job's credentials")
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in line and "Nothing measured is lost" in line
    assert "Traceback" not in proc.stderr
    assert not (workdir / "no-credentials.json").exists()


def test_a_password_inside_the_uri_is_used_and_masked(
    tiny_run: dict[str, Any], mlflow_server: MlflowServer, client: Any, tmp_path: Path
) -> None:
    """tracking_uri http://admin:<password>@host:port and no MLflow variables: the jobs log (the credential in
    the URI is used), into the same runs (nothing re-measured or re-logged), and the password is in no file but
    the config and in no output."""
    before = _run_ids(client)
    work = tmp_path / "copy"
    shutil.copytree(tiny_run["workdir"], work, symlinks=True)
    config = yaml.safe_load((work / "config.yaml").read_text())
    host = mlflow_server.url.removeprefix("http://")
    config["mlflow"]["tracking_uri"] = f"http://admin:{mlflow_server.password}@{host}"
    (work / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = snakemake(work, base_env(), "--forcerun", "track_variant")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "localrule track_variant" in proc.stdout + proc.stderr and "localrule cell" not in proc.stdout + proc.stderr
    assert _run_ids(client) == before  # logged once: the rerun found every run complete and kept it
    marker = json.loads((work / "results" / EXP / "sim" / "eagle3" / "mlflow_sweep.json").read_text())
    assert marker["tracking_uri"] == mlflow_server.url
    assert f"MLflow UI: {mlflow_server.url}" in proc.stdout + proc.stderr
    assert _files_holding(work, mlflow_server.password, skip={work / "config.yaml"}) == []
    assert mlflow_server.password not in proc.stdout + proc.stderr
