"""The loads a schedule covers but the sweep never measured: above the highest level, up to the engine's largest
batch (vLLM's `max_num_seqs`, SGLang's `--max-running-requests`).

A schedule must name every batch size up to that end, so it says something above the highest level too: the
threshold rule switches speculation off there (it does not extrapolate), the per-level rule keeps the highest
level's choice. Either is a default, not a finding: on a short sweep (C=1, 4, 16 of 64 batch slots) where
speculation won at every level, [[1, 16, 3], [17, 64, 0]] would read as "measured: off above 16". So the range is
named wherever the schedule is shown (the schedule job's output, the table, policy.yaml's opening comment and
entries), with the levels that would measure it and the command that adds them.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

__all__ = ["levels_above", "measure_command", "unmeasured_comments", "unmeasured_range"]

MOST_LEVELS = 4  # levels suggested above the highest one: doublings up to the upper end


def levels_above(highest: float, upper: int, most: int = MOST_LEVELS) -> list[int]:
    """Integer levels above `highest`, doubling, up to `upper` (the last one `upper` where the doublings reach it)."""
    out: list[int] = []
    c = int(math.floor(highest))
    while len(out) < most and c < upper:
        c = min(upper, max(c * 2, c + 1))
        out.append(c)
    return out


def measure_command(configured: Sequence[float], add: Sequence[int]) -> str:
    """The command that measures `add` beside the configured levels (a config file on top of the user's own)."""
    levels = sorted({int(c) for c in configured} | {int(c) for c in add})
    return (
        f"printf 'concurrency: {levels}\\n' > measure-above.yaml && "
        "snakemake --cores 1 crossover --configfile <your config> measure-above.yaml"
    )


def _k_at(schedule: list[list[int]], level: float) -> int | None:
    return next((int(k) for a, b, k in schedule if a <= level <= b), None)


def unmeasured_range(
    schedule: list[list[int]] | None,
    highest: float | None,
    configured: Sequence[float],
    evidence: str = "",
) -> dict[str, Any] | None:
    """The schedule's range above the highest measured level, what it serves there and why that is not measured,
    with the levels and the command that would measure it; None where the sweep reaches the schedule's end.
    `evidence`: what was measured at the highest level, in words (e.g. the best arm's speedup there)."""
    if not schedule or highest is None or not math.isfinite(highest):
        return None
    first, last = int(math.floor(highest)) + 1, int(schedule[-1][1])
    if first > last:
        return None
    k, k_top = _k_at(schedule, first), _k_at(schedule, highest)
    if k is None:
        return None
    above = sorted({int(x) for a, b, x in schedule if b >= first})
    served = f"K={k}" if len(above) == 1 else "K=" + "/".join(map(str, above))
    where = f"running requests {first}-{last} lie above the highest measured level (C={highest:g})"
    if len(above) == 1 and k == k_top:
        why = f"{served} there continues the choice measured at C={highest:g}, not a measurement"
    else:
        why = f"{served} there is the rule's default (no extrapolation), not a measurement" + (
            ": speculation is switched off there untested" if above == [0] else ""
        )
    add = levels_above(highest, last)
    seen = f" ({evidence})" if evidence else ""
    return {
        "first": first,
        "last": last,
        "k": k,
        "highest_measured": highest,
        "note": f"{where}{seen}: {why}",
        "add_levels": add,
        "command": measure_command(configured, add),
    }


def unmeasured_comments(policy: dict[str, Any]) -> str:
    """policy.yaml's comment lines, read before anything is pasted: every entry whose schedule covers loads above
    the highest measured level, with the command that measures them. Empty where none does."""
    out = []
    for group in ("arms", "schedules"):
        for name, entry in (policy.get(group) or {}).items():
            u = (entry or {}).get("unmeasured")
            if u:
                out += textwrap.wrap(f"NOT MEASURED ({group}.{name}): {u['note']}. To measure:", 110)
                out.append(f"  {u['command']}")  # one line, to copy as it is
    return "".join(f"# {line}\n" for line in out)
