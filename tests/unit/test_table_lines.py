"""The crossover table's verdict line says where the interval crosses when the point estimates do not."""

from __future__ import annotations

import pytest

from specsweep.analysis.table import _crossover_line

pytestmark = pytest.mark.unit


def _arm(lo_state: str, lo: float | None) -> dict:
    states = {"estimate": "above_range", "lo": lo_state, "hi": "above_range"}
    return {
        "crossover": {"states": states, "estimate": None, "lo": lo, "hi": None, "min_level": 1.0, "max_level": 64.0},
        "metrics": {"output_tok_s": {"orientation": "higher"}},
        "primary_metric": "output_tok_s",
        "crossings": [],
        "smallest_margin": {"speedup": 1.14, "lo": 0.994, "hi": 1.29, "concurrency": 64.0},
        "winner": "ngram-k1",
        "verdict": {"kind": "wins_everywhere"},
        "levels": [1.0, 4.0, 16.0, 64.0],
    }


def test_no_crossing_whose_interval_reaches_in_says_how_far_it_pays() -> None:
    # the policy stops at the interval's lower end: the verdict line says so beside "wins at every level"
    line = _crossover_line("ngram-k1", _arm("within", 61.6))
    assert "no crossing: ngram-k1 wins at every level" in line
    assert line.endswith(
        "its crossover interval C=>64 [61.6, >64] reaches into the levels "
        "(the crossover_lower policy rule stops at its lower end)"
    )


def test_no_crossing_above_the_range_adds_nothing() -> None:
    line = _crossover_line("ngram-k1", _arm("above_range", None))
    assert line.endswith("smallest margin 1.14 [0.994, 1.29] at C=64")
