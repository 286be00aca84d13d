"""Intervals of a cell's metrics: time blocks within a repeat, a t distribution across repeats.

Requests of one run are not independent: those in flight together share every engine step, so the server's
speed at a moment moves all of them. Resampling single requests (the earlier method) treats them as
independent and under-covers. Instead:

- Within a repeat, the steady window is cut into equal time blocks (`cells.BlockLayout`) and the blocks are
  resampled with replacement (a non-overlapping block bootstrap). Aggregate throughput of a resample is the
  tokens delivered in the chosen blocks over their summed length, the same quantity as the summary's
  steady-window throughput (tokens in the window / its length), restricted to the chosen blocks; goodput is
  likewise requests meeting every SLO per second of chosen blocks. Latencies (TPOT p50/p99, E2E p50) and the
  mean per-request tok/s come from the requests ending in the chosen blocks.
- Across R >= 2 repeats, the replicates are t draws with R-1 degrees of freedom, centred on the reported value,
  with scale s / sqrt(R) on the log scale: s^2 is the sample variance of the repeats' own values (their
  `repeats[i].metrics` in summary.json), floored by the mean within-repeat block-bootstrap variance (the t then
  takes that estimate's degrees of freedom). A plain resample of 3 repeats has only 10 distinct outcomes and
  under-covers badly (docs/analysis.md gives figures).
- With one repeat, the replicates are the block-bootstrap ones, widened for the few blocks (below); they hold
  the noise within that run only, which the analysis states next to the interval.

Replicates are placed on the reported number: the official point values are summary.json's; a block-bootstrap
replicate is that value times est(resample) / est(all blocks), so interval and point never disagree because
of a difference in definition.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special  # the t and normal quantiles (scipy.stats: 0.5 s more import a job)

from specsweep.analysis.cells import Cell, RequestArrays, metric_value_any
from specsweep.measure.metrics import meets_slos

__all__ = [
    "METRICS",
    "PLOTTED",
    "CellBootstrap",
    "MetricSpec",
    "RepeatReplicates",
    "block_replicates",
    "bootstrap_cell",
    "cell_rng",
    "few_blocks_factor",
    "percentile_interval",
]


THROUGHPUT = "aggregate_tok_s"


@dataclass(frozen=True)
class MetricSpec:
    """A metric compared between arms. `higher_is_better` fixes the speedup's orientation."""

    name: str
    # where summary.json keeps it (the metrics module's names): (dotted path under "metrics", factor to this unit)
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
        (("output_tok_s_steady", 1.0),),
        True,
        "aggregate throughput",
        "tok/s",
    ),
    MetricSpec(
        "per_request_tok_s_mean",
        (("request_tok_s.mean", 1.0),),
        True,
        "per-request throughput (mean)",
        "tok/s",
    ),
    MetricSpec("tpot_p50_s", (("tpot_ms.p50", 1e-3),), False, "TPOT p50", "s"),
    MetricSpec("tpot_p99_s", (("tpot_ms.p99", 1e-3),), False, "TPOT p99", "s"),
    MetricSpec("e2e_p50_s", (("e2e_ms.p50", 1e-3),), False, "E2E latency p50", "s"),
    MetricSpec("goodput_rps", (("goodput_rps", 1.0),), True, "goodput under SLO", "req/s"),
)
# summary values that are plotted but not compared with an interval
PLOTTED: dict[str, tuple[tuple[str, float], ...]] = {
    "aggregate_tok_s": METRICS[0].summary_paths,
    "tpot_p50_s": METRICS[2].summary_paths,
    "tpot_p99_s": METRICS[3].summary_paths,
    "ttft_p50_s": (("ttft_ms.p50", 1e-3),),
    "accept_length": (("accept_length", 1.0),),
    # the engine's batch while busy: C in a closed loop, measured in an open one (docs/metrics.md, "Open loop")
    "running_requests": (("running_requests.busy_mean", 1.0),),
}


