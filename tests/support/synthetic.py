"""Synthetic cells with a known truth, for the analysis tests and for trying the analysis without a server.

Two generators of closed-loop request records (the requests.parquet columns):

- `synthetic_requests`: independent requests, each with a lognormal end-to-end time around a known mean.
- `correlated_requests`: what a real server does to a batch: all requests in flight share one time-varying
  server speed (log speed an AR(1) process with a correlation time of about one request), and each repeat has
  its own speed factor (run-to-run variation). A request is a fixed amount of work that progresses at the
  current speed, so requests that overlap in time are slow or fast together. The speed's mean over time and
  the run factor's mean are both 1, so the true mean aggregate throughput is C * tokens / mean_e2e_s (Little's
  law) whatever the noise: `true_throughput` gives it, and a true speedup is a ratio of two of them.

`write_synthetic_variant` writes a baseline and a speculative arm whose true throughput ratio is a given
function of C, with summary.json values computed like `specsweep.measure.metrics` computes them (steady window,
per-repeat values, ramp rows left out).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.signal import lfilter

from specsweep.analysis.cells import Cell, RequestArrays, block_layout
from specsweep.config import defaults
from specsweep.measure import gates, metrics
from specsweep.measure.summary import cell_identity, summary_body, write_cell

__all__ = [
    "SimulatedRun",
    "correlated_cell",
    "correlated_requests",
    "simulate_correlated",
    "summary_metrics",
    "synthetic_requests",
    "true_throughput",
    "write_synthetic_cell",
    "write_synthetic_variant",
]


def true_throughput(concurrency: float, tokens: int, mean_e2e_s: float) -> float:
    """Mean aggregate throughput of a closed loop at C whose requests take mean_e2e_s at mean speed."""
    return concurrency * tokens / mean_e2e_s


def _row(
    r: int, i: int, slot: int, ramp: bool, send: float, chunk_s: list[float], chunk_tokens: list[int]
) -> dict[str, Any]:
    """One successful record in the requests.parquet layout; the stream ends with its last chunk."""
    tokens = int(sum(chunk_tokens))
    return {
        "repeat": r,
        "request_index": i,
        "prompt_index": i,
        "slot": slot,
        "ramp": ramp,
        "filler": False,
        "scheduled_s": math.nan,  # a closed loop
        "held_s": 0.0,
        "send_s": send,
        "first_token_s": chunk_s[0] if chunk_s else math.nan,
        "end_s": chunk_s[-1] if chunk_s else send,
        "chunk_s": chunk_s,
        "chunk_tokens": chunk_tokens,
        "server_chunk_s": [],
        "input_tokens": 128,
        "output_tokens": tokens,
        "server_output_tokens": tokens,
        "expected_output_tokens": tokens,
        "spec_verify_ct": -1,
        "cached_tokens": 0,
        "output_sha256": "",
        "output_prefix": "",
        "content": "",
        "finish_reason": "length",
        "ok": True,
        "error_kind": "",
        "error": "",
    }


def synthetic_requests(
    concurrency: int,
    n_requests: int,
    tokens: int,
    mean_e2e_s: float,
    sigma: float,
    rng: np.random.Generator,
    repeats: int = 1,
    ttft_frac: float = 0.05,
    tokens_per_chunk: int = 1,
) -> pd.DataFrame:
    """Request records of a closed loop of independent requests with lognormal end-to-end times."""
    rows: list[dict[str, Any]] = []
    n_chunks = max(1, math.ceil(tokens / tokens_per_chunk))
    chunk_tokens = [tokens_per_chunk] * (n_chunks - 1) + [tokens - tokens_per_chunk * (n_chunks - 1)]
    for r in range(repeats):
        e2e = mean_e2e_s * rng.lognormal(-0.5 * sigma**2, sigma, size=n_requests)  # mean exactly mean_e2e_s
        slot_free = np.zeros(concurrency)
        for i in range(n_requests):
            j = int(np.argmin(slot_free))
            send = float(slot_free[j])
            first, end = send + ttft_frac * e2e[i], send + e2e[i]
            slot_free[j] = end
            rows.append(_row(r, i, j, False, send, list(np.linspace(first, end, n_chunks)), list(chunk_tokens)))
    return pd.DataFrame(rows)


@dataclass
class SimulatedRun:
    """Arrays of one correlated closed-loop run, all repeats: one entry per record (ramp rows included)."""

    repeat: np.ndarray  # int
    slot: np.ndarray  # int
    ramp: np.ndarray  # bool: a slot's first, shortened request
    send_s: np.ndarray
    end_s: np.ndarray
    tokens: np.ndarray  # int, per record
    token_s: np.ndarray  # (records, max tokens): arrival of each token, NaN past a record's tokens
    concurrency: int

    def __len__(self) -> int:
        return int(self.send_s.size)


def _log_speed(n: int, dt: float, corr_s: float, sd: float, rng: np.random.Generator) -> np.ndarray:
    """A stationary AR(1) path of log speed on a grid of step dt: correlation exp(-lag / corr_s), sd `sd`."""
    if sd <= 0:
        return np.zeros(n)
    phi = math.exp(-dt / corr_s)
    eps = rng.standard_normal(n)
    x0 = rng.standard_normal() * sd
    x, _ = lfilter([sd * math.sqrt(1.0 - phi * phi)], [1.0, -phi], eps, zi=[phi * x0])
    return np.asarray(x)


def _work_done(
    need: float, dt: float, corr_s: float, speed_sd: float, run: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(grid times, work one slot has done by each): the shared speed run x exp(log speed), mean `run`,
    long enough for `need` seconds of work at speed 1."""
    n_grid = int(need / (run * dt) * 1.5) + 16
    while True:
        x = _log_speed(n_grid, dt, corr_s, speed_sd, rng)
        done = np.concatenate([[0.0], np.cumsum(run * np.exp(x - 0.5 * speed_sd**2) * dt)])
        if done[-1] >= need:
            return np.arange(n_grid + 1) * dt, done
        n_grid *= 2


