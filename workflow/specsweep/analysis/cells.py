"""Reading measured cells (summary.json + requests.parquet) for the analysis.

Per-request times come from `specsweep.measure.metrics` (`per_request`, `measured`, `steady_window`): one definition
of TTFT, E2E, TPOT and busy time and of the steady window in the whole project, so the bootstrap resamples the
same quantities the summary's point values were computed from. What is added here is the time-block layout of
each repeat's steady window that the block bootstrap resamples (docs/analysis.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specsweep.measure import metrics

__all__ = [
    "MIN_BLOCKS",
    "N_BLOCKS",
    "autocorrelation_time",
    "BlockLayout",
    "Cell",
    "RequestArrays",
    "block_layout",
    "find_cells",
    "infer_concurrency",
    "load_cell",
    "metric_value",
    "metric_value_any",
    "request_arrays",
    "summary_windows",
]

_LEVEL_DIR = re.compile(r"^([crt])(\d+(?:\.\d+)?)$")  # c<C>, r<requests/s>, t<time scale>
# Most blocks per repeat's steady window (the spread of a mean of K blocks is estimated with K-1 degrees of
# freedom; 10 is where more blocks stop paying for shorter ones).
N_BLOCKS = 10
# Fewest blocks: with fewer a repeat gives no interval of its own.
MIN_BLOCKS = 3
# Requests ending per block, at least.
MIN_BLOCK_REQUESTS = 2
# A block spans at least this many median request lifetimes (send to end) when the window allows more than
# MIN_BLOCKS: requests in flight together share the server's state, so blocks much shorter than a lifetime are
# correlated and their resample understates the spread (docs/analysis.md has the coverage figures).
BLOCK_LIFETIMES = 3.0
# Throughput has its own blocks, sized from the data: the token-delivery series of the window in FINE_BINS bins
# gives its integrated autocorrelation time tau, and a block spans TP_BLOCK_TAUS * tau (batch means need
# batches long against the correlation), up to N_TP_BLOCKS blocks. Why not the request blocks: tokens count in
# the block they arrive in, so throughput blocks are independent once they outlast the correlation of the
# server's speed, which is often far shorter than a request's lifetime (one engine step on the simulated
# engine), while a request's latency carries its whole lifetime's history.
FINE_BINS = 200
TP_BLOCK_TAUS = 4.0
N_TP_BLOCKS = 20


@dataclass
class BlockLayout:
    """Each repeat's steady window cut into equal, non-overlapping time blocks.

    A request belongs to the block holding its end time; tokens count in the block in which their chunk
    arrived (every row, ramp included: tokens delivered are tokens, as in the summary's steady throughput).
    Blocks of one repeat have consecutive ids; requests ending outside the window are in no block (-1).
    """

    block: np.ndarray  # int, per measured request: its block id, -1 outside every block
    block_repeat: np.ndarray  # int, per block: the repeat it belongs to
    block_tokens: np.ndarray  # float, per block: output tokens delivered inside it (`_tokens_per_block`)
    block_len_s: np.ndarray  # float, per block: its length in seconds
    windows: dict[int, tuple[float, float]]  # per repeat: the steady window [start, end] that was cut
    # throughput blocks (sized from the token series' autocorrelation; see TP_BLOCK_TAUS)
    tp_block_repeat: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    tp_block_tokens: np.ndarray = field(default_factory=lambda: np.empty(0))
    tp_block_len_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    tau_s: dict[int, float] = field(default_factory=dict)  # per repeat: integrated autocorrelation time

    def n_blocks(self, repeat: int) -> int:
        return int(np.count_nonzero(self.block_repeat == repeat))


@dataclass
class RequestArrays:
    """Per-request quantities of one cell's measured requests (ramp rows left out), pooled over repeats."""

    repeat: np.ndarray  # int, repeat index
    tokens: np.ndarray  # float, output tokens received
    busy_s: np.ndarray  # float, end_s - send_s: how long the request held a client slot
    ttft_s: np.ndarray  # float, NaN when no token arrived
    e2e_s: np.ndarray  # float, last token - send (NaN when no token arrived)
    tpot_s: np.ndarray  # float, (e2e - ttft) / (tokens - 1), NaN when tokens < 2
    ok: np.ndarray  # bool
    end_s: np.ndarray | None = None  # float, end time relative to the repeat's t0
    blocks: BlockLayout | None = None  # the block bootstrap's layout (None: no usable steady window)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def repeats(self) -> list[int]:
        return sorted(int(r) for r in np.unique(self.repeat))


@dataclass
class Cell:
    """One measured cell: its summary and (when present) its request records."""

    arm: str
    concurrency: float
    path: Path  # the cell directory
    summary: dict[str, Any]
    requests: RequestArrays | None = None
    notes: list[str] = field(default_factory=list)
    outputs: Any = None  # per request: repeat, prompt_index, output hash and head (`analysis.outputs`)

    @property
    def key(self) -> str:
        """The summary's cell key; a bench level's `<folder>/<arm>/c<C>` (distinct across variants)."""
        if "cell" in self.summary:
            return str(self.summary["cell"]["key"])
        return f"{self.path.parent.parent.name}/{self.arm}/c{_fmt_c(self.concurrency)}"  # a bench level

    @property
    def valid(self) -> bool:
        """Judged validity (`load_cell` judges every cell it reads; a summary without a judgement is an error)."""
        return bool(self.summary["validity"]["valid"])

    @property
    def flags(self) -> list[str]:
        """The judged cell's flags: what the gates noted without invalidating it."""
        return [str(f) for f in self.summary["validity"]["flags"]]

    @property
    def invalid_reasons(self) -> list[str]:
        return [str(r) for r in self.summary["validity"]["reasons"]]

    @property
    def source(self) -> str:
        """simulated or real; `specsweep bench` levels do not know which engine they measured."""
        return str(self.summary["source"]) if "cell" in self.summary else "unknown (specsweep bench)"

    def repeat_metrics(self) -> dict[int, dict[str, Any]]:
        """Each repeat's own metrics from summary.json (`repeats[i].metrics`), keyed by repeat index."""
        out: dict[int, dict[str, Any]] = {}
        for rep in self.summary["repeats"]:
            out[int(rep["repeat"])] = rep["metrics"]
        return out


def _fmt_c(c: float) -> str:
    return str(int(c)) if float(c).is_integer() else str(c)


def metric_value(summary: dict[str, Any], path: str) -> float:
    """A dotted path into summary['metrics'] (e.g. 'tpot_s.p99'), NaN when absent or not a number."""
    node: Any = summary.get("metrics", {})
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return float("nan")
        node = node[part]
    try:
        return float(node)
    except (TypeError, ValueError):
        return float("nan")


def metric_value_any(summary: dict[str, Any], paths: tuple[tuple[str, float], ...]) -> float:
    """The first present of several (path, factor) spellings of a metric, times its factor; NaN if none."""
    for path, factor in paths:
        v = metric_value(summary, path)
        if np.isfinite(v):
            return v * factor
    return float("nan")


def summary_windows(summary: Mapping[str, Any]) -> dict[int, tuple[float, float]]:
    """Each repeat's steady window as summary.json states it (`repeats[i].metrics.steady_window`).

    Why read it rather than recompute: the block bootstrap must cut the very window the reported throughput
    was measured over.
    """
    out: dict[int, tuple[float, float]] = {}
    for i, rep in enumerate(summary.get("repeats") or []):
        w = ((rep or {}).get("metrics") or {}).get("steady_window") if isinstance(rep, dict) else None
        if isinstance(w, dict) and w.get("start_s") is not None and w.get("end_s") is not None:
            out[int(rep.get("repeat", i))] = (float(w["start_s"]), float(w["end_s"]))
    return out


def infer_concurrency(df: Any) -> int:
    """C of a closed loop from its records: the number of client slots, else the most requests in flight at
    once within a repeat (each repeat's times start at its own t0, so repeats are not overlaid)."""
    if "slot" in df and len(df) and int(df["slot"].max()) >= 0:
        return int(df["slot"].max()) + 1
    reps = df["repeat"].to_numpy() if "repeat" in df else np.zeros(len(df), dtype=np.int64)
    send = df["send_s"].to_numpy(dtype=float)
    end = df["end_s"].to_numpy(dtype=float)
    best = 1
    for r in np.unique(reps):
        ok = (reps == r) & np.isfinite(send) & np.isfinite(end)
        n = int(ok.sum())
        if not n:
            continue
        t = np.concatenate([send[ok], end[ok]])
        step = np.concatenate([np.ones(n), -np.ones(n)])
        order = np.lexsort((step, t))  # at equal times an end (-1) comes before a send: a reissued slot
        best = max(best, int(np.cumsum(step[order]).max()))
    return best


def _bins(t: np.ndarray, start: float, end: float, k: int) -> np.ndarray:
    """Block index of each request end time in [start, end] cut into k equal blocks (an inner edge belongs to the
    earlier block); -1 outside. The blocks' tokens are `_tokens_per_block`'s, over the same edges."""
    with np.errstate(invalid="ignore"):
        idx = np.ceil((t - start) / (end - start) * k).astype(np.int64) - 1
    inside = np.isfinite(t) & (t >= start) & (t <= end)
    return np.where(inside, np.clip(idx, 0, k - 1), -1)


def autocorrelation_time(x: np.ndarray) -> float:
    """Integrated autocorrelation time of a series, in samples (>= 1): 1 + 2 * sum of autocorrelations, summed
    in pairs until a pair is no longer positive (Geyer's initial positive sequence, robust to the noisy tail)."""
    x = np.asarray(x, dtype=float) - float(np.mean(x))
    n = x.size
    if n < 4 or not np.any(x):
        return 1.0
    f = np.fft.rfft(x, 2 * n)
    ac = np.fft.irfft(f * np.conj(f))[:n]
    ac = ac / ac[0]
    tau, k = 1.0, 1
    while k + 1 < n:
        pair = ac[k] + ac[k + 1]
        if pair <= 0:
            break
        tau += 2.0 * pair
        k += 2
    return max(1.0, tau)


def _tokens_per_block(
    since: np.ndarray, times: np.ndarray, tokens: np.ndarray, start: float, end: float, k: int
) -> np.ndarray:
    """Tokens delivered in each of k equal blocks of (start, end], each chunk's spread over its interval as
    `metrics.tokens_between` counts the window's (the blocks' sum is its count)."""
    edges = start + (end - start) * np.arange(k + 1) / k
    return np.diff(metrics.delivered_by(since, times, tokens, edges))


def _throughput_blocks(times: np.ndarray, tokens: np.ndarray, start: float, end: float) -> tuple[int, float]:
    """(blocks, tau in seconds) for one repeat's window: TP_BLOCK_TAUS taus a block, MIN_BLOCKS..N_TP_BLOCKS.

    tau is the arrivals' own: each chunk counted at its arrival (spread over its interval, a chunk would add its
    interval to the series' correlation, and fewer, longer blocks would widen the interval for nothing)."""
    tau = autocorrelation_time(_tokens_per_block(times, times, tokens, start, end, FINE_BINS))
    k = int(FINE_BINS / (TP_BLOCK_TAUS * tau))
    return max(MIN_BLOCKS, min(N_TP_BLOCKS, k)), tau * (end - start) / FINE_BINS


def block_layout(
    rep_all: np.ndarray,
    send_all: np.ndarray,
    end_all: np.ndarray,
    chunk_rep: np.ndarray,
    chunk_since: np.ndarray,
    chunk_s: np.ndarray,
    chunk_tokens: np.ndarray,
    rep_meas: np.ndarray,
    end_meas: np.ndarray,
    concurrency: int,
    windows: Mapping[int, tuple[float, float]] | None = None,
    n_blocks: int = N_BLOCKS,
    busy_meas: np.ndarray | None = None,
) -> BlockLayout:
    """Cut each repeat's steady window into blocks (see BlockLayout).

    `*_all` are every row of the records (ramp included: they decide where the window starts), `chunk_*` every
    token-carrying chunk with its repeat and where its interval starts (`metrics.chunk_since`), `*_meas` the
    measured requests (`busy_meas`: their send-to-end times).
    The window is the summary's when given (`windows`), else `metrics.steady_window` of the repeat's rows. A
    repeat gets min(n_blocks, requests ending in its window / MIN_BLOCK_REQUESTS, window / (BLOCK_LIFETIMES x
    median lifetime)) blocks, but not fewer than MIN_BLOCKS; none when its requests do not allow MIN_BLOCKS.
    """
    windows = dict(windows or {})
    block = np.full(rep_meas.shape[0], -1, dtype=np.int64)
    b_rep: list[np.ndarray] = []
    b_tok: list[np.ndarray] = []
    b_len: list[np.ndarray] = []
    t_rep: list[np.ndarray] = []
    t_tok: list[np.ndarray] = []
    t_len: list[np.ndarray] = []
    taus: dict[int, float] = {}
    used: dict[int, tuple[float, float]] = {}
    next_id = 0
    for r in sorted(int(x) for x in np.unique(rep_meas)):
        if r in windows:
            start, end = windows[r]
        else:
            m = rep_all == r
            start, end = metrics.steady_window(send_all[m], end_all[m], concurrency)
        if not (math.isfinite(start) and math.isfinite(end) and end > start):
            continue
        cm = chunk_rep == r
        if np.count_nonzero(cm) >= FINE_BINS // 4:  # enough chunks for a token series
            kt, taus[r] = _throughput_blocks(chunk_s[cm], chunk_tokens[cm], start, end)
            t_tok.append(_tokens_per_block(chunk_since[cm], chunk_s[cm], chunk_tokens[cm], start, end, kt))
            t_rep.append(np.full(kt, r, dtype=np.int64))
            t_len.append(np.full(kt, (end - start) / kt))
            used[r] = (float(start), float(end))
        rows = np.flatnonzero(rep_meas == r)
        inside = (end_meas[rows] >= start) & (end_meas[rows] <= end)
        n_in = int(np.count_nonzero(inside))
        k = min(n_blocks, n_in // MIN_BLOCK_REQUESTS)
        if busy_meas is not None and n_in:
            life = float(np.nanmedian(busy_meas[rows][inside]))
            if math.isfinite(life) and life > 0:
                k = min(k, max(MIN_BLOCKS, int((end - start) / (BLOCK_LIFETIMES * life))))
        if k < MIN_BLOCKS:
            continue
        idx = _bins(end_meas[rows], start, end, k)
        block[rows] = np.where(idx >= 0, idx + next_id, -1)
        b_tok.append(_tokens_per_block(chunk_since[cm], chunk_s[cm], chunk_tokens[cm], start, end, k))
        b_rep.append(np.full(k, r, dtype=np.int64))
        b_len.append(np.full(k, (end - start) / k))
        used[r] = (float(start), float(end))
        next_id += k
    cat = np.concatenate
    return BlockLayout(
        block=block,
        block_repeat=cat(b_rep) if b_rep else np.empty(0, dtype=np.int64),
        block_tokens=cat(b_tok) if b_tok else np.empty(0),
        block_len_s=cat(b_len) if b_len else np.empty(0),
        windows=used,
        tp_block_repeat=cat(t_rep) if t_rep else np.empty(0, dtype=np.int64),
        tp_block_tokens=cat(t_tok) if t_tok else np.empty(0),
        tp_block_len_s=cat(t_len) if t_len else np.empty(0),
        tau_s=taus,
    )


def request_arrays(
    df: Any,
    concurrency: int | None = None,
    windows: Mapping[int, tuple[float, float]] | None = None,
    n_blocks: int = N_BLOCKS,
) -> RequestArrays:
    """The analysis's per-request arrays from a requests.parquet frame (columns: docs/ARCHITECTURE.md).

    Latencies come from `metrics.per_request`; ramp rows (`metrics.measured` false) are left out of every
    per-request quantity but still place the steady window and deliver tokens inside it. `concurrency`
    defaults to the records' slot count; `windows` (per repeat, from summary.json) to `metrics.steady_window`.
    """
    if "repeat" not in df:
        df = df.assign(repeat=0)
    pr = metrics.per_request(df)
    meas = metrics.measured(df)
    rep_all = df["repeat"].to_numpy(dtype=np.int64)
    send_all = df["send_s"].to_numpy(dtype=float)
    end_all = df["end_s"].to_numpy(dtype=float)
    c = int(concurrency) if concurrency is not None else infer_concurrency(df)
    chunk_row, chunk_since, chunk_s, chunk_tok = metrics.flat_chunks(df)
    layout = block_layout(
        rep_all,
        send_all,
        end_all,
        rep_all[chunk_row],
        chunk_since,
        chunk_s,
        chunk_tok,
        rep_all[meas],
        end_all[meas],
        c,
        windows,
        n_blocks,
        pr["busy"].to_numpy(dtype=float)[meas],
    )
    return RequestArrays(
        repeat=rep_all[meas],
        tokens=df["output_tokens"].to_numpy(dtype=float)[meas],
        busy_s=pr["busy"].to_numpy(dtype=float)[meas],
        ttft_s=pr["ttft"].to_numpy(dtype=float)[meas],
        e2e_s=pr["e2e"].to_numpy(dtype=float)[meas],
        tpot_s=pr["tpot"].to_numpy(dtype=float)[meas],
        ok=df["ok"].to_numpy(dtype=bool)[meas],
        end_s=end_all[meas],
        blocks=layout,
    )


def load_cell(
    cell_dir: str | Path,
    arm: str | None = None,
    concurrency: float | None = None,
    gates: Mapping[str, Any] | None = None,
    slos: Mapping[str, float | None] | None = None,
) -> Cell:
    """Load one cell directory, judged by `gates` (default: the schema's) and `slos` (`summary.judged`).

    A cell without requests.parquet cannot be judged: it is invalid, with its point values kept."""
    from specsweep.config import defaults
    from specsweep.measure.summary import read_judged

    cell_dir = Path(cell_dir)
    if cell_dir.name == "summary.json":  # an explicit summary path names its cell directory too
        cell_dir = cell_dir.parent
    summary, df = read_judged(cell_dir, dict(gates) if gates is not None else defaults("gates"), slos)
    if "cell" in summary:  # a pipeline cell names itself
        meta = summary["cell"]
        arm = arm or meta["arm"]
        level = meta["level"] if meta.get("level") is not None else meta["concurrency"]
    else:  # a `specsweep bench` level: <arm>/c<C>/ names it
        arm, level = arm or cell_dir.parent.name, summary["concurrency"]
    if concurrency is None:  # the level: C, or an open/trace cell's rate or time scale
        concurrency = level
    cell = Cell(arm=str(arm), concurrency=float(concurrency), path=cell_dir, summary=summary)
    if df is None:
        cell.notes.extend(summary["validity"]["reasons"])
    else:
        cell.requests = request_arrays(df, int(round(cell.concurrency)), summary_windows(summary) or None)
        if "output_sha256" in df:
            from specsweep.analysis.outputs import OUTPUT_COLUMNS

            cell.outputs = df[list(OUTPUT_COLUMNS)]
    return cell


def find_cells(
    cells_root: str | Path, arms: list[str] | None = None, levels: list[float] | None = None
) -> dict[str, dict[float, Path]]:
    """Cell directories under `<cells_root>/<arm>/<level>/summary.json` (c<C>, r<rate>, t<scale>), filtered to
    configured arms/levels."""
    root = Path(cells_root)
    out: dict[str, dict[float, Path]] = {}
    for summary in sorted(root.glob("*/*/summary.json")):
        m = _LEVEL_DIR.match(summary.parent.name)
        if not m:
            continue
        arm, c = summary.parent.parent.name, float(m.group(2))
        if arms is not None and arm not in arms:
            continue
        if levels is not None and c not in {float(x) for x in levels}:
            continue
        out.setdefault(arm, {})[c] = summary.parent
    return out
