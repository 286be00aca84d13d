"""Is a level's answer known, and what next: another round, a larger block, or stop?

The stopping rule that `measure/interleave.py` asks between rounds, and the record of how precise each level's
paired speedup came out (crossover.json, the table, MLflow). Both read the same paired interval
(`analysis/paired.py`), so the half-width a level stops on is the one it reports.

The rule is a fixed-width sequential interval (Chow and Robbins, 1965): after `min_rounds` rounds (at least 3,
so the rounds' own spread enters the interval), rounds are added until the paired t interval's relative
half-width is at most the target, judged after complete A B | B A cycles (`measure.interleave.judged_after`),
or the level's budget (rounds, seconds) is spent. The stop depends on the
interval's width only, never on where the estimate lies, and the width rests on at least min_rounds - 1 degrees
of freedom: `benchmarks/precision_coverage.py` measures its coverage on synthetic sweeps with a known speedup.

What a round costs and what it buys sets its size. One round's d varies by `within` (its two blocks' own
sampling noise: which prompts it drew, the requests' own spread, which shrinks with more requests per block)
plus `between` (the host's and the instances' time-to-time variation, which does not). Per round, a block of
m requests takes o + a m seconds (o: warm-up, ramp, thaw, idle probe). The time to reach a target is
proportional to (o + a m)(W / m + B), W = within x m: least at m* = sqrt(o W / (a B)) (the classical optimal
allocation of a two-stage sample). So a level whose spread is the prompts' (vLLM C=1) grows its blocks, and a
level whose spread is the host's (vLLM C=64) adds rounds. Under a seconds budget the size is the one whose rounds
that still fit give the narrowest expected interval (`budgeted_growth`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from scipy import special

from specsweep.analysis.bootstrap import METRICS, THROUGHPUT, bootstrap_cell
from specsweep.analysis.cells import Cell, request_arrays, summary_windows
from specsweep.analysis.paired import PairedEstimate, Rounds, paired_estimate
from specsweep.analysis.verdict import levels_text
from specsweep.config import defaults
from specsweep.measure.rounds import BUDGET_SPENT, CYCLE_ROUNDS, VERDICT_DECIDED, least_rounds, looks
from specsweep.measure.segments import merged_level
from specsweep.records import SegmentDecision

if TYPE_CHECKING:  # the measuring path (client, servers): not imported by the analysis jobs
    from specsweep.measure.interleave import LevelProgress


# The verdict stop's Bonferroni counts at most this many looks: over the 19 of max_rounds 40 its 99.7% intervals
# stopped a tenth of the drifting levels a verdict could stop, over 4 (98.75%) 44%, with the same coverage of the
# 95% intervals (94.7% of 11,000 synthetic levels either way; benchmarks/precision_coverage.py --max-rounds 40)
VERDICT_LOOKS = 4


@dataclass(frozen=True)
class PrecisionSettings:
    """The config's `precision:` block (a target of None: fixed rounds, `repeats` of them)."""

    target: float | None  # the paired speedup's 95% half-width, relative (0.05: +-5%)
    min_rounds: int
    max_rounds: int
    max_level_s: float | None  # seconds of measuring per level (every arm's blocks), None: no time budget
    max_block_growth: int  # the largest block, in multiples of the configured requests per block
    confidence: float = 0.95
    decide_margin: float | None = None  # stop once every arm's verdict is outside 1 +- this (None: width only)
    # a policy level's (`config.proof_precision`): stop once its proof is decided at this margin, not on the width
    proof_margin: float | None = None
    level_s_from: str = "max_level_s"  # what set max_level_s: the level's own, or the run's budget (its share)

    @classmethod
    def from_config(cls, precision: dict[str, Any], instances: int = 1) -> PrecisionSettings:
        """With server instances, at least two rounds per instance (both arm orders on every instance)."""
        return cls(
            target=precision["target"],
            min_rounds=least_rounds(int(precision["min_rounds"]), instances),
            max_rounds=int(precision["max_rounds"]),
            max_level_s=precision.get("max_level_s"),
            max_block_growth=int(precision["max_block_growth"]),
            # a cell's spec holds it only where it is not the default (`config._precision_key`)
            decide_margin=precision.get("decide_margin", defaults("precision")["decide_margin"]),
            proof_margin=precision.get("proof_margin"),
        )

    @property
    def looks(self) -> int:
        """The looks the verdict stop spreads its error rate over: those the rule may take at a level (after
        complete cycles, from min_rounds to max_rounds), at most VERDICT_LOOKS."""
        return min(VERDICT_LOOKS, looks(self.min_rounds, self.max_rounds))