def _token_times(
    start_work: np.ndarray,
    work: np.ndarray,
    ntok: np.ndarray,
    width: int,
    ttft_frac: float,
    grid: np.ndarray,
    done: np.ndarray,
) -> np.ndarray:
    """(records, width) arrival time of each token: the first after ttft_frac of a request's work, the rest
    evenly over the remaining work, the last at its end; NaN past a record's tokens."""
    j = np.arange(width)[None, :]
    n = ntok[:, None]
    frac = np.where(n > 1, ttft_frac + (1.0 - ttft_frac) * j / np.maximum(n - 1, 1), 1.0)
    frac = np.where(j < n, np.minimum(frac, 1.0), np.nan)
    tok_work = start_work[:, None] + frac * work[:, None]
    return np.where(np.isfinite(tok_work), np.interp(np.nan_to_num(tok_work), done, grid), np.nan)


def _one_repeat(
    concurrency: int,
    n_requests: int,
    tokens: int,
    mean_e2e_s: float,
    rng: np.random.Generator,
    speed_sd: float,
    corr_requests: float,
    run_sd: float,
    request_sd: float,
    ttft_frac: float,
    stagger: bool,
) -> tuple[np.ndarray, ...]:
    """One repeat: (slot, ramp, send, end, tokens, token times) of its records, in order of sending.

    Each slot runs its requests back to back, each a lognormal amount of work (its duration at speed 1, mean
    mean_e2e_s) done at the shared speed; the closed loop keeps the first n_requests measured sends of all
    slots (after them it stops issuing). Slots get enough candidate requests that none runs out first.
    """
    c = concurrency
    run = math.exp(rng.normal(-0.5 * run_sd**2, run_sd)) if run_sd else 1.0
    dt = 0.1 * mean_e2e_s * min(1.0, corr_requests)
    ramp_tok = np.maximum(1, np.round(tokens * (np.arange(c) + 1) / c)).astype(np.int64)
    per_slot = math.ceil(1.5 * n_requests / c) + 3
    while True:
        work = mean_e2e_s * rng.lognormal(-0.5 * request_sd**2, request_sd, size=(c, per_slot + 1))
        if stagger:
            work[:, 0] *= ramp_tok / tokens  # the ramp request: (k+1)/C of the tokens
        cum = np.cumsum(work, axis=1)  # work done by each slot when each of its requests ends
        grid, done = _work_done(float(cum.max()), dt, corr_requests * mean_e2e_s, speed_sd, run, rng)
        end = np.interp(cum, done, grid)
        send = np.concatenate([np.zeros((c, 1)), end[:, :-1]], axis=1)  # a slot sends as its previous one ends
        ramp = np.zeros(send.shape, dtype=bool)
        ramp[:, 0] = stagger
        order = np.argsort(np.where(ramp, np.inf, send), axis=None, kind="stable")[:n_requests]
        if send.ravel()[order].max() < send[:, -1].min():  # every slot still had requests left
            break
        per_slot *= 2
    ntok = np.full(send.shape, tokens, dtype=np.int64)
    if stagger:
        ntok[:, 0] = ramp_tok
    keep = np.zeros(send.size, dtype=bool)
    keep[order] = True
    keep |= ramp.ravel()
    idx = np.flatnonzero(keep)
    idx = idx[np.argsort(send.ravel()[idx], kind="stable")]
    tok_s = _token_times((cum - work).ravel()[idx], work.ravel()[idx], ntok.ravel()[idx], tokens, ttft_frac, grid, done)
    slot = np.broadcast_to(np.arange(c)[:, None], send.shape).ravel()
    return slot[idx], ramp.ravel()[idx], send.ravel()[idx], end.ravel()[idx], ntok.ravel()[idx], tok_s


