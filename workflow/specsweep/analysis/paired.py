"""The speedup of two arms measured in interleaved blocks (specsweep.interleave), from neighbouring blocks.

Each block of the compared arm is set against the reference arm's blocks next to it in time (the one before and
the one after): d = log(compared block) - mean log(neighbouring reference blocks). In a counterbalanced order
(A B | B A) a drift that is linear over the level cancels in the mean of d, which the arms' separate means would
carry straight into the ratio. The interval is a t interval of that mean: its variance is the larger of the
blocks' own sampling noise (each block's block bootstrap, propagated through the weights) and the spread of the
d's themselves (drift and instance effects left over), so neither is left out. Blocks that share both neighbours
(the two middle blocks of A B | B A) count as one unit of that spread: their d's move together. An odd number of
rounds leaves the last one unbalanced (its block has a neighbour on one side only): use an even number of repeats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from specsweep.analysis.bootstrap import CellBootstrap
from specsweep.analysis.cells import Cell

_MAX_LOG_DRAW = 30.0


@dataclass(frozen=True)
class PairedEstimate:
    """A level's paired speedup of one metric: the point, its replicates, and what it rests on."""

    speedup: float
    replicates: np.ndarray
    pairs: int  # blocks of the compared arm, each set against its neighbouring reference blocks
    df: int  # of the variance used: the clusters of blocks sharing neighbours less one, or the blocks' own
    spread_dominates: bool  # the d's varied more than the blocks' own noise explains (drift or instances)
    unit: str = "block"  # what `pairs` counts: interleaved blocks, or server instances (segments)


def pairing_of(cell: Cell) -> dict[str, Any] | None:
    p = cell.summary.get("pairing")
    return p if isinstance(p, dict) and p.get("mode") in ("interleaved", "segments") else None


def paired(base: Cell, other: Cell) -> bool:
    """Whether the two cells were measured together: in one interleaved level job, or merged from one set of
    counterbalanced segments (the same pairing id)."""
    a, b = pairing_of(base), pairing_of(other)
    return a is not None and b is not None and a.get("id") == b.get("id")


def neighbour_weights(blocks: list[dict[str, Any]], ref_arm: str, arm: str) -> dict[int, dict[int, float]]:
    """For each block (repeat) of `arm`: the reference arm's blocks next to it in time (the one before and the
    one after), as repeat -> weight (a block's weights sum to 1)."""
    order = sorted((b for b in blocks if b["arm"] in (ref_arm, arm)), key=lambda b: float(b["start_unix"]))
    out: dict[int, dict[int, float]] = {}
    for i, b in enumerate(order):
        if b["arm"] != arm:
            continue
        before = next((x for x in reversed(order[:i]) if x["arm"] == ref_arm), None)
        after = next((x for x in order[i + 1 :] if x["arm"] == ref_arm), None)
        nbrs = [int(x["repeat"]) for x in (before, after) if x is not None]
        if nbrs:
            out[int(b["repeat"])] = {r: 1.0 / len(nbrs) for r in nbrs}
    return out


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
    weights = neighbour_weights(pairing["blocks"], base.arm, other.arm)
    bv, ov = base_boot.repeat_values.get(name, {}), other_boot.repeat_values.get(name, {})
    if not weights or any(r not in ov for r in weights) or any(r not in bv for w in weights.values() for r in w):
        return None
    values = [*(bv[r] for w in weights.values() for r in w), *(ov[r] for r in weights)]
    if any(not np.isfinite(v) or v <= 0 for v in values):
        return None
    sign = 1.0 if higher_is_better else -1.0
    d = np.array(
        [sign * (math.log(ov[r]) - sum(w * math.log(bv[q]) for q, w in nb.items())) for r, nb in weights.items()]
    )
    n = d.size
    # D = mean(d) is a linear combination of the blocks' logs: its sampling variance from the blocks' own noise
    coef: dict[tuple[str, int], float] = {}
    for r, nb in weights.items():
        coef[("o", r)] = coef.get(("o", r), 0.0) + 1.0 / n
        for q, w in nb.items():
            coef[("b", q)] = coef.get(("b", q), 0.0) - w / n
    bvar, ovar = base_boot.repeat_log_var.get(name, {}), other_boot.repeat_log_var.get(name, {})
    within, df_within, known = 0.0, 0, True
    for (side, r), c in coef.items():
        v = (ovar if side == "o" else bvar).get(r)
        if v is None:
            known = False
            continue
        within += c * c * v[0]
        df_within += v[1]
    # blocks that share their neighbours (A B | B A: both B blocks sit between the same two A blocks) are not
    # independent: the spread is taken over such clusters' means, one unit each
    clusters: dict[frozenset[int], list[float]] = {}
    for (_r, nb), di in zip(weights.items(), d, strict=True):
        clusters.setdefault(frozenset(nb), []).append(float(di))
    units = np.array([np.mean(v) for v in clusters.values()])
    k = units.size
    spread = float(np.var(units, ddof=1)) / k if k >= 2 else float("nan")
    if k >= 2 and (not known or spread >= within):
        var, df, dominated = spread, k - 1, True
    elif known and df_within >= 1:
        var, df, dominated = within, df_within, False
    else:
        return None
    point = float(np.mean(d))
    draws = rng.standard_t(df, size=n_boot) * math.sqrt(var)
    reps = np.exp(np.clip(point + draws, -_MAX_LOG_DRAW, _MAX_LOG_DRAW))
    return PairedEstimate(math.exp(point), reps, n, int(df), dominated)


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
    counterbalanced order cancels to first order but does not remove) and the blocks' sampling noise."""
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
        var, df, dominated = noise, int(bdf + odf), False
    else:
        return None
    draws = rng.standard_t(df, size=n_boot) * math.sqrt(var)
    reps = np.exp(np.clip(point + draws, -_MAX_LOG_DRAW, _MAX_LOG_DRAW))
    return PairedEstimate(math.exp(point), reps, int(om.size), df, dominated, unit="instance")
