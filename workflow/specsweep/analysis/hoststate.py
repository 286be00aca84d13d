"""Does a level's speedup depend on the host's state? Its rounds split by how fast the host ran.

Why: an interleaved level's paired rounds cancel the host's speed where it slows both arms alike. Where it does
not (a slow spell that costs speculation more than plain decoding, or less), the level has no one answer on that
host: measuring it again until the host calms down only picks one of the two. So the level's rounds are split by
the host's speed in each round, and where the two halves' speedups disagree beyond their intervals the level says
so with both values (docs/analysis.md, "A budget for the run").

The host's speed in a round is read from both arms' blocks: the mean of their log throughputs. Not the baseline's
alone: its blocks' own noise enters each round's log ratio with the opposite sign, so rounds split by the baseline
alone would read a lower speedup in its fast half with nothing depending on the host. The mean of both arms
carries that noise with both signs, which cancel where the arms' blocks are about equally noisy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import special

from specsweep.analysis.paired import PairedEstimate

MIN_ROUNDS_PER_HALF = 3  # each half's own spread in its interval (2 degrees of freedom at least)


@dataclass(frozen=True)
class HostSplit:
    """A level's speedup in the rounds where the host ran fast and in those where it ran slow."""

    fast: float
    fast_lo: float
    fast_hi: float
    slow: float
    slow_lo: float
    slow_hi: float
    rounds: int  # in each half (a middle round of an odd count is in neither)
    apart: bool  # the halves' intervals do not overlap: the speedup depends on the host's state

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _interval(d: np.ndarray, confidence: float) -> tuple[float, float, float]:
    mean = float(d.mean())
    half = float(special.stdtrit(d.size - 1, 0.5 + confidence / 2)) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def host_split(pe: PairedEstimate | None, confidence: float = 0.95) -> HostSplit | None:
    """The split of a throughput's paired estimate, where the level has the rounds for it (at least
    2 x MIN_ROUNDS_PER_HALF on one server instance, the reference arm's value in each); None otherwise (with
    several instances an instance's own speed would read as the host's)."""
    rounds = pe.rounds if pe is not None else None
    if rounds is None or rounds.reference is None or rounds.d.size < 2 * MIN_ROUNDS_PER_HALF:
        return None
    if len(set(rounds.instance)) > 1:
        return None
    d, ref = rounds.d, rounds.reference
    if not (np.all(np.isfinite(d)) and np.all(np.isfinite(ref))):
        return None
    # d is oriented (> 0: the compared arm better); for a throughput the compared arm's log value is ref + d
    host = ref + d / 2
    order = np.argsort(host, kind="stable")
    n = d.size // 2
    slow, fast = d[order[:n]], d[order[-n:]]
    f, s = _interval(fast, confidence), _interval(slow, confidence)
    apart = f[1] > s[2] or s[1] > f[2]
    return HostSplit(f[0], f[1], f[2], s[0], s[1], s[2], n, apart)


def host_state_notes(per_level: list[dict[str, Any]], symbol: str) -> list[str]:
    """One line per arm naming the levels whose speedup depends on the host's state, with both values."""
    said = [
        f"{symbol}={r['concurrency']:g}: host fast {h['fast']:.3g} [{h['fast_lo']:.3g}, {h['fast_hi']:.3g}], "
        f"slow {h['slow']:.3g} [{h['slow_lo']:.3g}, {h['slow_hi']:.3g}] ({h['rounds']} rounds each)"
        for r in per_level
        if (h := r.get("host_split")) and h["apart"]
    ]
    if not said:
        return []
    return [
        "host state: the speedup depends on how fast the host ran, beyond the intervals of its rounds split by "
        f"speed ({'; '.join(said)}): no one answer on this host; the slow value is the one a busy host gets"
    ]