@dataclass(frozen=True)
class Components:
    """The variance of one round's d (log ratio), split: what more requests per block shrink (`within`) and
    what only more rounds shrink (`between_round`), plus the server instances' own (`between_instance`)."""

    within: float
    between_round: float
    between_instance: float | None  # None: one instance
    # the reference arm's own log value across rounds beyond its blocks' noise: the time between blocks (host,
    # engine), seen in the one arm whose configuration and content do not change from round to round
    reference_between: float | None = None


def components(rounds: Rounds) -> Components | None:
    """Method-of-moments split of the rounds' d: within = the mean of the rounds' blocks' noise; between rounds =
    what the rounds' spread (within instances) has beyond it; between instances = what the instances' means
    have beyond the rounds' (one-way random effects). The blocks' noise is the mean over the rounds that have it:
    a block whose bootstrap cannot be put on the log scale (a resample of empty time blocks, from a short bursty
    window) leaves its round without one, not the level. None without two rounds or any round's blocks' noise."""
    d, w = rounds.d, rounds.within
    known = w[np.isfinite(w)]
    if d.size < 2 or known.size == 0:
        return None
    within = float(np.mean(known))
    reference = _reference_between(rounds)
    groups = _by_instance(d, rounds.instance)
    resid_df = d.size - len(groups)
    if len(groups) == 1:
        return Components(within, max(0.0, float(np.var(d, ddof=1)) - within), None, reference)
    ms_within = float(sum(((g - g.mean()) ** 2).sum() for g in groups)) / resid_df if resid_df > 0 else float("nan")
    n0 = d.size / len(groups)
    ms_between = float(sum(g.size * (g.mean() - d.mean()) ** 2 for g in groups)) / (len(groups) - 1)
    between_round = max(0.0, ms_within - within) if math.isfinite(ms_within) else 0.0
    between_instance = max(0.0, (ms_between - (ms_within if math.isfinite(ms_within) else 0.0)) / n0)
    return Components(within, between_round, between_instance, reference)


def _by_instance(values: np.ndarray, instance: tuple[int, ...]) -> list[np.ndarray]:
    """The rounds' values grouped by the server instance each ran on."""
    return [values[[i for i, k in enumerate(instance) if k == inst]] for inst in sorted(set(instance))]


def _reference_between(rounds: Rounds) -> float | None:
    """The reference arm's round-to-round variance beyond its blocks' own noise (within server instances)."""
    ref, noise = rounds.reference, rounds.reference_within
    if ref is None or noise is None or ref.size < 2 or not np.any(np.isfinite(noise)):
        return None
    groups = _by_instance(ref, rounds.instance)
    resid_df = ref.size - len(groups)
    if resid_df < 1:
        return None
    spread = float(sum(((g - g.mean()) ** 2).sum() for g in groups)) / resid_df
    return max(0.0, spread - float(np.mean(noise[np.isfinite(noise)])))


@dataclass(frozen=True)
class LevelPrecision:
    """How precise a level's paired speedup came out against its target, and what it cost."""

    target: float | None
    half_width: float | None  # relative, of the 95% interval; None: no interval
    met: bool
    budget_spent: bool  # stopped by max_rounds or max_level_s before the target was met
    decided: bool  # stopped when its verdict was known, before the target was met (precision.decide_margin)
    rounds: int
    requests: int | None  # measured requests per arm, every round
    block_growth: int  # the last round's requests per block over the configured ones
    components: Components | None
    rounds_for_target: int | None  # what the rounds' variance implies at the last block size (None: unknown)
    unit: str = "round"  # what `rounds` and `rounds_for_target` count: rounds, or server instances per arm

    def as_dict(self) -> dict[str, Any]:
        c = self.components
        return {
            "target": self.target,
            "half_width": self.half_width,
            "met": self.met,
            "budget_spent": self.budget_spent,
            "decided": self.decided,
            "rounds": self.rounds,
            "requests": self.requests,
            "block_growth": self.block_growth,
            "within_round_var": c.within if c else None,
            "between_round_var": c.between_round if c else None,
            "between_instance_var": c.between_instance if c else None,
            "reference_between_round_var": c.reference_between if c else None,
            "rounds_for_target": self.rounds_for_target,
            "unit": self.unit,
        }


