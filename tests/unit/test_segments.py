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


def test_another_pair_starts_only_where_the_run_budget_has_room_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under budget.run_s a sequential level's next instance pair (GPU time: each arm's server start, the longest
    any of its instance cells waited, and its closed loops at the level) starts only where it fits in the
    measuring seconds left; otherwise the level stops at its pairs, the answer saying why (the budget spent)."""
    import argparse
    import time

    from specsweep.cli import segment_need
    from specsweep.measure.budget import BUDGET_ENV, RunBudget
    from specsweep.measure.interleave import BUDGET_SPENT
    from specsweep.measure.segments import pair_seconds

    for i, (arm, k) in enumerate(SEGMENTS):
        instance_cell(tmp_path, arm, k, 1.0 if arm == "baseline" else 0.8, 1000.0 + 100 * i, seed=i)
        path = tmp_path / arm / "c4" / "instances" / f"i{k}" / "summary.json"
        summary = json.loads(path.read_text())
        summary["server"]["ready_after_s"] = 300.0 if k == 1 else 1.0  # the first instance started its server
        summary["measured_s"] = 50.0
        path.write_text(json.dumps(summary))
    arms = ["baseline", "eagle3"]
    assert pair_seconds(tmp_path, "c4", arms, 2) == pytest.approx(2 * (300.0 + 50.0))

    def ask(run_s: float | None) -> dict:
        out = tmp_path / f"after-{run_s}.json"
        if run_s is None:
            monkeypatch.delenv(BUDGET_ENV, raising=False)
        else:
            monkeypatch.setenv(BUDGET_ENV, RunBudget(run_s, time.time(), 4, str(tmp_path / "ledger.jsonl")).to_env())
        args = argparse.Namespace(
            variant_root=tmp_path, level="c4", arms=arms, instances=2, target=0.001, max_instances=3,
            decide_margin=None, out=out,
        )  # fmt: skip
        assert segment_need.run(args) == 0
        return json.loads(out.read_text())

    roomy = ask(2000.0)  # 85% of it, 1700 s, left for measuring: a 700-s pair fits
    assert roomy["more"] and roomy["decision"].endswith("> +-0.1%"), roomy
    tight = ask(600.0)  # 510 s left
    assert not tight["more"] and tight["decision"].startswith(f"{BUDGET_SPENT} run budget 600 s"), tight
    assert "another instance pair (~700 s, its servers' starts included) does not fit" in tight["decision"], tight
    assert ask(None)["more"]  # no budget (the env unset): the rule alone
