"""The run's budget (`budget.run_s`): how many seconds of it a level may still spend.

Why: each level's own budget (`precision.max_level_s`, `max_rounds`) bounds that level, and nothing bounds the run;
on a host that will not sit still every level spent its own and the vLLM example ran past 40 minutes. With a budget
for the run, the workflow starts a clock when it starts executing jobs (`Snakefile` `onstart`: the time left and the
levels still to measure, through the environment, not a rule param, so that a budget change re-measures nothing) and
each measuring job asks, before its level, what is left: the run's seconds less the share kept for what follows the
measuring (analysis, MLflow), less what has passed, spread over the levels not yet measured, this one included: a
fixed arms' level one share, a policy level half of one (its proof is of a schedule the fixed arms already decided,
and where the schedule is one K no policy level runs at all). The share bounds the level's rounds
(`analysis.precision.LevelRule`): the servers' start is the run's cost (the first level's job starts the servers the
later levels reuse), off the run's clock and so off every later share. A level that stops early (its target met, its
verdict known) leaves its seconds to the levels after it: the added levels inside the crossover interval and the
policy levels, which come last. A level still measures its `min_rounds` (fewer rounds give no interval), so a budget
below that overruns, and the run's final lines say by how much. Measuring a level's spoiled rounds again
(`measure/heal.py`) starts within the level's share, or past it where the run has room (`room_for`: the levels after
it projected at what those done took).

A sequential (GPU) variant's levels measure their `pairing.instances` pairs, then the segment rule asks for another
pair where a level's answer is not known; under the budget a pair starts only where its GPU time (its servers'
starts and closed loops, estimated from the pairs measured) fits in the measuring seconds left (`bound_pair`).

The ledger (`<results>/<experiment>/budget/<run>.jsonl`, one line per level done) counts the levels this run has
measured, so a level knows how many remain after it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specsweep.measure.rounds import BUDGET_SPENT
from specsweep.records import SegmentDecision

BUDGET_ENV = "SPECSWEEP_RUN_BUDGET"
AFTER_MEASURING_SHARE = 0.15  # of the run's budget, kept for the jobs after the last level (analysis, MLflow, plots)
POLICY_LEVEL_SHARE = 0.5  # a policy level's share against a fixed arms' level's


@dataclass(frozen=True)
class RunBudget:
    """The run's clock as the workflow started it."""

    run_s: float  # the whole run's seconds (budget.run_s)
    started_unix: float  # when the workflow started executing jobs
    levels: float  # level shares still to measure when it started (an estimate: added and policy levels may not run)
    ledger: str  # the run's ledger: one JSON line per level measured

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> RunBudget | None:
        """The run's budget where the workflow set one (None: no budget, or a job run by hand)."""
        raw = os.environ.get(BUDGET_ENV)
        return cls(**json.loads(raw)) if raw else None


@dataclass(frozen=True)
class Allowance:
    """What one level may spend now, and what it rests on (logged in the level's decisions)."""

    seconds: float  # for this level's job, its servers' start included; <= 0: the run's budget is spent
    left_s: float  # the run's measuring seconds left
    remaining: float  # level shares still to measure, this one's included

    def text(self) -> str:
        share, left = max(0.0, self.seconds), self.left_s
        return f"run budget: {share:.0f} s for this level ({left:.0f} s left over {self.remaining:g} level shares)"


def done_levels(budget: RunBudget) -> list[dict]:
    path = Path(budget.ledger)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def allowance(budget: RunBudget, share: float = 1.0, now: float | None = None) -> Allowance:
    """This level's part (`share`: 1, or POLICY_LEVEL_SHARE) of what is left of the run's measuring seconds."""
    now = time.time() if now is None else now
    left = measuring_left(budget, now)
    done = sum(float(d.get("share", 1.0)) for d in done_levels(budget))
    remaining = max(share, budget.levels - done)
    return Allowance(left * share / remaining, left, remaining)


def room_for(budget: RunBudget, seconds: float, share: float = 1.0, now: float | None = None) -> bool:
    """Whether `seconds` more for this level (measuring rounds again) still leave the run within its measuring
    seconds: the levels after it projected at what the levels done so far took per share. Why: a level's share
    is an equal split of an estimate, and the levels spend it unequally (the demo's C=1 levels take a third of
    their share, its C=250 levels more than theirs); a retry the run has room for is not refused because one
    level's share is spent. Unknown (no level done yet): no room beyond the share."""
    now = time.time() if now is None else now
    done = done_levels(budget)
    spent_shares = sum(float(d.get("share", 1.0)) for d in done)
    if not done or spent_shares <= 0:
        return False
    per_share = sum(float(d["seconds"]) for d in done) / spent_shares
    left = measuring_left(budget, now)
    after = max(0.0, budget.levels - spent_shares - share)
    return seconds + after * per_share <= left


def measuring_left(budget: RunBudget, now: float | None = None) -> float:
    """The run's measuring seconds left: its seconds less the share kept for the jobs after measuring, less what
    has passed."""
    now = time.time() if now is None else now
    return budget.run_s * (1 - AFTER_MEASURING_SHARE) - (now - budget.started_unix)


def bound_pair(answer: SegmentDecision, budget: RunBudget, pair_s: float, now: float | None = None) -> SegmentDecision:
    """The segment rule's answer within the run's budget: another instance pair at a sequential level (GPU time:
    its servers' starts and its closed loops, `segments.pair_seconds`) only where it fits in the measuring
    seconds left; otherwise the level stops at the pairs it has, saying so (its notes then say its budget was
    spent and the pairs its spread implies). Pairs go, in the order the checkpoints ask, only to levels whose
    answer is not yet known: the rule asks for none where the target is met or the verdict decided."""
    left = measuring_left(budget, now)
    if not answer.more or pair_s <= left:
        return answer
    why = (
        f"{BUDGET_SPENT} run budget {budget.run_s:.0f} s: another instance pair (~{pair_s:.0f} s, its servers' "
        f"starts included) does not fit the {max(0.0, left):.0f} s of measuring left ({answer.decision})"
    )
    return answer.model_copy(update={"more": False, "decision": why})


def record_level(budget: RunBudget, level: str, seconds: float, rounds: int | None, share: float = 1.0) -> None:
    """One line in the run's ledger: appended in one write (levels measured in parallel append whole lines)."""
    path = Path(budget.ledger)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"level": level, "share": share, "seconds": round(seconds, 3), "rounds": rounds, "end_unix": time.time()}
    line = json.dumps(entry)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def spent_text(budget: RunBudget, now: float | None = None) -> str:
    """How the run spent its budget: the run's seconds against it, the levels measured and their seconds."""
    now = time.time() if now is None else now
    done = done_levels(budget)
    took = now - budget.started_unix
    measured = sum(float(d["seconds"]) for d in done)
    over = took - budget.run_s
    verdict = f"over it by {over:.0f} s ({100 * over / budget.run_s:.0f}%)" if over > 0 else "within it"
    return (
        f"run budget {budget.run_s:.0f} s: the run took {took:.0f} s, {verdict}; {len(done)} levels measured in "
        f"{measured:.0f} s (their blocks, servers and process), the rest analysis, tracking and Snakemake"
    )