MAX_UNITS = 100_000


def units_for(per_unit_var: float, target: float, confidence: float = 0.95, most: int = MAX_UNITS) -> int | None:
    """The fewest units (rounds, server instance pairs) whose t interval of the mean log ratio is within
    `target`, each unit's log ratio varying by `per_unit_var` (None: more than `most`)."""
    if not math.isfinite(per_unit_var) or per_unit_var < 0:
        return None
    goal = math.log1p(target)
    for n in range(2, most + 1):
        if float(special.stdtrit(n - 1, 0.5 + confidence / 2)) * math.sqrt(per_unit_var / n) <= goal:
            return n
    return None


def rounds_for(pe: PairedEstimate, target: float, confidence: float = 0.95) -> int | None:
    """Rounds the estimate's own per-round variance needs for `target` (the t quantile at that many rounds)."""
    if pe.rounds is None or not math.isfinite(pe.log_se) or pe.log_se <= 0:
        return None
    return units_for(pe.log_se**2 * pe.rounds.d.size, target, confidence)


def assess(
    pe: PairedEstimate | None,
    target: float | None,
    confidence: float,
    requests: int | None,
    block_growth: int,
    budget_spent: bool,
    decided: bool = False,
) -> LevelPrecision:
    """The level's precision from its paired estimate."""
    hw = pe.half_width(confidence) if pe is not None else float("nan")
    met = target is not None and math.isfinite(hw) and hw <= target
    return LevelPrecision(
        target=target,
        half_width=hw if math.isfinite(hw) else None,
        met=met,
        budget_spent=budget_spent and not met,
        decided=decided and not met,
        rounds=pe.rounds.d.size if pe is not None and pe.rounds is not None else (pe.pairs if pe else 0),
        requests=requests,
        block_growth=block_growth,
        components=components(pe.rounds) if pe is not None and pe.rounds is not None else None,
        rounds_for_target=rounds_for(pe, target, confidence) if pe is not None and target else None,
    )


def level_precision(cell: Cell | None, pe: PairedEstimate | None, confidence: float) -> LevelPrecision | None:
    """A paired level's precision as the analysis reports it: its own interval against the target it was measured
    for (the rounds' log in its summary; none: fixed rounds), what it spent, and its variance components."""
    if cell is None or pe is None:
        return None
    if pe.rounds is None:
        return _segments_precision(cell, pe, confidence)
    log = (cell.summary.get("pairing") or {}).get("precision")
    if log is None:
        return assess(pe, None, confidence, None, 1, False)
    sizes = [int(n) for n in log["block_requests"]]
    last = str(log["decisions"][-1]) if log["decisions"] else ""
    return assess(
        pe,
        log["target"],
        confidence,
        sum(sizes),
        sizes[-1] // sizes[0],
        last.startswith(BUDGET_SPENT),
        last.startswith(VERDICT_DECIDED),
    )


def _segments_precision(cell: Cell, pe: PairedEstimate, confidence: float) -> LevelPrecision | None:
    """A sequential level measured by the segment rule (precision.max_instances): its interval over the arms'
    instances against its target, and the instances per arm its variance implies. None: fixed instances."""
    log = (cell.summary.get("pairing") or {}).get("instance_log")
    if log is None or pe.unit != "instance":
        return None
    hw = pe.half_width(confidence)
    met = math.isfinite(hw) and hw <= log["target"]
    # each answer reads "i<k>: <decision>"
    last = str(log["decisions"][-1]).split(": ", 1)[-1] if log["decisions"] else ""
    spent = last.startswith(BUDGET_SPENT)
    ok = math.isfinite(pe.log_se) and pe.log_se > 0
    return LevelPrecision(
        target=log["target"],
        half_width=hw if math.isfinite(hw) else None,
        met=met,
        budget_spent=spent and not met,
        decided=last.startswith(VERDICT_DECIDED) and not met,
        rounds=pe.pairs,
        requests=None,
        block_growth=1,
        components=None,
        rounds_for_target=units_for(pe.log_se**2 * pe.pairs, log["target"], confidence) if ok else None,
        unit="instance",
    )


