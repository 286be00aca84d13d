"""The rule's own caution, told apart from a policy failure (docs/analysis.md, "The proof: policy regret").

The threshold rule stops speculating at the lower end of the crossover interval (rounded down), not at the
estimate: between that threshold and the interval's upper end the sweep could not tell whether speculation still
pays, and the rule chose plain decoding there on purpose. The per-level rule does the same with draft lengths: it
serves the smallest K whose ratio to the best is within the noise. At such a level the best fixed arm (by point
value) can still be the larger K, so "policy / best" reads below 1 by what that K happened to gain, which the rule
never promised to keep. Judging it against 1 - margin calls the rule's caution a failure (seen: 0.956 [0.941,
0.976] at C=10, where the threshold was 8 and the crossover interval started at 8.22, and speculation had measured
1.06 [0.974, 1.17] there).

What the rule does promise at such a level: to lose no more than the sweep allowed, i.e. the served K over the
best K no lower than the lower end of their ratio's interval in the sweep (here 1 / 1.17: up to 14.5%). So the
level is judged against that bound, with the same margin: `caution` where the policy's interval lies above it,
`fails` where it lies wholly below (the served K itself lost, beyond what caution costs), `not decided` between.
"""

from __future__ import annotations

from typing import Any

__all__ = ["caution_at", "caution_text"]


def _bound(v: Any, state: str | None) -> str:
    if state == "below_range":
        return "below the levels"
    if state == "above_range" or v is None:
        return "above the levels"
    return f"{v:.3g}"


def caution_at(entry: dict[str, Any], level: float, scheduled: int | None, best: str | None, best_k: int | None):
    """Why the schedule chose caution at `level` (serving `scheduled` below the best fixed arm's K), and the most
    that caution may cost there by the sweep (`bound`: the served K over the best's lower end; None: no interval);
    None where it was no caution (the same or a larger K, or the sweep showed the best K better there).

    `entry`: the family's schedule.json entry (its `per_level` choices, and for the threshold rule its
    `threshold` and the `crossover` interval it was drawn from)."""
    if scheduled is None or best_k is None or scheduled >= best_k:
        return None
    choice = next((x for x in entry.get("per_level") or [] if x["concurrency"] == level), None)
    cand = next((x for x in (choice or {}).get("candidates", []) if x["k"] == scheduled), None)
    why = None
    x, n = entry.get("crossover"), entry.get("threshold")
    if x and n is not None and level > n:
        states = x.get("states") or {}
        hi = x.get("hi")
        if states.get("hi") == "above_range" or hi is None or level <= hi:
            why = (
                f"within the crossover interval [{_bound(x.get('lo'), states.get('lo'))}, "
                f"{_bound(hi, states.get('hi'))}]: the threshold rule (N={n}) chose caution"
            )
    if why is None and cand is not None and cand.get("within_noise"):
        why = f"K={scheduled} was within the noise of the best (K={best_k}) in the sweep: the rule chose caution"
    if why is None:
        return None
    same_best = choice is not None and choice.get("best") == best and cand is not None
    lo = cand.get("ratio_lo") if same_best else None
    out: dict[str, Any] = {"why": why, "bound": lo, "served_k": scheduled, "best_k": best_k}
    if same_best and cand.get("ratio") and cand.get("ratio_hi") and lo:  # the best over the served K in the sweep
        out["best_over_served"] = [1.0 / cand["ratio"], 1.0 / cand["ratio_hi"], 1.0 / lo]
    return out


def caution_text(level: float, caution: dict[str, Any], ratio: float | None, lo: float | None, hi: float | None) -> str:
    """'C=10: within the crossover interval [...]: ...; loss bounded by 14.5% (...), measured 4.4% [2.4%, 5.9%]'."""
    said = f"C={level:g}: {caution['why']} (K={caution['served_k']})"
    if caution.get("bound") is None:
        return f"{said}; the sweep has no interval to bound its loss"
    sweep = caution.get("best_over_served")
    seen = ""
    if sweep:
        ks = f"K={caution['best_k']} over K={caution['served_k']}"
        seen = f", {ks} {sweep[0]:.3g} [{sweep[1]:.3g}, {sweep[2]:.3g}] in the sweep"
    said += f"; loss bounded by {1 - caution['bound']:.1%}{seen}"
    if None not in (ratio, lo, hi):
        said += f"; measured {1 - ratio:.1%} [{1 - hi:.1%}, {1 - lo:.1%}]"
    return said
