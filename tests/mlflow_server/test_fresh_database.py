"""A fresh PostgreSQL database as the store itself (`mlflow.tracking_uri: postgresql://...`, the team's database
without a tracking server in front), opened by eight tracking jobs at the same moment, ten rounds: every job
opens it, the schema created once under specsweep's advisory lock (tracking.store.schema_lock). MLflow's own
store creates it in every process that finds the tables missing (docs/mlflow-schema-race.md)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.mlflow_server.conftest import PG_SCRIPT, MlflowServer
from tests.support.store_race import open_at_once

pytestmark = [pytest.mark.mlflow_server, pytest.mark.timeout(600)]

ROUNDS, JOBS = 10, 8


def fresh_database(server: MlflowServer, name: str) -> str:
    """A new, empty database on the tier's PostgreSQL, owned by its role; its URI (with the role's password)."""
    port = urlsplit(server.db_uri).port
    up = subprocess.run(
        ["bash", str(PG_SCRIPT), "up", str(server.root / "pg"), str(port)],
        env={**os.environ, "SPECSWEEP_PG_DB": name},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, f"postgres.sh up (database {name}) failed:\n{up.stdout}\n{up.stderr}"
    return up.stdout.strip().splitlines()[-1]


def test_a_fresh_database_opened_by_many_jobs_at_once(
    mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job opens one store and ends; the test's processes live through ten rounds, and with MLflow's pooled
    # engines (kept per store) they would hold 80 connections of the server's 100. MLflow's own setting closes
    # each connection after use, as a short job's exit does.
    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
    uris = [fresh_database(mlflow_server, f"fresh{r}") for r in range(ROUNDS)]

    def config_of(round_: int) -> dict[str, Any]:
        return {
            "experiment": "fresh",
            "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
            "results_dir": str(tmp_path / f"r{round_}" / "results"),
            "mlflow": {"tracking_uri": uris[round_]},
            "view_arms": {"speculative": ["eagle3"], "policy": []},
        }

    said = open_at_once(JOBS, ROUNDS, config_of)
    assert said == {"ok": JOBS * ROUNDS}, said