@dataclass(frozen=True)
class RoundCost:
    """What the level's rounds took: seconds per round (every arm's blocks) and the requests in each block."""

    seconds: list[float]
    requests: list[int]  # measured requests per block, each round
    overhead_s: float  # per round, besides its requests: warm-up, ramp, thaw, idle probe (every arm)


@dataclass(frozen=True)
class Next:
    """The rule's answer after a round: stop (and why), or measure another round with `growth` x the
    configured requests per block."""

    stop: bool
    reason: str
    growth: int


def block_growth(comp: Components | None, cost: RoundCost, growth: int, max_growth: int) -> int:
    """The next round's block size (in configured blocks) that reaches the target soonest: m* = sqrt(o W / (a B))
    (module docstring), never smaller than the current one (smaller blocks would have more of the ramp's and
    warm-up's share), at most `max_growth`."""
    if comp is None or growth >= max_growth:
        return growth
    m_now = cost.requests[-1]
    per_request_s = max(1e-9, (cost.seconds[-1] - cost.overhead_s) / m_now)
    w_per_request = comp.within * m_now
    if comp.between_round <= 0:
        best = max_growth if cost.overhead_s > 0 and comp.within > 0 else growth
    else:
        m_star = math.sqrt(cost.overhead_s * w_per_request / (per_request_s * comp.between_round))
        best = round(m_star / (m_now / growth))
    return int(min(max_growth, max(growth, best)))


