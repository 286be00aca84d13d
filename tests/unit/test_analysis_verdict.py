"""Verdicts: a crossover, a win or loss at every level, or inconclusive with the levels to add or re-measure;
and the interpolation envelope of the crossover interval."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from specsweep.analysis.analyze import analyze_arm
from specsweep.analysis.cells import Cell
from specsweep.analysis.policy import choose_threshold
from specsweep.analysis.settings import AnalysisSettings
from specsweep.analysis.verdict import decide_verdict, suggest_levels
from specsweep.cli import main
from tests.support.crossovers import crossover_block
from tests.support.synthetic import correlated_cell, simulate_correlated, write_synthetic_variant

pytestmark = pytest.mark.unit

TOKENS = 16


def _cells(
    levels: list[int],
    speedup: Callable[[float], float],
    turnovers: int = 40,
    invalid: tuple[tuple[str, int], ...] = (),
    missing: tuple[tuple[str, int], ...] = (),
    seed: int = 0,
) -> dict[str, dict[float, Cell]]:
    """Cells in memory (no files): low-noise closed loops whose true speedup at C is speedup(C)."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[float, Cell]] = {"baseline": {}, "eagle3": {}}
    for c in levels:
        for arm, mean in (("baseline", 1.0), ("eagle3", 1.0 / speedup(c))):
            run = simulate_correlated(c, c * turnovers, TOKENS, mean, rng, speed_sd=0.02, request_sd=0.05)
            cell = correlated_cell(f"v/{arm}/c{c}", run, arm)
            if (arm, c) in invalid:
                cell.summary["validity"] = {"valid": False, "reasons": ["client saturated"], "flags": []}
            if (arm, c) not in missing:
                out[arm][float(c)] = cell
    return out


def _arm(cells: dict[str, dict[float, Cell]], levels: list[int], **kw: Any) -> dict[str, Any]:
    s = AnalysisSettings(replicates=300, seed=1, levels=[float(c) for c in levels])
    for k, v in kw.items():
        setattr(s, k, v)
    return analyze_arm(cells, "baseline", "eagle3", s)


DENSE = [1, 2, 4, 6, 8, 10, 14, 20]


def _falls(c: float) -> float:
    """True speedup 1.5 - 0.25 ln C: crosses 1 at e^2 = 7.39, linear in log C."""
    return 1.5 - 0.25 * math.log(c)


def test_clean_variant_is_a_crossover_with_a_threshold() -> None:
    ar = _arm(_cells(DENSE, _falls), DENSE)
    v = ar["verdict"]
    assert v["kind"] == "crossover" and v["add_levels"] == [] and v["remeasure_levels"] == []
    x = ar["crossover"]
    assert x["lo"] <= math.exp(2) <= x["hi"] and x["hi"] / x["lo"] <= 2.0
    # dense levels: the interpolants barely disagree, the interval is (nearly) not widened
    ip = ar["interpolation"]
    lo0, hi0 = ip["intervals"]["loglinear"]["lo"], ip["intervals"]["loglinear"]["hi"]
    assert x["lo"] >= 0.97 * lo0 and x["hi"] <= 1.03 * hi0
    assert ip["estimate_max"] / ip["estimate_min"] < 1.03
    t = choose_threshold(ar)
    assert t["threshold"] == math.floor(x["lo"]) and t["verdict"] == "crossover"


def test_outputs_never_compared_are_said_so_not_taken_as_equal() -> None:
    """Cells without recorded outputs (virtual-time, older cells): output_match None at each level and a verdict
    note that outputs were not compared, never a share of 1.0 taken for "same output" (issue 28)."""
    ar = _arm(_cells(DENSE, _falls), DENSE)
    assert all(r["output_match"] is None for r in ar["per_level"]), ar["per_level"]
    assert ar["output_match_min"] is None
    assert any("outputs not compared" in n for n in ar["verdict"]["notes"]), ar["verdict"]["notes"]
    assert not any("OUTPUTS DIFFER" in n for n in ar["verdict"]["notes"])


