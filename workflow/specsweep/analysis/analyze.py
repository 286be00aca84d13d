"""A variant's crossover: speedup curves per metric with intervals, crossings, winner, invalid cells, verdict.

The result is the body of `crossover.json` (layout in docs/analysis.md); plots, policy and the printed table
are made from it. The crossover interval is the envelope of the intervals under several interpolants between
levels (`crossover.INTERPOLANTS`), and each speculative arm gets a verdict: a crossover, a win or loss at
every level, or inconclusive (interval too wide, or invalid/missing cells where the answer is decided) with
the levels to add or re-measure.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsweep.analysis.bootstrap import (
    METRICS,
    THROUGHPUT,
    CellBootstrap,
    MetricSpec,
    bootstrap_cell,
    cell_rng,
    percentile_interval,
)
from specsweep.analysis.cells import BLOCK_LIFETIMES, MIN_BLOCKS, N_BLOCKS, Cell
from specsweep.analysis.crossover import INTERPOLANTS, crossings_log_c, crossings_matrix
from specsweep.analysis.outputs import output_match, output_verdict
from specsweep.analysis.paired import PairedEstimate, paired_estimate, pairing_of
from specsweep.analysis.precision import LevelPrecision, level_precision, precision_notes
from specsweep.analysis.running import running_requests_view
from specsweep.config import configured_levels, defaults, load_mode
from specsweep.measure.heal import is_drift, is_server_slowed
from specsweep.measure.metrics import slo_seconds

__all__ = [
    "INTERVAL_NOTE_ONE_REPEAT",
    "INTERVAL_NOTE_TWO_REPEATS",
    "AnalysisSettings",
    "analyze_arm",
    "analyze_variant",
    "crossover_text",
    "decide_verdict",
    "levels_text",
    "payoff_limit",
    "suggest_levels",
]

INTERVAL_NOTE_ONE_REPEAT = "1 repeat: intervals hold within-run noise only; use repeats >= 3 for run-to-run variation"
INTERVAL_NOTE_TWO_REPEATS = (
    "2 repeats: the t interval over repeats has 1 degree of freedom and is very wide; use repeats >= 3"
)

SCHEMA_VERSION = 1


LEVEL_SYMBOL = {"closed": "C", "open": "rate", "trace": "scale"}  # how texts name a level, by load mode

_DEFAULTS = defaults("analysis")


@dataclass
class AnalysisSettings:
    """The config's `analysis:` section (and top-level `slo:`); defaults are the schema's (one home)."""

    replicates: int = _DEFAULTS["bootstrap_samples"]
    seed: int = _DEFAULTS["seed"]
    confidence: float = _DEFAULTS["confidence"]
    include_invalid: bool = _DEFAULTS["include_invalid"]
    baseline_arm: str = _DEFAULTS["baseline_arm"]
    primary_metric: str = _DEFAULTS["primary_metric"]
    policy_rule: str = _DEFAULTS["policy_rule"]  # "crossover_lower" or "level_lower_bound"
    slo: dict[str, float] | None = None  # seconds: ttft_s, tpot_s, e2e_s
    max_crossover_ratio: float = _DEFAULTS["max_crossover_ratio"]  # a wider crossover interval is inconclusive
    min_output_match: float = _DEFAULTS["min_output_match"]  # unreferred differences: flag a cell below this share
    output_tie_nats: float = _DEFAULTS["output_tie_nats"]  # a referred difference this close is batch numerics
    levels: list[float] | None = None  # the configured levels (concurrency, rates or time scales): what should exist
    load: str = "closed"  # closed, open or trace: the unit of the levels
    gates: dict[str, Any] = field(default_factory=lambda: defaults("gates"))  # validity, judged when cells are read
    slo_ms: dict[str, float] = field(default_factory=dict)  # the config's `slo:` as given (ms), for judging cells
    # the A/A band (lo, hi) of the primary metric's ratio per level: the indifference zone of verdicts, schedules
    # and proofs at that level when the config has an A/A arm (`noise_floor`); empty: no A/A arm measured
    noise_bands: dict[float, tuple[float, float]] = field(default_factory=dict)
    # the proof's equivalence margin (config `policy.margin`): a policy fails only below 1 - margin
    proof_margin: float = defaults("policy")["margin"]

    def noise_band_at(self, level: float) -> tuple[float, float] | None:
        """The A/A band measured at `level`; None where no A/A comparison judged it (no other level's stands in:
        the noise differs between levels, e.g. one instance effect at one level)."""
        return self.noise_bands.get(float(level))

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
        s.slo_ms = {k: float(v) for k, v in (config.get("slo") or {}).items() if v is not None}
        s.gates = {**defaults("gates"), **(config.get("gates") or {})}
        s.max_crossover_ratio = float(a.get("max_crossover_ratio", s.max_crossover_ratio))
        s.proof_margin = float((config.get("policy") or {}).get("margin", s.proof_margin))
        s.min_output_match = float(a.get("min_output_match", s.min_output_match))
        s.output_tie_nats = float(a.get("output_tie_nats", s.output_tie_nats))
        configured = configured_levels(config)
        if configured:
            s.levels = sorted(float(c) for c in configured)
        s.load = load_mode(config)
        if s.primary_metric not in {m.name for m in METRICS}:
            raise ValueError(f"analysis.primary_metric must be one of {[m.name for m in METRICS]}")
        if s.policy_rule not in {"crossover_lower", "level_lower_bound"}:
            raise ValueError("analysis.policy_rule must be 'crossover_lower' or 'level_lower_bound'")
        if not 0.5 < s.confidence < 1.0:
            raise ValueError("analysis.confidence must be in (0.5, 1)")
        if s.replicates < 10:
            raise ValueError("analysis.bootstrap_samples must be >= 10")
        if not s.max_crossover_ratio > 1.0:
            raise ValueError("analysis.max_crossover_ratio must be > 1")
        return s


def payoff_limit(concurrency: np.ndarray, speedups: np.ndarray, method: str = "loglinear") -> np.ndarray:
    """Per curve: the load up to which speculation wins, from the bottom (the policy is 'speculate <= N').

    0.0 when speculation already loses at the lowest level, the first crossing when it wins there and then
    stops, +inf when it wins at every measured level. `speedups` is (B, L) with columns sorted by C; `method`
    is the interpolant between levels (`crossover.INTERPOLANTS`).
    """
    S = np.atleast_2d(speedups)
    first = crossings_matrix(concurrency, S, method)[:, 0]
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


def crossover_text(x: dict[str, Any] | None, symbol: str = "C") -> str:
    """'C=12.3 [8.1, 20.4]' with '<min' / '>max' where a value lies outside the measured levels."""
    if not x:
        return f"{symbol}=- (no usable levels)"

    def one(field: str) -> str:
        st, v = x["states"][field], x[field]
        if st == "below_range":
            return f"<{x['min_level']:g}"
        if st == "above_range" or v is None:
            return f">{x['max_level']:g}"
        return f"{v:.3g}"

    return f"{symbol}={one('estimate')} [{one('lo')}, {one('hi')}]"


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
            "concurrency": _f(lv[i]),
            "speedup": _f(spk[i]),
            "lo": _f(lo_ok[i]),
            "hi": _f(hi_ok[i]),
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
                "concurrency": _f(x),
                "direction": _direction(lv, spk, x),
                "lo": _f(min(los)) if los else None,
                "hi": _f(max(his)) if his else None,
                "replicate_fraction": _f(frac),
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
        "estimate": _f(point),
        "lo": _f(lo),
        "hi": _f(hi),
        "states": {"estimate": _state(point, cmax), "lo": _state(lo, cmax), "hi": _state(hi, cmax)},
        "fraction_below_range": _f(np.mean(lims0 == 0.0)) if lims0.size else None,
        "fraction_above_range": _f(np.mean(np.isinf(lims0))) if lims0.size else None,
        "min_level": _f(lv.min()),
        "max_level": _f(cmax),
        "interpolation": {
            "methods": list(INTERPOLANTS),
            "estimates": {m: _f(v) for m, v in est.items()},
            "intervals": {m: {"lo": _f(v[0]), "hi": _f(v[1])} for m, v in ivl.items()},
            "estimate_min": _f(min(est.values())),
            "estimate_max": _f(max(est.values())),
            "widened": bool(lo < ivl[INTERPOLANTS[0]][0] or hi > ivl[INTERPOLANTS[0]][1]),
        },
    }


def levels_text(levels: Sequence[float]) -> str:
    """'10, 30' with integer levels shown as integers."""
    return ", ".join(f"{c:g}" for c in levels)


def _as_levels(levels: Sequence[float]) -> list[int | float]:
    """Levels for JSON: integers where they are whole numbers (configured levels are)."""
    return [int(c) if float(c).is_integer() else float(c) for c in sorted(levels)]


def suggest_levels(
    crossover: dict[str, Any],
    used: Sequence[float],
    configured: Sequence[float],
    max_ratio: float,
    max_new: int = 8,
    integer: bool = True,
) -> list[int | float]:
    """Levels to measure so that the crossover interval can narrow (integers for concurrency, two significant
    digits for rates and time scales with `integer` False): log-spaced between the measured
    levels that bracket the interval, at most a factor sqrt(max_ratio) apart, none already configured.

    An interval reaching below the lowest level reaches down to C=1; one reaching above the largest level is
    bracketed at twice the largest level (the sweep must be extended to bound it).
    """
    st = crossover["states"]
    known = {float(c) for c in (*used, *configured)}
    top = max(known)
    if st["lo"] == "within":
        lo_anchor = max((c for c in used if c <= crossover["lo"]), default=min(used))
    else:
        lo_anchor = 1.0 if integer else min(used) / 2.0
    if st["hi"] == "within":
        hi_anchor = min((c for c in used if c >= crossover["hi"]), default=top)
    else:
        hi_anchor = 2.0 * top
    if hi_anchor <= lo_anchor:
        return []
    span = math.log(hi_anchor / lo_anchor)
    n = min(max_new + 1, max(1, math.ceil(span / math.log(math.sqrt(max_ratio)))))
    raw = [lo_anchor * math.exp(span * k / n) for k in range(n + 1)]
    if not integer:  # request rates and time scales: two significant digits
        rates = {float(f"{c:.2g}") for c in raw}
        return sorted(c for c in rates if c > 0 and c not in known and lo_anchor <= c <= hi_anchor)
    cands = {int(round(c)) for c in raw}
    return sorted(c for c in cands if c >= 1 and float(c) not in known and lo_anchor <= c <= hi_anchor)


def _limit_text(x: dict[str, Any], field: str) -> str:
    st = x["states"][field]
    if st == "below_range":
        return f"<{x['min_level']:g}"
    if st == "above_range" or x[field] is None:
        return f">{x['max_level']:g}"
    return f"{x[field]:.3g}"


def _open_towards_estimate(states: dict[str, str]) -> bool:
    """An interval open on the side where the point estimate lies is an answer, not a gap: speculation won at
    every level and the lower end says up to where that is sure (or it lost at the lowest level and the upper end
    says how far that may reach). Open on the other side, the measurement contradicts itself: inconclusive.
    Open on both sides, the interval spans every level (speculation not shown to win even at the lowest, or to
    lose even at the highest): no answer either."""
    if (states["lo"], states["hi"]) == ("below_range", "above_range"):
        return False
    return (states["estimate"], states["hi"]) == ("above_range", "above_range") or (
        states["estimate"],
        states["lo"],
    ) == ("below_range", "below_range")


def decide_verdict(
    crossover: dict[str, Any] | None,
    used: Sequence[float],
    configured: Sequence[float],
    bad: Sequence[float],
    max_ratio: float,
    upward: bool = False,
    no_interval: Sequence[float] = (),
    symbol: str = "C",
    integer: bool = True,
) -> dict[str, Any]:
    """The answer for one speculative arm, or why there is none yet (docs/analysis.md, "Verdicts").

    `used`: levels measured validly in both arms; `bad`: configured levels that are invalid or missing in
    either arm (not used). Every bad level at or below the measured level that bounds the crossover interval
    from above decides the answer, so it makes the verdict inconclusive (`remeasure_levels`) rather than being
    bridged by interpolation; bad levels above it are only noted. The same holds for used levels without an
    interval (`no_interval`: no request records, or steady windows too short), whose fixed point values would
    make the crossover interval look narrower than it is. An interval whose hi/lo exceeds `max_ratio`, or that
    is open on one side (reaches beyond the measured levels on one end only), is inconclusive too, with
    `add_levels` to measure.
    """
    if crossover is None or not used:
        return {
            "kind": "inconclusive",
            "reason": "no level was measured validly in both arms",
            "add_levels": [],
            "remeasure_levels": _as_levels(bad),
            "notes": [],
        }
    st = crossover["states"]
    used_s = sorted(float(c) for c in used)
    kind = {"below_range": "loses_everywhere", "above_range": "wins_everywhere"}.get(st["estimate"], "crossover")
    if st["hi"] == "above_range":
        upper = math.inf  # the interval reaches above every level: all of them decide
    elif st["hi"] == "below_range":
        upper = used_s[0]
    else:
        upper = min(c for c in used_s if c >= crossover["hi"])
    blocking = sorted(float(b) for b in bad if b <= upper)
    ignored = sorted(float(b) for b in (*bad, *no_interval) if b > upper)
    unsure = sorted(float(b) for b in no_interval if b <= upper)
    reasons: list[str] = []
    add: list[int] = []
    where = (
        "the answer depends on every level" if math.isinf(upper) else f"at or below {symbol}={upper:g}, which decide"
    )
    if blocking:
        reasons.append(f"{symbol}={levels_text(blocking)} invalid or missing ({where}): re-measure")
    if unsure:
        reasons.append(
            f"{symbol}={levels_text(unsure)} without an interval (no request records, or steady windows too short; "
            f"{where}): re-measure"
        )
    interval = f"[{_limit_text(crossover, 'lo')}, {_limit_text(crossover, 'hi')}]"
    too_wide = ""
    if st["lo"] == st["hi"] == "within":
        ratio = crossover["hi"] / crossover["lo"]
        if ratio > max_ratio:
            too_wide = f"crossover interval {interval} spans {ratio:.2f}x > analysis.max_crossover_ratio {max_ratio:g}"
    elif st["lo"] != st["hi"] and not _open_towards_estimate(st):
        too_wide = f"crossover interval {interval} is open beyond the measured levels"
    if too_wide:
        add = suggest_levels(crossover, used_s, configured, max_ratio, integer=integer)
        fix = f"measure {symbol}={levels_text(add)} and/or" if add else "levels there are dense already:"
        reasons.append(f"{too_wide}: {fix} more repeats or requests per level")
    notes = []
    if ignored:
        notes.append(
            f"{symbol}={levels_text(ignored)} invalid, missing or without an interval above {symbol}={upper:g}: "
            "not needed for this verdict"
        )
    if reasons:
        return {
            "kind": "inconclusive",
            "reason": "; ".join(reasons),
            "add_levels": add,
            "remeasure_levels": _as_levels([*blocking, *unsure]),
            "notes": notes,
        }
    if kind == "crossover":
        reason = (
            f"speculation pays off up to {symbol}={crossover['estimate']:.3g} {interval}; every level up to "
            f"{symbol}={upper:g} measured validly"
        )
    elif kind == "wins_everywhere":
        reason = f"speculation wins at every level, {symbol}={used_s[0]:g} to {used_s[-1]:g}, all measured validly"
        if st["lo"] == "within":
            reason += (
                f"; with 95% confidence it pays at least up to {symbol}={crossover['lo']:.3g} (the interval {interval} "
                "is open above the measured levels)"
            )
    else:
        reason = f"speculation already loses at the lowest level, {symbol}={used_s[0]:g}"
        if upward:
            reason += " (and wins again at higher load: see the crossings)"
    return {"kind": kind, "reason": reason, "add_levels": [], "remeasure_levels": [], "notes": notes}


def _paired_entry(pe: PairedEstimate | None) -> dict[str, Any] | None:
    """How a level's speedup was estimated when its arms were interleaved (None: from separate cells)."""
    if pe is None:
        return None
    out = {
        "blocks": pe.pairs,
        "unit": pe.unit,
        "df": pe.df,
        "spread_dominates": pe.spread_dominates,
        "log_se": pe.log_se if math.isfinite(pe.log_se) else None,
    }
    return out if pe.instance_effect is None else {**out, "instance_effect": pe.instance_effect}