def budgeted_growth(
    pe: PairedEstimate, comp: Components, cost: RoundCost, growth: int, max_growth: int, settings: PrecisionSettings
) -> int | None:
    """Under a seconds budget: the block size (in configured blocks, from the current one to `max_growth`) whose
    rounds that still fit give the narrowest expected interval; None where not one more round fits. m* alone can
    grow a block so far that the budget then holds one round of it: on the vLLM example C=64 grew 4x after three
    rounds and stopped at four (t with 3 degrees of freedom), where two more rounds of the same size would have
    given a narrower interval. Expected: the past rounds' variance as measured, each new round's
    within / g + between_round, the mean's t interval at the rounds it would then rest on."""
    assert settings.max_level_s is not None
    n = len(cost.seconds)
    left_s, left_rounds = settings.max_level_s - sum(cost.seconds), settings.max_rounds - n
    per_request_s = max(1e-9, (cost.seconds[-1] - cost.overhead_s) / cost.requests[-1])
    configured = cost.requests[-1] / growth
    past = pe.log_se**2 * n**2  # the past rounds' summed variance (the mean's variance is that over n^2)
    w_per_request = comp.within * cost.requests[-1]
    best: tuple[float, int] | None = None
    for g in range(growth, max(growth, max_growth) + 1):
        k = min(left_rounds, int(left_s // (cost.overhead_s + per_request_s * configured * g)))
        if k < 1:
            continue
        var = (past + k * (w_per_request / (configured * g) + comp.between_round)) / (n + k) ** 2
        hw = float(special.stdtrit(n + k - 1, 0.5 + settings.confidence / 2)) * math.sqrt(var)
        if best is None or hw < best[0] * (1 - 1e-9):
            best = (hw, g)
    return best[1] if best is not None else None


def stop_width(pe: PairedEstimate, confidence: float) -> float:
    """The half-width the rule stops on: the interval's, its variance at least the blocks' own noise (the mean
    of the rounds' `within`; same degrees of freedom). The interval itself rests on the rounds' spread alone;
    stopping on that alone picks the rounds whose spread came out small by chance, and those under-cover
    (module docstring). The blocks' noise comes from inside the blocks, not from the rounds' agreement, so
    asking it too stops no level early on a lucky spread; where it overstates (short steady windows), the level
    only measures longer, and its blocks grow."""
    if not math.isfinite(pe.log_se) or pe.df < 1:
        return float("nan")
    var = pe.log_se**2
    if pe.rounds is not None and np.all(np.isfinite(pe.rounds.within)):
        var = max(var, float(pe.rounds.within.sum()) / pe.rounds.d.size**2)
    return math.expm1(float(special.stdtrit(pe.df, 0.5 + confidence / 2)) * math.sqrt(var))


def next_step(
    pe: PairedEstimate | None,
    settings: PrecisionSettings,
    cost: RoundCost,
    growth: int,
    max_growth: int,
    decided: str | None = None,
) -> Next:
    """At a look (after a complete cycle, `judged_after`): stop when the target is met (after min_rounds), the
    verdict is known (`decided`, from `verdict_decided`) or the budget is spent (max_rounds, or the next cycle
    would end past max_level_s), else the next cycle's block size. A level without a target measures min_rounds
    rounds (`repeats`)."""
    n = len(cost.seconds)
    if n < settings.min_rounds:
        return Next(False, "fewer than min_rounds", growth)
    if settings.target is None:
        return Next(True, "fixed rounds", growth)
    hw = stop_width(pe, settings.confidence) if pe is not None else float("nan")
    # a proof's width says nothing of its decision: an A/A pair at +-1.7% may still straddle 1 - margin
    if settings.proof_margin is None and math.isfinite(hw) and hw <= settings.target:
        return Next(True, f"target met: +-{hw:.1%} <= +-{settings.target:.0%}", growth)
    if decided is not None:
        return Next(True, f"{VERDICT_DECIDED} {decided}", growth)
    if n >= settings.max_rounds:
        return Next(True, f"{BUDGET_SPENT} max_rounds {settings.max_rounds}", growth)
    comp = components(pe.rounds) if pe is not None and pe.rounds is not None else None
    largest = min(max_growth, settings.max_block_growth)
    # a proof's pair shares its blocks' prompts, so what larger blocks average cancels in it: rounds, not blocks
    proof = settings.proof_margin is not None
    nxt = growth if proof else block_growth(comp, cost, growth, largest)
    if settings.max_level_s is not None:
        if not proof and pe is not None and comp is not None and math.isfinite(pe.log_se):
            nxt = budgeted_growth(pe, comp, cost, growth, largest, settings) or nxt
        per_request_s = (cost.seconds[-1] - cost.overhead_s) / cost.requests[-1]
        next_s = cost.overhead_s + per_request_s * cost.requests[-1] * nxt / growth
        ahead = min(CYCLE_ROUNDS, settings.max_rounds - n)  # the next look is after a whole cycle
        if sum(cost.seconds) + ahead * next_s > settings.max_level_s:
            return Next(True, f"{BUDGET_SPENT} {settings.level_s_from} {settings.max_level_s:.0f} s", growth)
    if proof:  # its width may be within the target: what goes on is the proof
        ratio = f" {pe.speedup:.3g}" if pe is not None else ""
        return Next(False, f"proof not decided:{ratio}, its interval reaches 1 - {settings.proof_margin:.0%}", nxt)
    return Next(False, f"+-{hw:.1%} > +-{settings.target:.0%}", nxt)


def verdict_decided(
    estimates: dict[str, PairedEstimate | None], margin: float | None, confidence: float, n_looks: int
) -> str | None:
    """Whether the level's verdict is known, and how it reads; None where it is not (or the stop is off).

    Known: every arm's interval against the reference (at the stop's confidence: the interval's error rate spread
    over the `n_looks` the rule may take (Bonferroni), so stopping where a verdict first shows picks no lucky
    interval; the blocks' noise included as the
    width stop takes it) lies wholly above 1 + decide_margin or wholly below 1 - decide_margin, and where several
    arms win, the best one's lower end lies above every other's upper end (the K choice decided). A level far from
    the crossover then stops at its first look (the default run's C=250 read 0.718 [0.672, 0.761]) and the budget
    stays with the levels whose sign is in doubt. The interval reported is the 95% one; stopping only on the wider
    one keeps its coverage (benchmarks/precision_coverage.py)."""
    if margin is None or not estimates:
        return None
    conf = 1 - (1 - confidence) / max(1, n_looks)
    bounds: dict[str, tuple[float, float, float]] = {}
    for arm, pe in estimates.items():
        hw = stop_width(pe, conf) if pe is not None else math.nan
        if pe is None or not math.isfinite(hw):
            return None
        lo, hi = pe.speedup / (1 + hw), pe.speedup * (1 + hw)
        if not (lo > 1 + margin or hi < 1 - margin):
            return None
        bounds[arm] = (pe.speedup, lo, hi)
    winners = {arm: b for arm, b in bounds.items() if b[1] > 1 + margin}
    if len(winners) > 1:
        best = max(winners, key=lambda a: winners[a][0])
        if any(bounds[best][1] <= b[2] for arm, b in winners.items() if arm != best):
            return None
    shown = ", ".join(
        f"{arm} {s:.3g} [{lo:.3g}, {hi:.3g}] {'above 1 +' if lo > 1 else 'below 1 -'} {margin:.0%}"
        for arm, (s, lo, hi) in bounds.items()
    )
    return f"{shown} ({conf:.1%} intervals: {confidence:.0%} over {n_looks} looks)"


def proof_decided(
    estimates: dict[str, PairedEstimate | None], margin: float, confidence: float, n_looks: int
) -> str | None:
    """Whether a policy level's proof is known, and how it reads; None where it is not. Known: the policy arm's
    interval against its reference (the best fixed arm, measured with it), at the confidence `verdict_decided`
    uses (the error rate spread over the looks), lies wholly at or above 1 - margin (holds) or wholly below it
    (fails), as `analysis.proof.judge` reads the 95% one. The interval is the rounds' own, as the proof's: the
    width stop's floor of the blocks' noise (`stop_width`) adds both arms' sampling noise of the round's prompts,
    which the pair shares and cancels (a demo run's A/A levels: +-0.1-1.4% on their rounds, +-1.2-7% with the
    floor). A level of the rule's own caution (inside the crossover interval) is judged there against a lower
    floor, which the measuring job does not know: such a level reads "fails" here or measures to its budget
    (cheap levels: they sit at the crossover)."""
    conf = 1 - (1 - confidence) / max(1, n_looks)
    floor = 1.0 - margin
    shown = []
    for arm, pe in estimates.items():
        hw = pe.half_width(conf) if pe is not None else math.nan
        if pe is None or not math.isfinite(hw):
            return None
        lo, hi = pe.speedup / (1 + hw), pe.speedup * (1 + hw)
        if hi >= floor > lo:
            return None
        side = "above" if lo >= floor else "below"
        shown.append(f"{arm} {pe.speedup:.3g} [{lo:.3g}, {hi:.3g}] {side} 1 - {margin:.0%}")
    if not shown:
        return None
    return f"proof {', '.join(shown)} ({conf:.1%} intervals: {confidence:.0%} over {n_looks} looks)"


def next_pair(
    variant_root: Path,
    level: str,
    arms: list[str],
    instances: int,
    target: float,
    most: int,
    decide_margin: float | None = None,
    confidence: float = 0.95,
) -> SegmentDecision:
    """A sequential level's answer after its first `instances` instance pairs: the arms' cells merged from those
    instances in memory (as `merge-segments` would write them), each speculative arm's paired interval against
    the baseline (`arms[0]`), the widest deciding (`segment_step`)."""
    merged = merged_level(variant_root, level, arms, instances)
    concurrency = int(next(iter(merged.values()))[1]["concurrency"])
    estimates = paired_estimates(merged, concurrency, arms[0])
    widest = widest_estimate(estimates, confidence)
    # a look after every pair from the second on
    decided = verdict_decided(estimates, decide_margin, confidence, max(1, most - 1))
    step = segment_step(widest, target, confidence, instances, most, decided)
    hw = stop_width(widest, confidence) if widest is not None else float("nan")
    return SegmentDecision(
        instances=instances, more=not step.stop, decision=step.reason, half_width=hw if math.isfinite(hw) else None
    )


RULE_REPLICATES = 1000  # the blocks' bootstrap inside the rule (the analysis redoes it with its own count)


class LevelRule:
    """The stopping rule as `measure/interleave.py` asks it: after each complete cycle, the paired interval of the
    level's throughput (the reference arm against each other arm, the widest deciding) from the records so far,
    by the same bootstrap and paired t as the analysis (`paired_estimates`)."""

    def __init__(self, settings: PrecisionSettings, metric: str = THROUGHPUT, share_s: float | None = None) -> None:
        self.settings = settings
        self.metric = next(m for m in METRICS if m.name == metric)
        # the run budget's share for this level's rounds (measure/budget.py); None: no run budget
        self.share_s = share_s

    def settings_now(self) -> PrecisionSettings:
        """The settings the level is judged with: under a run budget, its rounds' seconds are its share of the
        run where that is less than its own max_level_s. The share bounds the rounds, not the job: the servers'
        start is a cost of the run (the first level's job starts the servers every later level reuses), and it
        comes off the run's clock, so off every later level's share, not all off the first level's (the vLLM
        example's first level spent 100 of its 153 s starting three servers and stopped at +-21%, the run ending
        at 538 s of its 1200)."""
        st = self.settings
        if self.share_s is None:
            return st
        share = max(0.0, self.share_s)
        if st.max_level_s is not None and st.max_level_s <= share:
            return st
        return dataclasses.replace(st, max_level_s=share, level_s_from="run budget")

    def __call__(self, progress: LevelProgress) -> Next:
        cells = {arm: (progress.frames[arm], s) for arm, s in progress.summaries.items()}
        estimates = paired_estimates(cells, progress.concurrency, progress.reference_arm, self.metric.name)
        widest = widest_estimate(estimates, self.settings.confidence)
        cost = RoundCost(progress.round_s, progress.round_requests, float(np.mean(progress.round_overhead_s)))
        st = self.settings_now()
        if st.proof_margin is not None:
            decided = proof_decided(estimates, st.proof_margin, st.confidence, st.looks)
        else:
            decided = verdict_decided(estimates, st.decide_margin, st.confidence, st.looks)
        return next_step(widest, st, cost, progress.growth, progress.max_growth, decided)


def paired_estimates(
    cells: dict[str, tuple[pd.DataFrame, dict[str, Any]]], concurrency: int, reference: str, metric: str = THROUGHPUT
) -> dict[str, PairedEstimate | None]:
    """Each other arm's paired interval against `reference` from its records and summary so far (arm -> (records,
    summary)), by the same bootstrap and paired t as the analysis: what both rules judge."""
    m = next(x for x in METRICS if x.name == metric)
    built = {}
    for arm, (frame, summary) in cells.items():
        windows = summary_windows(summary) or None
        built[arm] = Cell(
            arm=arm,
            concurrency=float(concurrency),
            path=Path(arm),
            summary=summary,
            requests=request_arrays(frame, concurrency, windows),
        )
    boots = {arm: bootstrap_cell(c, RULE_REPLICATES, 0, metrics=(m,)) for arm, c in built.items()}
    rng = np.random.default_rng(0)
    return {
        arm: paired_estimate(built[reference], c, boots[reference], boots[arm], m.name, m.higher_is_better, 2, rng)
        for arm, c in built.items()
        if arm != reference
    }


def widest_estimate(estimates: dict[str, PairedEstimate | None], confidence: float) -> PairedEstimate | None:
    """The arm whose interval decides a stop: the widest (None where one arm has no interval)."""

    def width(pe: PairedEstimate | None) -> float:
        hw = stop_width(pe, confidence) if pe is not None else math.nan
        return hw if math.isfinite(hw) else math.inf

    widest = max(estimates.values(), key=width, default=None)
    return widest if widest is not None and math.isfinite(width(widest)) else None


def segment_step(
    pe: PairedEstimate | None, target: float, confidence: float, instances: int, most: int, decided: str | None = None
) -> Next:
    """A sequential level's answer after `instances` instance pairs (each arm on that many server instances, in
    the counterbalanced segment order): stop when its interval is within the target, its verdict is known
    (`decided`, from `verdict_decided`), or at `most` instances (precision.max_instances), else measure one
    more pair. The same stop as the rounds' rule (`stop_width`, on
    the width only), with the instances as its units."""
    hw = stop_width(pe, confidence) if pe is not None else float("nan")
    goal = f"+-{100 * target:g}%"
    if math.isfinite(hw) and hw <= target:
        return Next(True, f"target met: +-{hw:.1%} <= {goal}", 1)
    if decided is not None:
        return Next(True, f"{VERDICT_DECIDED} {decided}", 1)
    if instances >= most:
        return Next(True, f"{BUDGET_SPENT} max_instances {most}", 1)
    shown = f"+-{hw:.1%}" if math.isfinite(hw) else "no interval"
    return Next(False, f"{shown} > {goal}", 1)


def precision_notes(per_level: list[dict[str, Any]], symbol: str) -> list[str]:
    """What the analysis says of its levels' precision, in one line per arm: every level's target met, or the levels
    short of it with the widest (its half-width, rounds, why it stopped, the rounds its variance implies and where
    its spread came from); never one as if it met the target. Each level's own figure is in the table's `+-`
    column and crossover.json `per_level[].precision`."""
    rows = [(r["concurrency"], r["precision"]) for r in per_level if r.get("precision")]
    measured = [(c, p) for c, p in rows if p["target"] is not None]
    if not measured:
        return []
    short = [(c, p) for c, p in measured if not p["met"] and not p.get("decided")]
    # stopped on their verdict short of the target: their intervals are wider than it, and the note says so
    decided = [c for c, p in measured if p.get("decided") and not p["met"]]
    targets = sorted({p["target"] for _, p in measured})
    known = (
        f"; {symbol}={levels_text(decided)} stopped short of it with their verdict known (outside 1 +- the "
        "decide margin)"
        if decided
        else ""
    )
    if not short:
        met = [c for c, p in measured if p["met"]]
        goal = f"+-{targets[-1]:.0%}, 95%"
        if not decided:
            return [f"precision: every level within its target ({goal})"]
        if not met:
            return [f"precision: no level within the target ({goal}){known}"]
        return [f"precision: {symbol}={levels_text(met)} within the target ({goal}){known}"]
    target = "/".join(f"+-{t:.0%}" for t in sorted({p["target"] for _, p in short}))
    # the widest first: a level with no interval at all is wider than any
    c, p = max(short, key=lambda cp: math.inf if cp[1]["half_width"] is None else cp[1]["half_width"])
    hw = f"+-{p['half_width']:.1%}" if p["half_width"] is not None else "no interval"
    why = "its budget spent" if p["budget_spent"] else "the rule's own estimate stopped it"
    units = "server instances per arm" if p.get("unit") == "instance" else "rounds"
    need = f"; its variance implies {p['rounds_for_target']} {units}" if p["rounds_for_target"] else ""
    ruled = [x for x, q in short if not q["budget_spent"]]
    stopped = f"; the rule's own estimate stopped {symbol}={levels_text(ruled)}" if ruled and len(short) > 1 else ""
    return [
        f"precision: {symbol}={levels_text([x for x, _ in short])} short of the target {target} (95%); the widest "
        f"{symbol}={c:g}: {hw} after {p['rounds']} {units} ({why}){need}{_time_spread(p)}{stopped}{known}"
    ]


def _time_spread(p: dict[str, Any]) -> str:
    """Where a short level's spread came from: within its blocks (what larger blocks average: the prompts drawn,
    the requests), or the rounds' ratio beyond that; beside it the baseline's own blocks beyond their noise. The
    baseline serves the same work every round, so its spread is time (the host, the engine's state), which only
    more rounds or a quieter machine shrink. Empty where the components are unknown."""
    within, ratio = p.get("within_round_var"), p.get("between_round_var")
    reference = p.get("reference_between_round_var")
    if within is None or ratio is None:
        return ""
    if ratio <= within:
        said = "; its rounds' spread is mostly within their blocks (what larger blocks average)"
    else:
        said = f"; beyond the blocks' noise the rounds' ratio varied {math.sqrt(ratio):.0%} (SD)"
    if reference is None:
        return said
    alone = math.sqrt(reference)
    return f"{said}, the baseline alone {alone:.0%} (the same work every round: time, the host's or the engine's)"
