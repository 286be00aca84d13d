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

from specsweep.analysis.analyze import analyze_arm
from specsweep.analysis.cells import load_cell
from specsweep.analysis.settings import AnalysisSettings
from specsweep.measure.segments import instance_log, merge_level
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


def test_the_segment_rule_adds_a_pair_until_the_answer_is_known(tmp_path: Path) -> None:
    """`next_pair` (the DAG's checkpoint after each instance pair): a speedup its instances agree on is known to a
    loose target after two pairs; to a tight one it asks for a third pair, and at the budget it stops saying so.
    The merged cells keep the answers, and the analysis reports the level in instances with its budget spent."""
    from specsweep.analysis.precision import next_pair
    from specsweep.measure.interleave import BUDGET_SPENT

    order = [*SEGMENTS, ("baseline", 3), ("eagle3", 3)]
    for i, (arm, k) in enumerate(order):
        instance_cell(tmp_path, arm, k, 1.0 if arm == "baseline" else 0.8, 1000.0 + 100 * i, seed=i)
    arms = ["baseline", "eagle3"]
    loose = next_pair(tmp_path, "c4", arms, 2, target=0.5, most=3)
    assert not loose.more and loose.decision.startswith("target met: +-"), loose
    assert loose.half_width is not None and loose.half_width <= 0.5
    tight = next_pair(tmp_path, "c4", arms, 2, target=0.001, most=3)
    assert tight.more and tight.decision.endswith("> +-0.1%") and tight.half_width > 0.001, tight
    spent = next_pair(tmp_path, "c4", arms, 3, target=0.001, most=3)
    assert not spent.more and spent.decision == f"{BUDGET_SPENT} max_instances 3", spent
    log = instance_log([spent, tight], 0.001, 3, 3)
    assert log["decisions"] == [f"i2: {tight.decision}", f"i3: {spent.decision}"]
    out = merge_level(tmp_path, "c4", arms, 3, log)
    assert out["eagle3"]["pairing"]["instance_log"] == log
    settings = AnalysisSettings(replicates=200, include_invalid=True)
    cells = {arm: {4.0: load_cell(tmp_path / arm / "c4", arm=arm, concurrency=4)} for arm in arms}
    row = analyze_arm(cells, "baseline", "eagle3", settings)["per_level"][0]
    p = row["precision"]
    assert (p["unit"], p["rounds"], p["target"]) == ("instance", 3, 0.001), p
    assert p["budget_spent"] and not p["met"] and (p["rounds_for_target"] is None or p["rounds_for_target"] > 3), p