def test_wide_gap_widens_the_interval() -> None:
    """A crossing between C=10 and C=30: linear-in-C and PCHIP disagree with log-linear, and the interval
    takes their envelope."""
    levels = [1, 3, 10, 30, 100]
    ar = _arm(_cells(levels, _falls_late), levels, max_crossover_ratio=10.0)
    ip, x = ar["interpolation"], ar["crossover"]
    assert 10 < x["estimate"] < 30
    assert ip["widened"] is True
    assert ip["estimates"]["linear"] > 1.05 * ip["estimates"]["loglinear"]
    assert x["hi"] >= ip["intervals"]["linear"]["hi"] > 1.05 * ip["intervals"]["loglinear"]["hi"]


def _falls_late(c: float) -> float:
    """Crosses 1 at C = 17.3 (between 10 and 30)."""
    return 1.0 - 0.2 * math.log(c / math.sqrt(300))


def test_too_wide_interval_is_inconclusive_with_levels_to_add() -> None:
    levels = [1, 3, 30, 100]
    ar = _arm(_cells(levels, lambda c: 1.0 - 0.15 * math.log(c / math.sqrt(90))), levels, max_crossover_ratio=2.0)
    v = ar["verdict"]
    assert v["kind"] == "inconclusive" and "max_crossover_ratio" in v["reason"]
    assert v["add_levels"] and all(3 < c < 30 for c in v["add_levels"])
    assert v["remeasure_levels"] == []
    steps = np.diff(np.log([3, *v["add_levels"], 30]))
    assert steps.max() <= math.log(math.sqrt(2.0)) + 0.15  # about sqrt(max ratio) apart


def test_invalid_deciding_levels_are_inconclusive_and_named() -> None:
    cells = _cells(DENSE, _falls, invalid=(("eagle3", 6),), missing=(("baseline", 2),))
    ar = _arm(cells, DENSE)
    v = ar["verdict"]
    assert v["kind"] == "inconclusive"
    assert v["remeasure_levels"] == [2, 6]
    assert "C=2, 6 invalid or missing" in v["reason"]
    # the same run with include_invalid keeps the invalid cell; the missing one still blocks
    ar2 = _arm(cells, DENSE, include_invalid=True)
    assert ar2["verdict"]["remeasure_levels"] == [2]


def test_invalid_level_above_the_deciding_range_is_a_note() -> None:
    levels = [*DENSE, 40]
    ar = _arm(_cells(levels, _falls, invalid=(("eagle3", 40),)), levels)
    v = ar["verdict"]
    assert v["kind"] == "crossover"
    assert any("C=40" in n for n in v["notes"])


def test_wins_everywhere_with_an_invalid_top_level_is_inconclusive() -> None:
    levels = [1, 2, 5, 10]
    cells = _cells(levels, lambda c: 1.5, invalid=(("eagle3", 10),))
    ar = _arm(cells, levels)
    assert ar["winner"] == "eagle3" and ar["crossover"]["states"]["estimate"] == "above_range"
    assert ar["verdict"]["kind"] == "inconclusive" and ar["verdict"]["remeasure_levels"] == [10]
    clean = _arm(_cells(levels, lambda c: 1.5), levels)
    assert clean["verdict"]["kind"] == "wins_everywhere"


def test_loses_at_the_lowest_level_needs_that_level() -> None:
    levels = [1, 2, 5]
    assert _arm(_cells(levels, lambda c: 0.7), levels)["verdict"]["kind"] == "loses_everywhere"
    ar = _arm(_cells(levels, lambda c: 0.7, missing=(("baseline", 1),)), levels)
    assert ar["verdict"]["kind"] == "inconclusive" and ar["verdict"]["remeasure_levels"] == [1]


def _x(est: float | None, lo: float | None, hi: float | None, states: tuple[str, str, str]) -> dict[str, Any]:
    return crossover_block(est, lo, hi, states, max_level=100.0)


