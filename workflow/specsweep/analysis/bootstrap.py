"""Bootstrap of a cell's metrics: resample repeats, then requests within each repeat; vectorised with numpy.

Throughput of a resample: in a closed loop every request holds one of the C client slots from send to end,
so while all slots are busy the wall time equals (sum of per-request busy times) / C. The estimator

    aggregate_tok_s* = C * sum(output_tokens) / sum(end_s - send_s)

is therefore the throughput of a fully loaded system (Little's law), the same quantity as the steady-window
aggregate throughput, and it is defined for any multiset of requests (a plain re-count of tokens over the
original window would not be, since a resample has no wall clock of its own). The official point value is the
one in summary.json (metrics module); a replicate is that value times est(resample) / est(full sample), so the
interval is the bootstrap's relative spread placed around the reported number. See docs/analysis.md.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsweep.analysis.cells import Cell, RequestArrays, metric_value_any

__all__ = [
    "METRICS",
    "PLOTTED",
    "CellBootstrap",
    "MetricSpec",
    "bootstrap_cell",
    "cell_rng",
    "percentile_interval",
]


@dataclass(frozen=True)
class MetricSpec:
    """A metric compared between arms. `higher_is_better` fixes the speedup's orientation."""

    name: str
    # where summary.json keeps it: (dotted path under "metrics", factor to this unit), first found wins; both
    # the metrics module's names (ms, output_tok_s_steady) and the seconds-based names are read
    summary_paths: tuple[tuple[str, float], ...]
    higher_is_better: bool
    label: str
    unit: str

    @property
    def orientation(self) -> str:
        return "spec/baseline" if self.higher_is_better else "baseline/spec"

    def value(self, summary: dict[str, Any]) -> float:
        """The official point value from summary.json, NaN when it is not there."""
        return metric_value_any(summary, self.summary_paths)


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "aggregate_tok_s",
        (("aggregate_tok_s", 1.0), ("output_tok_s_steady", 1.0)),
        True,
        "aggregate throughput",
        "tok/s",
    ),
    MetricSpec(
        "per_request_tok_s_mean",
        (("per_request_tok_s.mean", 1.0), ("request_tok_s.mean", 1.0)),
        True,
        "per-request throughput (mean)",
        "tok/s",
    ),
    MetricSpec("tpot_p50_s", (("tpot_s.p50", 1.0), ("tpot_ms.p50", 1e-3)), False, "TPOT p50", "s"),
    MetricSpec("tpot_p99_s", (("tpot_s.p99", 1.0), ("tpot_ms.p99", 1e-3)), False, "TPOT p99", "s"),
    MetricSpec("e2e_p50_s", (("e2e_s.p50", 1.0), ("e2e_ms.p50", 1e-3)), False, "E2E latency p50", "s"),
    MetricSpec("goodput_rps", (("goodput_rps", 1.0),), True, "goodput under SLO", "req/s"),
)
# summary values that are plotted but not compared with an interval
PLOTTED: dict[str, tuple[tuple[str, float], ...]] = {
    "aggregate_tok_s": METRICS[0].summary_paths,
    "tpot_p50_s": METRICS[2].summary_paths,
    "tpot_p99_s": METRICS[3].summary_paths,
    "ttft_p50_s": (("ttft_s.p50", 1.0), ("ttft_ms.p50", 1e-3)),
    "accept_length": (("accept_length", 1.0),),
}


def cell_rng(seed: int, key: str) -> np.random.Generator:
    """A generator per cell from (seed, cell key): replicates independent of other cells."""
    return np.random.default_rng([int(seed), zlib.crc32(key.encode())])


