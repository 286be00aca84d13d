"""MLflow runs of a pipeline run say only what is true: every param against the files it came from, curves
with valid cells only (an invalid cell is made by removing one cell's requests.parquet in a copy)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specsweep.config import load, tracking_spec
from tests.pipeline.conftest import EXP, mlflow_runs

pytestmark = pytest.mark.pipeline

COORDINATES = {"variant", "arm", "concurrency", "source"}
SWEEP_LISTS = {"levels", "n_requests_by_level", "invalid_levels", "step"}  # sweep-only params


def _summaries(root: Path) -> dict[str, dict]:
    out = {}
    for path in root.glob("results/*/*/*/c*/summary.json"):
        s = json.loads(path.read_text())
        out[s["cell"]["key"]] = s
    return out


def _params(row: pd.Series) -> dict[str, str]:
    return {k[len("params.") :]: v for k, v in row.items() if k.startswith("params.") and isinstance(v, str)}


def _expected_cell_param(summary: dict, key: str, workdir: Path) -> str | None:
    """What summary.json says a cell param should be (None: not a param this test knows how to check)."""
    cell, server = summary["cell"], summary["server"]
    if key in ("variant", "arm", "concurrency"):
        return str(cell[key])
    if key == "source":
        return str(summary["source"])
    if key.startswith("workload."):
        return str(summary["workload"][key.split(".", 1)[1]])
    if key == "server.identity":
        return str(server["identity"])
    if key.startswith("server."):
        return str(server["info"][key.split(".", 1)[1]])
    facts = {
        "stack.engine": summary["engine"],
        "stack.engine_version": server["info"]["version"],
        "stack.model": server["info"]["model_path"],
        "stack.tp": server["info"]["tp_size"],
        "stack.gpus": "none (CPU)",
        "stack.draft_model": "simulated EAGLE3 head" if cell["speculative"] else "none (no speculation)",
        "stack.server_command": " ".join(
            "<port>" if prev == "--port" else a for prev, a in zip(["", *server["argv"]], server["argv"], strict=False)
        ),
    }
    if key == "stack.fingerprint_sha256":
        import hashlib

        return hashlib.sha256((workdir / summary["stack"]["fingerprint"]).read_bytes()).hexdigest()
    return None if key not in facts else str(facts[key])


def test_every_param_is_true_for_the_run_it_sits_on(run_dir: Path) -> None:
    runs = mlflow_runs(run_dir)
    summaries = _summaries(run_dir)
    cells = runs[runs["tags.specsweep.kind"] == "cell"]
    unchecked: set[str] = set()
    for _, row in cells.iterrows():
        s = summaries[row["tags.specsweep.cell_key"]]
        for key, value in _params(row).items():
            expected = _expected_cell_param(s, key, run_dir)
            if expected is None:
                unchecked.add(key)
            else:
                assert value == expected, (row["tags.specsweep.cell_key"], key, value, expected)
        assert row["tags.mlflow.runName"] == f"sim/{s['cell']['arm']}/c{s['cell']['concurrency']:04d}"
    assert unchecked <= {"stack.packages", "stack.recipe", "stack.recipe_sha256", "stack.torch_cuda"}, unchecked
    for _, sweep in runs[runs["tags.specsweep.kind"] == "sweep"].iterrows():
        children = cells[cells["tags.mlflow.parentRunId"] == sweep["run_id"]]
        child_params = [_params(r) for _, r in children.iterrows()]
        levels = sorted(int(p["concurrency"]) for p in child_params)
        for key, value in _params(sweep).items():
            if key not in SWEEP_LISTS:  # true for the whole sweep: every cell has the same value
                assert all(p.get(key) == value for p in child_params), (sweep["tags.mlflow.runName"], key)
        p = _params(sweep)
        assert p["levels"] == ",".join(map(str, levels))
        by_c = {int(q["concurrency"]): q["workload.n_requests"] for q in child_params}
        assert p["n_requests_by_level"] == ",".join(f"{c}:{by_c[c]}" for c in levels)
        invalid = children[children["tags.specsweep.valid"] != "true"]
        bad = sorted(int(c) for c in invalid["params.concurrency"])
        assert p["invalid_levels"] == (",".join(map(str, bad)) or "none")
        assert "workload.n_requests" not in p or len(set(by_c.values())) == 1  # differs per level here
        assert sweep["tags.mlflow.note.content"].startswith(f"Sweep of arm **{p['arm']}**")
    crossover = runs[runs["tags.specsweep.kind"] == "crossover"].iloc[0]
    data = json.loads((run_dir / "results" / EXP / "sim" / "crossover.json").read_text())
    assert _params(crossover) == {"variant": "sim", "metric": "aggregate_tok_s", "baseline_arm": data["baseline_arm"]}
    note = crossover["tags.mlflow.note.content"]
    assert "eagle3" in note and ("crossover at C =" in note or "no crossover" in note)
    assert ("threshold N =" in note) == (data["arms"]["eagle3"]["threshold"] is not None)


def test_curves_hold_valid_cells_only(run_dir: Path, tmp_path: Path) -> None:
    """A cell that cannot be judged (its requests.parquet gone) is left off the sweep's curves, marked by
    `cell_valid` 0 at its level, named in `invalid_levels` and the `specsweep.invalid_cells` tag."""
    from mlflow.tracking import MlflowClient

    work = tmp_path / "copy"
    shutil.copytree(run_dir / "results", work / "results", ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts"))
    shutil.copy(run_dir / "config.yaml", work / "config.yaml")
    (work / "results" / EXP / "sim" / "eagle3" / "c4" / "requests.parquet").unlink()
    spec = tracking_spec(load(work / "config.yaml"))
    spec["mlflow"]["tracking_uri"] = f"sqlite:///{work / 'results' / 'mlflow.db'}"
    cells = sorted(str(p) for p in (work / "results" / EXP / "sim" / "eagle3").glob("c*/summary.json"))
    proc = subprocess.run(
        [sys.executable, "-m", "specsweep", "track", "sweep", "--config", json.dumps(spec), "--variant", "sim"]
        + ["--arm", "eagle3", "--out", str(work / "marker.json"), *cells],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    marker = json.loads((work / "marker.json").read_text())
    client = MlflowClient(tracking_uri=spec["mlflow"]["tracking_uri"])
    sweep = client.get_run(marker["sweep_run_id"])
    assert {m.step for m in client.get_metric_history(sweep.info.run_id, "aggregate_tok_s")} == {1}
    assert {m.step for m in client.get_metric_history(sweep.info.run_id, "tpot_p99_s")} == {1}
    assert {(m.step, m.value) for m in client.get_metric_history(sweep.info.run_id, "cell_valid")} == {
        (1, 1.0),
        (4, 0.0),
    }
    assert sweep.data.params["invalid_levels"] == "4"
    assert sweep.data.tags["specsweep.invalid_cells"].startswith("C=4: requests.parquet missing")
