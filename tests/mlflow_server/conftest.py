"""A team's MLflow server of the tier's own: `mlflow server` with basic auth on a real PostgreSQL
(tests/services/postgres.sh) and proxied artifacts (--artifacts-destination), on loopback ports. Started once per
session, stopped when it ends, also after a failed test or a failed start.

Clients get the credential the way a team member would: MLflow's own MLFLOW_TRACKING_USERNAME/_PASSWORD (or
inside the URI, test_credentials.py), never from this tier's files. `FaultyProxy` stands in for a server that
goes down in the middle of a run (test_outage.py).
"""

from __future__ import annotations

import contextlib
import copy
import glob
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import PYTHON, REPO, SNAKEMAKE, missing

PG_SCRIPT = REPO / "tests" / "services" / "postgres.sh"
TINY = REPO / "tests" / "pipeline" / "tiny.yaml"
ADMIN = "admin"
TEAM = ("alice", "bob")  # users of their own for the two checkouts of test_outage.py
# what docs/mlflow.md recommends for a team sharing experiments: specsweep deletes the runs it supersedes, which
# takes MANAGE on the experiment (EDIT logs, but fails the first retire in a teammate's experiment)
DEFAULT_PERMISSION = "MANAGE"
# variables the server and the "no credentials" clients must not inherit from the test's environment
CLIENT_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_URI")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_requirement() -> str | None:
    """Why this tier cannot run here (a package to install), or None."""
    if not (shutil.which("pg_ctl") or glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")):
        return "PostgreSQL server binaries not found: apt-get install -y postgresql"
    try:
        import psycopg2  # noqa: F401  (MLflow's PostgreSQL driver)
    except ImportError:
        return "psycopg2 not installed: pip install psycopg2-binary (in the test extra)"
    try:
        import flask_wtf  # noqa: F401  (MLflow's basic-auth app)
    except ImportError:
        return "Flask-WTF not installed (MLflow's basic-auth app): pip install 'mlflow[auth]' (in the test extra)"
    return None


def base_env() -> dict[str, str]:
    """The test's environment without any MLflow credential or URI of its own."""
    return {k: v for k, v in os.environ.items() if k not in CLIENT_VARS}


class MlflowServer:
    """`mlflow server --app-name basic-auth` on PostgreSQL, artifacts proxied into `artifacts`."""

    def __init__(self, root: Path, db_uri: str, port: int) -> None:
        self.root = root
        self.db_uri = db_uri
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.artifacts = root / "artifacts"
        self.log = root / "mlflow-server.log"
        # unique, so a leak is found by searching for it (test_credentials.py)
        self.password = f"pw-{secrets.token_hex(12)}"
        self.passwords = {ADMIN: self.password} | {u: f"pw-{u}-{secrets.token_hex(12)}" for u in TEAM}
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self, user: str = ADMIN) -> dict[str, str]:
        """A client's environment: the user's credential in MLflow's variables."""
        return {**base_env(), "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": self.passwords[user]}

    def add_users(self) -> None:
        """The team's users, created by the admin through the auth app's API."""
        from unittest import mock

        from mlflow.server import get_app_client

        with mock.patch.dict(os.environ, self.env()):
            auth = get_app_client("basic-auth", tracking_uri=self.url)
            for user in TEAM:
                auth.create_user(user, self.passwords[user])

    def start(self, timeout_s: float = 120) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        auth_ini = self.root / "basic_auth.ini"
        # users and permissions in the same database (their own tables); password checks cached (PBKDF2 is slow)
        auth_ini.write_text(
            f"[mlflow]\ndefault_permission = {DEFAULT_PERMISSION}\n"
            f"database_uri = {self.db_uri}\nadmin_username = {ADMIN}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            "auth_cache_ttl_seconds = 300\n"
        )
        env = {
            **base_env(),
            "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.password,  # used once, when the user store is empty
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        }
        cmd = [PYTHON, "-m", "mlflow", "server", "--app-name", "basic-auth"]
        cmd += ["--backend-store-uri", self.db_uri, "--artifacts-destination", self.artifacts.as_uri()]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "2"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not ready on {self.url} within {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """The server's whole process group (uvicorn and its workers): SIGTERM, then SIGKILL after 15 s."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):  # the master gone or not: no worker stays behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


@pytest.fixture(scope="package")  # down after its tier: later tiers measure on an idle host
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    why = missing_requirement()
    if why:
        missing(f"MLflow server tier: {why}")
    # under /tmp: short enough for PostgreSQL's unix socket, and reachable by the `postgres` user it runs as
    root = Path(tempfile.mkdtemp(prefix="ss-mlflow-", dir="/tmp"))
    root.chmod(0o711)  # searchable by that user; postgres.sh makes pg/ its own
    pg_dir = root / "pg"
    server: MlflowServer | None = None
    try:
        up = subprocess.run(
            ["bash", str(PG_SCRIPT), "up", str(pg_dir), str(free_port())],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert up.returncode == 0, f"postgres.sh up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}"
        server = MlflowServer(root, up.stdout.strip().splitlines()[-1], free_port())
        server.start()
        server.add_users()
        yield server
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["bash", str(PG_SCRIPT), "down", str(pg_dir)], capture_output=True, timeout=60)
        logs = tmp_path_factory.getbasetemp() / "mlflow-server-logs"  # kept with the test's files
        logs.mkdir(exist_ok=True)
        for log in (root / "mlflow-server.log", pg_dir / "postgres.log"):
            if log.is_file():
                shutil.copy(log, logs / log.name)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def client(mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An MlflowClient of the admin (MLflow reads the credential from the environment at each request)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_server.password)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)  # nothing falls back to a local ./mlflow.db
    return MlflowClient(tracking_uri=mlflow_server.url)


# This tier checks what is logged, not the measurements: a machine busy with other work (other tests) must not
# turn cells invalid, whose curves are then left empty. The error and prefix-cache gates stay.
LENIENT_GATES = {
    "min_achieved_concurrency_ratio": 0.0,
    "max_client_cpu_share": 1.0,
    "max_client_wait_share": 1.0,
    "max_foreign_cpu_share": 1.0,
    "max_loop_lag_excess_ms": 1e6,
    "max_late_send_share": 1.0,
}


def track_sweep(workdir: Path, exp: str, variant: str, out: Path, env: dict[str, str]) -> tuple[Any, float]:
    """One eagle3 sweep-tracking job as the rule runs it, on the workdir's cells; its process and wall time."""
    from specsweep.config import load, tracking_spec

    spec = tracking_spec(load(workdir / "config.yaml"))
    cells = sorted(str(p) for p in (workdir / "results" / exp / variant / "eagle3").glob("c*/summary.json"))
    cmd = [PYTHON, "-m", "specsweep", "track", "sweep", "--config", json.dumps(spec), "--variant", variant]
    cmd += ["--arm", "eagle3", "--out", str(out), *cells]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - t0


def write_config(workdir: Path, tracking_uri: str, **changes: Any) -> dict[str, Any]:
    """tests/pipeline/tiny.yaml logging to `tracking_uri` (lenient gates), top-level keys replaced by `changes`."""
    config = copy.deepcopy(yaml.safe_load(TINY.read_text()))
    config["gates"] = dict(LENIENT_GATES)
    config.update(changes)
    config["mlflow"] = {"tracking_uri": tracking_uri}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


def snakemake_cmd(*args: str) -> list[str]:
    """The user's command (`snakemake --cores 1 crossover`), with extra arguments before the config."""
    snakefile = str(REPO / "Snakefile")
    return [*SNAKEMAKE, "-s", snakefile, "--cores", "1", "crossover", *args, "--configfile", "config.yaml"]


def snakemake(workdir: Path, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_cmd(*args), cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def summaries(workdir: Path) -> dict[str, Path]:
    """Cell key -> summary.json of every measured cell under the workdir."""
    return {json.loads(p.read_text())["cell"]["key"]: p for p in sorted(workdir.glob("results/*/*/*/c*/summary.json"))}


def active_runs(client: Any, experiment: str) -> list[Any]:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], max_results=1000) if exp else []


