"""A speedup curve over the levels: its intervals, its crossings of 1 and the crossover with its interval.

Per metric: the speedup's point and replicates per level (from the paired estimate where the arms were
interleaved, else the two cells' bootstraps), where the point curve crosses 1 with each crossing's interval, and
the payoff limit (up to which load speculation wins, seen from the lowest level) with the envelope of its
percentile intervals under every interpolant between levels (`crossover.INTERPOLANTS`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from specsweep.analysis.bootstrap import CellBootstrap, MetricSpec, percentile_interval
from specsweep.analysis.crossover import INTERPOLANTS, crossings_log_c, crossings_matrix
from specsweep.analysis.paired import PairedEstimate

__all__ = ["json_float", "metric_result", "payoff_limit"]


def payoff_limit(concurrency: np.ndarray, speedups: np.ndarray, method: str = "loglinear") -> np.ndarray:
    """Per curve: the load up to which speculation wins, from the bottom (the policy is 'speculate <= N').

    0.0 when speculation already loses at the lowest level, the first crossing when it wins there and then
    stops, +inf when it wins at every measured level. `speedups` is (B, L) with columns sorted by C; `method`
    is the interpolant between levels (`crossover.INTERPOLANTS`).
    """
    S = np.atleast_2d(speedups)
    first = crossings_matrix(concurrency, S, method)[:, 0]
    return np.where(S[:, 0] < 1.0, 0.0, np.where(np.isnan(first), np.inf, first))


def json_float(x: Any) -> float | None:
    """JSON-safe float: NaN and inf become null."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def _state(v: float, cmax: float) -> str:
    if v == 0.0:
        return "below_range"
    if not np.isfinite(v):
        return "above_range" if v > 0 else "unknown"
    return "within" if v <= cmax else "above_range"


def _direction(levels: np.ndarray, s: np.ndarray, x: float) -> str:
    """'down' (spec stops winning), 'up' (starts winning) or 'touch' (reaches 1.0 and stays on its side)."""
    d = s - 1.0
    below = d[(levels < x) & (d != 0)]
    above = d[(levels > x) & (d != 0)]
    a = np.sign(below[-1]) if below.size else 0.0
    b = np.sign(above[0]) if above.size else 0.0
    if a > 0 and b < 0:
        return "down"
    if a < 0 and b > 0:
        return "up"
    return "touch"


