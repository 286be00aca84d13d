"""Where the runs go (the tracking URI, credentials kept out of it), the UI's address, and what a tracking job
that could not log says: where, what went wrong, the fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from specsweep.config import defaults
from specsweep.redact import redact_text, redact_uri, split_uri_credentials
from specsweep.tracking.view import view_url

# MLflow's own variables: the credentials of a tracking server, and how long one request may take
USER_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
# a PostgreSQL database as the store (postgresql://host/db): libpq's own variables take its credentials
PG_USER_ENV, PG_PASSWORD_ENV = "PGUSER", "PGPASSWORD"
HTTP_ENV = {"http_max_retries": "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "http_timeout_s": "MLFLOW_HTTP_REQUEST_TIMEOUT"}
# what a request that never got an answer says (requests/urllib3 through MLflow's "failed with exception")
UNREACHABLE = (
    "Max retries exceeded",
    "Connection refused",
    "Failed to establish",
    "timed out",
    "Connection aborted",
    "RemoteDisconnected",
    "Connection reset",
    "too many 5",
)
AUTH_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")


def resolve_tracking_uri(uri: str) -> str:
    """Make a relative sqlite path absolute so every process (and the printed UI command) agrees on it."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


def is_server_uri(uri: str) -> bool:
    """A tracking server (http/https), as opposed to a store this process writes itself (sqlite, files)."""
    return urlsplit(uri).scheme in ("http", "https")


def credentials_to_env(uri: str) -> str:
    """The tracking URI without a user:password@ of its own; those go to MLflow's variables instead
    (MLFLOW_TRACKING_USERNAME / _PASSWORD), which this process and the jobs it starts read. Why: in the URI the
    password would travel into marker files, rule params Snakemake prints, and MLflow's "View run at" lines.
    For a PostgreSQL database as the store they go to libpq's PGUSER / PGPASSWORD."""
    bare, user, password = split_uri_credentials(uri)
    user_env, password_env = (PG_USER_ENV, PG_PASSWORD_ENV) if is_postgresql_uri(bare) else (USER_ENV, PASSWORD_ENV)
    if user:
        os.environ[user_env] = user
    if password:
        os.environ[password_env] = password
    return bare


def is_postgresql_uri(uri: str) -> bool:
    """A PostgreSQL database as the store itself (postgresql://, postgresql+psycopg2://), no server in front."""
    return urlsplit(uri).scheme.split("+")[0] == "postgresql"


def http_env(mlflow_cfg: dict[str, Any]) -> None:
    """Few retries and a bounded wait per request (`mlflow.http_*`): with MLflow's defaults (7 retries with
    back-off, 120 s a request) a job against a server that is down hangs for minutes before it fails."""
    base = defaults("mlflow")
    for key, var in HTTP_ENV.items():
        os.environ[var] = str(mlflow_cfg.get(key, base[key]))


def ui_command(config: dict[str, Any]) -> str:
    """How to open the UI: a local store needs `mlflow ui` on it; a tracking server is its own UI."""
    uri = resolve_tracking_uri(split_uri_credentials(config["mlflow"]["tracking_uri"])[0])
    if is_server_uri(uri):
        return uri
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def ui_base(config: dict[str, Any]) -> str:
    """The UI's address: the tracking server's, or the one `ui_command` serves a local store on."""
    uri = split_uri_credentials(config["mlflow"]["tracking_uri"])[0]
    return uri if is_server_uri(uri) else "http://127.0.0.1:5000"


def ui_view_url(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """Where the UI shows the experiment's saved view of the curves."""
    return view_url(base, experiment_id)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status behind an error: MLflow's own (from its error code), or that of a requests.HTTPError
    (artifact uploads and downloads raise those)."""
    response = getattr(exc, "response", None)
    if getattr(response, "status_code", None) is not None:
        return int(response.status_code)
    return getattr(exc, "get_http_status_code", lambda: None)()


def error_code(exc: BaseException) -> str | None:
    """MLflow's error code of the failure, an artifact request's 401/403 included."""
    by_status = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}
    return by_status.get(http_status(exc) or 0, getattr(exc, "error_code", None))


def unreachable(exc: BaseException) -> bool:
    """A request that got no answer, or only a gateway's "unavailable" (the server behind it is down)."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    return any(s in str(exc) for s in UNREACHABLE) or http_status(exc) in (502, 503, 504)


def failure_text(exc: BaseException, config: dict[str, Any]) -> str:
    """One line for a tracking job that could not log: where (the server, credentials masked), what went
    wrong, the fix, and that nothing measured is lost (MLflow is fed from the local files)."""
    uri = redact_uri(split_uri_credentials(resolve_tracking_uri(config["mlflow"]["tracking_uri"]))[0])
    where = f"the MLflow server at {uri}" if is_server_uri(uri) else f"the MLflow store {uri}"
    detail = redact_text((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:500]
    code = error_code(exc)
    rerun = "rerun the same snakemake command"
    if code == "UNAUTHENTICATED":
        problem = f"refused this job's credentials ({code})"
        fix = f"export {USER_ENV} and {PASSWORD_ENV} (or MLFLOW_TRACKING_TOKEN) of an account on it, then {rerun}"
    elif code == "PERMISSION_DENIED":
        user = os.environ.get(USER_ENV) or "this job's user"
        problem = f"refused {user} a change to experiment {config['experiment']!r} ({code})"
        fix = (
            f"give {user} MANAGE on the experiment (specsweep deletes the runs it supersedes; with basic auth, "
            f"default_permission = MANAGE gives it to every user), then {rerun}"
        )
    elif unreachable(exc):
        problem = "cannot be reached"
        fix = f"start it (or correct mlflow.tracking_uri), then {rerun}"
    else:
        problem = "failed"
        fix = f"see the error above; once it is fixed, {rerun}"
    results = Path(config["results_dir"]) / config["experiment"]
    return (
        f"specsweep track: {where} {problem}: {detail}. Fix: {fix}. Nothing measured is lost: the results under "
        f"{results}/ stay as they are, and the rerun runs only the MLflow jobs, which log each cell once."
    )