def by_kind(runs: list[Any], kind: str) -> list[Any]:
    return [r for r in runs if r.data.tags.get("specsweep.kind") == kind]


@pytest.fixture(scope="package")  # down after its tier: later tiers measure on an idle host
def tiny_run(mlflow_server: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/pipeline/tiny.yaml through Snakemake on the simulated engine, logging to the server with the
    credential in MLflow's variables; shared by the layout and credential tests."""
    workdir = tmp_path_factory.mktemp("tiny-server")
    write_config(workdir, mlflow_server.url)
    t0 = time.monotonic()
    proc = snakemake(workdir, mlflow_server.env())
    (workdir.parent / "tiny-server.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"workdir": workdir, "stdout": proc.stdout, "stderr": proc.stderr, "wall_s": time.monotonic() - t0}


_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade", "te"}


class FaultyProxy:
    """An HTTP proxy in front of the server that can go down: `down()` closes its port (connections refused, as
    from a stopped server), and `cut_at(marker, nth)` drops the nth request whose path holds `marker` without an
    answer and goes down then, in the middle of a job. `up()` again is the server back, on the same address."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.is_down = True
        self.cut: tuple[str, int] | None = None
        self.seen = 0
        self.cut_done = False
        self.httpd: ThreadingHTTPServer | None = None

    def up(self) -> None:
        self.cut, self.seen, self.is_down = None, 0, False
        handler = type("Handler", (_ProxyHandler,), {"proxy": self})
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def down(self) -> None:
        self.is_down = True
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def cut_at(self, marker: str, nth: int) -> None:
        with self.lock:
            self.cut, self.seen, self.cut_done = (marker, nth), 0, False

    def should_drop(self, path: str) -> bool:
        with self.lock:
            if self.is_down:
                return True
            if self.cut and self.cut[0] in path:
                self.seen += 1
                if self.seen == self.cut[1]:
                    self.is_down, self.cut_done = True, True
                    threading.Thread(target=self.down, daemon=True).start()
                    return True
            return False


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultyProxy

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read the proxy's counters, not a line per request on stderr."""

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _forward(self) -> None:
        body = self._body()
        if self.proxy.should_drop(self.path):  # no answer: the connection just ends
            self.close_connection = True
            return
        upstream = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            upstream.request(self.command, self.path, body=body, headers=headers)
            resp = upstream.getresponse()
            data = resp.read()
        finally:
            upstream.close()
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward
