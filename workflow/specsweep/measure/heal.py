"""Cells that heal themselves: a cell judged invalid only for a transient cause is measured again, every attempt
kept on disk, and the cell says which attempt counts and why the others did not.

Why here and not in the analysis: the analysis judges stored records and stays free to rerun (a gate change
re-judges, it never re-measures); only the job that holds the server can measure again, while it still holds it.
Transient means the host, not the engine: other processes on the measured CPUs, a starved or saturated client,
host jitter in the client's loop, a server given less of its CPUs or GPUs in some blocks than in its others.
Server errors, short outputs, prefix-cache hits, shared CPUs and a closed
loop that did not reach its concurrency are the engine's or the config's doing: measuring again would repeat
them, so they end the attempts at once.

An interleaved level measures again only the rounds a transient cause spoiled (`transient_rounds`): a busy spell
of seconds in one round of a level that took minutes costs that round, not the level.

`measure_until_valid` knows nothing of cells: the pipeline's cell job and an interleaved measuring path both call
it with their own `measure_once`, `judge` and `keep`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

SLOWED_PREFIX = "server slowed:"  # specsweep.measure.gates.server_state_gate's reasons
# Reason texts of specsweep.measure.gates.validity that the host causes (their start, after any "repeat N: " prefix).
TRANSIENT_PREFIXES = (
    "machine busy:",
    "client saturated:",
    "client starved:",
    "client event-loop lag",
    "client sent late:",
    SLOWED_PREFIX,  # a block whose server got less of its CPUs or GPUs than its other blocks (gates)
)
# ...and those other work causes, which a wait for quiet CPUs can outlast (a saturated client or a lagging loop is
# the client's own load: measuring again may pass, waiting does not help).
OTHER_WORK_PREFIXES = ("machine busy:", "client starved:")
DRIFT_PREFIX = "drift:"
# a reason's prefix: an interleaved level's [arm], then the round (repeat) it names, where it names one
_REPEAT = re.compile(r"^(?:\[[^\]]+\] )?(?:repeat (\d+): )?")
JUDGE_ENV = "SPECSWEEP_CELL_JUDGE"  # {"gates": ..., "attempts": N}: set by the Snakefile for the cell jobs


def is_transient(reason: str) -> bool:
    """Whether one validity reason is the host's doing (measuring again can clear it)."""
    return _REPEAT.sub("", reason).startswith(TRANSIENT_PREFIXES)


def is_drift(reason: str) -> bool:
    """Whether a validity flag is an interleaved level's drift (`gates.block_drift_gate`)."""
    return _REPEAT.sub("", reason).startswith(DRIFT_PREFIX)


def is_server_slowed(reason: str) -> bool:
    """Whether one validity reason is a block served by a slowed server (`gates.server_state_gate`)."""
    return _REPEAT.sub("", reason).startswith(SLOWED_PREFIX)


def transient_only(reasons: list[str]) -> bool:
    """An invalid verdict that measuring again can clear: at least one reason, every one transient."""
    return bool(reasons) and all(is_transient(r) for r in reasons)


def transient_rounds(reasons: list[str]) -> tuple[int, ...] | None:
    """The rounds an interleaved level measures again: each round a transient reason names, where every reason
    is transient and names its round (None: a cause that is not the host's, or one of the whole level)."""
    if not transient_only(reasons):
        return None
    rounds = [m.group(1) for m in map(_REPEAT.match, reasons) if m]
    if len(rounds) < len(reasons) or None in rounds:
        return None
    return tuple(sorted({int(r) for r in rounds}))


