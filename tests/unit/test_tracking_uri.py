"""A tracking server's URI, credentials and failures as specsweep handles them without a server (the server
itself: tests/mlflow_server)."""

from __future__ import annotations

import json
import os

import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import PERMISSION_DENIED, UNAUTHENTICATED

from specsweep.config import tracking_spec
from specsweep.final import final_text
from specsweep.redact import MASK, redact_text, redact_uri, split_uri_credentials
from specsweep.tracking.uri import USER_ENV, credentials_to_env, failure_text, ui_base, ui_command
from specsweep.tracking.view import view_arms, view_tag

pytestmark = pytest.mark.unit

URI = "https://alice:s3cr%40t-pw@mlflow.example.org:5000/prefix"


def test_a_password_in_a_uri_is_split_off_and_masked() -> None:
    assert split_uri_credentials(URI) == ("https://mlflow.example.org:5000/prefix", "alice", "s3cr@t-pw")
    assert split_uri_credentials("sqlite:///results/mlflow.db") == ("sqlite:///results/mlflow.db", None, None)
    assert split_uri_credentials("http://127.0.0.1:5000") == ("http://127.0.0.1:5000", None, None)
    assert redact_uri(URI) == f"https://alice:{MASK}@mlflow.example.org:5000/prefix"
    text = f"API request to {URI}/api/2.0/mlflow/runs/get failed"
    assert "s3cr" not in redact_text(text) and "alice" in redact_text(text)


def test_the_tracking_spec_never_holds_the_password() -> None:
    config = {"experiment": "e", "results_dir": "results", "mlflow": {"tracking_uri": URI, "enabled": True}}
    config |= {"gates": {}, "slo": {}, "arms": {}, "analysis": {"baseline_arm": "b"}, "policy": {}}
    spec = tracking_spec(config)
    assert spec["mlflow"]["tracking_uri"] == "https://mlflow.example.org:5000/prefix"
    assert "s3cr" not in json.dumps(spec) and "alice" not in json.dumps(spec)


def test_credentials_go_to_mlflows_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(USER_ENV, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    assert credentials_to_env(URI) == "https://mlflow.example.org:5000/prefix"
    assert os.environ[USER_ENV] == "alice" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3cr@t-pw"


def test_a_postgresql_stores_credentials_go_to_libpqs_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PostgreSQL database as the store: the jobs open it themselves, through libpq, which reads PGUSER and
    PGPASSWORD; the URI they get (a rule param Snakemake prints) holds neither."""
    for var in ("PGUSER", "PGPASSWORD", USER_ENV, "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    bare = credentials_to_env("postgresql+psycopg2://team:pg%2Fpw@db.example.org:5432/mlflow")
    assert bare == "postgresql+psycopg2://db.example.org:5432/mlflow"
    assert os.environ["PGUSER"] == "team" and os.environ["PGPASSWORD"] == "pg/pw"
    assert USER_ENV not in os.environ and "MLFLOW_TRACKING_PASSWORD" not in os.environ


def _config(uri: str) -> dict:
    return {"experiment": "exp", "results_dir": "results", "mlflow": {"tracking_uri": uri, "enabled": True}}


def test_a_server_is_its_own_ui(tmp_path) -> None:
    config = _config(URI) | {"results_dir": str(tmp_path), "variants": []}
    assert ui_command(config) == ui_base(config) == "https://mlflow.example.org:5000/prefix"
    text = final_text(config)
    assert "MLflow UI: https://mlflow.example.org:5000/prefix" in text and "s3cr" not in text
    local = _config("sqlite:////abs/mlflow.db") | {"results_dir": str(tmp_path), "variants": []}
    assert ui_command(local).startswith("mlflow ui --backend-store-uri sqlite:////abs/mlflow.db")
    assert ui_base(local) == "http://127.0.0.1:5000"
    text = final_text(local)  # a local store: the command that serves it, not "the tracking server"
    assert "MLflow UI: mlflow ui --backend-store-uri sqlite:////abs/mlflow.db" in text
    assert "(the tracking server)" not in text


def _http_error(status: int) -> requests.HTTPError:
    """What an artifact upload raises for a refused request (requests' raise_for_status)."""
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status} Client Error for url: {URI}/api/2.0/mlflow-artifacts/...", response=response)


@pytest.mark.parametrize(
    ("exc", "problem", "fix"),
    [
        (
            MlflowException(
                f"API request to {URI}/api/2.0/mlflow/experiments/get-by-name failed with exception "
                "HTTPConnectionPool(host='mlflow.example.org', port=5000): Max retries exceeded with url: ... "
                "(Caused by NewConnectionError(... [Errno 111] Connection refused))"
            ),
            "cannot be reached",
            "start it",
        ),
        (requests.exceptions.ConnectTimeout("timed out"), "cannot be reached", "start it"),
        (
            MlflowException("failed with error code 401 != 200", error_code=UNAUTHENTICATED),
            "refused this job's credentials (UNAUTHENTICATED)",
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)",
        ),
        (
            MlflowException("runs/delete failed with error code 403 != 200", error_code=PERMISSION_DENIED),
            "refused bob a change to experiment 'exp' (PERMISSION_DENIED)",
            "give bob MANAGE on the experiment",
        ),
        (_http_error(403), "refused bob a change to experiment 'exp' (PERMISSION_DENIED)", "MANAGE"),
        (_http_error(503), "cannot be reached", "start it"),
        (KeyError("cell"), "failed", "see the error above"),
    ],
)
def test_a_failed_job_names_the_server_and_the_fix(
    exc: BaseException, problem: str, fix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(USER_ENV, "bob")
    text = failure_text(exc, _config(URI))
    assert text.startswith("specsweep track: the MLflow server at https://mlflow.example.org:5000/prefix ")
    assert problem in text and fix in text
    assert "rerun the same snakemake command" in text and "Nothing measured is lost" in text
    assert "s3cr" not in text and "\n" not in text


def test_view_arms_reads_back_the_charts_of_a_view() -> None:
    _, value = view_tag(["eagle3", "eagle3-k1"], ["eagle3-policy"], now_ms=1)
    assert view_arms(value) == (["eagle3", "eagle3-k1"], ["eagle3-policy"])
    assert view_arms("not json") == ([], []) and view_arms(json.dumps({"state": "{}"})) == ([], [])
