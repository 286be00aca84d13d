"""The MLflow UI on a pipeline run's store, used as a user would in a real (headless Chromium) browser driven by
Playwright, screenshots kept as CI artifacts (test-artifacts/); and the Snakemake report."""

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
from typing import Any

import pytest

from specsweep.tracking.payloads import SWEEP_COLOURS
from specsweep.tracking.view import VIEW_NAME
from tests.conftest import REPO, SNAKEMAKE, missing
from tests.pipeline.conftest import EXP

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(300)]

ARTIFACTS = Path(os.environ.get("SPECSWEEP_TEST_ARTIFACTS", REPO / "test-artifacts"))
# Playwright starts Chromium headless; without the background-networking flags this closed network refuses
# Chromium's own connections, many at a time.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
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


class Clicks:
    """A Playwright page that counts the user's clicks (the issue's budget: 3 to the curves, 2 to the
    crossover's meaning) and keeps a screenshot of each step as a CI artifact."""

    def __init__(self, page: Any, name: str) -> None:
        self.page, self.name, self.count, self.shots = page, name, 0, []

    def click(self, locator: Any, **kwargs: Any) -> None:
        locator.click(**kwargs)
        self.count += 1
        self.page.wait_for_timeout(1500)

    def shot(self, label: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"mlflow-ui-{self.name}-{len(self.shots) + 1}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.shots.append(path)
        return path


@pytest.fixture
def browser():
    """Headless Debian Chromium driven by Playwright (no browser download); always closed."""
    browser_exe = chromium()
    if browser_exe is None:
        missing("MLflow UI browser check: chromium is not installed (.ci/run installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_exe, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def new_user_page(browser: Any) -> Any:
    """A page in a fresh context: a user who has not opened this MLflow before (no remembered UI state)."""
    page = browser.new_context(viewport={"width": 1600, "height": 1100}).new_page()
    page.set_default_timeout(30_000)
    return page


def _chart_card(page: Any, metric: str) -> Any:
    """The chart card titled with `metric` (MLflow titles a card with its first metric key)."""
    cards = page.locator("[data-testid=experiment-view-compare-runs-card]")
    return cards.filter(has=page.get_by_text(metric, exact=True)).first


def rgb(hex_colour: str) -> str:
    """A #rrggbb colour as the browser writes it in a style."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _curves(card: Any) -> list[tuple[int, str]]:
    """(points, stroke colour) of each drawn line (plotly trace) in a chart card."""
    return card.locator("g.trace.scatter").evaluate_all(
        "els => els.map(t => t.querySelector('path.js-line')).filter(Boolean).map(e =>"
        " [(e.getAttribute('d') || '').split(/[ML]/).filter(Boolean).length, e.style.stroke])"
    )


def test_mlflow_ui_user_path(run_dir: Path, mlflow_ui: str, browser: Any) -> None:
    """From the experiment page: 3 clicks to both arms' throughput against C (log axis) in one chart, and
    1 click to the crossover run's meaning, 2 to its speedup chart."""
    exp = get_json(f"{mlflow_ui}/api/2.0/mlflow/experiments/get-by-name?experiment_name={EXP}")["experiment"]
    tags = {t["key"]: t["value"] for t in exp.get("tags", [])}
    assert tags.get("mlflow.experimentKind") == "custom_model_development"  # opens on the runs table
    page = new_user_page(browser)
    experiment_page = f"{mlflow_ui}/#/experiments/{exp['experiment_id']}/runs"
    page.goto(experiment_page)
    page.get_by_text("sim/eagle3 sweep").first.wait_for()
    user = Clicks(page, "curves")
    user.shot("experiment")
    user.click(page.get_by_role("button", name="Views"))
    user.click(page.get_by_text(VIEW_NAME).first)
    user.click(page.locator("label:has(input[value=CHART])"))
    card = _chart_card(page, "aggregate_tok_s")
    card.locator("g.trace.scatter path.js-line").first.wait_for()
    user.shot("curves")
    assert user.count <= 3
    curves = _curves(card)  # plotly draws each run's line twice (the line and its faint hover copy)
    colours = {colour for n, colour in curves if n >= 2}
    # baseline and eagle3, each over both levels, told apart by the colours their sweep runs are tagged with (by
    # the run id's hash otherwise: in one CI run both came out rgb(166, 99, 12))
    assert colours == {rgb(SWEEP_COLOURS[0]), rgb(SWEEP_COLOURS[1])}, curves
    assert card.locator("g.xaxislayer-above text").count() >= 2  # the C axis is drawn
    assert page.locator("text=specsweep: arms against concurrency").count() >= 1

    page = new_user_page(browser)
    page.goto(experiment_page)
    page.get_by_text("sim crossover").first.wait_for()
    user = Clicks(page, "crossover")
    user.click(page.get_by_role("link", name="sim crossover").first)
    description = page.get_by_text("Crossover of variant").first
    description.wait_for()
    body = page.locator("body").inner_text()
    assert ("crossover at C =" in body or "no crossover inside the measured levels" in body) and "threshold" in body
    user.shot("crossover")
    assert user.count <= 2
    user.click(page.get_by_role("tab", name="Model metrics").first)
    speedup = _chart_card(page, "eagle3.speedup")
    speedup.locator("g.trace.scatter path.js-line").first.wait_for()
    user.shot("speedup")
    assert user.count <= 2
    assert any(n >= 2 for n, _ in _curves(speedup)), _curves(speedup)


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
