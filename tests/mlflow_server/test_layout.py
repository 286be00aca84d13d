"""An experiment logged to a team's server (PostgreSQL, proxied artifacts, basic auth), read back through the
server only: one run per cell, sweep and crossover, cells nested under their sweeps, metric histories with
step = C, artifacts listed and downloaded through the server and stored where the server keeps them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from specsweep.tracking.private import redacted, shareable
from tests.mlflow_server.conftest import MlflowServer, active_runs, by_kind, summaries

pytestmark = [pytest.mark.mlflow_server, pytest.mark.timeout(300)]

EXP = "tiny"


def _history(client: Any, run_id: str, key: str) -> dict[int, float]:
    points = client.get_metric_history(run_id, key)
    assert len({p.step for p in points}) == len(points), f"{key}: a step logged twice: {points}"
    return {p.step: p.value for p in points}


def test_runs_nesting_histories_and_artifacts(
    tiny_run: dict[str, Any], mlflow_server: MlflowServer, client: Any, tmp_path: Path
) -> None:
    workdir = tiny_run["workdir"]
    cells_on_disk = summaries(workdir)
    assert len(cells_on_disk) == 4  # 2 arms x C = 1, 4
    exp = client.get_experiment_by_name(EXP)
    # the server decides where artifacts go (proxied), not the client's results/ folder
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    assert not (workdir / "results" / "mlartifacts").exists()

    runs = active_runs(client, EXP)
    assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    cells, sweeps, crossovers = by_kind(runs, "cell"), by_kind(runs, "sweep"), by_kind(runs, "crossover")
    assert len(runs) == len(cells) + len(sweeps) + len(crossovers)
    assert sorted(r.data.tags["specsweep.cell_key"] for r in cells) == sorted(cells_on_disk)
    assert sorted(r.data.tags["specsweep.sweep_key"] for r in sweeps) == ["tiny/sim/baseline", "tiny/sim/eagle3"]
    assert [r.data.tags["specsweep.crossover_key"] for r in crossovers] == ["tiny/sim"]

    crossover = json.loads((workdir / "results" / EXP / "sim" / "crossover.json").read_text())
    per_level = {r["concurrency"]: r for r in crossover["arms"]["eagle3"]["per_level"]}
    sweep_by_arm = {r.data.tags["specsweep.arm"]: r for r in sweeps}
    for arm, sweep in sweep_by_arm.items():
        marker = json.loads((workdir / "results" / EXP / "sim" / arm / "mlflow_sweep.json").read_text())
        assert marker["sweep_run_id"] == sweep.info.run_id
        assert marker["tracking_uri"] == mlflow_server.url
        children = {r.info.run_id: r for r in cells if r.data.tags.get("mlflow.parentRunId") == sweep.info.run_id}
        assert sorted(children) == sorted(marker["cell_run_ids"].values())
        assert {r.data.tags["specsweep.arm"] for r in children.values()} == {arm}
        # the curves: one point per level, step = C, the values crossover.json was computed from
        valid = {int(r.data.params["concurrency"]): r.data.tags["specsweep.valid"] for r in children.values()}
        assert _history(client, sweep.info.run_id, "cell_valid") == {c: float(v == "true") for c, v in valid.items()}
        assert sorted(valid) == [1, 4] and set(valid.values()) == {"true"}, valid  # lenient gates
        curve = _history(client, sweep.info.run_id, "aggregate_tok_s")
        side = "baseline_value" if arm == "baseline" else "spec_value"
        assert sorted(curve) == [1, 4]
        for c, value in curve.items():
            assert math.isclose(value, per_level[float(c)][side], rel_tol=1e-9), (arm, c, value)
    speedup = _history(client, crossovers[0].info.run_id, "eagle3.speedup")
    assert speedup and all(math.isclose(v, per_level[float(c)]["speedup"], rel_tol=1e-9) for c, v in speedup.items())

    # artifacts: listed and downloaded through the server, byte for byte the local files as logged (their output
    # texts kept local: mlflow.log_texts is false, tracking/private.py)
    for run in cells:
        names = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert names == ["summary.json"], names
        (tmp_path / run.info.run_id).mkdir()
        got = client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path / run.info.run_id))
        with shareable(cells_on_disk[run.data.tags["specsweep.cell_key"]], {}) as logged:
            assert Path(got).read_bytes() == logged.read_bytes()
        stored = mlflow_server.artifacts / exp.experiment_id / run.info.run_id / "artifacts" / "summary.json"
        assert stored.is_file(), f"not where the server keeps artifacts: {stored}"
    for sweep in sweeps:
        assert {"prompt_sets.json", "stack"} <= {a.path for a in client.list_artifacts(sweep.info.run_id)}
    top = {a.path for a in client.list_artifacts(crossovers[0].info.run_id)}
    assert {"crossover.json", "policy.yaml", "crossover_table.csv", "plots", "cell_runs.json"} <= top, top
    plots = [a.path for a in client.list_artifacts(crossovers[0].info.run_id, "plots")]
    assert plots and all(p.startswith("plots/") for p in plots)
    (tmp_path / "x").mkdir()
    got = client.download_artifacts(crossovers[0].info.run_id, "crossover.json", str(tmp_path / "x"))
    assert json.loads(Path(got).read_text()) == redacted(crossover)
    # the final print names the server as the UI, not an `mlflow ui` command on a local file
    assert f"MLflow UI: {mlflow_server.url}" in tiny_run["stdout"] + tiny_run["stderr"]
