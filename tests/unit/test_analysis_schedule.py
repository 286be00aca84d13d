"""From measured draft lengths to a schedule, and the proof that the policy arm serving it holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specsweep.analysis.analyze import analyze_variant
from specsweep.analysis.cells import find_cells, load_cell
from specsweep.analysis.policy import choose_threshold
from specsweep.analysis.proof import policy_proof
from specsweep.analysis.schedule import derive_schedules, level_choices, ranges_from_choices
from specsweep.analysis.settings import AnalysisSettings
from specsweep.engines.speculation import threshold_schedule
from tests.support.synthetic import write_synthetic_variant

pytestmark = pytest.mark.unit

LEVELS = [1, 4, 16, 64]


def test_ranges_keep_the_larger_k_only_where_it_was_measured_best() -> None:
    # going down: the boundary is the lower level; a run of equal K is one range
    assert ranges_from_choices([(1, 3), (2, 3), (5, 1), (10, 0), (30, 0)], 1024) == [
        [1, 2, 3],
        [3, 5, 1],
        [6, 1024, 0],
    ]
    # going up: the larger K starts at the level where it was measured best
    assert ranges_from_choices([(1, 0), (10, 3)], 256) == [[1, 9, 0], [10, 256, 3]]
    assert ranges_from_choices([(1, 2)], 64) == [[1, 64, 2]]
    assert ranges_from_choices([], 64) == []


def _cells(root: Path, arms: dict[str, object], seed: int = 0) -> dict:
    """Synthetic cells: one baseline and, per arm, a speculative arm with the given true speedup(C)."""
    for arm, speedup in arms.items():
        write_synthetic_variant(root, LEVELS, speedup, spec_arm=arm, sigma=0.05, seed=seed)  # type: ignore[arg-type]
    found = find_cells(root, ["baseline", *arms], LEVELS)
    return {a: {c: load_cell(d, arm=a, concurrency=c) for c, d in by.items()} for a, by in found.items()}


def _config(members: dict[str, int | None], policy: bool = True) -> dict:
    arms: dict = {"baseline": {"speculative": False}}
    for name, k in members.items():
        arms[name] = {"speculative": True, "family": "eagle3", "draft_length": k, "server_args": []}
    if policy:
        arms["eagle3-policy"] = {"speculative": True, "family": "eagle3", "policy": True}
    return {
        "concurrency": LEVELS,
        "arms": arms,
        "policy": {"measure": policy, "schedules": {}},
        "variants": {"v": {"engine": "sim", "profile": "demo"}},
    }


def test_best_k_per_level_prefers_the_smaller_within_the_noise(tmp_path: Path) -> None:
    # K=3 wins clearly at low load, K=1 and K=3 tie at C=16 (smaller chosen), both lose at C=64 (K=0)
    arms = {
        "eagle3-k1": lambda c: {1: 1.3, 4: 1.25, 16: 1.2, 64: 0.7}[int(c)],
        "eagle3-k3": lambda c: {1: 1.9, 4: 1.7, 16: 1.2, 64: 0.5}[int(c)],
    }
    cells = _cells(tmp_path, arms)
    settings = AnalysisSettings(replicates=300, levels=[float(c) for c in LEVELS])
    choices = level_choices(cells, "baseline", {"eagle3-k1": 1, "eagle3-k3": 3}, settings)
    assert [x["k"] for x in choices] == [3, 3, 1, 0]
    at16 = next(x for x in choices if x["concurrency"] == 16)
    assert {c["arm"] for c in at16["candidates"] if c["within_noise"]} >= {"eagle3-k1", "eagle3-k3"}
    config = _config({"eagle3-k1": 1, "eagle3-k3": 3})
    result = analyze_variant(cells, "baseline", ["eagle3-k1", "eagle3-k3"], settings)
    doc = derive_schedules(config, "v", result, cells, settings)
    assert doc["families"]["eagle3"]["schedule"] == [[1, 4, 3], [5, 16, 1], [17, 1024, 0]]


def test_one_draft_length_reduces_to_the_threshold(tmp_path: Path) -> None:
    cells = _cells(tmp_path, {"eagle3": lambda c: 1.6 / (1 + c / 12)})
    settings = AnalysisSettings(replicates=300, levels=[float(c) for c in LEVELS])
    result = analyze_variant(cells, "baseline", ["eagle3"], settings)
    doc = derive_schedules(_config({"eagle3": None}), "v", result, cells, settings)
    t = choose_threshold(result["arms"]["eagle3"])["threshold"]
    assert t is not None and 0 < t < 64
    assert doc["families"]["eagle3"]["schedule"] == threshold_schedule(t, 3, 1024)  # the demo profile's K=3


def test_proof_fails_where_the_policy_is_below_the_best_fixed_arm(tmp_path: Path) -> None:
    """A 'policy' that speculates everywhere, where speculation loses under load: fails there, holds below."""
    speedup = {1: 1.5, 4: 1.3, 16: 0.8, 64: 0.5}
    cells = _cells(tmp_path, {"eagle3": lambda c: speedup[int(c)]})
    # the policy arm's cells are the speculative arm's, measured again (another seed)
    again = _cells(tmp_path / "again", {"eagle3": lambda c: speedup[int(c)]}, seed=7)
    cells["eagle3-policy"] = again["eagle3"]
    settings = AnalysisSettings(replicates=300, levels=[float(c) for c in LEVELS])
    proof = policy_proof(cells, _config({"eagle3": 3})["arms"], "baseline", settings)["eagle3"]
    status = {r["concurrency"]: r["status"] for r in proof["per_level"]}
    assert status[16] == status[64] == "fails" and proof["failing_levels"] == [16, 64]
    assert status[1] == status[4] == "holds"
    assert {r["concurrency"]: r["best_fixed_arm"] for r in proof["per_level"]} == {
        1: "eagle3",
        4: "eagle3",
        16: "baseline",
        64: "baseline",
    }
    assert not proof["holds"] and "FAILS at C=16, 64" in proof["verdict"]


def test_sglang_adaptive_file_follows_schedule_json(tmp_path: Path) -> None:
    """The schedule job writes SGLang's adaptive config from schedule.json, also when it keeps a decision:
    a lost file comes back with the job, never a stale one."""
    from specsweep.analysis.schedule import write_engine_files

    path = tmp_path / "policy" / "eagle3.sglang-adaptive.json"
    doc = {"engine": "sglang", "families": {"eagle3": {"schedule": [[1, 8, 3], [9, 256, 0]], "file": str(path)}}}
    write_engine_files(doc)
    assert json.loads(path.read_text()) == {"1": {"candidate_steps": [3]}, "9": {"candidate_steps": [0]}}
    path.unlink()
    write_engine_files(doc)
    assert path.is_file()
    write_engine_files({"engine": "vllm", "families": {"ngram": {"schedule": [[1, 64, 1]]}}})  # nothing to write


def test_a_proof_row_says_whether_it_measures_the_mechanism_or_the_schedule() -> None:
    from specsweep.analysis.proof import mechanism_cost, what_it_compares
    from specsweep.analysis.served import scheduled_k as served_k

    schedule = [[1, 8, 3], [9, 64, 1], [65, 1024, 0]]
    assert [served_k(schedule, c) for c in (1, 8, 9, 64, 100)] == [3, 3, 1, 1, 0]
    assert served_k(schedule, 2000) is None
    assert what_it_compares(3, 3) == "mechanism, K=3 as the static flag"
    assert what_it_compares(0, 0) == "mechanism, K=0 range vs the baseline server"
    assert what_it_compares(1, 3) == "schedule" and what_it_compares(None, 3) == "unknown"
    rows = [
        {"concurrency": 1, "compares": "mechanism, K=3 as the static flag", "ratio": 0.99, "log_se": 0.01, "df": 4},
        {"concurrency": 4, "compares": "mechanism, K=3 as the static flag", "ratio": 0.97, "log_se": 0.01, "df": 4},
        {"concurrency": 16, "compares": "schedule", "ratio": 0.9, "log_se": 0.01, "df": 4},
        {"concurrency": 64, "compares": "mechanism, K=0 range vs the baseline server", "ratio": 0.95, "log_se": None},
    ]
    cost = mechanism_cost(rows, 0.95)
    assert list(cost) == ["mechanism, K=3 as the static flag"]  # the K=0 row has no paired error: absent
    m = cost["mechanism, K=3 as the static flag"]
    assert m["levels"] == [1, 4] and m["ratio"] == pytest.approx(math.sqrt(0.99 * 0.97))
    # two levels' errors add: se = sqrt(2) x 0.01 / 2, Satterthwaite df = 8
    half = math.log(m["ratio_hi"] / m["ratio"])
    assert half == pytest.approx(2.306 * math.sqrt(2) * 0.01 / 2, rel=1e-3)