def _as_dict(p: LevelPrecision | None) -> dict[str, Any] | None:
    return p.as_dict() if p is not None else None


def _cell_entry(cell: Cell, included: bool) -> dict[str, Any]:
    return {
        "arm": cell.arm,
        "concurrency": _f(cell.concurrency),
        "key": cell.key,
        "reasons": cell.invalid_reasons,
        "included": included,
    }


def _differ_note(
    rows: list[dict[str, Any]], spec_arm: str, baseline_arm: str, settings: AnalysisSettings, sym: str
) -> str:
    """OUTPUTS DIFFER: where, how much, and the first clear difference by prompt and position (or, unreferred,
    the first differing character)."""
    worst = min(rows, key=lambda r: r["output_match"]["share"])
    m = worst["output_match"]
    head = (
        f"OUTPUTS DIFFER at {sym}={levels_text([r['concurrency'] for r in rows])}: only {m['share']:.0%} of "
        f"{spec_arm}'s outputs equal {baseline_arm}'s at {sym}={worst['concurrency']:g}"
    )
    refs = [r["output_match"]["referral"] for r in rows if (r["output_match"]["referral"] or {}).get("clear")]
    ex = refs[0]["clear_examples"][0] if refs else None
    if ex is None:
        fd = m["first_difference"] or {}
        return (
            f"{head} (first difference at character {fd.get('char')}; not referred to the baseline server: "
            f"analysis.min_output_match {settings.min_output_match:g}): a faster arm that generates other text is "
            "not the same service; check the draft and verify path"
        )
    ref = refs[0]
    told = (
        f"{baseline_arm} {ex['reference_token']!r} over {spec_arm} {ex['other_token']!r} "
        f"by {ex['margin_nats']:.3g} nats"
        if ex["other_token"] is not None
        else f"{spec_arm}'s {ex['other_head']!r} not among the baseline's top candidates "
        f"(its own token: {ex['reference_token']!r})"
    )
    return (
        f"{head}; {ref['clear']} of {ref['referred']} referred differences are clear (more than "
        f"{settings.output_tie_nats:g} nats between the two tokens, analysis.output_tie_nats), e.g. prompt "
        f"{ex['prompt_index']} of round {ex['repeat']} at character {ex['char']}: {told}. A faster arm that generates "
        "other text is not the same service; check the draft and verify path"
    )