def test_decide_verdict_rules() -> None:
    used = [1.0, 2.0, 5.0, 10.0, 30.0, 100.0]
    within = ("within",) * 3
    # bad levels at or below the upper bracketing level (10) decide; above it they are notes
    v = decide_verdict(_x(7.0, 6.0, 9.0, within), used, [*used, 70.0], [70.0], 2.0)
    assert v["kind"] == "crossover" and "C=70" in v["notes"][0]
    v = decide_verdict(_x(7.0, 6.0, 9.0, within), used, [*used, 8.0], [8.0], 2.0)
    assert v["kind"] == "inconclusive" and v["remeasure_levels"] == [8]
    # open on the side of the point estimate: an answer (it won everywhere; the lower end is how far that is sure)
    v = decide_verdict(_x(None, 80.0, None, ("above_range", "within", "above_range")), used, used, [], 2.0)
    assert v["kind"] == "wins_everywhere" and "pays at least up to C=80" in v["reason"]
    v = decide_verdict(_x(0.0, 0.0, 3.0, ("below_range", "below_range", "within")), used, used, [], 2.0)
    assert v["kind"] == "loses_everywhere"
    # open on both sides: the interval spans every level, so neither a win nor a loss is shown anywhere
    # (a vLLM open sweep once read "wins everywhere" with a policy threshold of 0 from such an interval)
    for est in ("above_range", "below_range"):
        v = decide_verdict(_x(None, 0.0, None, (est, "below_range", "above_range")), used, used, [], 2.0)
        assert v["kind"] == "inconclusive" and "open beyond the measured levels" in v["reason"], v
    # open on the other side: the point estimate and its interval disagree, whatever the ratio
    v = decide_verdict(_x(1.5, 0.0, 3.0, ("within", "below_range", "within")), used, used, [], 2.0)
    assert v["kind"] == "inconclusive" and v["add_levels"]
    v = decide_verdict(_x(50.0, 30.0, None, ("within", "within", "above_range")), used, used, [], 2.0)
    assert v["kind"] == "inconclusive" and 200 in v["add_levels"]
    # nothing measured validly
    v = decide_verdict(None, [], [1.0, 2.0], [1.0, 2.0], 2.0)
    assert v["kind"] == "inconclusive" and v["remeasure_levels"] == [1, 2]


def test_suggest_levels() -> None:
    x = _x(17.0, 11.0, 26.0, ("within",) * 3)
    assert suggest_levels(x, [1, 2, 5, 10, 30], [1, 2, 5, 10, 30], 2.0) == [13, 17, 23]
    # nothing to add between dense levels
    assert suggest_levels(_x(1.5, 1.1, 1.9, ("within",) * 3), [1, 2, 3], [1, 2, 3], 2.0) == []
    # below the lowest level: from C=1 up
    x = _x(6.0, 0.0, 7.0, ("within", "below_range", "within"))
    assert suggest_levels(x, [5, 10, 30], [5, 10, 30], 4.0) == [1, 2, 3, 6]


@pytest.fixture(scope="module")
def inconclusive_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vLLM variant whose crossing (C=7.4) is bracketed by an invalid cell at C=8."""
    root = tmp_path_factory.mktemp("verdict")
    levels = [1, 2, 4, 8, 16]
    write_synthetic_variant(
        root / "v",
        levels,
        _falls,
        tokens=TOKENS,
        sigma=0.05,
        requests_per_level=lambda c: 30 * c,
        invalid=(("eagle3", 8),),
        seed=3,
        variant="v",
    )
    cfg = {
        "experiment": "exp",
        "concurrency": levels,
        "arms": {
            "baseline": {"speculative": False},
            "eagle3": {
                "speculative": True,
                "server_args": ["--speculative-config", '{"method":"eagle3","num_speculative_tokens":3}'],
            },
        },
        "variants": {"v": {"engine": "vllm"}},
        "analysis": {"bootstrap_samples": 200, "seed": 1},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root


def test_inconclusive_run_writes_no_threshold(inconclusive_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = inconclusive_run
    argv = ["--variant", "v", "--cells-root", str(root / "v"), "--config", str(root / "config.yaml")]
    assert main(["crossover", *argv, "--out-dir", str(root / "out"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    res = json.loads((root / "out" / "crossover.json").read_text())
    ar = res["arms"]["eagle3"]
    assert ar["verdict"]["kind"] == "inconclusive" and ar["verdict"]["remeasure_levels"] == [8]
    assert ar["threshold"] is None
    assert res["policy"]["eagle3"] == {"threshold": None, "rule": "crossover_lower", "verdict": "inconclusive"}
    pol = yaml.safe_load((root / "out" / "policy.yaml").read_text())["arms"]["eagle3"]
    assert pol["threshold"] is None and pol["verdict"] == "inconclusive" and pol["remeasure_levels"] == [8]
    assert "vllm" not in pol  # no engine schedule
    assert "eagle3: policy: INCONCLUSIVE" in out and "re-measure: 8" in out
    assert "1 repeat: intervals hold within-run noise only" in out
