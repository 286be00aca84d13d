"""A variant's crossover: speedup curves per metric with intervals, crossings, winner, invalid cells.

The result is the body of `crossover.json` (layout in docs/analysis.md); plots, policy and the printed table
are made from it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from specsweep.analysis.bootstrap import (
    METRICS,
    CellBootstrap,
    MetricSpec,
    bootstrap_cell,
    percentile_interval,
)
from specsweep.analysis.cells import Cell
from specsweep.analysis.crossover import crossings_log_c, crossings_matrix

__all__ = [
    "AnalysisSettings",
    "slo_seconds",
    "analyze_arm",
    "analyze_variant",
    "crossover_text",
    "payoff_limit",
]

SCHEMA_VERSION = 1


_SLO_KEYS = {
    "ttft_ms": "ttft_s",
    "tpot_ms": "tpot_s",
    "e2e_ms": "e2e_s",
    "ttft_s": "ttft_s",
    "tpot_s": "tpot_s",
    "e2e_s": "e2e_s",
}


def slo_seconds(slo: dict[str, Any] | None) -> dict[str, float] | None:
    """Config SLOs ({ttft,tpot,e2e}_ms, null = not set; or *_s) as seconds keyed ttft_s/tpot_s/e2e_s."""
    out: dict[str, float] = {}
    for k, v in (slo or {}).items():
        if v is None:
            continue
        if k not in _SLO_KEYS:
            raise ValueError(f"unknown SLO key {k!r}; expected one of {sorted(_SLO_KEYS)}")
        out[_SLO_KEYS[k]] = float(v) * (1e-3 if k.endswith("_ms") else 1.0)
    return out or None


@dataclass
class AnalysisSettings:
    """The config's `analysis:` section (and top-level `slo:`), with defaults; see docs/analysis.md."""

    replicates: int = 1000
    seed: int = 0
    confidence: float = 0.95
    include_invalid: bool = False
    baseline_arm: str = "baseline"
    primary_metric: str = "aggregate_tok_s"
    policy_rule: str = "crossover_lower"  # or "level_lower_bound"
    slo: dict[str, float] | None = None  # seconds: ttft_s, tpot_s, e2e_s

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AnalysisSettings:
        a = dict(config.get("analysis") or {})
        s = cls()
        s.replicates = int(a.get("bootstrap_samples", a.get("replicates", s.replicates)))
        s.seed = int(a.get("seed", s.seed))
        s.confidence = float(a.get("confidence", s.confidence))
        s.include_invalid = bool(a.get("include_invalid", s.include_invalid))
        s.baseline_arm = str(a.get("baseline_arm", s.baseline_arm))
        s.primary_metric = str(a.get("primary_metric", s.primary_metric))
        s.policy_rule = str(a.get("policy_rule", s.policy_rule))
        s.slo = slo_seconds(a.get("slo") or config.get("slo"))
        if s.primary_metric not in {m.name for m in METRICS}:
            raise ValueError(f"analysis.primary_metric must be one of {[m.name for m in METRICS]}")
        if s.policy_rule not in {"crossover_lower", "level_lower_bound"}:
            raise ValueError("analysis.policy_rule must be 'crossover_lower' or 'level_lower_bound'")
        if not 0.5 < s.confidence < 1.0:
            raise ValueError("analysis.confidence must be in (0.5, 1)")
        if s.replicates < 10:
            raise ValueError("analysis.bootstrap_samples must be >= 10")
        return s


def payoff_limit(concurrency: np.ndarray, speedups: np.ndarray) -> np.ndarray:
    """Per curve: the load up to which speculation wins, from the bottom (the policy is 'speculate <= N').

    0.0 when speculation already loses at the lowest level, the first crossing when it wins there and then
    stops, +inf when it wins at every measured level. `speedups` is (B, L) with columns sorted by C.
    """
    S = np.atleast_2d(speedups)
    first = crossings_matrix(concurrency, S)[:, 0]
    return np.where(S[:, 0] < 1.0, 0.0, np.where(np.isnan(first), np.inf, first))


def _f(x: Any) -> float | None:
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


def crossover_text(x: dict[str, Any] | None) -> str:
    """'C=12.3 [8.1, 20.4]' with '<min' / '>max' where a value lies outside the measured levels."""
    if not x:
        return "C=- (no usable levels)"

    def one(field: str) -> str:
        st, v = x["states"][field], x[field]
        if st == "below_range":
            return f"<{x['min_level']:g}"
        if st == "above_range" or v is None:
            return f">{x['max_level']:g}"
        return f"{v:.3g}"

    return f"C={one('estimate')} [{one('lo')}, {one('hi')}]"


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