def _ties_note(rows: list[dict[str, Any]], spec_arm: str, baseline_arm: str, tie_nats: float, sym: str) -> str:
    """Differences that are near-ties: batch numerics, with their share; not the speculative path."""
    parts = []
    for r in rows:
        m, ref = r["output_match"], r["output_match"]["referral"]
        left = f", {ref['unreferred']} not referred" if ref["unreferred"] else ""
        parts.append(f"{sym}={r['concurrency']:g} {m['differ']} of {m['compared']} ({ref['near_ties']} referred{left})")
    worst = max(r["output_match"]["referral"]["max_tie_margin_nats"] or 0.0 for r in rows)
    return (
        f"outputs differ at near-ties: {'; '.join(parts)}: at each referred first difference the {baseline_arm} "
        f"server scores its own token and {spec_arm}'s within {worst:.2g} nats (analysis.output_tie_nats "
        f"{tie_nats:g}): numerics of another batch shape (the verify pass scores K+1 tokens at once), not the "
        "speculative path"
    )


def _slowed_attempts(cell: Cell) -> bool:
    """Whether an attempt of the cell's level found a block served by a slowed server (`gates.server_state_gate`)."""
    log = (cell.summary.get("attempts") or {}).get("log") or []
    return any(is_server_slowed(r) for entry in log for r in entry["reasons"])