def cell_rng(seed: int, key: str) -> np.random.Generator:
    """A generator per cell from (seed, cell key): replicates independent of other cells."""
    return np.random.default_rng([int(seed), zlib.crc32(key.encode())])


def _weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """Row-wise quantiles (inverted CDF) of `values` (n,) under integer weights (B, n); NaN values ignored.

    Why weights: a block resample is every request of the chosen blocks, each as often as its block was drawn,
    so one sort of the values serves all B replicates (only the weights change between them).
    """
    keep = np.isfinite(values)
    v, w = values[keep], weights[:, keep]
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[:, order]
    if v.size == 0:
        return [np.full(weights.shape[0], np.nan) for _ in qs]
    cum = np.cumsum(w, axis=1)
    total = cum[:, -1]
    out = []
    for q in qs:
        k = np.count_nonzero(cum < (q * total)[:, None] - 1e-9, axis=1)
        out.append(np.where(total > 0, v[np.minimum(k, v.size - 1)], np.nan))
    return out


def _estimate(
    req: RequestArrays,
    rows: np.ndarray,
    local_block: np.ndarray,
    blocks: np.ndarray,
    counts: np.ndarray,
    slo: dict[str, float] | None,
) -> dict[str, np.ndarray]:
    """Each metric's estimator on block resamples: `counts` (B, K) is how often each of `blocks` was drawn.

    `rows` are the requests ending in those blocks and `local_block` their block's column in `counts`.
    """
    lay = req.blocks
    assert lay is not None
    w = counts[:, local_block].astype(float)  # (B, n): a request counts as often as its block was drawn
    length = counts @ lay.block_len_s[blocks]
    ok = req.ok[rows]
    with np.errstate(invalid="ignore", divide="ignore"):
        out: dict[str, np.ndarray] = {"aggregate_tok_s": (counts @ lay.block_tokens[blocks]) / length}
        e2e = np.where(ok, req.e2e_s[rows], np.nan)
        rate = np.where(ok & (e2e > 0), req.tokens[rows] / e2e, np.nan)
        has = np.isfinite(rate)
        n_rate = w @ has.astype(float)
        out["per_request_tok_s_mean"] = np.where(n_rate > 0, (w @ np.where(has, rate, 0.0)) / n_rate, np.nan)
        tpot = np.where(ok, req.tpot_s[rows], np.nan)
        out["tpot_p50_s"], out["tpot_p99_s"] = _weighted_quantiles(tpot, w, (0.5, 0.99))
        (out["e2e_p50_s"],) = _weighted_quantiles(e2e, w, (0.5,))
        if slo:  # the summary's goodput (metrics.goodput_rps) over the resampled blocks
            good = ok & meets_slos(req.ttft_s[rows], req.tpot_s[rows], req.e2e_s[rows], slo)
            out["goodput_rps"] = (w @ good.astype(float)) / length
    return out


@dataclass
class RepeatReplicates:
    """One repeat's block bootstrap: its estimate over all its blocks and over B block resamples.

    `n_blocks` is the request blocks' count, `tp_blocks` the throughput blocks' (see cells.TP_BLOCK_TAUS)."""

    repeat: int
    n_blocks: int
    full: dict[str, float]
    replicates: dict[str, np.ndarray]
    tp_blocks: int = 0

    def k(self, name: str) -> int:
        """The blocks behind metric `name`'s replicates."""
        return self.tp_blocks if name == THROUGHPUT and self.tp_blocks else self.n_blocks