def simulate_correlated(
    concurrency: int,
    n_requests: int,
    tokens: int,
    mean_e2e_s: float,
    rng: np.random.Generator,
    repeats: int = 1,
    speed_sd: float = 0.2,
    corr_requests: float = 1.0,
    run_sd: float = 0.0,
    request_sd: float = 0.1,
    ttft_frac: float = 0.05,
    stagger: bool = True,
) -> SimulatedRun:
    """A closed loop of C slots whose in-flight requests share a time-varying server speed.

    speed_sd: sd of log speed (shared by every request in flight); corr_requests: its correlation time in mean
    request durations; run_sd: sd of each repeat's log speed factor (run-to-run variation); request_sd: sd of
    each request's own log work. stagger: each slot first sends a ramp request of (k+1)/C of the tokens, marked
    `ramp`, as the real load generator does. Times are seconds from the repeat's first send.
    """
    parts = [
        _one_repeat(
            concurrency,
            n_requests,
            tokens,
            mean_e2e_s,
            rng,
            speed_sd,
            corr_requests,
            run_sd,
            request_sd,
            ttft_frac,
            stagger,
        )
        for _ in range(repeats)
    ]
    return SimulatedRun(
        repeat=np.concatenate([np.full(p[0].size, r, dtype=np.int64) for r, p in enumerate(parts)]),
        slot=np.concatenate([p[0] for p in parts]),
        ramp=np.concatenate([p[1] for p in parts]),
        send_s=np.concatenate([p[2] for p in parts]),
        end_s=np.concatenate([p[3] for p in parts]),
        tokens=np.concatenate([p[4] for p in parts]),
        token_s=np.concatenate([p[5] for p in parts]),
        concurrency=concurrency,
    )


def correlated_requests(
    concurrency: int,
    n_requests: int,
    tokens: int,
    mean_e2e_s: float,
    rng: np.random.Generator,
    repeats: int = 1,
    **kwargs: Any,
) -> pd.DataFrame:
    """`simulate_correlated` as request records (the requests.parquet columns, one token per chunk)."""
    run = simulate_correlated(concurrency, n_requests, tokens, mean_e2e_s, rng, repeats, **kwargs)
    rows = []
    for i in range(len(run)):
        n = int(run.tokens[i])
        chunks = [float(t) for t in run.token_s[i, :n]]
        r, slot, ramp, send = int(run.repeat[i]), int(run.slot[i]), bool(run.ramp[i]), float(run.send_s[i])
        rows.append(_row(r, i, slot, ramp, send, chunks, [1] * n))
    df = pd.DataFrame(rows)
    df["request_index"] = df.groupby("repeat").cumcount()
    return df


def _stat(values: np.ndarray, q: float) -> float | None:
    v = values[np.isfinite(values)]
    return float(np.percentile(v, q)) if v.size else None


def _metrics_block(
    tok_s: float | None,
    window: tuple[float, float],
    ttft: np.ndarray,
    e2e: np.ndarray,
    tpot: np.ndarray,
    rate: np.ndarray,
) -> dict[str, Any]:
    """The compared metrics in summary.json's layout (*_ms, output_tok_s_steady), for the in-memory cells."""
    r_mean = float(np.nanmean(rate)) if np.isfinite(rate).any() else None
    lat = {
        "ttft": {"p50": _stat(ttft, 50)},
        "tpot": {"p50": _stat(tpot, 50), "p99": _stat(tpot, 99)},
        "e2e": {"p50": _stat(e2e, 50)},
    }
    out: dict[str, Any] = {"output_tok_s_steady": tok_s, "request_tok_s": {"mean": r_mean}}
    for k, v in lat.items():
        out[f"{k}_ms"] = {q: (None if x is None else 1e3 * x) for q, x in v.items()}
    out["steady_window"] = {"start_s": window[0], "end_s": window[1]}
    return out


