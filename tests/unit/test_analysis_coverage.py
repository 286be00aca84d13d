"""Coverage of the intervals on correlated synthetic data with a known truth (docs/analysis.md quotes these).

Every data set is a closed loop whose in-flight requests share a time-varying server speed (correlation time
one request) and, with repeats, a run-level speed factor per repeat. The 95% interval of a cell's aggregate
throughput, and of the speedup between two cells, must cover the truth about 95% of the time. The earlier
method (requests resampled as if independent; repeats resampled with replacement) is measured on the same data
to show why it was replaced. Run with `-s` to see the figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from specsweep.analysis.bootstrap import METRICS, bootstrap_cell, percentile_interval
from specsweep.analysis.cells import Cell
from tests.support.synthetic import correlated_cell, simulate_correlated, true_throughput

pytestmark = pytest.mark.unit

TOKENS = 16
C = 8
TRUE_SPEEDUP = 1.25  # mean request time 1.0 s (baseline) vs 0.8 s (speculative) at equal tokens and C
N_SETS = 200
B = 400


@dataclass
class Coverage:
    """Share of data sets whose 95% interval held the truth, per method and quantity."""

    new_throughput: float
    new_speedup: float
    old_throughput: float
    old_speedup: float
    repeat_resample_throughput: float | None


def _old_request_bootstrap(cell: Cell, rng: np.random.Generator) -> np.ndarray:
    """The replaced method: repeats with replacement, then single requests as if independent (Little's-law
    throughput C * sum(tokens) / sum(busy)), scaled to the reported value. Vectorised like the original."""
    req = cell.requests
    assert req is not None
    reps = req.repeats
    rows = [np.flatnonzero(req.repeat == r) for r in reps]
    n = min(len(r) for r in rows)
    chosen = rng.integers(0, len(reps), size=(B, len(reps))) if len(reps) > 1 else np.zeros((B, 1), dtype=int)
    picks = np.stack([r[:n] for r in rows])[chosen]  # (B, R, n) rows of each chosen repeat
    idx = np.take_along_axis(picks, rng.integers(0, n, size=picks.shape), axis=2).reshape(B, -1)
    est = C * req.tokens[idx].sum(axis=1) / req.busy_s[idx].sum(axis=1)
    full = C * req.tokens.sum() / req.busy_s.sum()
    return cell.summary["metrics"]["output_tok_s_steady"] * est / full


def _repeat_resample(cell: Cell, rng: np.random.Generator) -> np.ndarray:
    """A plain bootstrap of the repeats' own values: the mean of R values drawn with replacement."""
    vals = np.array([r["metrics"]["output_tok_s_steady"] for r in cell.summary["repeats"]])
    return vals[rng.integers(0, vals.size, size=(B, vals.size))].mean(axis=1)


def _covers(reps: np.ndarray, truth: float) -> bool:
    lo, hi = percentile_interval(reps, 0.95)
    return bool(lo <= truth <= hi)


def measure(turnovers: int, repeats: int, speed_sd: float, run_sd: float, seed: int) -> Coverage:
    """Coverage over N_SETS data sets of two cells each (baseline 1.0 s, speculative 0.8 s per request)."""
    rng = np.random.default_rng(seed)
    truth = true_throughput(C, TOKENS, 1.0)
    hits = np.zeros(5)
    for k in range(N_SETS):
        cells = [
            correlated_cell(
                f"{seed}/{k}/{mean}",
                simulate_correlated(
                    C, C * turnovers, TOKENS, mean, rng, repeats, speed_sd=speed_sd, run_sd=run_sd, request_sd=0.1
                ),
            )
            for mean in (1.0, 0.8)
        ]
        new = [bootstrap_cell(c, B, seed, metrics=(METRICS[0],)).replicates["aggregate_tok_s"] for c in cells]
        old_rng = np.random.default_rng([seed, k])
        old = [_old_request_bootstrap(c, old_rng) for c in cells]
        hits[0] += _covers(new[0], truth)
        hits[1] += _covers(new[1] / new[0], TRUE_SPEEDUP)
        hits[2] += _covers(old[0], truth)
        hits[3] += _covers(old[1] / old[0], TRUE_SPEEDUP)
        if repeats > 1:
            hits[4] += _covers(_repeat_resample(cells[0], old_rng), truth)
    cov = hits / N_SETS
    return Coverage(*cov[:4], cov[4] if repeats > 1 else None)


def _report(title: str, c: Coverage) -> None:
    rr = "" if c.repeat_resample_throughput is None else f", plain repeat resample {c.repeat_resample_throughput:.3f}"
    print(
        f"\n{title}: block/t method throughput {c.new_throughput:.3f}, speedup {c.new_speedup:.3f}; "
        f"request-level bootstrap throughput {c.old_throughput:.3f}, speedup {c.old_speedup:.3f}{rr}"
    )


def test_three_repeats_with_run_to_run_variation() -> None:
    """The default workload (4 turnovers a slot) measured 3 times; each run has its own speed factor."""
    c = measure(turnovers=4, repeats=3, speed_sd=0.15, run_sd=0.1, seed=1)
    _report("R=3, run-to-run sd 0.1, 4 turnovers", c)
    assert 0.90 <= c.new_throughput <= 0.99
    # two cells' t distributions convolved: conservative for a ratio (docs/analysis.md)
    assert 0.90 <= c.new_speedup <= 0.995
    assert c.old_throughput < 0.85 and c.old_speedup < 0.9
    assert c.repeat_resample_throughput is not None and c.repeat_resample_throughput < 0.85


def test_one_repeat_without_run_to_run_variation() -> None:
    """One long run (20 turnovers a slot): the block bootstrap holds the correlated within-run noise."""
    c = measure(turnovers=20, repeats=1, speed_sd=0.2, run_sd=0.0, seed=2)
    _report("R=1, 20 turnovers", c)
    assert 0.90 <= c.new_throughput <= 0.99
    assert 0.90 <= c.new_speedup <= 0.99
    assert c.old_throughput < 0.6 and c.old_speedup < 0.6
