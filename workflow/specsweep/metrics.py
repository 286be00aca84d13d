"""Per-cell metrics and validity gates: a pure function of the request records (docs/metrics.md defines each).

Why pure: the same numbers must come out of a live measurement, a rerun from `requests.parquet`, and a unit
test on hand-built records. No clocks, no I/O, no server calls here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

STAT_KEYS = ("mean", "std", "min", "max", "p50", "p90", "p95", "p99")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
DEFAULT_GATES: dict[str, float] = {
    "loop_lag_p99_ms": 5.0,  # client event loop later than this at p99: timestamps are client delay
    "min_concurrency_fraction": 0.95,  # achieved concurrency below this share of C: not a closed loop at C
    "max_error_rate": 0.0,  # failed share of requests above this: invalid
}
# Scalars that are properties of a whole repeat (not of a request): pooled as the mean over repeats.
REPEAT_SCALARS = (
    "duration_s",
    "steady_window_s",
    "output_tok_s_steady",
    "output_tok_s_total",
    "request_throughput_rps",
    "goodput_rps",
    "achieved_concurrency",
)


def stats(values: Iterable[float] | np.ndarray, scale: float = 1.0) -> dict[str, float | int | None]:
    """mean, std (population), min, max, p50/p90/p95/p99 of finite values, times `scale`; None if empty."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)] * scale
    out: dict[str, float | int | None] = {"n": int(a.size)}
    if a.size == 0:
        out.update(dict.fromkeys(STAT_KEYS))
        return out
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    out.update(
        mean=float(a.mean()),
        std=float(a.std()),
        min=float(a.min()),
        max=float(a.max()),
        p50=float(p50),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
    )
    return out


def per_request(df: pd.DataFrame) -> pd.DataFrame:
    """Per-request latencies in seconds: ttft, e2e, tpot (NaN for < 2 tokens), tok_s (output_tokens / e2e).

    E2E ends at the last token-carrying chunk, not at the stream's close, so a trailing usage/[DONE] line does
    not count as decode time.
    """
    last = np.array([c[-1] if len(c) else np.nan for c in df["chunk_s"]], dtype=float)
    send = df["send_s"].to_numpy(dtype=float)
    ttft = df["first_token_s"].to_numpy(dtype=float) - send
    e2e = last - send
    out_tok = df["output_tokens"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out_tok >= 2, (e2e - ttft) / (out_tok - 1), np.nan)
        tok_s = np.where((out_tok > 0) & (e2e > 0), out_tok / e2e, np.nan)
    return pd.DataFrame({"ttft": ttft, "e2e": e2e, "tpot": tpot, "tok_s": tok_s}, index=df.index)


