"""Where a speedup curve crosses 1.0: interpolation between measured levels, for one curve or many at once.

Concurrency levels are spaced roughly geometrically (1, 2, 5, 10, 30, ...), so the reference line between two
levels is drawn in log C (`loglinear`): the crossing between C=30 and C=70 is then not pulled towards 70 just
because the gap is wide. Speedup itself is interpolated linearly (it is a ratio near 1, where log and linear
agree). Nothing was measured between two levels, though, so the analysis also finds each crossing under other
plausible interpolants (`INTERPOLANTS`: a straight line in C, a monotone cubic in log C) and widens the
crossover interval to their envelope: across a wide gap they disagree, across dense levels they do not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["INTERPOLANTS", "crossings_log_c", "crossings_matrix", "first_crossing"]

# loglinear: linear in log C (the point estimate); linear: linear in C; pchip_log: PCHIP (monotone piecewise
# cubic through the levels) in log C, which bends with the neighbouring levels instead of drawing a chord.
INTERPOLANTS = ("loglinear", "linear", "pchip_log")


def _validated(concurrency: Sequence[float], speedup: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, finite points; why: callers pass levels in config order, which need not be sorted."""
    c = np.asarray(concurrency, dtype=float)
    s = np.asarray(speedup, dtype=float)
    if c.ndim != 1 or c.shape != s.shape:
        raise ValueError(f"concurrency and speedup must be 1-D, equal length: {c.shape} vs {s.shape}")
    if np.any(~np.isfinite(c)) or np.any(c <= 0):
        raise ValueError("concurrency levels must be finite and > 0 (they are interpolated in log C)")
    order = np.argsort(c, kind="stable")
    c, s = c[order], s[order]
    if np.any(np.diff(c) == 0):
        raise ValueError("concurrency levels must be distinct")
    keep = np.isfinite(s)  # a level without a speedup (e.g. left out as invalid) is skipped
    return c[keep], s[keep]


def crossings_log_c(concurrency: Sequence[float], speedup: Sequence[float]) -> list[float]:
    """Every concurrency where speedup(C) crosses 1.0, in increasing C.

    Between two levels whose speedups lie strictly on opposite sides of 1.0, the crossing is found by linear
    interpolation of speedup in log C. A level whose speedup is exactly 1.0 is a crossing at that level; a run
    of consecutive levels exactly at 1.0 counts once, at its first level (where break-even is reached).
    Touching 1.0 without changing side also counts: the curve reaches break-even there, which a threshold
    must respect.
    Input may be unsorted (it is sorted by C); duplicate or non-positive levels raise ValueError; NaN speedups
    are dropped. Returns [] when the curve stays on one side of 1.0.
    """
    c, s = _validated(concurrency, speedup)
    out: list[float] = []
    logc = np.log(c)
    d = s - 1.0
    n = len(d)
    i = 0
    while i < n:
        if d[i] == 0.0:
            out.append(float(c[i]))
            while i + 1 < n and d[i + 1] == 0.0:  # the run of exact 1.0 levels counts once
                i += 1
            i += 1
            continue
        if i + 1 < n and d[i] * d[i + 1] < 0.0:
            t = d[i] / (d[i] - d[i + 1])
            out.append(float(math.exp(logc[i] + t * (logc[i + 1] - logc[i]))))
        i += 1
    return out


def _pchip_roots(logc: np.ndarray, d: np.ndarray, change: np.ndarray) -> np.ndarray:
    """log C where each row's PCHIP through (logc, d) crosses 0, inside every segment flagged in `change`.

    PCHIP is monotone on each segment, so a segment whose ends have opposite signs holds exactly one root;
    bisection on all flagged segments at once (60 halvings: far below any level spacing) finds it.
    """
    from scipy.interpolate import PchipInterpolator

    out = np.full(change.shape, np.nan)
    rows, seg = np.nonzero(change)
    if rows.size == 0:
        return out
    coef = PchipInterpolator(logc, d.T, axis=0).c  # (4, L-1, B): cubic in (x - logc[i]) per segment
    k = coef[:, seg, rows]  # (4, M)
    lo = np.zeros(rows.size)
    hi = (logc[1:] - logc[:-1])[seg]
    s0 = np.sign(d[rows, seg])
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        val = ((k[0] * mid + k[1]) * mid + k[2]) * mid + k[3]
        same = np.sign(val) == s0
        lo, hi = np.where(same, mid, lo), np.where(same, hi, mid)
    out[rows, seg] = logc[seg] + 0.5 * (lo + hi)
    return out