def _repeats_note(methods: list[str], n_repeats: list[int]) -> tuple[bool, str | None]:
    """Whether the intervals hold within-run noise only (a cell with one repeat), and the note that says so."""
    if "blocks" in methods:
        return True, INTERVAL_NOTE_ONE_REPEAT
    if n_repeats and min(n_repeats) == 2:
        return False, INTERVAL_NOTE_TWO_REPEATS
    return False, None


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
    configured = sorted(set(settings.levels or []) | set(base_cells) | set(spec_cells))
    invalid, missing, per_level = [], [], []
    used: list[float] = []
    for c in configured:
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
        if c in base_cells and c in spec_cells:
            referral = spec_cells[c].summary.get("output_referral")
            if referral and referral.get("against") != base_cells[c].arm:
                referral = None  # referred against another arm's server (a policy level's reference arm)
            row["output_match"] = output_match(
                base_cells[c].outputs, spec_cells[c].outputs, referral, settings.output_tie_nats
            )
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

    def pair(m: MetricSpec, i: int, c: float) -> PairedEstimate | None:
        b, s = base_cells[c], spec_cells[c]
        rng = cell_rng(settings.seed, f"paired/{b.key}/{s.key}/{m.name}")
        return paired_estimate(b, s, base_b[i], spec_b[i], m.name, m.higher_is_better, settings.replicates, rng)

    paired = {m.name: [pair(m, i, c) for i, c in enumerate(used)] for m in METRICS}
    metrics = {
        m.name: _metric_result(m, levels, base_b, spec_b, settings.confidence, spec_arm, baseline_arm, paired[m.name])
        for m in METRICS
    }
    prim = metrics[settings.primary_metric]
    pname = settings.primary_metric
    for row in per_level:
        if row["used"]:
            i = used.index(row["concurrency"])
            row.update(
                baseline_value=prim["baseline"][i],
                spec_value=prim["spec"][i],
                speedup=prim["speedup"][i],
                speedup_lo=prim["speedup_lo"][i],
                speedup_hi=prim["speedup_hi"][i],
                baseline_n_repeats=base_b[i].n_repeats.get(pname, 0),
                spec_n_repeats=spec_b[i].n_repeats.get(pname, 0),
                paired=_paired_entry(paired[pname][i]),
                precision=_as_dict(level_precision(spec_cells[used[i]], paired[THROUGHPUT][i], settings.confidence)),
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
    bad = [r["concurrency"] for r in per_level if not r["used"]]
    upward = any(x["direction"] == "up" for x in prim.get("crossings") or [])
    no_interval = [c for c, has in zip(used, prim["interval_available"], strict=True) if not has]
    sym = LEVEL_SYMBOL[settings.load]
    verdict = decide_verdict(
        prim["crossover"],
        used,
        configured,
        bad,
        settings.max_crossover_ratio,
        upward,
        no_interval,
        symbol=sym,
        integer=settings.load == "closed",
    )
    # None: the two cells' outputs were never compared (one recorded none: virtual-time or older cells); said
    # so below, never counted as equal
    compared = [r for r in per_level if r.get("output_match") is not None]
    judged = {r["concurrency"]: output_verdict(r["output_match"], settings.min_output_match) for r in compared}
    differ = [r for r in compared if judged[r["concurrency"]] == "differ"]
    if differ:
        verdict["notes"].append(_differ_note(differ, spec_arm, baseline_arm, settings, sym))
    ties = [r for r in compared if judged[r["concurrency"]] == "numerics"]
    if ties:
        verdict["notes"].append(_ties_note(ties, spec_arm, baseline_arm, settings.output_tie_nats, sym))
    not_compared = [r["concurrency"] for r in per_level if "output_match" in r and r["output_match"] is None]
    if not_compared:
        verdict["notes"].append(
            f"outputs not compared at {sym}={levels_text(not_compared)}: a cell there recorded no outputs "
            '(virtual-time or older cells), so "same output, only faster" is not checked there'
        )
    shares = [r["output_match"]["share"] for r in compared]
    drifted = [c for c in used if any(is_drift(f) for x in (base_cells[c], spec_cells[c]) for f in x.flags)]
    if drifted:
        verdict["notes"].append(
            f"the host changed speed inside the level at {sym}={levels_text(drifted)}, in two attempts in a row "
            "(the cells' drift flags): kept, the rounds' spread carries it into the interval; more rounds "
            "(repeats) or fewer arms per level narrow it"
        )
    slowed = [c for c in used if any(_slowed_attempts(x) for x in (base_cells[c], spec_cells[c]))]
    if slowed:
        verdict["notes"].append(
            f"a server slowed in a block at {sym}={levels_text(slowed)} (it got less of its CPUs or GPUs than in "
            "its other blocks, gates.max_server_slowdown): that attempt is kept under the cell's attempts/ and the "
            "level was measured again; the answer uses the attempt that counts"
        )
    included_invalid = sorted({e["concurrency"] for e in invalid if e["included"]})
    if included_invalid:
        verdict["notes"].append(f"{sym}={levels_text(included_invalid)} invalid but included (include_invalid)")
    cells_b = [*base_b, *spec_b]
    methods = [b.method.get(pname, "none") for b in cells_b]
    n_reps = [b.n_repeats.get(pname, 0) for b in cells_b if b.has_interval.get(pname)]
    within_only, interval_note = _repeats_note(methods, n_reps)
    pairs = [r["paired"] for r in per_level if r.get("paired")]
    interleaved = all(pairing_of(x) is None or pairing_of(x)["mode"] == "interleaved" for x in base_cells.values())
    if pairs and len(pairs) == len(used) and {p["unit"] for p in pairs} == {"instance"}:
        counts = sorted({p["blocks"] for p in pairs})
        within_only = counts == [1]
        interval_note = (
            f"interleaved arms on {'/'.join(map(str, counts))} server instances per arm: the speedup the mean "
            "of the instances' paired rounds; where the rounds show an instance effect (F test, 50%), the interval "
            "is a t over the instances"
            + (
                f" (at {sym}={levels_text(effect)}: more instances narrow it)"
                if (effect := [r["concurrency"] for r in per_level if (r.get("paired") or {}).get("instance_effect")])
                else " (none showed one)"
            )
            if interleaved
            else f"replicated arms: {'/'.join(map(str, counts))} server instance(s) per arm in counterbalanced "
            "segments, the speedup from the arms' instance means (the instances' spread in the interval)"
        )
    elif pairs and len(pairs) == len(used):  # every level measured in interleaved blocks: the paired interval
        blocks = sorted({p["blocks"] for p in pairs})
        within_only = blocks == [1]
        shown = f"{blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else str(blocks[0])
        interval_note = (
            f"interleaved arms: {shown} round(s) of blocks per level, the speedup a paired t over the rounds "
            "(each round's blocks of both arms)"
            + (
                "; 1 round: intervals hold within-block noise only, use precision.min_rounds >= 3"
                if within_only
                else ""
            )
        )
    verdict["notes"].extend(precision_notes(per_level, sym))
    return {
        "baseline_arm": baseline_arm,
        "spec_arm": spec_arm,
        "source": sources[0] if len(sources) == 1 else ("mixed" if sources else "unknown"),
        "levels": [_f(c) for c in used],
        "configured_levels": [_f(c) for c in configured],
        "cell_keys": {
            "baseline": [base_cells[c].key for c in used],
            "spec": [spec_cells[c].key for c in used],
        },
        "n_repeats": {
            "baseline": [b.n_repeats.get(pname, 0) for b in base_b],
            "spec": [b.n_repeats.get(pname, 0) for b in spec_b],
        },
        "within_run_only": within_only,
        "interval_note": interval_note,
        "per_level": per_level,
        "invalid_cells": invalid,
        "missing_cells": missing,
        "primary_metric": settings.primary_metric,
        # flat copies for trackers: null where out of range (see crossover.states)
        "crossover_concurrency": (prim["crossover"] or {}).get("estimate"),
        "crossover_ci_low": (prim["crossover"] or {}).get("lo"),
        "crossover_ci_high": (prim["crossover"] or {}).get("hi"),
        "crossover": prim["crossover"],
        "interpolation": (prim["crossover"] or {}).get("interpolation"),
        "crossings": prim["crossings"],
        "monotone": prim["monotone"],
        "winner": prim["winner"],
        "output_match_min": min(shares) if shares else None,
        "smallest_margin": prim["smallest_margin"],
        "verdict": verdict,
        "metrics": metrics,
        "notes": notes + ([interval_note] if interval_note else []),
    }


def analyze_variant(
    cells: dict[str, dict[float, Cell]],
    baseline_arm: str,
    spec_arms: list[str],
    settings: AnalysisSettings,
    experiment: str = "",
    variant: str = "",
    engine: str = "",
    aa_arms: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every speculative arm of a variant against its baseline arm: the body of crossover.json. With A/A arms
    (arm -> the arm it repeats), their noise floor first: its bands per level are set on `settings.noise_bands`,
    and every level whose speedup lies inside its level's band reads "within the noise"."""
    cache: dict[str, CellBootstrap] = {}
    noise = noise_floor(cells, aa_arms or {}, settings, cache)
    settings.noise_bands = {float(b["concurrency"]): (b["lo"], b["hi"]) for b in (noise or {}).get("bands", [])}
    arms = {a: analyze_arm(cells, baseline_arm, a, settings, cache) for a in spec_arms}
    if noise is not None:
        for ar in arms.values():
            inside, unjudged = [], []
            for row in ar["per_level"]:
                sp, band = row.get("speedup"), settings.noise_band_at(row["concurrency"])
                if sp is None or not row["used"]:
                    row["within_noise"] = None
                elif band is None:
                    row["within_noise"] = None
                    unjudged.append(row["concurrency"])
                else:
                    row["within_noise"] = bool(band[0] <= sp <= band[1])
                    if row["within_noise"]:
                        inside.append(f"{row['concurrency']:g} [{band[0]:.3g}, {band[1]:.3g}]")
            sym = LEVEL_SYMBOL[settings.load]
            if inside:
                ar["verdict"]["notes"].append(
                    f"{sym}={', '.join(inside)}: within the noise (inside that level's A/A band): no better or "
                    "worse than the baseline as far as this set-up can tell"
                )
            if unjudged:
                ar["verdict"]["notes"].append(
                    f"{sym}={levels_text(unjudged)}: no A/A band (the A/A comparison did not judge the level): "
                    "the noise there is not known"
                )
    if settings.load != "closed":  # the answer in the unit the policy acts on (analysis/running.py)
        for a, ar in arms.items():
            ar["running_requests"] = running_requests_view(ar, cells.get(baseline_arm, {}), cells.get(a, {}))
    sources = sorted({r["source"] for r in arms.values()})
    return {
        "schema_version": SCHEMA_VERSION,
        "experiment": experiment,
        "variant": variant,
        "engine": engine,
        "load": settings.load,  # the levels' unit: closed (concurrency), open (requests/s), trace (time scale)
        "source": sources[0] if len(sources) == 1 else ("mixed" if sources else "unknown"),
        "baseline_arm": baseline_arm,
        "bootstrap": {
            "replicates": settings.replicates,
            "seed": settings.seed,
            "confidence": settings.confidence,
            "method": (
                "per repeat: block bootstrap over equal time blocks of the steady window; R >= 2 repeats: "
                "t(R-1) around the reported value, scale s/sqrt(R) on the log scale, s floored by the "
                "within-repeat block variance; percentile intervals"
            ),
            "throughput_estimator": "tokens delivered in the chosen blocks / their summed length, scaled to summary",
            "blocks": {
                "max_blocks": N_BLOCKS,
                "min_blocks": MIN_BLOCKS,
                "min_block_lifetimes": BLOCK_LIFETIMES,
            },
            "interpolants": list(INTERPOLANTS),
        },
        "max_crossover_ratio": settings.max_crossover_ratio,
        "include_invalid": settings.include_invalid,
        "slo": settings.slo,
        "arms": arms,
        "noise_floor": noise,
    }


def noise_floor(
    cells: dict[str, dict[float, Cell]],
    aa_arms: dict[str, str],
    settings: AnalysisSettings,
    cache: dict[str, CellBootstrap],
) -> dict[str, Any] | None:
    """The A/A comparisons: each A/A arm against the arm it repeats, per level (ratio and interval), the share
    of levels whose interval excludes 1 (a verdict that says "different" where nothing differs), and the bands:
    per level, the furthest either end of an A/A interval there strayed from 1, made symmetric on the log scale
    (with several A/A arms, the widest at that level); `band` is the widest of them, the set-up's worst level.

    Why per level: an A/A level interval can be wide for a reason of its level alone (two server instances that
    disagree give a t with one degree of freedom: [0.14, 7.5] at C=16 in one vLLM CPU run whose other levels
    read [0.94, 1.66], [0.69, 1.49], [0.88, 1.36]); one band for all levels made every level "within the noise"."""
    if not aa_arms:
        return None
    comparisons, judged, excluding = {}, 0, 0
    per_level: dict[float, float] = {}
    for aa, twin in aa_arms.items():
        res = analyze_arm(cells, twin, aa, settings, cache)
        rows = []
        for r in res["per_level"]:
            lo, hi = r.get("speedup_lo"), r.get("speedup_hi")
            row = {"concurrency": r["concurrency"], "ratio": r.get("speedup"), "lo": lo, "hi": hi}
            if r["used"] and lo is not None and hi is not None and lo > 0:
                judged += 1
                row["excludes_one"] = bool(lo > 1.0 or hi < 1.0)
                excluding += row["excludes_one"]
                c, half_c = float(r["concurrency"]), max(abs(math.log(lo)), abs(math.log(hi)))
                per_level[c] = max(per_level.get(c, 0.0), half_c)
            else:
                row["excludes_one"] = None
            rows.append(row)
        comparisons[aa] = {"of": twin, "per_level": rows}
    half = max(per_level.values()) if per_level else None
    return {
        "metric": settings.primary_metric,
        "comparisons": comparisons,
        "levels_judged": judged,
        "levels_excluding_one": excluding,
        "false_verdict_share": excluding / judged if judged else None,
        "band": {"lo": math.exp(-half), "hi": math.exp(half)} if half is not None else None,
        "bands": [{"concurrency": c, "lo": math.exp(-h), "hi": math.exp(h)} for c, h in sorted(per_level.items())],
    }
