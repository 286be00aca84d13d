"""`track_variant`, the workflow's one MLflow job per variant: each arm's sweep gets the cells under its own
folder, each marker is written as soon as its sweep is logged, and a failure after that keeps those markers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specsweep.tracking import log

pytestmark = pytest.mark.unit

CONFIG = {"experiment": "demo", "results_dir": "results", "mlflow": {"tracking_uri": "sqlite:///results/mlflow.db"}}


class StubTracker:
    """The Tracker's surface track_variant touches (its URI and the saved view), no MLflow."""

    uri = "sqlite:///results/mlflow.db"

    def __init__(self, config: dict[str, Any]) -> None:
        self.views = 0

    def save_view(self) -> None:
        self.views += 1


def layout(root: Path) -> tuple[list[Path], list[Path]]:
    """Cells of two fixed arms at two levels; a policy arm with a marker and no cells (no schedule served)."""
    cells = [root / "sim" / arm / f"c{c}" / "summary.json" for arm in ("baseline", "eagle3") for c in (1, 10)]
    markers = [root / "sim" / arm / "mlflow_sweep.json" for arm in ("baseline", "eagle3", "eagle3-policy")]
    return cells, markers


def test_each_arm_logs_its_own_cells_then_the_crossover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells, markers = layout(tmp_path)
    logged: dict[str, list[Path]] = {}

    def log_sweep(tracker: Any, variant: str, arm: str, paths: list[Path]) -> dict[str, Any]:
        logged[arm] = paths
        return {"arm": arm, "sweep_run_id": f"run-{arm}", "cell_run_ids": {}, "tracking_uri": "unredacted"}

    def log_crossover(tracker: Any, variant: str, crossover: Path, sweep_markers: list[Path]) -> dict[str, Any]:
        assert all(m.is_file() for m in sweep_markers)  # every sweep is on disk before the crossover is logged
        return {"crossover_run_id": "run-x", "cell_run_ids": []}

    monkeypatch.setattr(log, "Tracker", StubTracker)
    monkeypatch.setattr(log, "log_sweep", log_sweep)
    monkeypatch.setattr(log, "log_crossover", log_crossover)
    marker = log.track_variant(CONFIG, "sim", cells, tmp_path / "sim" / "crossover.json", markers)
    assert logged == {"baseline": cells[:2], "eagle3": cells[2:]}  # the policy arm served nothing: not logged
    assert marker["crossover_run_id"] == "run-x" and marker["tracking_uri"] == StubTracker.uri
    policy = json.loads(markers[2].read_text())
    assert policy["sweep_run_id"] is None and policy["note"].startswith("no cells")
    assert json.loads(markers[0].read_text())["tracking_uri"] == StubTracker.uri  # redacted, never log_sweep's own


def test_a_failed_crossover_keeps_the_sweeps_it_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells, markers = layout(tmp_path)

    def log_crossover(*_: Any) -> dict[str, Any]:
        raise RuntimeError("the store went away")

    monkeypatch.setattr(log, "Tracker", StubTracker)
    monkeypatch.setattr(log, "log_sweep", lambda t, v, arm, p: {"arm": arm, "sweep_run_id": f"run-{arm}"})
    monkeypatch.setattr(log, "log_crossover", log_crossover)
    with pytest.raises(log.TrackingFailed, match="the MLflow store .* failed: the store went away"):
        log.track_variant(CONFIG, "sim", cells, tmp_path / "sim" / "crossover.json", markers)
    assert [json.loads(m.read_text())["arm"] for m in markers] == ["baseline", "eagle3", "eagle3-policy"]


def test_each_arm_gets_its_own_sweep_colour() -> None:
    """The MLflow UI draws a run in its `mlflow.runColor` tag's colour (else one hashed from the run id, which two
    runs can share): each arm of the tracking spec gets its own, the same in every variant and on every re-log."""
    from specsweep.config import tracking_spec, validate
    from specsweep.tracking.payloads import SWEEP_COLOURS, sweep_colour

    config = validate(
        {
            "experiment": "demo",
            "arms": {
                "baseline": {"speculative": False},
                "eagle3": {"speculative": True, "draft_lengths": [1, 3]},
            },
            "variants": {"sim": {"engine": "sim"}},
        }
    )
    spec = tracking_spec(config)
    arms = ["baseline", "eagle3-k1", "eagle3-k3", "eagle3-policy"]
    assert spec["arms"] == arms
    assert [sweep_colour(spec, a) for a in arms] == list(SWEEP_COLOURS[:4])
    assert sweep_colour(spec, "not-an-arm") is None  # MLflow's own colour, no guess