def _segment_crossings(c: np.ndarray, d: np.ndarray, change: np.ndarray, method: str) -> np.ndarray:
    """(B, L-1) crossing position inside each segment with a strict sign change, NaN elsewhere."""
    d0, d1 = d[:, :-1], d[:, 1:]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = np.where(change, d0 / np.where(change, d0 - d1, 1.0), 0.0)
        if method == "loglinear":
            logc = np.log(c)
            x = np.exp(logc[None, :-1] + t * (logc[None, 1:] - logc[None, :-1]))
        elif method == "linear":
            x = c[None, :-1] + t * (c[None, 1:] - c[None, :-1])
        elif method == "pchip_log":
            x = np.exp(_pchip_roots(np.log(c), d, change))
        else:
            raise ValueError(f"unknown interpolant {method!r}; expected one of {INTERPOLANTS}")
    return np.where(change, x, np.nan)


def crossings_matrix(concurrency: Sequence[float], speedups: np.ndarray, method: str = "loglinear") -> np.ndarray:
    """Crossings of many curves at once (bootstrap replicates): rows of `speedups` share `concurrency`.

    Returns a (B, L) float array: row b holds replicate b's crossings in increasing C, padded with NaN. Same
    rules as `crossings_log_c` (which is the reference for it in the tests), vectorised with numpy so that
    thousands of replicates cost milliseconds. `method` picks the interpolant between levels (`INTERPOLANTS`);
    which segments hold a crossing does not depend on it. Levels with NaN in any row must be removed by the
    caller.
    """
    c = np.asarray(concurrency, dtype=float)
    S = np.atleast_2d(np.asarray(speedups, dtype=float))
    if S.shape[1] != c.shape[0]:
        raise ValueError("speedups must have one column per concurrency level")
    if np.any(~np.isfinite(c)) or np.any(c <= 0):
        raise ValueError("concurrency levels must be finite and > 0")
    if method not in INTERPOLANTS:
        raise ValueError(f"unknown interpolant {method!r}; expected one of {INTERPOLANTS}")
    order = np.argsort(c, kind="stable")
    c, S = c[order], S[:, order]
    if np.any(np.diff(c) == 0):
        raise ValueError("concurrency levels must be distinct")
    B, L = S.shape
    d = S - 1.0
    # candidate positions: a zero level (first of a run) at slot 2i, a strict sign change at slot 2i+1
    pos = np.full((B, 2 * L), np.nan)
    zero = d == 0.0
    run_start = zero.copy()
    run_start[:, 1:] &= ~zero[:, :-1]
    pos[:, 0::2] = np.where(run_start, c[None, :], np.nan)
    if L > 1:
        change = (d[:, :-1] * d[:, 1:]) < 0.0
        pos[:, 1:-1:2] = _segment_crossings(c, d, change, method)
    # compact: NaNs to the end of each row, order of slots is already increasing in C
    key = np.isnan(pos)
    idx = np.argsort(key, axis=1, kind="stable")
    out = np.take_along_axis(pos, idx, axis=1)
    return out[:, :L]


def first_crossing(concurrency: Sequence[float], speedup: Sequence[float]) -> float | None:
    """The lowest-C crossing or None; why: the load where the verdict first changes sets the policy."""
    xs = crossings_log_c(concurrency, speedup)
    return xs[0] if xs else None