@dataclass
class Attempts(Generic[T]):
    """The attempt that counts (`result`, 1-based `counted`) and what every attempt was judged."""

    result: T
    counted: int
    log: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The summary's `attempts` block: which attempt counts, why, and each attempt's verdict."""
        last = self.log[self.counted - 1]
        if last["valid"]:
            why = "the first valid attempt" if self.counted > 1 else "valid at the first attempt"
        elif last.get("not_again"):
            why = f"still invalid, and not measured again: {last['not_again']}"
        elif not transient_only(last["reasons"]):
            why = "invalid for a cause measuring again does not clear (not the host's doing)"
        else:
            why = "still invalid for a transient cause after the last attempt allowed"
        return {"counted": self.counted, "why": why, "made": len(self.log), "log": self.log}


def measure_until_valid(
    measure_once: Callable[[int], T],
    judge: Callable[[T], Mapping[str, Any]],
    attempts: int,
    keep: Callable[[int, T], str | None] | None = None,
    before_retry: Callable[[int], dict[str, Any]] | None = None,
    may_retry: Callable[[], bool] | None = None,
) -> Attempts[T]:
    """Measure (`measure_once(n)`, n = 1, 2, ...) until `judge` (a validity: {valid, reasons}) says valid, a
    reason is not transient, or `attempts` are made. `keep(n, result)` stores a superseded attempt before the
    next starts (nothing measured is lost) and returns where; `before_retry(n)` runs before attempt n > 1 when
    other work made the last one invalid (e.g.
    `wait_for_quiet`: a busy spell lasts longer than a cell, so measuring again at once would meet it again) and
    what it returns is logged with that attempt. The last attempt counts (the caller writes it as the
    cell): the valid one, or the one after which measuring again could not help. `may_retry()`: whether the run's
    budget leaves room for another attempt (None: always); where it does not, the attempt counts and says so."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts} (config: cell_attempts)")
    log: list[dict[str, Any]] = []
    for n in range(1, attempts + 1):
        other_work = n > 1 and any(_REPEAT.sub("", r).startswith(OTHER_WORK_PREFIXES) for r in log[-1]["reasons"])
        waited = before_retry(n) if before_retry is not None and other_work else None
        result = measure_once(n)
        v = judge(result)
        entry: dict[str, Any] = {"attempt": n, "valid": bool(v["valid"]), "reasons": list(v["reasons"])}
        if v.get("rounds_measured"):  # an interleaved level's attempt that measured some rounds again, not all
            entry["rounds_measured"] = list(v["rounds_measured"])
        if waited is not None:
            entry["before"] = waited
        log.append(entry)
        if v["valid"] or not transient_only(entry["reasons"]) or n == attempts:
            entry["counts"] = True
            return Attempts(result, n, log)
        if may_retry is not None and not may_retry():
            entry["counts"] = True
            entry["not_again"] = (
                "the level's share of the run's budget is spent, and the levels after it need the rest (budget.run_s)"
            )
            return Attempts(result, n, log)
        entry["counts"] = False
        if keep is not None:  # superseded: stored before the next attempt starts
            entry["kept_at"] = keep(n, result)
    raise AssertionError("unreachable: the loop returns at its last attempt")


def wait_for_quiet(
    cpus: tuple[int, ...] | None, max_share: float, timeout_s: float = 30.0, window_s: float = 1.0
) -> dict[str, Any]:
    """Wait until the CPUs a cell measures on are idle (busy share at most `max_share` over a `window_s` window:
    between attempts the server and client do nothing, so what is busy there is other work), or `timeout_s`.
    Returns what it saw: {waited_s, busy_share (the last window), quiet}."""
    import time

    import psutil

    start = time.monotonic()
    while True:
        per = psutil.cpu_times_percent(interval=window_s, percpu=True)
        chosen = [per[c] for c in cpus if c < len(per)] if cpus else per
        busy = sum(100.0 - t.idle - getattr(t, "iowait", 0.0) for t in chosen) / (100.0 * max(1, len(chosen)))
        waited = time.monotonic() - start
        if busy <= max_share or waited >= timeout_s:
            return {"waited_s": round(waited, 1), "busy_share": round(busy, 3), "quiet": busy <= max_share}


def judge_settings(env: Mapping[str, str] | None = None) -> tuple[dict[str, Any] | None, int]:
    """(gates, attempts) the workflow gave the cell jobs (`JUDGE_ENV`); (None, 1) for a cell run by hand: without
    the experiment's gates a cell cannot know what its analysis will call valid, so it measures once."""
    raw = (os.environ if env is None else env).get(JUDGE_ENV)
    if not raw:
        return None, 1
    try:
        data = json.loads(raw)
        return dict(data["gates"]), int(data["attempts"])
    except (ValueError, KeyError, TypeError) as e:
        why = f"{JUDGE_ENV} is not {{'gates': ..., 'attempts': N}} ({e})"
        raise ValueError(f"{why}: unset it, or let snakemake set it") from None


def judge_env(config: Mapping[str, Any]) -> str:
    """The value of `JUDGE_ENV` for a validated config."""
    return json.dumps({"gates": config["gates"], "attempts": int(config["cell_attempts"])}, sort_keys=True)
