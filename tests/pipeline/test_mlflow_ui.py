"""The MLflow UI on a pipeline run's store, seen through a real (headless Chromium) browser; and the report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, SNAKEMAKE
from tests.pipeline.conftest import EXP

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(300)]

ARTIFACTS = Path(os.environ.get("SPECSWEEP_TEST_ARTIFACTS", REPO / "test-artifacts"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
    "--virtual-time-budget=20000",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def mlflow_ui(run_dir: Path):
    """`mlflow ui` on the run's store, bound to 127.0.0.1; always stopped."""
    port = free_port()
    uri = f"sqlite:///{run_dir / 'results' / 'mlflow.db'}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=run_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("mlflow ui did not come up") from None
                time.sleep(0.5)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_mlflow_ui_shows_experiment_and_runs(run_dir: Path, mlflow_ui: str, tmp_path: Path) -> None:
    exp = get_json(f"{mlflow_ui}/api/2.0/mlflow/experiments/get-by-name?experiment_name={EXP}")["experiment"]
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's chromium)")
    tags = {t["key"]: t["value"] for t in exp.get("tags", [])}
    assert tags.get("mlflow.experimentKind") == "custom_model_development"  # opens on the runs table
    url = f"{mlflow_ui}/#/experiments/{exp['experiment_id']}/runs"
    profile = tmp_path / "chromium-profile"
    dom = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "mlflow-ui-experiment.png"
    subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", url],
        capture_output=True,
        timeout=120,
    )
    (ARTIFACTS / "mlflow-ui-experiment.html").write_text(dom)
    assert EXP in dom, "the experiment's name is not on the page"
    for name in ("sim/baseline sweep", "sim/eagle3 sweep", "sim crossover"):
        assert name in dom, f"run {name!r} is not on the page"
    assert shot.stat().st_size > 10_000


def test_report_bundles_plots_tables_and_fingerprints(run_dir: Path) -> None:
    cmd = [
        *SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "--report",
        "report.html",
        "crossover",
        "--configfile",
        "config.yaml",
    ]
    proc = subprocess.run(cmd, cwd=run_dir, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    html = (run_dir / "report.html").read_text(errors="replace")
    for needle in ("speedup.png", "crossover.json", "policy.yaml", "sim.json", "throughput.png"):
        assert needle in urllib.parse.unquote(html), needle
