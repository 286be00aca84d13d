"""crossings_log_c and its vectorised twin: interpolation in log C, exact-1.0 levels, several crossings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specsweep.analysis.crossover import INTERPOLANTS, crossings_log_c, crossings_matrix, first_crossing

pytestmark = pytest.mark.unit


def test_no_crossing_returns_empty() -> None:
    assert crossings_log_c([1, 2, 5, 10], [1.5, 1.4, 1.2, 1.1]) == []
    assert crossings_log_c([1, 2, 5, 10], [0.5, 0.6, 0.9, 0.99]) == []
    assert first_crossing([1, 2], [2.0, 3.0]) is None


def test_one_crossing_interpolates_in_log_c() -> None:
    # speedup 1.5 at C=1, 0.5 at C=10: halfway in log C is sqrt(10), not 5.5
    (x,) = crossings_log_c([1, 10], [1.5, 0.5])
    assert x == pytest.approx(math.sqrt(10))


def test_linear_in_log_c_curve_is_recovered_exactly() -> None:
    levels = [1, 2, 5, 10, 30, 70, 100, 250]
    s = [1.5 - 0.25 * math.log(c) for c in levels]
    (x,) = crossings_log_c(levels, s)
    assert x == pytest.approx(math.exp(2.0))


def test_several_crossings_all_returned_in_order() -> None:
    xs = crossings_log_c([1, 2, 5, 10, 30], [1.3, 0.8, 1.2, 0.7, 0.6])
    assert len(xs) == 3
    assert xs == sorted(xs)
    assert 1 < xs[0] < 2 < xs[1] < 5 < xs[2] < 10


def test_exact_one_counts_once() -> None:
    assert crossings_log_c([1, 2, 5], [1.2, 1.0, 0.8]) == [2.0]
    # a run of levels at exactly 1.0 counts once, at its first level
    assert crossings_log_c([1, 2, 5, 10], [1.2, 1.0, 1.0, 0.8]) == [2.0]
    # touching 1.0 without changing side is still break-even there
    assert crossings_log_c([1, 2, 5], [1.2, 1.0, 1.1]) == [2.0]
    assert crossings_log_c([1, 2, 5], [1.0, 0.9, 0.8]) == [1.0]


def test_unsorted_input_is_sorted() -> None:
    c, s = [10, 1, 5, 2], [0.8, 1.5, 0.9, 1.1]
    assert crossings_log_c(c, s) == crossings_log_c(sorted(c), [1.5, 1.1, 0.9, 0.8])


def test_bad_input_rejected() -> None:
    with pytest.raises(ValueError):
        crossings_log_c([1, 1, 2], [1.2, 1.1, 0.9])
    with pytest.raises(ValueError):
        crossings_log_c([0, 1, 2], [1.2, 1.1, 0.9])
    with pytest.raises(ValueError):
        crossings_log_c([1, 2], [1.2])


def test_nan_levels_dropped() -> None:
    assert crossings_log_c([1, 2, 5], [1.5, float("nan"), 0.5]) == pytest.approx([math.sqrt(5)])


def test_matrix_matches_scalar_version() -> None:
    rng = np.random.default_rng(0)
    levels = [1, 2, 5, 10, 30, 70, 100, 250]
    S = rng.uniform(0.6, 1.4, size=(300, len(levels)))
    S[rng.random(S.shape) < 0.1] = 1.0  # exact break-even values, runs included
    M = crossings_matrix(levels, S)
    for row, mrow in zip(S, M, strict=True):
        expect = crossings_log_c(levels, row)
        got = [x for x in mrow if np.isfinite(x)]
        assert got == pytest.approx(expect)


def test_interpolants_find_the_same_crossings_in_the_same_segments() -> None:
    rng = np.random.default_rng(1)
    levels = [1, 2, 5, 10, 30, 70, 100, 250]
    S = rng.uniform(0.6, 1.4, size=(200, len(levels)))
    base = crossings_matrix(levels, S)
    for method in INTERPOLANTS:
        M = crossings_matrix(levels, S, method)
        assert np.array_equal(np.isnan(M), np.isnan(base))
        # each crossing stays in the segment where the curve changes side
        idx = np.searchsorted(levels, base, side="right")
        got = np.searchsorted(levels, M, side="right")
        ok = np.isfinite(base)
        assert np.array_equal(idx[ok], got[ok])


def test_interpolant_formulas() -> None:
    x = crossings_matrix([10, 30], np.array([[1.1, 0.9]]), "linear")[0, 0]
    assert x == pytest.approx(20.0)
    x = crossings_matrix([10, 30], np.array([[1.1, 0.9]]), "loglinear")[0, 0]
    assert x == pytest.approx(math.sqrt(300))
    # PCHIP through a straight line in log C is that line
    levels = [1, 2, 5, 10, 30]
    s = np.array([[1.5 - 0.25 * math.log(c) for c in levels]])
    assert crossings_matrix(levels, s, "pchip_log")[0, 0] == pytest.approx(math.exp(2.0), rel=1e-9)
    with pytest.raises(ValueError):
        crossings_matrix(levels, s, "spline")


def _cells(points: list[float], rng: np.random.Generator, nan_rows: dict[int, int]) -> list:
    """CellBootstraps of aggregate throughput with 200 replicates at 3% noise; `nan_rows[level index]` replicates
    without a value (a thin level's resample that held no valid request)."""
    from specsweep.analysis.bootstrap import CellBootstrap

    out = []
    for i, p in enumerate(points):
        reps = p * np.exp(rng.normal(0.0, 0.03, 200))
        reps[: nan_rows.get(i, 0)] = np.nan
        name = "aggregate_tok_s"
        out.append(CellBootstrap(point={name: p}, replicates={name: reps}, has_interval={name: True}))
    return out


@pytest.mark.parametrize("missing", [10, 200])
def test_replicates_without_a_value_at_a_level_are_left_out_not_read_as_no_crossing(missing: int) -> None:
    """The analysis stopped (PCHIP refuses NaN) when some replicates of a used level had no value; they are now
    left out and counted, and where none is complete there is no interval rather than the point for one."""
    from specsweep.analysis.bootstrap import METRICS
    from specsweep.analysis.curve import metric_result

    rng = np.random.default_rng(0)
    levels = np.array([1.0, 2.0, 5.0, 10.0, 30.0])
    base = _cells([100.0] * 5, rng, {})
    spec = _cells([150.0, 130.0, 110.0, 95.0, 80.0], rng, {2: missing})
    out = metric_result(METRICS[0], levels, base, spec, 0.95, "eagle3", "baseline")
    assert out["replicates_incomplete"] == missing
    x = out["crossover"]
    assert 5.0 < x["estimate"] < 10.0
    if missing < 200:
        assert x["lo"] is not None and x["hi"] is not None and x["lo"] <= x["estimate"] <= x["hi"]
    else:
        assert x["lo"] is None and x["hi"] is None, x
        assert x["states"]["lo"] == x["states"]["hi"] == "unknown"
        assert out["crossings"][0]["lo"] is None and out["crossings"][0]["hi"] is None