def itl(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(per-token ITL, per-chunk gap) in seconds over all requests in `df`.

    A chunk carrying k tokens after a gap g contributes k per-token ITLs of g/k each (the gap split evenly
    over the tokens it delivered) and one per-chunk gap g.
    """
    per_token: list[np.ndarray] = []
    per_chunk: list[np.ndarray] = []
    for cs, ct in zip(df["chunk_s"], df["chunk_tokens"], strict=True):
        if len(cs) < 2:
            continue
        gaps = np.diff(np.asarray(cs, dtype=float))
        toks = np.asarray(ct, dtype=np.int64)[1:]
        per_chunk.append(gaps)
        pos = toks > 0
        per_token.append(np.repeat(gaps[pos] / toks[pos], toks[pos]))
    cat = np.concatenate
    return (cat(per_token) if per_token else np.empty(0)), (cat(per_chunk) if per_chunk else np.empty(0))


def steady_window(df: pd.DataFrame, concurrency: int) -> tuple[float, float]:
    """[start, end] when all C slots are busy: from the C-th send to the first end after the last send.

    In a closed loop every end before the last send is followed at once by a new send, so in-flight stays at C
    until the requests run out; the first request to end after the last send is the first slot left empty.
    With fewer requests than C the window starts at the last send (achieved concurrency shows the shortfall).
    """
    sends = np.sort(df["send_s"].to_numpy(dtype=float))
    sends = sends[np.isfinite(sends)]
    ends = df["end_s"].to_numpy(dtype=float)
    ends = ends[np.isfinite(ends)]
    if sends.size == 0 or ends.size == 0:
        return (math.nan, math.nan)
    start = sends[min(concurrency, sends.size) - 1]
    last_send = sends[-1]
    after = ends[ends > last_send]
    end = float(after.min()) if after.size else float(ends.max())
    return float(start), max(end, float(start))


def mean_in_flight(df: pd.DataFrame, start: float, end: float) -> float:
    """Time-weighted mean number of requests in flight (sent, not yet ended) over [start, end]."""
    if not (end > start):
        return math.nan
    send = df["send_s"].to_numpy(dtype=float)
    stop = df["end_s"].to_numpy(dtype=float)
    m = np.isfinite(send) & np.isfinite(stop)
    overlap = np.clip(np.minimum(stop[m], end) - np.maximum(send[m], start), 0.0, None)
    return float(overlap.sum() / (end - start))


def tokens_between(df: pd.DataFrame, start: float, end: float) -> int:
    """Output tokens whose chunk arrived within [start, end] (all requests: tokens delivered are tokens)."""
    n = 0
    for cs, ct in zip(df["chunk_s"], df["chunk_tokens"], strict=True):
        if len(cs):
            a = np.asarray(cs, dtype=float)
            n += int(np.asarray(ct, dtype=np.int64)[(a >= start) & (a <= end)].sum())
    return n


def tokens_per_chunk(df: pd.DataFrame) -> dict[str, Any]:
    """Distribution of tokens carried per token-carrying chunk (1 without speculation, >1 with drafts)."""
    parts = [np.asarray(ct, dtype=np.int64) for ct in df["chunk_tokens"] if len(ct)]
    a = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if a.size == 0:
        return {"n_chunks": 0, "mean": None, "p50": None, "p99": None, "max": None, "histogram": {}}
    values, counts = np.unique(a, return_counts=True)
    return {
        "n_chunks": int(a.size),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": int(a.max()),
        "histogram": {str(int(v)): int(c) for v, c in zip(values, counts, strict=True)},
    }


def accept_length_from_records(df: pd.DataFrame) -> float | None:
    """SGLang: sum of completion tokens / sum of spec_verify_ct over the cell's requests that report it.

    Per-request counters cover exactly this cell, unlike the server's cumulative avg_spec_accept_length.
    """
    if "spec_verify_ct" not in df or df.empty:
        return None
    m = (df["spec_verify_ct"] > 0) & df["ok"]
    if not m.any():
        return None
    sub = df[m]
    toks = np.where(sub["server_output_tokens"] >= 0, sub["server_output_tokens"], sub["output_tokens"])
    return float(toks.sum() / sub["spec_verify_ct"].sum())


def accept_length_from_counters(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
    """vLLM-style spec-decode counter deltas (snapshots around the cell) -> acceptance figures.

    accept_length = 1 + accepted / drafts (vLLM's mean acceptance length: the bonus token plus accepted drafts
    per verify step); acceptance_rate = accepted / draft_tokens. Deltas, never since-start totals.
    """
    d = {
        k: float(after.get(k, 0.0)) - float(before.get(k, 0.0))
        for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    }
    if any(v < 0 for v in d.values()):
        raise ValueError(f"counter went backwards (server restarted?): {d}")
    drafts, draft_tokens, accepted = d["num_drafts"], d["num_draft_tokens"], d["num_accepted_tokens"]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "accept_length": (1.0 + accepted / drafts) if drafts > 0 else None,
        "acceptance_rate": (accepted / draft_tokens) if draft_tokens > 0 else None,
    }


def _meets_slos(pr: pd.DataFrame, slos: Mapping[str, float]) -> np.ndarray:
    ok = np.ones(len(pr), dtype=bool)
    col = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2e_ms": "e2e"}
    for key, limit in slos.items():
        if key not in col:
            raise ValueError(f"unknown SLO {key!r}; expected one of {SLO_KEYS}")
        v = pr[col[key]].to_numpy(dtype=float) * 1e3
        # An undefined TPOT (one output token) has no inter-token time to violate: it meets the SLO.
        ok &= (v <= limit) | (np.isnan(v) if key == "tpot_ms" else False)
    return ok


def errors_summary(df: pd.DataFrame, max_messages: int = 3) -> dict[str, Any]:
    """Failed requests counted by kind, with the first few distinct messages of each kind."""
    bad = df[~df["ok"]]
    by_kind: dict[str, int] = {}
    messages: dict[str, list[str]] = {}
    for kind, msg in zip(bad["error_kind"], bad["error"], strict=True):
        by_kind[kind] = by_kind.get(kind, 0) + 1
        lst = messages.setdefault(kind, [])
        if len(lst) < max_messages and msg not in lst:
            lst.append(msg)
    n = len(df)
    return {
        "count": int(len(bad)),
        "rate": (len(bad) / n) if n else 0.0,
        "by_kind": by_kind,
        "messages": messages,
    }


def repeat_metrics(
    df: pd.DataFrame,
    concurrency: int,
    slos: Mapping[str, float] | None = None,
    lag_samples: Sequence[float] | None = None,
) -> dict[str, Any]:
    """All metrics of one repeat (or of pooled records when `df` holds several repeats; see `summarize`)."""
    pr = per_request(df)
    good = df["ok"].to_numpy(dtype=bool) & (df["output_tokens"].to_numpy() > 0)
    prg = pr[good]
    itl_tok, itl_chunk = itl(df[good])
    sends = df["send_s"].to_numpy(dtype=float)
    ends = df["end_s"].to_numpy(dtype=float)
    first_send = float(np.nanmin(sends)) if len(df) else math.nan
    last_end = float(np.nanmax(ends)) if len(df) else math.nan
    duration = last_end - first_send
    start, end = steady_window(df, concurrency)
    steady = end - start
    total_tokens = int(df["output_tokens"].sum())
    n_ok = int(df["ok"].sum())
    goodput = None
    if slos:
        goodput = float(_meets_slos(prg, slos).sum() / duration) if duration > 0 else None
    lag = np.asarray(lag_samples if lag_samples is not None else [], dtype=float)

    def rate(x: float, t: float) -> float | None:
        return float(x / t) if t > 0 and math.isfinite(t) else None

    return {
        "n_requests": int(len(df)),
        "n_ok": n_ok,
        "output_tokens_total": total_tokens,
        "duration_s": duration if math.isfinite(duration) else None,
        "steady_window": {"start_s": _f(start), "end_s": _f(end)},
        "steady_window_s": _f(steady),
        "output_tok_s_steady": rate(tokens_between(df, start, end), steady),
        "output_tok_s_total": rate(total_tokens, duration),
        "request_throughput_rps": rate(n_ok, duration),
        "goodput_rps": goodput,
        "slos": dict(slos) if slos else {},
        "achieved_concurrency": _f(mean_in_flight(df, start, end)),
        "ttft_ms": stats(prg["ttft"], 1e3),
        "tpot_ms": stats(prg["tpot"], 1e3),
        "itl_token_ms": stats(itl_tok, 1e3),
        "itl_chunk_ms": stats(itl_chunk, 1e3),
        "e2e_ms": stats(prg["e2e"], 1e3),
        "request_tok_s": stats(prg["tok_s"]),
        "tokens_per_chunk": tokens_per_chunk(df[good]),
        "accept_length": accept_length_from_records(df),
        "loop_lag_ms": stats(lag, 1e3),
        "errors": errors_summary(df),
    }


def _f(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def validity(
    m: Mapping[str, Any],
    df: pd.DataFrame,
    concurrency: int,
    gates: Mapping[str, float] | None = None,
    server_max_running: int | None = None,
    expected_output_tokens: int | None = None,
) -> dict[str, Any]:
    """Gates on one repeat's metrics -> {valid, reasons[], flags[]}. Reasons invalidate; flags inform."""
    g = {**DEFAULT_GATES, **(gates or {})}
    reasons: list[str] = []
    flags: list[str] = []
    lag_p99 = m["loop_lag_ms"]["p99"]
    if lag_p99 is None:
        flags.append("no loop-lag samples: client keep-up not checked")
    elif lag_p99 > g["loop_lag_p99_ms"]:
        reasons.append(
            f"client event-loop lag p99 {lag_p99:.2f} ms > {g['loop_lag_p99_ms']:g} ms: the client could not keep up"
        )
    ach = m["achieved_concurrency"]
    if ach is None or ach < g["min_concurrency_fraction"] * concurrency:
        shown = "n/a" if ach is None else f"{ach:.2f}"
        reasons.append(f"achieved concurrency {shown} < {g['min_concurrency_fraction']:.0%} of C={concurrency}")
    err = m["errors"]
    if err["rate"] > g["max_error_rate"]:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(err["by_kind"].items()))
        reasons.append(f"error rate {err['rate']:.2%} > {g['max_error_rate']:.2%} ({kinds})")
    short = int((df["error_kind"] == "short_output").sum())
    if expected_output_tokens is not None:
        short += int(((df["output_tokens"] < expected_output_tokens) & df["ok"]).sum())
    if short:
        reasons.append(f"{short} request(s) produced fewer output tokens than asked")
    if server_max_running is not None and concurrency > server_max_running:
        flags.append(
            f"C={concurrency} exceeds the server's running-request cap {server_max_running}: "
            "the excess requests queue inside the server"
        )
    okdf = df[df["ok"] & (df["server_output_tokens"] >= 0)]
    mismatch = int((okdf["server_output_tokens"] != okdf["output_tokens"]).sum())
    if mismatch:
        flags.append(f"{mismatch} request(s): streamed token count differs from the server's usage")
    if len(df) and len(df) < concurrency:
        flags.append(f"only {len(df)} requests for C={concurrency}: no steady window")
    return {"valid": not reasons, "reasons": reasons, "flags": flags}


