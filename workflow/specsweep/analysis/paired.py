"""The speedup of two arms measured in interleaved blocks (specsweep.measure.interleave): a paired t over the rounds.

Every round holds one block of each arm, the order reversed from round to round (A B | B A). Each round gives
d = log(compared block) - log(reference block), and the speedup is exp(mean d): a drift that is linear over the
level enters the rounds with alternating signs and cancels in the mean over an even number of rounds (an odd
number leaves one round's share of it); it is not removed from the d's spread, so it widens the interval instead
of moving it. The interval is a t interval of that mean over the rounds, rounds - 1 degrees of freedom. From
three rounds on (FLOORLESS_ROUNDS) its variance is the rounds' own spread: each round's d carries its own prompts,
its blocks' sampling noise and the host's moment, so their spread is the whole variance, where the blocks' own
bootstrap can overstate it badly (short steady windows deliver tokens in batch steps: the simulated engine's
rounds agreed within 1.5% where their blocks said 12%). With two rounds the blocks' noise is a floor under their
one degree of freedom; with one round it is all there is. It never lends the interval its own many degrees of
freedom: where a few rounds' spread came out small by chance, that covered 53% instead of 95%
(benchmarks/precision_coverage.py). The stopping rule asks it instead (analysis/precision.py).

With several server instances per arm (`pairing.instances`), round r measured every arm on instance k(r), and the
instance's own speed is in that round's d; the rounds of one instance share it, so they are not independent. The
speedup is then the mean over instances of each instance's mean d. Where the rounds show an instance effect (an F
test of the instances' means against the rounds' spread within them, at 50%), the interval is a t over the
instances' means (instances - 1 degrees of freedom: two instances that disagree give a wide interval, which is
what they can tell); where they show none, the rounds are pooled as without instances (the "sometimes pool"
rule of random-effects analysis), with the instances' own share added where their means spread beyond the
rounds (the random-effects variance of the grand mean), so instances that agree cost no width. The pretest's
level is what keeps A/A honest with two instances (benchmarks/precision_coverage.py, 20,000 sweeps): at 5% it
pooled instances that differed and covered 85-88%; at 25%, as Bozivich, Bancroft and Hartley recommend for
larger designs, two instances' A/A levels still excluded 1 in 7.2%; at 50%, in 5.2%, at the price of the
instances' t (one degree of freedom) in more levels whose instances agree.

Why rounds and not each block against both its neighbouring blocks: that cancels a linear drift inside the d's,
but blocks sharing both neighbours are one unit of spread, which leaves rounds / 2 - 1 degrees of freedom: on vLLM
CPU with 3 repeats one unit was left (t = 6.3 at 90%) and C=1's interval went from 0.17 to 7.4 where the rounds'
own d's (1.64, 1.92, 1.33) give 1.18 to 2.18.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from specsweep.analysis.bootstrap import CellBootstrap
from specsweep.analysis.cells import Cell

_MAX_LOG_DRAW = 30.0
FLOORLESS_ROUNDS = 3  # from this many rounds on, their own spread is the variance (no floor under it)
INSTANCE_EFFECT_ALPHA = 0.5  # the pretest of "sometimes pool" (module docstring)


@dataclass(frozen=True)
class Rounds:
    """An interleaved level's rounds as the paired interval sees them: what the stopping rule
    (`analysis/precision.py`) splits into variance components."""

    d: np.ndarray  # each round's log ratio, oriented (> 0: the compared arm better)
    within: np.ndarray  # each round's d variance from its two blocks' own sampling noise (NaN: unknown)
    within_df: int  # degrees of freedom of the blocks' noise estimates, summed
    instance: tuple[int, ...]  # the server instance each round ran on (all 1 without instances)
    # the reference arm's own blocks: each round's log value and its sampling noise (None: not known). The
    # reference is the same configuration every round, so its spread beyond its noise is time: the host, the
    # engine's state, a drift (`precision.components`)
    reference: np.ndarray | None = None
    reference_within: np.ndarray | None = None


@dataclass(frozen=True)
class PairedEstimate:
    """A level's paired speedup of one metric: the point, its replicates, and what it rests on."""

    speedup: float
    replicates: np.ndarray
    pairs: int  # rounds (interleaved: one block of each arm) or server instances (segments)
    df: int  # of the variance used: rounds less one, or the blocks' own
    spread_dominates: bool  # the d's varied more than the blocks' own noise explains (drift or instances)
    unit: str = "round"  # what `pairs` counts: interleaved rounds, or server instances (segments, or interleaved)
    instance_effect: bool | None = None  # interleaved instances: the rounds showed one (its spread set the interval)
    log_se: float = float("nan")  # the standard error of log(speedup) the t interval (df) rests on
    rounds: Rounds | None = None  # interleaved: the rounds themselves

    def half_width(self, confidence: float = 0.95) -> float:
        """The interval's relative half-width, exp(t * se) - 1 (NaN where it has none)."""
        if not np.isfinite(self.log_se) or self.df < 1:
            return float("nan")
        return math.expm1(float(special.stdtrit(self.df, 0.5 + confidence / 2)) * self.log_se)


