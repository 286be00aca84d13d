"""Do the intervals keep their 95% coverage under the stopping rule? Synthetic sweeps with a known speedup.

Each synthetic level draws rounds as an interleaved level measures them: a round's d (log ratio of its two blocks)
is the true log speedup, plus content noise (which prompts the round drew: variance W / m for m requests per
block), plus the host's round-to-round variation (B), plus a linear drift that the A B | B A order turns into
alternating signs, plus, with two server instances, each instance's own offset. Each round's blocks' noise
estimate is W / m times a chi-square draw (its block bootstrap's degrees of freedom). The stopping rule
(`specsweep.analysis.precision.next_step`) and the interval (`specsweep.analysis.paired.paired_rounds`) are the
pipeline's own; only the measurement is simulated.

Prints, per scenario and overall: the coverage of the 95% intervals of the true speedup (goal: at least 93%), for
A/A (true speedup 1) the share of levels whose interval excludes 1 (goal: at most 5%), the share meeting the target,
and the mean rounds and requests spent.

    python benchmarks/precision_coverage.py [--sweeps 200] [--seed 0] [--target 0.05] [--min-rounds 3]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from specsweep.analysis.paired import Rounds, paired_rounds  # noqa: E402
from specsweep.analysis.precision import PrecisionSettings, RoundCost, next_step  # noqa: E402

BLOCK_DF = 18  # a round's blocks' noise estimate: two blocks of 10 time blocks each


@dataclass(frozen=True)
class Scenario:
    """One kind of level: its true speedup and variance components (log scale, per round at the base block)."""

    name: str
    speedup: float
    within: float  # content + request noise of one round's d at the base block size (scales 1 / m)
    between: float  # the host's round-to-round variance (does not shrink with m)
    drift: float  # a linear drift's share per round (alternating sign in d)
    instance_sd: float  # with two instances: each one's own offset's standard deviation (0: one instance)
    base_requests: int = 8
    overhead_s: float = 0.7
    per_request_s: float = 0.1


SCENARIOS = (
    Scenario("content-dominated (vLLM C=1)", 1.7, within=0.010, between=0.0002, drift=0.0, instance_sd=0.0),
    Scenario("host-dominated (vLLM C=64)", 1.45, within=0.0005, between=0.004, drift=0.0, instance_sd=0.0),
    Scenario("mixed, with drift", 1.1, within=0.003, between=0.0015, drift=0.02, instance_sd=0.0),
    Scenario("A/A, content", 1.0, within=0.006, between=0.0005, drift=0.0, instance_sd=0.0),
    Scenario("A/A, host and drift", 1.0, within=0.0008, between=0.003, drift=0.03, instance_sd=0.0),
    Scenario("two instances", 1.3, within=0.002, between=0.0008, drift=0.0, instance_sd=0.02),
    Scenario("A/A, two instances", 1.0, within=0.002, between=0.0008, drift=0.0, instance_sd=0.02),
    Scenario("quiet (sim C=100)", 0.88, within=0.0015, between=0.0001, drift=0.0, instance_sd=0.0),
)


def one_level(s: Scenario, settings: PrecisionSettings, rng: np.random.Generator) -> tuple[bool, bool, bool, int, int]:
    """One level measured under the rule: (covered, excludes 1, met, rounds, requests)."""
    instances = 2 if s.instance_sd > 0 else 1
    offsets = rng.normal(0.0, s.instance_sd, size=instances) if instances > 1 else np.zeros(1)
    cycle = list(range(1, instances + 1)) + list(range(instances, 0, -1))
    slope = s.drift * rng.choice([-1.0, 1.0])
    d, w, on, seconds, sizes = [], [], [], [], []
    growth = 1
    while True:
        r = len(d)
        m = s.base_requests * growth
        k = cycle[r % len(cycle)]
        sign = 1.0 if r % 2 == 0 else -1.0  # A B | B A: a linear drift lands with alternating signs
        noise = rng.normal(0.0, math.sqrt(s.within / growth)) + rng.normal(0.0, math.sqrt(s.between))
        d.append(math.log(s.speedup) + noise + sign * slope + offsets[k - 1])
        w.append(s.within / growth * rng.chisquare(BLOCK_DF) / BLOCK_DF)
        on.append(k)
        sizes.append(m)
        seconds.append(2 * (s.overhead_s + s.per_request_s * m))
        rounds = Rounds(np.array(d), np.array(w), BLOCK_DF * len(d), tuple(on))
        pe = paired_rounds(rounds, 2, rng)
        cost = RoundCost(seconds, sizes, 2 * s.overhead_s)
        nxt = next_step(pe, settings, cost, growth, settings.max_block_growth)
        if nxt.stop:
            break
        growth = nxt.growth
    assert pe is not None
    t = pe.half_width(settings.confidence)
    lo, hi = pe.speedup / (1 + t), pe.speedup * (1 + t)
    return lo <= s.speedup <= hi, not lo <= 1.0 <= hi, t <= (settings.target or 0), len(d), sum(sizes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweeps", type=int, default=200, help="synthetic sweeps (each has every scenario's level)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.05)
    ap.add_argument("--min-rounds", type=int, default=3)
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument("--max-block-growth", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="10 sweeps: the script runs (the pipeline tier)")
    args = ap.parse_args()
    if args.smoke:
        args.sweeps = 10
    rng = np.random.default_rng(args.seed)
    rows = []
    all_cov, aa_excl = [], []
    for s in SCENARIOS:
        settings = PrecisionSettings.from_config(
            {
                "target": args.target,
                "min_rounds": args.min_rounds,
                "max_rounds": args.max_rounds,
                "max_level_s": None,
                "max_block_growth": args.max_block_growth,
            },
            2 if s.instance_sd > 0 else 1,
        )
        res = [one_level(s, settings, rng) for _ in range(args.sweeps)]
        cov = [x[0] for x in res]
        all_cov += cov
        if s.speedup == 1.0:
            aa_excl += [x[1] for x in res]
        rows.append(
            (
                s.name,
                np.mean(cov),
                np.mean([x[1] for x in res]) if s.speedup == 1.0 else float("nan"),
                np.mean([x[2] for x in res]),
                np.mean([x[3] for x in res]),
                np.mean([x[4] for x in res]),
            )
        )
    print(
        f"{args.sweeps} synthetic sweeps, target +-{args.target:.0%}, min_rounds {args.min_rounds}, "
        f"max_rounds {args.max_rounds} (interval: analysis.paired; rule: analysis.precision)"
    )
    print(f"{'scenario':34} | coverage | excludes 1 | target met | rounds | requests/arm")
    for name, cov, excl, met, rounds, req in rows:
        ex = f"{excl:10.1%}" if math.isfinite(excl) else f"{'-':>10}"
        print(f"{name:34} | {cov:8.1%} | {ex} | {met:10.1%} | {rounds:6.1f} | {req:8.0f}")
    print(f"overall coverage of the 95% intervals: {np.mean(all_cov):.1%} of {len(all_cov)} levels (goal >= 93%)")
    print(f"A/A levels whose interval excludes 1: {np.mean(aa_excl):.1%} of {len(aa_excl)} (goal <= 5%)")


if __name__ == "__main__":
    main()