def _metric_result(
    spec: MetricSpec,
    levels: np.ndarray,
    base: list[CellBootstrap],
    arm: list[CellBootstrap],
    confidence: float,
    spec_arm: str,
    baseline_arm: str,
) -> dict[str, Any]:
    """Speedup curve, intervals, crossings and crossover interval for one metric."""
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
        "baseline": [_f(v) for v in b_pt],
        "spec": [_f(v) for v in s_pt],
        "speedup": [_f(v) for v in sp],
        "speedup_lo": [_f(v) for v in lo],
        "speedup_hi": [_f(v) for v in hi],
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
    rep_x = crossings_matrix(lv, reps) if reps.size else np.zeros((0, 0))
    crossings = []
    for k, x in enumerate(xs):
        col = rep_x[:, k] if rep_x.size and k < rep_x.shape[1] else np.array([])
        col = col[np.isfinite(col)]
        crossings.append(
            {
                "concurrency": _f(x),
                "direction": _direction(lv, spk, x),
                "lo": _f(np.quantile(col, alpha)) if col.size else None,
                "hi": _f(np.quantile(col, 1 - alpha)) if col.size else None,
                "replicate_fraction": _f(col.size / max(len(reps), 1)),
            }
        )
    out["crossings"] = crossings
    out["n_crossings"] = len(xs)
    out["monotone"] = len(xs) <= 1
    # the crossover proper: where speculation stops paying off, seen from the lowest level
    est = float(payoff_limit(lv, spk[None, :])[0])
    lims = payoff_limit(lv, reps) if reps.size else np.array([est])
    lo_l = float(np.quantile(lims, alpha, method="inverted_cdf"))
    hi_l = float(np.quantile(lims, 1 - alpha, method="inverted_cdf"))
    cmax = float(lv.max())
    out["crossover"] = {
        "estimate": _f(est),
        "lo": _f(lo_l),
        "hi": _f(hi_l),
        "states": {"estimate": _state(est, cmax), "lo": _state(lo_l, cmax), "hi": _state(hi_l, cmax)},
        "fraction_below_range": _f(np.mean(lims == 0.0)),
        "fraction_above_range": _f(np.mean(np.isinf(lims))),
        "min_level": _f(lv.min()),
        "max_level": _f(cmax),
    }
    if xs:
        out["winner"], out["smallest_margin"] = None, None
    else:
        i = int(np.argmin(np.abs(spk - 1.0)))
        lo_ok, hi_ok = lo[ok], hi[ok]
        out["winner"] = spec_arm if spk[0] > 1.0 else baseline_arm
        out["smallest_margin"] = {
            "concurrency": _f(lv[i]),
            "speedup": _f(spk[i]),
            "lo": _f(lo_ok[i]),
            "hi": _f(hi_ok[i]),
        }
    return out


def _cell_entry(cell: Cell, included: bool) -> dict[str, Any]:
    return {
        "arm": cell.arm,
        "concurrency": _f(cell.concurrency),
        "key": cell.key,
        "reasons": cell.invalid_reasons,
        "included": included,
    }