def block_replicates(
    req: RequestArrays,
    repeat: int,
    n_boot: int,
    rng: np.random.Generator,
    slo: dict[str, float] | None = None,
) -> RepeatReplicates | None:
    """Block bootstrap of one repeat (None when its steady window has no blocks of either kind).

    Throughput resamples its own blocks (sized from the token series' autocorrelation); the per-request
    metrics resample the request blocks."""
    lay = req.blocks
    if lay is None:
        return None
    blocks = np.flatnonzero(lay.block_repeat == repeat)
    tp = np.flatnonzero(lay.tp_block_repeat == repeat)
    k, kt = int(blocks.size), int(tp.size)
    if k == 0 and kt == 0:
        return None
    full: dict[str, float] = {}
    boot: dict[str, np.ndarray] = {}
    if k:
        rows = np.flatnonzero((req.repeat == repeat) & (lay.block >= 0))
        local = lay.block[rows] - blocks[0]
        est = _estimate(req, rows, local, blocks, np.ones((1, k), dtype=np.int64), slo)
        full = {m: float(v[0]) for m, v in est.items()}
        boot = _estimate(req, rows, local, blocks, rng.multinomial(k, np.full(k, 1.0 / k), size=n_boot), slo)
    if kt:
        tok, length = lay.tp_block_tokens[tp], lay.tp_block_len_s[tp]
        counts = rng.multinomial(kt, np.full(kt, 1.0 / kt), size=n_boot)
        value = float(tok.sum() / length.sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            short = (counts @ tok) / (counts @ length)
        boot[THROUGHPUT] = _not_below(short, value, boot.get(THROUGHPUT), full.get(THROUGHPUT), kt, k)
        full[THROUGHPUT] = value
    return RepeatReplicates(repeat, k, full, boot, kt)


def _not_below(
    short: np.ndarray, value: float, long: np.ndarray | None, long_value: float | None, k_short: int, k_long: int
) -> np.ndarray:
    """Short-block throughput replicates, stretched when the request blocks (a lifetime or more each) vary more.

    Why both: the token series' autocorrelation can only be estimated within the window, so a correlation as long
    as a request (e.g. per-request acceptance under speculation) looks shorter than it is in a window of a few
    lifetimes. The spread is therefore never taken below what the lifetime-long blocks show (each bootstrap
    variance corrected by K/(K-1)); the widening for few blocks stays the short blocks' (their K gives the degrees
    of freedom)."""
    if long is None or long_value is None or not (np.isfinite(long_value) and long_value > 0) or value <= 0:
        return short
    with np.errstate(invalid="ignore", divide="ignore"):
        ls, ll = np.log(short / value), np.log(long / long_value)
    ls, ll = ls[np.isfinite(ls)], ll[np.isfinite(ll)]
    if ls.size < 2 or ll.size < 2 or k_long < 2:
        return short
    v_short = float(np.var(ls)) * k_short / (k_short - 1)
    v_long = float(np.var(ll)) * k_long / (k_long - 1)
    if v_short <= 0 or v_long <= v_short:
        return short
    return value * np.exp(np.log(short / value) * math.sqrt(v_long / v_short))


@dataclass
class CellBootstrap:
    """A cell's point value per metric and its B replicates (NaN rows when no interval can be had).

    `method[m]`: "repeats_t" (t across repeats), "blocks" (one repeat's block bootstrap: within-run noise only)
    or "none"; `n_repeats[m]`: the repeats the interval rests on.
    """

    point: dict[str, float]
    replicates: dict[str, np.ndarray]
    has_interval: dict[str, bool] = field(default_factory=dict)
    method: dict[str, str] = field(default_factory=dict)
    n_repeats: dict[str, int] = field(default_factory=dict)
    # per metric, each repeat's own value and the variance of its log from its block bootstrap (with the
    # degrees of freedom of that estimate): what a paired comparison of interleaved blocks rests on
    repeat_values: dict[str, dict[int, float]] = field(default_factory=dict)
    repeat_log_var: dict[str, dict[int, tuple[float, int]]] = field(default_factory=dict)


_MAX_LOG_DRAW = 30.0


def few_blocks_factor(k: int, level: float = 0.975) -> float:
    """Widening of a k-block bootstrap's deviations: sqrt(k/(k-1)) for the plug-in variance's bias, times
    t(k-1)/z for a spread estimated from only k blocks (the batch-means interval; 1.22 at k = 10)."""
    if k < 2:
        return float("nan")
    return math.sqrt(k / (k - 1)) * float(special.stdtrit(k - 1, level) / special.ndtri(level))


def _positive(*arrays: Any) -> bool:
    """Whether every finite value is > 0, so that the log scale (relative spread) applies."""
    for a in arrays:
        x = np.asarray(a, dtype=float)
        x = x[np.isfinite(x)]
        if np.any(x <= 0):
            return False
    return True


def _from_blocks(point: float, rb: RepeatReplicates, name: str) -> np.ndarray:
    """One repeat's replicates on the reported value, widened for its few blocks."""
    ratio = rb.replicates[name] / rb.full[name]
    c = few_blocks_factor(rb.k(name))
    if _positive(ratio):
        return point * np.exp(c * np.log(ratio))
    return point * (1.0 + c * (ratio - 1.0))


def _across_repeats(
    point: float,
    values: np.ndarray,
    within: list[tuple[RepeatReplicates, float]],
    name: str,
    n_boot: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """t replicates around `point` with scale s / sqrt(R); s^2 floored by the mean within-repeat variance.

    s^2 is the sample variance of the R repeats' values (R-1 degrees of freedom). A repeat cannot vary less
    than its own sampling noise, so s^2 is raised to the mean block-bootstrap variance of the repeats when it
    is smaller; the t distribution then takes that estimate's degrees of freedom (the blocks of all repeats,
    sum of K_r - 1), since using R-1 for a variance not estimated from R values would over-cover. Log scale
    (relative spread) when every value is positive.
    """
    r = values.size
    log = _positive(values, point)
    x = np.log(values) if log else values
    s2 = float(np.var(x, ddof=1))
    floors, df_floor = [], 0
    for rb, v in within:
        ratio = rb.replicates[name] / rb.full[name]
        ratio = ratio[np.isfinite(ratio)]
        if ratio.size < 2:
            continue
        if log and not _positive(ratio):
            continue  # a resample with a zero value (e.g. no request met the SLO) has no log: no floor from it
        kb = rb.k(name)
        k_corr = kb / (kb - 1)  # the plug-in bootstrap variance is (K-1)/K of the unbiased one
        floors.append(float(np.var(np.log(ratio) if log else ratio * v)) * k_corr)
        df_floor += kb - 1
    df = r - 1
    if floors and float(np.mean(floors)) > s2:
        s2, df = float(np.mean(floors)), df_floor
    draws = rng.standard_t(df, size=n_boot) * math.sqrt(s2 / r)
    if log:
        # t with 1 degree of freedom (R = 2) is Cauchy: keep exp() finite; e^30 is far beyond any percentile used
        return point * np.exp(np.clip(draws, -_MAX_LOG_DRAW, _MAX_LOG_DRAW))
    return point + draws


def _log_var(rb: RepeatReplicates, name: str) -> tuple[float, int] | None:
    """The block-bootstrap variance of a repeat's log value (bias-corrected) and its degrees of freedom."""
    ratio = rb.replicates[name] / rb.full[name]
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size < 2 or not _positive(ratio):
        return None
    k = rb.k(name)
    if k < 2:
        return None
    return float(np.var(np.log(ratio))) * k / (k - 1), k - 1


def _repeat_value(spec: MetricSpec, rep_metrics: dict[str, Any] | None) -> float:
    return spec.value({"metrics": rep_metrics}) if rep_metrics else float("nan")


def _repeat_values(
    spec: MetricSpec,
    repeats: list[int],
    per_rep: dict[int, RepeatReplicates],
    rep_metrics: dict[int, dict[str, Any]],
    point: float,
    pooled: float,
) -> dict[int, float]:
    """Each recorded repeat's own value of a metric: summary.json's `repeats[i].metrics`, else (older or
    hand-made summaries) the repeat's block estimate put on the reported scale (times point / pooled)."""
    out: dict[int, float] = {}
    for r in repeats:
        v = _repeat_value(spec, rep_metrics.get(r))
        rb = per_rep.get(r)
        if not np.isfinite(v) and rb is not None and np.isfinite(pooled) and pooled != 0:
            v = rb.full.get(spec.name, float("nan")) * point / pooled
        if np.isfinite(v):
            out[r] = float(v)
    return out


def bootstrap_cell(
    cell: Cell,
    n_boot: int,
    seed: int,
    slo: dict[str, float] | None = None,
    metrics: tuple[MetricSpec, ...] = METRICS,
) -> CellBootstrap:
    """Point values (summary.json first, the request records second) and replicates per metric.

    With request records: R >= 2 repeats with a value each give t replicates across repeats (floored by the
    repeats' block-bootstrap variance); a single repeat gives its block-bootstrap replicates. Without records,
    without a usable steady window, or without an SLO for goodput: the point value and no interval.
    """
    point: dict[str, float] = {m.name: m.value(cell.summary) for m in metrics}
    out = CellBootstrap(point=point, replicates={}, has_interval={}, method={}, n_repeats={})
    req = cell.requests
    rng = cell_rng(seed, cell.key)
    per_rep: dict[int, RepeatReplicates] = {}
    pooled: dict[str, float] = {}
    repeats: list[int] = []
    if req is not None and len(req) > 0 and req.blocks is not None:
        repeats = req.repeats
        for r in repeats:
            rb = block_replicates(req, r, n_boot, rng, slo)
            if rb is not None:
                per_rep[r] = rb
        pooled = _pooled_estimate(req, slo)
    rep_metrics = cell.repeat_metrics()
    for m in metrics:
        name = m.name
        f = pooled.get(name, float("nan"))
        if not np.isfinite(point[name]):
            point[name] = f
        p = point[name]
        usable = [
            rb
            for rb in per_rep.values()
            if np.isfinite(rb.full.get(name, np.nan)) and rb.full[name] != 0 and name in rb.replicates
        ]
        values = _repeat_values(m, repeats, per_rep, rep_metrics, p, f) if usable else {}
        out.repeat_values[name] = values
        out.repeat_log_var[name] = {rb.repeat: v for rb in usable if (v := _log_var(rb, name)) is not None}
        if np.isfinite(p) and p != 0 and len(values) >= 2:
            vals = np.array(list(values.values()))
            within = [(rb, values[rb.repeat]) for rb in usable if rb.repeat in values]
            out.replicates[name] = _across_repeats(p, vals, within, name, n_boot, rng)
            out.has_interval[name], out.method[name], out.n_repeats[name] = True, "repeats_t", len(values)
        elif np.isfinite(p) and p != 0 and usable:
            out.replicates[name] = _from_blocks(p, usable[0], name)
            out.has_interval[name], out.method[name], out.n_repeats[name] = True, "blocks", 1
        else:
            out.replicates[name] = np.full(n_boot, p)
            out.has_interval[name], out.method[name], out.n_repeats[name] = False, "none", 0
    return out


def _pooled_estimate(req: RequestArrays, slo: dict[str, float] | None) -> dict[str, float]:
    """Each metric's estimator over every block of every repeat: the point value when the summary lacks one."""
    lay = req.blocks
    assert lay is not None
    out: dict[str, float] = {}
    if lay.block_repeat.size:
        rows = np.flatnonzero(lay.block >= 0)
        blocks = np.arange(lay.block_repeat.size)
        ones = np.ones((1, blocks.size), dtype=np.int64)
        out = {k: float(v[0]) for k, v in _estimate(req, rows, lay.block[rows], blocks, ones, slo).items()}
    if lay.tp_block_len_s.size:
        out[THROUGHPUT] = float(lay.tp_block_tokens.sum() / lay.tp_block_len_s.sum())
    return out


def percentile_interval(replicates: np.ndarray, confidence: float = 0.95, axis: int = 0) -> tuple[Any, Any]:
    """Percentile interval; ratios are skewed; invariant under 1/x."""
    alpha = (1.0 - confidence) / 2.0
    with np.errstate(invalid="ignore"):
        lo = np.nanquantile(replicates, alpha, axis=axis)
        hi = np.nanquantile(replicates, 1.0 - alpha, axis=axis)
    return lo, hi
