"""The answer for one speculative arm, or why there is none yet: its verdict, the levels that would decide it,
and how texts show a crossover interval (docs/analysis.md, "Verdicts")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["as_levels", "crossover_text", "decide_verdict", "levels_text", "suggest_levels"]


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


def levels_text(levels: Sequence[float]) -> str:
    """'10, 30' with integer levels shown as integers."""
    return ", ".join(f"{c:g}" for c in levels)


def as_levels(levels: Sequence[float]) -> list[int | float]:
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
            "remeasure_levels": as_levels(bad),
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
            "remeasure_levels": as_levels([*blocking, *unsure]),
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