def _token_since(send: np.ndarray, token_s: np.ndarray) -> np.ndarray:
    """Where each token's interval starts (`metrics.chunk_since`): the record's previous token, the first's send."""
    return np.column_stack([send, token_s[:, :-1]])


def _tokens_in(send: np.ndarray, token_s: np.ndarray, start: float, end: float) -> float:
    """The window's tokens in (start, end], as `metrics.tokens_between` counts them (one token a chunk)."""
    has = np.isfinite(token_s)
    since = _token_since(send, token_s)[has]
    before, by_end = metrics.delivered_by(since, token_s[has], np.ones(since.size), np.array([start, end]))
    return float(by_end - before)


def _summary_from_arrays(
    run_repeat: np.ndarray,
    send: np.ndarray,
    end: np.ndarray,
    token_s: np.ndarray,
    measured: np.ndarray,
    ok: np.ndarray,
    pr: pd.DataFrame,
    concurrency: int,
) -> dict[str, Any]:
    """metrics + repeats[i].metrics as `specsweep.measure.gates.summarize` lays them out (the values it would give
    for the compared metrics): steady-window throughput per repeat and pooled as their mean, latencies over
    the measured ok requests, per repeat and pooled."""
    reps = []
    good = measured & ok
    cols = {k: pr[k].to_numpy(dtype=float) for k in ("ttft", "e2e", "tpot", "tok_s")}
    for r in sorted(int(x) for x in np.unique(run_repeat)):
        m = run_repeat == r
        start, stop = metrics.steady_window(send[m], end[m], concurrency)
        steady = stop - start
        tok_s = _tokens_in(send[m], token_s[m], start, stop) / steady if steady > 0 else None
        g = good & m
        block = _metrics_block(tok_s, (start, stop), cols["ttft"][g], cols["e2e"][g], cols["tpot"][g], cols["tok_s"][g])
        reps.append({"repeat": r, "metrics": block})
    vals = [x["metrics"]["output_tok_s_steady"] for x in reps if x["metrics"]["output_tok_s_steady"] is not None]
    pooled = _metrics_block(
        float(np.mean(vals)) if vals else None,
        (math.nan, math.nan),
        cols["ttft"][good],
        cols["e2e"][good],
        cols["tpot"][good],
        cols["tok_s"][good],
    )
    pooled["steady_window"] = None
    pooled["n_repeats"] = len(reps)
    pooled["output_tok_s_total"] = pooled["output_tok_s_steady"]
    return {"metrics": pooled, "repeats": reps}


def summary_metrics(df: pd.DataFrame, concurrency: int) -> dict[str, Any]:
    """{metrics, repeats, validity} of request records, judged by the default gates (`gates.summarize`)."""
    return gates.summarize(df, concurrency, defaults("gates"))


def correlated_cell(key: str, run: SimulatedRun, arm: str = "a") -> Cell:
    """A Cell straight from simulated arrays (no DataFrame): what `load_cell` would give for the same records.

    Why: the coverage tests bootstrap hundreds of data sets; building list columns for each would dominate.
    """
    meas = ~run.ramp
    send, end = run.send_s, run.end_s
    first = run.token_s[:, 0]
    last = np.take_along_axis(run.token_s, (run.tokens - 1)[:, None], axis=1)[:, 0]
    toks = run.tokens.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        pr = pd.DataFrame(
            {
                "ttft": first - send,
                "e2e": last - send,
                "tpot": np.where(toks >= 2, (last - first) / (toks - 1), np.nan),
                "tok_s": np.where(last > send, toks / (last - send), np.nan),
                "busy": end - send,
            }
        )
    has = np.isfinite(run.token_s)
    layout = block_layout(
        run.repeat,
        send,
        end,
        np.repeat(run.repeat, has.sum(axis=1)),
        _token_since(send, run.token_s)[has],
        run.token_s[has],
        np.ones(int(has.sum())),
        run.repeat[meas],
        end[meas],
        run.concurrency,
        busy_meas=(end - send)[meas],
    )
    req = RequestArrays(
        repeat=run.repeat[meas],
        tokens=toks[meas],
        busy_s=(end - send)[meas],
        ttft_s=pr["ttft"].to_numpy()[meas],
        e2e_s=pr["e2e"].to_numpy()[meas],
        tpot_s=pr["tpot"].to_numpy()[meas],
        ok=np.ones(int(meas.sum()), dtype=bool),
        end_s=end[meas],
        blocks=layout,
    )
    ok = np.ones(len(run), dtype=bool)
    summary = _summary_from_arrays(run.repeat, send, end, run.token_s, meas, ok, pr, run.concurrency)
    summary.update(
        cell={"key": key, "arm": arm, "concurrency": run.concurrency},
        source="simulated",
        validity={"valid": True, "reasons": [], "flags": []},
    )
    return Cell(arm, float(run.concurrency), Path("."), summary, req)


