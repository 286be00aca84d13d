"""How a precision level's rounds are counted and judged: what `measure/interleave.py` measures by and
`analysis/precision.py` decides and reports by. A module of its own, importing nothing: the analysis jobs
(crossover, refine, schedule) read these without importing the measuring path (the client, aiohttp, servers)."""

from __future__ import annotations

BUDGET_SPENT = "budget spent:"  # how a level's last decision starts when its budget, not its target, stopped it
VERDICT_DECIDED = "verdict decided:"  # how it starts when its verdict was known before its target was met

CYCLE_ROUNDS = 2  # a complete counterbalanced cycle: A B | B A (any number of arms: the order reversed)


def judged_after(rounds: int, least: int, most: int) -> bool:
    """Whether the stopping rule judges a level after `rounds` rounds: from `least` on, after complete cycles
    (A B | B A) only, and at `most`. A stop mid-cycle leaves one round's share of a linear drift in the mean,
    and a block size changed mid-cycle gives the cycle's two rounds unequal spans of that drift; fewer looks
    also select fewer lucky spreads (benchmarks/precision_coverage.py: looking after every round, A/A levels
    under host noise and drift excluded 1 in 5.2% of 20,000 sweeps, after complete cycles in 4.7%)."""
    return rounds >= most or (rounds >= least and rounds % CYCLE_ROUNDS == 0)


def least_rounds(min_rounds: int, instances: int) -> int:
    """min_rounds, raised to 2 per server instance where there are several (both arm orders on every one)."""
    return max(min_rounds, 2 * instances if instances > 1 else 0)


def looks(least: int, most: int) -> int:
    """How many times the stopping rule may judge a level between `least` and `most` rounds (`judged_after`): the
    verdict stop spends its error rate over them."""
    return sum(judged_after(r, least, most) for r in range(least, most + 1))