def _resample(req: RequestArrays, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two-stage indices (B, R*nmax) and a mask: repeats with replacement, then requests within each."""
    reps = np.unique(req.repeat)
    order = np.argsort(req.repeat, kind="stable")
    counts = np.array([np.count_nonzero(req.repeat == r) for r in reps])
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    n_rep, nmax = len(reps), int(counts.max())
    chosen = rng.integers(0, n_rep, size=(n_boot, n_rep)) if n_rep > 1 else np.zeros((n_boot, 1), dtype=int)
    n_chosen = counts[chosen][..., None]  # (B, R, 1)
    u = rng.random((n_boot, n_rep, nmax))
    local = np.minimum((u * n_chosen).astype(np.int64), n_chosen - 1)
    idx = order[offsets[chosen][..., None] + local]
    mask = np.arange(nmax)[None, None, :] < n_chosen
    return idx.reshape(n_boot, -1), mask.reshape(n_boot, -1)


def _nan_quantile_rows(x: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """Row-wise quantiles (linear interpolation) ignoring NaN; one sort serves all qs (why: speed)."""
    s = np.sort(x, axis=1)  # NaN sorts last
    k = np.count_nonzero(~np.isnan(s), axis=1)
    out = []
    for q in qs:
        pos = q * np.maximum(k - 1, 0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(k - 1, 0))
        frac = pos - lo
        a = np.take_along_axis(s, lo[:, None], axis=1)[:, 0]
        b = np.take_along_axis(s, hi[:, None], axis=1)[:, 0]
        out.append(np.where(k > 0, a + frac * (b - a), np.nan))
    return out


def _estimate(
    req: RequestArrays, concurrency: float, idx: np.ndarray, mask: np.ndarray, slo: dict[str, float] | None
) -> dict[str, np.ndarray]:
    """Each metric's estimator on every resample (rows of idx); masked entries do not count."""
    w = mask.astype(float)
    tokens = req.tokens[idx] * w
    busy = req.busy_s[idx] * w
    ok = req.ok[idx] & mask
    with np.errstate(invalid="ignore", divide="ignore"):
        busy_sum = busy.sum(axis=1)
        out: dict[str, np.ndarray] = {"aggregate_tok_s": concurrency * tokens.sum(axis=1) / busy_sum}
        e2e = np.where(ok, req.e2e_s[idx], np.nan)
        rate = np.where(ok & (e2e > 0), req.tokens[idx] / e2e, np.nan)
        n_rate = np.count_nonzero(~np.isnan(rate), axis=1)
        out["per_request_tok_s_mean"] = np.where(n_rate > 0, np.nansum(rate, axis=1) / n_rate, np.nan)
        tpot = np.where(ok, req.tpot_s[idx], np.nan)
        out["tpot_p50_s"], out["tpot_p99_s"] = _nan_quantile_rows(tpot, (0.5, 0.99))
        (out["e2e_p50_s"],) = _nan_quantile_rows(e2e, (0.5,))
        if slo:
            good = ok.copy()
            for field_name, limit in (
                ("ttft_s", slo.get("ttft_s")),
                ("tpot_s", slo.get("tpot_s")),
                ("e2e_s", slo.get("e2e_s")),
            ):
                if limit is not None:
                    v = getattr(req, field_name)[idx]
                    # an undefined TPOT (one output token) has no inter-token time to violate (as metrics.py)
                    good &= (v <= float(limit)) | (np.isnan(v) if field_name == "tpot_s" else False)
            out["goodput_rps"] = concurrency * good.sum(axis=1) / busy_sum
    return out


@dataclass
class CellBootstrap:
    """A cell's point value per metric and its B replicates (NaN rows when no interval can be had)."""

    point: dict[str, float]
    replicates: dict[str, np.ndarray]
    has_interval: dict[str, bool] = field(default_factory=dict)


def bootstrap_cell(
    cell: Cell,
    n_boot: int,
    seed: int,
    slo: dict[str, float] | None = None,
    metrics: tuple[MetricSpec, ...] = METRICS,
) -> CellBootstrap:
    """Point values (summary.json first, the request records second) and scaled bootstrap replicates."""
    point: dict[str, float] = {m.name: m.value(cell.summary) for m in metrics}
    reps: dict[str, np.ndarray] = {}
    has: dict[str, bool] = {}
    req = cell.requests
    if req is not None and len(req) > 0:
        full_idx = np.arange(len(req))[None, :]
        full = _estimate(req, cell.concurrency, full_idx, np.ones_like(full_idx, dtype=bool), slo)
        idx, mask = _resample(req, n_boot, cell_rng(seed, cell.key))
        boot = _estimate(req, cell.concurrency, idx, mask, slo)
    else:
        full, boot = {}, {}
    for m in metrics:
        f = float(full[m.name][0]) if m.name in full else float("nan")
        if not np.isfinite(point[m.name]):
            point[m.name] = f
        if m.name in boot and np.isfinite(f) and f != 0 and np.isfinite(point[m.name]):
            reps[m.name] = boot[m.name] * (point[m.name] / f)
            has[m.name] = True
        else:
            # no records (or no SLO for goodput): the point value stands in, without an interval
            reps[m.name] = np.full(n_boot, point[m.name])
            has[m.name] = False
    return CellBootstrap(point=point, replicates=reps, has_interval=has)


def percentile_interval(replicates: np.ndarray, confidence: float = 0.95, axis: int = 0) -> tuple[Any, Any]:
    """Percentile interval; ratios are skewed; invariant under 1/x."""
    alpha = (1.0 - confidence) / 2.0
    with np.errstate(invalid="ignore"):
        lo = np.nanquantile(replicates, alpha, axis=axis)
        hi = np.nanquantile(replicates, 1.0 - alpha, axis=axis)
    return lo, hi