def write_synthetic_cell(
    variant_dir: str | Path,
    arm: str,
    concurrency: int,
    df: pd.DataFrame,
    *,
    experiment: str = "synthetic",
    variant: str = "synthetic",
    valid: bool = True,
    reasons: list[str] | None = None,
    accept_length: float | None = None,
    source: str = "simulated",
    engine: str = "sim",
) -> Path:
    """Write `<variant_dir>/<arm>/c<C>/{requests.parquet,summary.json}` through the pipeline's own summary
    builder and writer (`specsweep.measure.summary`), and return the cell directory. `valid=False` marks the cell
    invalid with `reasons`, as a failed gate would."""
    d = Path(variant_dir) / arm / f"c{concurrency}"
    repeats = sorted(int(r) for r in df["repeat"].unique()) if len(df) else [0]
    workload = {
        "source": "synthetic",
        "backend": "sglang",
        "endpoint": "generate",
        "n_requests": int((~df["ramp"]).sum() // max(1, len(repeats))) if len(df) else 0,
        "ramp_requests": concurrency,
        "stagger": True,
        "output_tokens": int(df["expected_output_tokens"].max()) if len(df) else 0,
        "temperature": 0.0,
        "request_timeout_s": 120.0,
        "repeats": len(repeats),
    }
    summary = summary_body(df, concurrency, workload=workload)
    if accept_length is not None:
        summary["metrics"]["accept_length"] = accept_length
    summary.update(
        cell=cell_identity(experiment, variant, arm, concurrency, arm != "baseline"),
        source=source,
        engine=engine,
        client_backend="sglang",
        server={  # no server ran: the facts of one that would have
            "engine": engine,
            "identity": f"synthetic-{arm}",
            "argv": [],
            "env": {},
            "host": "127.0.0.1",
            "port": 0,
            "resource": "cpu",
            "info": {},
            "pid": None,
            "started_at": None,
            "ready_after_s": None,
        },
        stack={"fingerprint": "", "recipe": None},
        cpus={"client": None, "server": None, "shared": None, "note": "synthetic"},
        level_s=0.0,
        measured_s=0.0,
    )
    if not valid:  # as the measuring process marks a cell it knows to be broken, whatever the gates
        summary["measurement"]["reasons"] = list(reasons or ["invalid"])
    write_cell(d, df, summary)
    return d


def write_synthetic_variant(
    variant_dir: str | Path,
    levels: list[int],
    speedup: Callable[[float], float],
    *,
    spec_arm: str = "eagle3",
    tokens: int = 64,
    sigma: float = 0.3,
    requests_per_level: Callable[[int], int] = lambda c: max(8, 4 * c),
    base_tpot_s: Callable[[float], float] = lambda c: 0.01 + 0.0004 * c,
    seed: int = 0,
    invalid: tuple[tuple[str, int], ...] = (),
    missing: tuple[tuple[str, int], ...] = (),
    repeats: int = 1,
    speed_sd: float = 0.0,
    run_sd: float = 0.0,
    experiment: str = "synthetic",
    variant: str = "synthetic",
) -> None:
    """A baseline and a speculative arm whose true throughput ratio at level C is `speedup(C)`.

    Closed loops with staggered ramp requests (as the load generator runs them); `sigma` is each request's own
    log-length spread, `speed_sd` / `run_sd` add a shared server speed and run-to-run variation
    (`simulate_correlated`). Cells in `invalid` are written marked invalid, those in `missing` not at all.
    """
    rng = np.random.default_rng(seed)
    for c in levels:
        base_e2e = tokens * base_tpot_s(c)
        for arm, mean in (("baseline", base_e2e), (spec_arm, base_e2e / speedup(c))):
            df = correlated_requests(
                c,
                requests_per_level(c),
                tokens,
                mean,
                rng,
                repeats=repeats,
                speed_sd=speed_sd,
                run_sd=run_sd,
                request_sd=sigma,
            )
            if (arm, c) in missing:
                continue
            bad = (arm, c) in invalid
            write_synthetic_cell(
                variant_dir,
                arm,
                c,
                df,
                experiment=experiment,
                variant=variant,
                valid=not bad,
                reasons=["client_lag"] if bad else None,
                accept_length=(2.5 - 0.1 * math.log(c)) if arm != "baseline" else None,
            )