def pairing_of(cell: Cell) -> dict[str, Any] | None:
    p = cell.summary.get("pairing")
    return p if isinstance(p, dict) and p.get("mode") in ("interleaved", "segments") else None


def paired(base: Cell, other: Cell) -> bool:
    """Whether the two cells were measured together: in one interleaved level job, or merged from one set of
    counterbalanced segments (the same pairing id)."""
    a, b = pairing_of(base), pairing_of(other)
    return a is not None and b is not None and a.get("id") == b.get("id")


def rounds_of(blocks: list[dict[str, Any]], ref_arm: str, arm: str) -> list[int]:
    """The rounds (repeats) in which both arms have a block, in order."""
    have: dict[str, set[int]] = {ref_arm: set(), arm: set()}
    for b in blocks:
        if b["arm"] in have:
            have[b["arm"]].add(int(b["repeat"]))
    return sorted(have[ref_arm] & have[arm])


def round_instance(blocks: list[dict[str, Any]], arm: str) -> dict[int, int]:
    """Round -> the server instance the arm was measured on (interleaved with `pairing.instances`; 1 without)."""
    return {int(b["repeat"]): int(b.get("instance") or 1) for b in blocks if b["arm"] == arm}


def _draws(point: float, var: float, df: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    draws = rng.standard_t(df, size=n_boot) * math.sqrt(var)
    return np.exp(np.clip(point + draws, -_MAX_LOG_DRAW, _MAX_LOG_DRAW))


def _instances_estimate(rounds: Rounds, within: float, n_boot: int, rng: np.random.Generator) -> PairedEstimate:
    """Rounds' log ratios grouped by the instance each round ran on: the mean of the instances' means. An
    instance effect the rounds show (a one-way F test of the instances against the rounds within them, at
    INSTANCE_EFFECT_ALPHA) sets the variance: the instances' means' spread, instances - 1 degrees of freedom.
    Otherwise the rounds, which go through every instance, are pooled: their spread, rounds - 1 degrees of
    freedom, as without instances. One round per instance cannot tell instances from rounds: the instances'
    spread. The blocks' own sampling noise (`within`) is the floor of either."""
    d, on = rounds.d, rounds.instance
    groups = [d[[i for i, k in enumerate(on) if k == inst]] for inst in sorted(set(on))]
    m, n = len(groups), d.size
    means = np.array([g.mean() for g in groups])
    point = float(means.mean())
    resid_df = n - m
    if resid_df >= 1:
        ss_within = float(sum(((g - g.mean()) ** 2).sum() for g in groups))
        ms_between = float(sum(g.size * (g.mean() - d.mean()) ** 2 for g in groups)) / (m - 1)
        f = ms_between / (ss_within / resid_df) if ss_within > 0 else math.inf
        effect = bool(special.fdtrc(m - 1, resid_df, f) < INSTANCE_EFFECT_ALPHA) if math.isfinite(f) else ms_between > 0
    else:
        effect = True
    if effect:
        var, df = float(np.var(means, ddof=1)) / m, m - 1
    else:
        var, df = float(np.var(d, ddof=1)) / n, n - 1
        if resid_df >= 1:  # the instances' own share where their means spread beyond the rounds (random effects)
            ms_within = ss_within / resid_df
            var = max(var, ms_within / n + max(0.0, ms_between - ms_within) / (n / m) / m)
    dominated = not np.isfinite(within) or var >= within
    if n < FLOORLESS_ROUNDS and np.isfinite(within) and within > var and rounds.within_df >= 1:
        var = within  # a floor under two rounds' spread: the degrees of freedom stay the spread's
    return PairedEstimate(
        math.exp(point),
        _draws(point, var, df, n_boot, rng),
        m,
        int(df),
        dominated,
        unit="instance",
        instance_effect=effect,
        log_se=math.sqrt(var),
        rounds=rounds,
    )


def paired_rounds(rounds: Rounds, n_boot: int, rng: np.random.Generator) -> PairedEstimate | None:
    """The paired speedup from a level's rounds: a t over their mean d, with the larger of the rounds' spread
    and the blocks' own noise (module docstring); the instances' estimate where rounds ran on several. None when
    neither variance can be had (one round without its blocks' noise)."""
    d = rounds.d
    n = d.size
    known = bool(np.all(np.isfinite(rounds.within)))
    within = float(rounds.within.sum()) / n**2 if known else float("nan")  # mean(d)'s variance, 1/n each
    if len(set(rounds.instance)) > 1:
        return _instances_estimate(rounds, within, n_boot, rng)
    spread = float(np.var(d, ddof=1)) / n if n >= 2 else float("nan")
    if n >= FLOORLESS_ROUNDS or (n >= 2 and (not known or spread >= within)):
        var, df = spread, n - 1
    elif n >= 2:  # two rounds: the blocks' noise is a floor on their one degree of freedom
        var, df = within, n - 1
    elif known and rounds.within_df >= 1:  # one round: its blocks' noise only (the analysis says so)
        var, df = within, rounds.within_df
    else:
        return None
    dominated = not known or spread >= within
    point = float(np.mean(d))
    return PairedEstimate(
        math.exp(point),
        _draws(point, var, df, n_boot, rng),
        n,
        int(df),
        dominated,
        log_se=math.sqrt(var),
        rounds=rounds,
    )


def _instances(blocks: list[dict[str, Any]], arm: str) -> dict[int, list[int]]:
    """A segmented arm's repeats by server instance."""
    out: dict[int, list[int]] = {}
    for b in blocks:
        if b["arm"] == arm:
            out.setdefault(int(b["instance"]), []).append(int(b["repeat"]))
    return out


def paired_estimate(
    base: Cell,
    other: Cell,
    base_boot: CellBootstrap,
    other_boot: CellBootstrap,
    name: str,
    higher_is_better: bool,
    n_boot: int,
    rng: np.random.Generator,
) -> PairedEstimate | None:
    """The paired speedup of metric `name` (other over base, oriented so that > 1 means `other` is better),
    or None when the cells were not measured together or a block lacks its value."""
    if not paired(base, other):
        return None
    pairing = pairing_of(base)
    assert pairing is not None
    if pairing["mode"] == "segments":
        return _segments_estimate(pairing, base, other, base_boot, other_boot, name, higher_is_better, n_boot, rng)
    rounds = rounds_of(pairing["blocks"], base.arm, other.arm)
    bv, ov = base_boot.repeat_values.get(name, {}), other_boot.repeat_values.get(name, {})
    if not rounds or any(r not in ov or r not in bv for r in rounds):
        return None
    if any(not np.isfinite(v) or v <= 0 for r in rounds for v in (bv[r], ov[r])):
        return None
    sign = 1.0 if higher_is_better else -1.0
    d = np.array([sign * (math.log(ov[r]) - math.log(bv[r])) for r in rounds])
    bvar, ovar = base_boot.repeat_log_var.get(name, {}), other_boot.repeat_log_var.get(name, {})
    within = np.array([bvar[r][0] + ovar[r][0] if r in bvar and r in ovar else np.nan for r in rounds])
    within_df = sum(bvar[r][1] + ovar[r][1] for r in rounds if r in bvar and r in ovar)
    on = round_instance(pairing["blocks"], base.arm)
    reference = np.array([math.log(bv[r]) for r in rounds])
    reference_within = np.array([bvar[r][0] if r in bvar else np.nan for r in rounds])
    instances = tuple(on.get(r, 1) for r in rounds)
    return paired_rounds(Rounds(d, within, int(within_df), instances, reference, reference_within), n_boot, rng)


def _segments_estimate(
    pairing: dict[str, Any],
    base: Cell,
    other: Cell,
    base_boot: CellBootstrap,
    other_boot: CellBootstrap,
    name: str,
    higher_is_better: bool,
    n_boot: int,
    rng: np.random.Generator,
) -> PairedEstimate | None:
    """Arms measured on several server instances in counterbalanced segments (A B | B A, each segment every
    level): the difference of the arms' mean log value over their instances. Its variance is the larger of the
    instances' own spread per arm (Welch: the instance effect and the drift between segments, which the
    counterbalanced order cancels to first order but does not remove) and the blocks' sampling noise; its degrees
    of freedom are the instances' (Welch-Satterthwaite, or with the noise as the floor, the instances less one per
    arm): agreeing instances do not show that there is no instance effect."""
    sign = 1.0 if higher_is_better else -1.0
    per_arm = []
    for cell, boot in ((base, base_boot), (other, other_boot)):
        values, log_var = boot.repeat_values.get(name, {}), boot.repeat_log_var.get(name, {})
        groups = _instances(pairing["blocks"], cell.arm)
        if not groups or any(r not in values or not values[r] > 0 for g in groups.values() for r in g):
            return None
        means = np.array([np.mean([math.log(values[r]) for r in g]) for g in groups.values()])
        within = [sum(log_var[r][0] for r in g) / len(g) ** 2 for g in groups.values() if all(r in log_var for r in g)]
        per_arm.append((means, within, sum(log_var.get(r, (0, 0))[1] for g in groups.values() for r in g)))
    (bm, bw, bdf), (om, ow, odf) = per_arm
    point = sign * (float(np.mean(om)) - float(np.mean(bm)))
    noise = sum(bw) / len(bm) ** 2 + sum(ow) / len(om) ** 2
    sb = float(np.var(bm, ddof=1)) / bm.size if bm.size >= 2 else float("nan")
    so = float(np.var(om, ddof=1)) / om.size if om.size >= 2 else float("nan")
    if np.isfinite(sb) and np.isfinite(so) and sb + so >= noise:
        var = sb + so  # Welch-Satterthwaite degrees of freedom
        df = max(1, int(var**2 / ((sb**2 / (bm.size - 1) if sb else 0) + (so**2 / (om.size - 1) if so else 0) or 1)))
        dominated = True
    elif noise > 0 and bdf + odf >= 1:
        # the blocks' noise is the floor, but the instances' count still bounds what the interval knows: taking the
        # noise's own degrees of freedom wherever the instances happened to agree within it undercovered under
        # an instance effect (89.6-91% in benchmarks/precision_coverage.py's segment scenarios; 96.8% so)
        var, df, dominated = noise, max(1, min(int(bdf + odf), bm.size - 1 + om.size - 1)), False
    else:
        return None
    return PairedEstimate(
        math.exp(point),
        _draws(point, var, df, n_boot, rng),
        int(om.size),
        df,
        dominated,
        unit="instance",
        log_se=math.sqrt(var),
    )
