"""A level's rounds split by the host's speed (analysis/hoststate.py): said where the speedup depends on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specsweep.analysis.hoststate import host_split, host_state_notes
from specsweep.analysis.paired import PairedEstimate, Rounds

pytestmark = pytest.mark.unit


def estimate(d: np.ndarray, reference: np.ndarray, instance: tuple[int, ...] | None = None) -> PairedEstimate:
    rounds = Rounds(d, np.full(d.size, 1e-4), 18 * d.size, instance or (1,) * d.size, reference, np.full(d.size, 1e-4))
    return PairedEstimate(float(np.exp(d.mean())), np.array([]), d.size, d.size - 1, False, rounds=rounds)


def test_a_speedup_that_shrinks_when_the_host_slows_is_said_with_both_values() -> None:
    rng = np.random.default_rng(1)
    slow_host = np.arange(12) % 2 == 1  # every other round in a slow spell: both arms 30% slower...
    base = math.log(100.0) + np.where(slow_host, math.log(0.7), 0.0) + rng.normal(0, 0.01, 12)
    # ...and speculation loses its edge there (1.4 on a fast host, 1.1 on a slow one)
    d = np.where(slow_host, math.log(1.1), math.log(1.4)) + rng.normal(0, 0.01, 12)
    h = host_split(estimate(d, base))
    assert h is not None and h.apart and h.rounds == 6
    assert h.fast == pytest.approx(1.4, rel=0.02) and h.slow == pytest.approx(1.1, rel=0.02)
    row = {"concurrency": 64, "host_split": h.as_dict()}
    (note,) = host_state_notes([row], "C")
    assert note.startswith("host state: the speedup depends on how fast the host ran") and "C=64: host fast 1.4" in note


def test_the_baselines_own_noise_does_not_read_as_a_dependence() -> None:
    """The baseline's block noise enters d with the opposite sign: split by the baseline alone, its fast rounds
    would read lower speedups with nothing depending on the host. Split by both arms' mean, they do not."""
    apart = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        b_noise, s_noise = rng.normal(0, 0.05, 12), rng.normal(0, 0.05, 12)
        base = math.log(100.0) + b_noise
        d = math.log(1.3) + s_noise - b_noise
        h = host_split(estimate(d, base))
        assert h is not None
        apart += h.apart
    assert apart <= 200 * 0.03, apart  # non-overlapping 95% intervals: rare without a dependence


def test_too_few_rounds_or_several_instances_are_not_split() -> None:
    d, base = np.full(5, 0.3), np.full(5, 4.6)
    assert host_split(estimate(d, base)) is None
    assert host_split(estimate(np.full(6, 0.3), np.full(6, 4.6), (1, 2, 2, 1, 1, 2))) is None
    assert host_state_notes([{"concurrency": 1, "host_split": None}], "C") == []
