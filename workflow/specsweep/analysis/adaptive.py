"""Adaptive levels: after each round of cells, the levels to add inside the crossover interval.

A fixed grid spends most of its GPU time far from the crossover and then interpolates across the one gap that
matters. Adaptive levels measure the configured grid first, then add levels inside each speculative arm's
crossover interval, round after round, until every interval is narrower than `adaptive.target_ratio` (hi/lo),
levels there are already dense, or a budget (added levels, measuring time) is spent. Each round is a Snakemake
checkpoint (`specsweep refine`, workflow/rules/adaptive.smk) whose output lists the levels; `specsweep plan`
runs the same `next_levels` on a virtual-time sweep. A finished round is a decision about what to measure: it
is kept while its cells and its adaptive settings are unchanged (`decision_key`, stored beside the round's
output), so that editing a gate, an SLO or an analysis setting, which reruns the round's job, never makes it
pick other levels and measure new cells. Levels are only added inside the measured range: an
interval open beyond it asks for a wider grid, which is the user's call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep.analysis import decisions
from specsweep.analysis.variant import analyze_cells
from specsweep.config import defaults
from specsweep.io import atomic_write_json

__all__ = ["AdaptiveSettings", "interior_levels", "measuring_seconds", "next_levels", "refine_round"]

_DEFAULTS = defaults("adaptive")


@dataclass
class AdaptiveSettings:
    """The config's `adaptive:` section; defaults are the schema's."""

    enabled: bool = _DEFAULTS["enabled"]
    target_ratio: float = _DEFAULTS["target_ratio"]
    levels_per_round: int = _DEFAULTS["levels_per_round"]
    max_rounds: int = _DEFAULTS["max_rounds"]
    max_levels: int = _DEFAULTS["max_levels"]
    max_measure_minutes: float | None = _DEFAULTS["max_measure_minutes"]
    grid_per_concurrency: float | None = _DEFAULTS["grid_per_concurrency"]
    added_per_concurrency: float | None = _DEFAULTS["added_per_concurrency"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AdaptiveSettings:
        a = {**_DEFAULTS, **(config.get("adaptive") or {})}
        return cls(**{k: a[k] for k in cls.__dataclass_fields__})


def interior_levels(lo: float, hi: float, k: int, measured: Sequence[float], estimate: float) -> list[int]:
    """Up to `k` integer levels log-evenly inside (lo, hi), none already measured; when rounding leaves none,
    the free integer inside nearest to `estimate` (log scale)."""
    taken = {int(round(c)) for c in measured}
    inside = [c for c in range(math.floor(lo) + 1, math.ceil(hi)) if c not in taken and c >= 1]
    if not inside:
        return []
    span = math.log(hi / lo)
    picks = {int(round(lo * math.exp(span * j / (k + 1)))) for j in range(1, k + 1)}
    picks = {c for c in picks if c in inside}
    if not picks:
        picks = {min(inside, key=lambda c: abs(math.log(c / estimate)))}
    return sorted(picks)[:k]


def _arm_plan(ar: dict[str, Any], measured: Sequence[float], settings: AdaptiveSettings) -> dict[str, Any]:
    """One speculative arm: its interval, whether it is settled, and the levels that would narrow it."""
    x, verdict = ar.get("crossover"), ar["verdict"]
    out: dict[str, Any] = {"verdict": verdict["kind"], "lo": None, "hi": None, "ratio": None, "candidates": []}
    if verdict.get("remeasure_levels"):
        out["settled"] = f"C={verdict['remeasure_levels']} invalid or missing: re-measure them first"
        return out
    if x is None:
        out["settled"] = "no crossover estimate"
        return out
    st = x["states"]
    out.update(lo=x.get("lo"), hi=x.get("hi"))
    if st["estimate"] != "within":  # the answer lies at an end of the grid: only a wider grid could move it
        out["settled"] = f"{verdict['kind']}: {verdict['reason']}"
        return out
    lo = x["lo"] if st["lo"] == "within" else min(measured)
    hi = x["hi"] if st["hi"] == "within" else max(measured)
    if st["lo"] == st["hi"] == "within":
        out["ratio"] = hi / lo
        if out["ratio"] <= settings.target_ratio:
            out["settled"] = f"interval spans {out['ratio']:.2f}x <= target {settings.target_ratio:g}x"
            return out
    out["candidates"] = interior_levels(lo, hi, settings.levels_per_round, measured, x["estimate"])
    out["settled"] = None if out["candidates"] else "the interval holds no level not yet measured"
    return out


def next_levels(
    result: dict[str, Any],
    measured: Sequence[float],
    grid: Sequence[float],
    settings: AdaptiveSettings,
    spent_s: float,
) -> dict[str, Any]:
    """The levels to add after a round, from a variant's crossover result (`analyze_variant`).

    `measured`: the levels measured so far; `grid`: the configured ones (what is added counts against
    `max_levels`); `spent_s`: measuring time so far (server starts and levels, every arm). Returns {add,
    levels (after adding), stop (why nothing is added, or None), arms{...}}."""
    measured = sorted({float(c) for c in measured})
    added = len([c for c in measured if c not in {float(g) for g in grid}])
    arms = {a: _arm_plan(ar, measured, settings) for a, ar in result["arms"].items()}
    budget = settings.max_levels - added
    stop = None
    if settings.max_measure_minutes is not None and spent_s >= 60.0 * settings.max_measure_minutes:
        stop = f"measuring budget spent: {spent_s / 60:.1f} min >= {settings.max_measure_minutes:g} min"
    elif budget <= 0:
        stop = f"level budget spent: {added} levels added (adaptive.max_levels {settings.max_levels})"
    add: list[int] = []
    if stop is None:
        queues = [list(p["candidates"]) for p in arms.values()]
        while queues and len(add) < min(budget, settings.levels_per_round):
            for q in queues:  # round-robin over the speculative arms
                while q and q[0] in add:
                    q.pop(0)
                if q and len(add) < min(budget, settings.levels_per_round):
                    add.append(q.pop(0))
            queues = [q for q in queues if q]
        if not add:
            stop = "; ".join(f"{a}: {p['settled']}" for a, p in arms.items())
    return {
        "add": sorted(add),
        "levels": sorted({*(int(c) for c in measured), *add}),
        "stop": stop,
        "spent_s": spent_s,
        "arms": arms,
    }


def measuring_seconds(summaries: Sequence[dict[str, Any]]) -> float:
    """What the cells cost: each level's wall time (warm-up, resets, closed loops) plus waiting for its
    server (a start, or ~0 when the running server was reused)."""
    total = 0.0
    for s in summaries:
        total += float(s.get("level_s") or 0.0) + float((s.get("server") or {}).get("ready_after_s") or 0.0)
    return total


def decision_key(decision: dict[str, Any], round_: int, summaries: Sequence[Path]) -> str:
    """What a round's decision depends on: its adaptive settings, its round, and the bytes of every cell it
    judged. The same key means the same decision, whatever the gates, SLOs or analysis settings now say."""
    return decisions.decision_key([decision, round_], summaries)


def refine_round(
    variant: str, decision: dict[str, Any], config: dict[str, Any], round_: int, summaries: list[Path], out: Path
) -> tuple[dict[str, Any], bool]:
    """What `specsweep refine` does: decide which levels adaptive round `round_` adds from every cell measured
    so far (judged by `config`), or keep the decision taken before on the same cells and `decision` settings
    (analysis/decisions.py), and write it to `out`. Returns the round's plan and whether it was kept."""
    key = decision_key(decision, round_, summaries)
    plan = decisions.kept(out.parent, f"round{round_}", key)
    if plan is not None:
        atomic_write_json(out, plan)
        return plan, True
    settings = AdaptiveSettings.from_config(decision)
    result, cells = analyze_cells(config, variant, summaries=summaries)
    measured = sorted({c for by_level in cells.values() for c in by_level})
    spent = measuring_seconds([cell.summary for by_level in cells.values() for cell in by_level.values()])
    plan = next_levels(result, measured, decision.get("concurrency") or [], settings, spent)
    plan.update(
        variant=variant,
        round=round_,
        measured=[int(c) for c in measured],
        judged_with={k: config.get(k) for k in ("gates", "slo", "analysis")},
        decision_key=key,
    )
    decisions.keep(out.parent, f"round{round_}", key, plan)
    atomic_write_json(out, plan)
    return plan, False