def analyze_arm(
    cells: dict[str, dict[float, Cell]],
    baseline_arm: str,
    spec_arm: str,
    settings: AnalysisSettings,
    cache: dict[str, CellBootstrap] | None = None,
) -> dict[str, Any]:
    """Compare one speculative arm against the baseline arm of the same variant, level by level."""
    cache = {} if cache is None else cache
    base_cells, spec_cells = cells.get(baseline_arm, {}), cells.get(spec_arm, {})
    all_levels = sorted(set(base_cells) | set(spec_cells))
    invalid, missing, per_level = [], [], []
    used: list[float] = []
    for c in all_levels:
        row: dict[str, Any] = {"concurrency": _f(c)}
        usable = True
        for role, arm_name, group in (("baseline", baseline_arm, base_cells), ("spec", spec_arm, spec_cells)):
            cell = group.get(c)
            if cell is None:
                missing.append({"arm": arm_name, "concurrency": _f(c)})
                row[f"{role}_key"], row[f"{role}_valid"] = None, None
                usable = False
                continue
            row[f"{role}_key"], row[f"{role}_valid"] = cell.key, cell.valid
            row[f"{role}_n_requests"] = len(cell.requests) if cell.requests is not None else None
            if not cell.valid:
                invalid.append(_cell_entry(cell, settings.include_invalid))
                usable = usable and settings.include_invalid
        row["used"] = usable
        per_level.append(row)
        if usable:
            used.append(c)

    def boot(cell: Cell) -> CellBootstrap:
        if cell.key not in cache:
            cache[cell.key] = bootstrap_cell(cell, settings.replicates, settings.seed, settings.slo)
        return cache[cell.key]

    levels = np.array(used, dtype=float)
    base_b = [boot(base_cells[c]) for c in used]
    spec_b = [boot(spec_cells[c]) for c in used]
    metrics = {
        m.name: _metric_result(m, levels, base_b, spec_b, settings.confidence, spec_arm, baseline_arm) for m in METRICS
    }
    prim = metrics[settings.primary_metric]
    for row in per_level:
        if row["used"]:
            i = used.index(row["concurrency"])
            row.update(
                baseline_value=prim["baseline"][i],
                spec_value=prim["spec"][i],
                speedup=prim["speedup"][i],
                speedup_lo=prim["speedup_lo"][i],
                speedup_hi=prim["speedup_hi"][i],
            )
        else:  # left out: its point values are still shown (flagged), without an interval
            pm = next(m for m in METRICS if m.name == settings.primary_metric)
            c = row["concurrency"]
            b = pm.value(base_cells[c].summary) if c in base_cells else float("nan")
            s = pm.value(spec_cells[c].summary) if c in spec_cells else float("nan")
            with np.errstate(invalid="ignore", divide="ignore"):
                sp = s / b if pm.higher_is_better else b / s
            row.update(baseline_value=_f(b), spec_value=_f(s), speedup=_f(sp), speedup_lo=None, speedup_hi=None)
    sources = sorted({cl.source for grp in (base_cells, spec_cells) for cl in grp.values()})
    notes = sorted({n for grp in (base_cells, spec_cells) for cl in grp.values() for n in cl.notes})
    return {
        "baseline_arm": baseline_arm,
        "spec_arm": spec_arm,
        "source": sources[0] if len(sources) == 1 else ("mixed" if sources else "unknown"),
        "levels": [_f(c) for c in used],
        "cell_keys": {
            "baseline": [base_cells[c].key for c in used],
            "spec": [spec_cells[c].key for c in used],
        },
        "per_level": per_level,
        "invalid_cells": invalid,
        "missing_cells": missing,
        "primary_metric": settings.primary_metric,
        # flat copies for trackers: null where out of range (see crossover.states)
        "crossover_concurrency": (prim["crossover"] or {}).get("estimate"),
        "crossover_ci_low": (prim["crossover"] or {}).get("lo"),
        "crossover_ci_high": (prim["crossover"] or {}).get("hi"),
        "crossover": prim["crossover"],
        "crossings": prim["crossings"],
        "monotone": prim["monotone"],
        "winner": prim["winner"],
        "smallest_margin": prim["smallest_margin"],
        "metrics": metrics,
        "notes": notes,
    }


def analyze_variant(
    cells: dict[str, dict[float, Cell]],
    baseline_arm: str,
    spec_arms: list[str],
    settings: AnalysisSettings,
    experiment: str = "",
    variant: str = "",
    engine: str = "",
) -> dict[str, Any]:
    """Every speculative arm of a variant against its baseline arm: the body of crossover.json."""
    cache: dict[str, CellBootstrap] = {}
    arms = {a: analyze_arm(cells, baseline_arm, a, settings, cache) for a in spec_arms}
    sources = sorted({r["source"] for r in arms.values()})
    return {
        "schema_version": SCHEMA_VERSION,
        "experiment": experiment,
        "variant": variant,
        "engine": engine,
        "source": sources[0] if len(sources) == 1 else ("mixed" if sources else "unknown"),
        "baseline_arm": baseline_arm,
        "bootstrap": {
            "replicates": settings.replicates,
            "seed": settings.seed,
            "confidence": settings.confidence,
            "method": "two-stage percentile bootstrap (repeats, then requests within each repeat)",
            "throughput_estimator": "C * sum(output_tokens) / sum(end_s - send_s), scaled to summary",
        },
        "include_invalid": settings.include_invalid,
        "slo": settings.slo,
        "arms": arms,
    }