def metric_result(
    spec: MetricSpec,
    levels: np.ndarray,
    base: list[CellBootstrap],
    arm: list[CellBootstrap],
    confidence: float,
    spec_arm: str,
    baseline_arm: str,
    paired: list[PairedEstimate | None] | None = None,
) -> dict[str, Any]:
    """Speedup curve, intervals, crossings and crossover interval for one metric. A level measured in
    interleaved blocks takes its point and replicates from the paired estimate (`analysis.paired`)."""
    b_pt = np.array([c.point[spec.name] for c in base])
    s_pt = np.array([c.point[spec.name] for c in arm])
    b_rep = np.stack([c.replicates[spec.name] for c in base], axis=1) if base else np.zeros((0, 0))
    s_rep = np.stack([c.replicates[spec.name] for c in arm], axis=1) if arm else np.zeros((0, 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        if spec.higher_is_better:
            sp, sp_rep = s_pt / b_pt, s_rep / b_rep
        else:
            sp, sp_rep = b_pt / s_pt, b_rep / s_rep
    has = [bool(b.has_interval[spec.name] and a.has_interval[spec.name]) for b, a in zip(base, arm, strict=True)]
    for i, pe in enumerate(paired or []):
        if pe is not None:
            sp[i], sp_rep[:, i], has[i] = pe.speedup, pe.replicates, True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = percentile_interval(sp_rep, confidence, axis=0) if sp_rep.size else (np.array([]),) * 2
    lo = np.where(has, lo, np.nan)
    hi = np.where(has, hi, np.nan)
    out: dict[str, Any] = {
        "label": spec.label,
        "unit": spec.unit,
        "orientation": spec.orientation,
        "higher_is_better": spec.higher_is_better,
        "baseline": [json_float(v) for v in b_pt],
        "spec": [json_float(v) for v in s_pt],
        "speedup": [json_float(v) for v in sp],
        "speedup_lo": [json_float(v) for v in lo],
        "speedup_hi": [json_float(v) for v in hi],
        "interval_available": has,
    }
    ok = np.isfinite(sp)
    lv, spk = levels[ok], sp[ok]
    if lv.size == 0:
        out.update(crossings=[], n_crossings=0, monotone=True, crossover=None, winner=None, smallest_margin=None)
        return out
    xs = crossings_log_c(lv, spk)
    alpha = (1.0 - confidence) / 2.0
    reps = sp_rep[:, ok]
    # A replicate without a value at a level the curve uses (its resampled blocks of a thin level held no valid
    # request) cannot say where its curve crosses: it is left out and counted, not read as "no crossing there"
    # (with PCHIP it stopped the analysis: a 10-request level left 32 of 1000 replicates without a value).
    complete = np.isfinite(reps).all(axis=1)
    out["replicates_incomplete"] = int((~complete).sum())
    reps = reps[complete]
    out["crossings"] = _crossings(lv, spk, xs, reps, alpha)
    out["n_crossings"] = len(xs)
    out["monotone"] = len(xs) <= 1
    # the crossover proper: where speculation stops paying off, seen from the lowest level
    out["crossover"] = _crossover(lv, spk, reps, alpha)
    if xs:
        out["winner"], out["smallest_margin"] = None, None
    else:
        i = int(np.argmin(np.abs(spk - 1.0)))
        lo_ok, hi_ok = lo[ok], hi[ok]
        out["winner"] = spec_arm if spk[0] > 1.0 else baseline_arm
        out["smallest_margin"] = {
            "concurrency": json_float(lv[i]),
            "speedup": json_float(spk[i]),
            "lo": json_float(lo_ok[i]),
            "hi": json_float(hi_ok[i]),
        }
    return out


def _quantiles(x: np.ndarray, alpha: float) -> tuple[float, float]:
    """Empirical (inverted-CDF) quantiles: no interpolation across the censored values 0 and +inf."""
    return float(np.quantile(x, alpha, method="inverted_cdf")), float(np.quantile(x, 1 - alpha, method="inverted_cdf"))


def _crossings(lv: np.ndarray, spk: np.ndarray, xs: list[float], reps: np.ndarray, alpha: float) -> list[dict]:
    """Each crossing of the point curve with the envelope, over the interpolants, of its replicates' k-th
    crossing interval (only replicates that have a k-th crossing; their share is `replicate_fraction`)."""
    per_method = [crossings_matrix(lv, reps, m) for m in INTERPOLANTS] if reps.size else []
    out = []
    for k, x in enumerate(xs):
        los, his, frac = [], [], 0.0
        for i, rep_x in enumerate(per_method):
            col = rep_x[:, k] if k < rep_x.shape[1] else np.array([])
            col = col[np.isfinite(col)]
            if col.size:
                los.append(float(np.quantile(col, alpha)))
                his.append(float(np.quantile(col, 1 - alpha)))
            if i == 0:
                frac = col.size / max(len(reps), 1)
        out.append(
            {
                "concurrency": json_float(x),
                "direction": _direction(lv, spk, x),
                "lo": json_float(min(los)) if los else None,
                "hi": json_float(max(his)) if his else None,
                "replicate_fraction": json_float(frac),
            }
        )
    return out


def _crossover(lv: np.ndarray, spk: np.ndarray, reps: np.ndarray, alpha: float) -> dict[str, Any]:
    """The payoff limit with its interval: the envelope of the percentile intervals under every interpolant.

    The estimate is the log-linear one. The spread of the interpolants' own estimates and their intervals are
    kept in `interpolation`: an interval widened by them says the levels are too far apart near the crossing.
    """
    cmax = float(lv.max())
    est: dict[str, float] = {}
    ivl: dict[str, tuple[float, float]] = {}
    lims0 = np.array([])
    for m in INTERPOLANTS:
        est[m] = float(payoff_limit(lv, spk[None, :], m)[0])
        lims = payoff_limit(lv, reps, m) if reps.size else np.array([])
        if m == INTERPOLANTS[0]:
            lims0 = lims
        # no replicate with a value at every level: no interval (never the point estimate standing in for one)
        ivl[m] = _quantiles(lims, alpha) if lims.size else (math.nan, math.nan)
    point = est[INTERPOLANTS[0]]
    lo = min(v[0] for v in ivl.values())
    hi = max(v[1] for v in ivl.values())
    return {
        "estimate": json_float(point),
        "lo": json_float(lo),
        "hi": json_float(hi),
        "states": {"estimate": _state(point, cmax), "lo": _state(lo, cmax), "hi": _state(hi, cmax)},
        "fraction_below_range": json_float(np.mean(lims0 == 0.0)) if lims0.size else None,
        "fraction_above_range": json_float(np.mean(np.isinf(lims0))) if lims0.size else None,
        "min_level": json_float(lv.min()),
        "max_level": json_float(cmax),
        "interpolation": {
            "methods": list(INTERPOLANTS),
            "estimates": {m: json_float(v) for m, v in est.items()},
            "intervals": {m: {"lo": json_float(v[0]), "hi": json_float(v[1])} for m, v in ivl.items()},
            "estimate_min": json_float(min(est.values())),
            "estimate_max": json_float(max(est.values())),
            "widened": bool(lo < ivl[INTERPOLANTS[0]][0] or hi > ivl[INTERPOLANTS[0]][1]),
        },
    }
