"""Which levels an adaptive round adds, and when it stops (`specsweep.analysis.adaptive.next_levels`)."""

from __future__ import annotations

import pytest

from specsweep.analysis.adaptive import AdaptiveSettings, interior_levels, next_levels

pytestmark = pytest.mark.unit

GRID = [1, 2, 5, 10, 30, 70, 100, 250]


def result(lo: float | None, hi: float | None, est: float | None, states: dict, kind: str = "crossover", **v) -> dict:
    crossover = None if est is None else {"lo": lo, "hi": hi, "estimate": est, "states": states}
    verdict = {"kind": kind, "reason": v.get("reason", kind), "remeasure_levels": v.get("remeasure", [])}
    return {"arms": {"eagle3": {"crossover": crossover, "verdict": verdict}}}


WITHIN = {"lo": "within", "hi": "within", "estimate": "within"}


def test_interior_levels_are_log_even_and_new() -> None:
    assert interior_levels(10, 30, 1, GRID, 17) == [17]
    assert interior_levels(10, 30, 2, GRID, 17) == [14, 21]
    assert interior_levels(20.2, 20.9, 1, GRID, 20.5) == []  # no integer inside
    assert interior_levels(16, 18, 1, [17], 17) == []  # the only one is measured


def test_a_wide_interval_gets_levels_inside_it() -> None:
    out = next_levels(result(12.0, 28.0, 20.0, WITHIN), GRID, GRID, AdaptiveSettings(levels_per_round=2), 0.0)
    assert out["stop"] is None and out["add"] and all(12 < c < 28 for c in out["add"])
    assert out["levels"] == sorted({*GRID, *out["add"]})


def test_a_narrow_interval_stops() -> None:
    out = next_levels(result(18.0, 24.0, 20.0, WITHIN), GRID, GRID, AdaptiveSettings(target_ratio=1.5), 0.0)
    assert out["add"] == [] and "<= target 1.5x" in out["stop"]


def test_open_interval_refines_inside_the_grid_only() -> None:
    st = {"lo": "within", "hi": "above_range", "estimate": "within"}
    out = next_levels(result(150.0, None, 220.0, st), GRID, GRID, AdaptiveSettings(), 0.0)
    assert out["add"] and all(150 < c < 250 for c in out["add"])


@pytest.mark.parametrize(
    ("res", "why"),
    [
        (
            result(
                None,
                None,
                300.0,
                {"lo": "above_range", "hi": "above_range", "estimate": "above_range"},
                "wins_everywhere",
                reason="speculation wins at every level",
            ),
            "wins_everywhere",
        ),
        (result(12.0, 28.0, 20.0, WITHIN, "inconclusive", remeasure=[30]), "re-measure"),
        (result(None, None, None, {}), "no crossover estimate"),
    ],
)
def test_no_level_added_when_the_answer_is_elsewhere(res: dict, why: str) -> None:
    out = next_levels(res, GRID, GRID, AdaptiveSettings(), 0.0)
    assert out["add"] == [] and why in out["stop"]


def test_budgets_stop_the_refinement() -> None:
    wide = result(12.0, 28.0, 20.0, WITHIN)
    spent = next_levels(wide, GRID, GRID, AdaptiveSettings(max_measure_minutes=1.0), 61.0)
    assert spent["add"] == [] and "measuring budget spent" in spent["stop"]
    full = next_levels(wide, [*GRID, 15, 17], GRID, AdaptiveSettings(max_levels=2), 0.0)
    assert full["add"] == [] and "level budget spent" in full["stop"]
    one_left = next_levels(wide, [*GRID, 15], GRID, AdaptiveSettings(max_levels=2, levels_per_round=3), 0.0)
    assert len(one_left["add"]) == 1