def summarize(
    records: pd.DataFrame,
    concurrency: int,
    expected_output_tokens: int | None = None,
    slos: Mapping[str, float] | None = None,
    gates: Mapping[str, float] | None = None,
    lag_samples: Sequence[Sequence[float]] | Mapping[int, Sequence[float]] | None = None,
    server_max_running: int | None = None,
    counters: tuple[Mapping[str, float], Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """Cell metrics: {metrics (pooled over repeats), repeats[...], validity} as a JSON-able dict.

    Pooled: latency/ITL/token distributions over all requests of all repeats; per-repeat scalars (throughputs,
    achieved concurrency, goodput, durations) as the mean over repeats, with their spread in `repeat_spread`;
    loop lag over all samples. A cell is valid only if every repeat is. `lag_samples` is one list per repeat
    (by position, or a mapping repeat -> samples). `counters` = (before, after) spec-decode counter snapshots.
    """
    if "repeat" not in records:
        records = records.assign(repeat=0)
    reps = sorted(int(r) for r in records["repeat"].unique())
    if isinstance(lag_samples, Mapping):
        lag_by = {int(k): list(v) for k, v in lag_samples.items()}
    else:
        lag_by = {r: list(lag_samples[i]) for i, r in enumerate(reps)} if lag_samples else {}
    per_rep: list[dict[str, Any]] = []
    valid, reasons, flags = True, [], []
    for r in reps:
        sub = records[records["repeat"] == r]
        m = repeat_metrics(sub, concurrency, slos, lag_by.get(r))
        v = validity(m, sub, concurrency, gates, server_max_running, expected_output_tokens)
        per_rep.append({"repeat": r, "metrics": m, "validity": v})
        valid &= v["valid"]
        prefix = f"repeat {r}: " if len(reps) > 1 else ""
        reasons += [prefix + x for x in v["reasons"]]
        flags += [x if x.startswith("C=") else prefix + x for x in v["flags"]]
    all_lag = [x for r in reps for x in lag_by.get(r, [])]
    pooled = repeat_metrics(records, concurrency, slos, all_lag) if len(records) else {}
    spread: dict[str, Any] = {}
    for key in REPEAT_SCALARS:
        vals = [p["metrics"][key] for p in per_rep if p["metrics"].get(key) is not None]
        if pooled:
            pooled[key] = float(np.mean(vals)) if vals else None
        spread[key] = stats(vals)
    if pooled:
        pooled["steady_window"] = None  # per repeat only: windows of different repeats share no clock origin
        pooled["repeat_spread"] = spread
        pooled["n_repeats"] = len(reps)
        if counters is not None:
            c = accept_length_from_counters(*counters)
            pooled["spec_counters"] = c
            if c["accept_length"] is not None:
                pooled["accept_length"] = c["accept_length"]
    if not reps:
        valid, reasons = False, ["no requests recorded"]
    return {
        "metrics": pooled,
        "repeats": per_rep,
        "validity": {"valid": bool(valid), "reasons": reasons, "flags": list(dict.fromkeys(flags))},
    }


def jsonable(obj: Any) -> Any:
    """NaN/inf -> None and numpy scalars -> Python, recursively (summary.json must be strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj
