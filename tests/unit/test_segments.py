"""Merging a replicated arm's instance cells (specsweep.measure.segments): records and repeats numbered on, the
segments' blocks in time order for every arm, and the analysis pairing each speculative segment with its
neighbouring baseline segments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specsweep.analysis.analyze import AnalysisSettings, analyze_arm
from specsweep.analysis.cells import load_cell
from specsweep.measure.segments import merge_level
from tests.support.synthetic import correlated_requests, write_synthetic_cell

pytestmark = pytest.mark.unit

SEGMENTS = [("baseline", 1), ("eagle3", 1), ("eagle3", 2), ("baseline", 2)]  # the order they ran in


def instance_cell(root: Path, arm: str, k: int, mean_e2e_s: float, t0: float, seed: int) -> None:
    """One instance's cell at C=4, written by the pipeline's summary builder, moved under instances/i<k>/."""
    df = correlated_requests(4, 16, 32, mean_e2e_s, np.random.default_rng(seed), repeats=2, request_sd=0.1)
    tmp = write_synthetic_cell(root / "tmp", arm, 4, df, experiment="x", variant="v")
    summary = json.loads((tmp / "summary.json").read_text())
    summary["server"].update(identity=f"{arm}-i{k}", pid=100 + k, started_at=t0 - 5)
    for r, rep in enumerate(summary["repeats"]):
        rep["t0_unix"] = t0 + 10 * r
    (tmp / "summary.json").write_text(json.dumps(summary))
    dest = root / arm / "c4" / "instances" / f"i{k}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(tmp), dest)


def test_merged_cells_pair_across_segments(tmp_path: Path) -> None:
    for i, (arm, k) in enumerate(SEGMENTS):
        instance_cell(tmp_path, arm, k, 1.0 if arm == "baseline" else 0.8, 1000.0 + 100 * i, seed=i)
    out = merge_level(tmp_path, "c4", ["baseline", "eagle3"], 2)
    base = out["baseline"]
    assert [r["repeat"] for r in base["repeats"]] == [0, 1, 2, 3]
    assert [r["instance"] for r in base["repeats"]] == [1, 1, 2, 2]
    df = pd.read_parquet(tmp_path / "baseline" / "c4" / "requests.parquet")
    assert sorted(df["repeat"].unique()) == [0, 1, 2, 3]
    blocks = base["pairing"]["blocks"]
    assert [(b["arm"], b["instance"]) for b in blocks] == [(a, k) for a, k in SEGMENTS for _ in range(2)]
    assert out["eagle3"]["pairing"]["id"] == base["pairing"]["id"]
    assert [s["identity"] for s in base["server"]["instances"]] == ["baseline-i1", "baseline-i2"]
    settings = AnalysisSettings(replicates=200, include_invalid=True)
    cells = {arm: {4.0: load_cell(tmp_path / arm / "c4", arm=arm, concurrency=4)} for arm in ("baseline", "eagle3")}
    row = analyze_arm(cells, "baseline", "eagle3", settings)["per_level"][0]
    assert row["paired"] is not None and (row["paired"]["blocks"], row["paired"]["unit"]) == (2, "instance"), row
    assert row["speedup"] == pytest.approx(1.25, rel=0.15)  # mean request time 1.0 s against 0.8 s
    assert row["speedup_lo"] < row["speedup"] < row["speedup_hi"]
