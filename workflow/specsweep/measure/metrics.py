"""Per-cell metrics: a pure function of the request records (docs/metrics.md defines each); the gates that
judge them are `specsweep.measure.gates`.

Why pure: the same numbers must come out of a live measurement, a rerun from `requests.parquet`, and a unit
test on hand-built records. No clocks, no I/O, no server calls here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from specsweep.client.backends import ABORTED

STAT_KEYS = ("mean", "std", "min", "max", "p50", "p90", "p95", "p99")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
# Scalars that are properties of a whole repeat (not of a request): pooled as the mean over repeats.
REPEAT_SCALARS = (
    "duration_s",
    "steady_window_s",
    "output_tok_s_steady",
    "output_tok_s_total",
    "request_throughput_rps",
    "goodput_rps",
    "achieved_concurrency",
    "running_requests_mean",
    "achieved_rate_rps",
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


def _flag(df: pd.DataFrame, column: str) -> np.ndarray:
    """A boolean record column as an array, False where it is missing or null (records from before it)."""
    if column not in df:
        return np.zeros(len(df), dtype=bool)
    values = df[column].to_numpy()
    if values.dtype == bool:
        return values
    return np.array([isinstance(v, bool | np.bool_) and bool(v) for v in values], dtype=bool)


def measured(df: pd.DataFrame) -> np.ndarray:
    """Rows that are measured requests: not the ramp requests that stagger the slots, nor the fillers that keep
    them busy to the last measured end (`loadgen.run_closed_loop`; older records: all, or no fillers)."""
    return ~(_flag(df, "ramp") | _flag(df, "filler"))


def aborted(df: pd.DataFrame) -> np.ndarray:
    """Fillers the closed loop stopped when its last measured request ended: not failures, not answers."""
    return _flag(df, "filler") & (df["error_kind"] == ABORTED).to_numpy(dtype=bool)


def per_request(df: pd.DataFrame) -> pd.DataFrame:
    """Per-request times in seconds: ttft, e2e, tpot (NaN for < 2 tokens), tok_s (output_tokens / e2e), busy.

    The one definition used by the metrics, the analysis's bootstrap and the simulator's checks. E2E ends at the
    last token-carrying chunk, not at the stream's close, so a trailing usage/[DONE] line does not count as
    decode time; `busy` (end - send) is how long the request held its client slot.
    """
    last = np.array([c[-1] if len(c) else np.nan for c in df["chunk_s"]], dtype=float)
    send = df["send_s"].to_numpy(dtype=float)
    ttft = df["first_token_s"].to_numpy(dtype=float) - send
    e2e = last - send
    out_tok = df["output_tokens"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out_tok >= 2, (e2e - ttft) / (out_tok - 1), np.nan)
        tok_s = np.where((out_tok > 0) & (e2e > 0), out_tok / e2e, np.nan)
    busy = df["end_s"].to_numpy(dtype=float) - send
    return pd.DataFrame({"ttft": ttft, "e2e": e2e, "tpot": tpot, "tok_s": tok_s, "busy": busy}, index=df.index)


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


def steady_window(send_s: Any, end_s: Any, concurrency: int) -> tuple[float, float]:
    """[start, end] of a closed-loop level's steady window, from plain arrays of send and end times.

    start: the C-th request end, i.e. one full turnover of the C slots after the first sends (with staggered
    slots, the end of the last ramp request), so the initial burst of C prefills is left out. end: the first
    end after the last send, the first slot left empty because the requests ran out. In between, every end is
    followed at once by a new send, so C requests are in flight unless the client falls behind. The one
    definition used by the metrics, `predict` and the simulator's load check (docs/metrics.md). An empty
    window (too few requests for a full turnover) is returned as (start, start).
    """
    sends = np.asarray(send_s, dtype=float)
    sends = sends[np.isfinite(sends)]
    ends = np.sort(np.asarray(end_s, dtype=float))
    ends = ends[np.isfinite(ends)]
    if sends.size == 0 or ends.size == 0:
        return (math.nan, math.nan)
    start = float(ends[min(concurrency, ends.size) - 1])
    after = ends[ends > sends.max()]
    end = float(after.min()) if after.size else float(ends.max())
    return start, max(end, start)


def is_open_loop(df: pd.DataFrame) -> bool:
    """Whether the records come from an open loop: their requests carry a planned send time."""
    return "scheduled_s" in df and bool(np.isfinite(df["scheduled_s"].to_numpy(dtype=float)).any())


def open_window(send_s: Any, end_s: Any) -> tuple[float, float]:
    """[start, end] of an open-loop level's steady window, from plain arrays of send and end times.

    start: the first end, about one request time after the first arrival into an idle server (the fill
    transient: before it nothing has left, so in-flight only grows). end: the last send, after which arrivals
    stop and the server drains. In between arrivals and departures both run, as in the stationary regime
    the level stands for (docs/metrics.md). An empty window (the run was shorter than one request) is
    returned as (start, start).
    """
    sends = np.asarray(send_s, dtype=float)
    sends = sends[np.isfinite(sends)]
    ends = np.asarray(end_s, dtype=float)
    ends = ends[np.isfinite(ends)]
    if sends.size == 0 or ends.size == 0:
        return (math.nan, math.nan)
    start = float(ends.min())
    return start, max(float(sends.max()), start)


def window(df: pd.DataFrame, concurrency: int) -> tuple[float, float]:
    """The level's steady window: `open_window` for open-loop records, `steady_window` for a closed loop."""
    sends, ends = df["send_s"].to_numpy(dtype=float), df["end_s"].to_numpy(dtype=float)
    return open_window(sends, ends) if is_open_loop(df) else steady_window(sends, ends, concurrency)


def send_lag(df: pd.DataFrame) -> np.ndarray:
    """Open loop: per request, how late the client sent it beyond its plan and the cap's hold (seconds)."""
    if not is_open_loop(df):
        return np.empty(0)
    lag = df["send_s"].to_numpy(dtype=float) - df["scheduled_s"].to_numpy(dtype=float)
    lag -= df["held_s"].to_numpy(dtype=float) if "held_s" in df else 0.0
    return lag[np.isfinite(lag)]


def held_share(df: pd.DataFrame, tolerance_s: float = 1e-3) -> float | None:
    """Open loop: the share of requests the in-flight cap held back (None in a closed loop)."""
    if not is_open_loop(df) or "held_s" not in df or not len(df):
        return None
    return float((df["held_s"].to_numpy(dtype=float) > tolerance_s).mean())


def running_requests(df: pd.DataFrame, start: float, end: float, samples: int = 200) -> dict[str, float | None]:
    """Requests in flight over [start, end], two ways: the measured in-flight curve (time-weighted mean, and
    its p50/p90/max at `samples` evenly spaced instants) and Little's law (arrival rate in the window x mean
    time in the system of the requests sent in it). In a closed loop both are C when the client keeps up; in
    an open loop they are what the server's speed makes of the offered rate.

    `busy_mean` is the time-weighted mean count while at least one request is in flight (`busy_share` of the
    window): the batch the engine steps with, which is what a per-batch-size speculation policy sees and what
    a decode step's cost depends on. At a low rate the plain mean counts idle time as 0 (0.4 running requests
    when one request runs 40% of the time); the engine then runs batches of 1, never of 0.4."""
    keys = ("mean", "littles_law", "busy_mean", "busy_share", "p50", "p90", "max")
    if not (end > start):
        return dict.fromkeys(keys)
    send = df["send_s"].to_numpy(dtype=float)
    stop = df["end_s"].to_numpy(dtype=float)
    m = np.isfinite(send) & np.isfinite(stop)
    send, stop = send[m], stop[m]
    t = np.linspace(start, end, samples)
    curve = ((send[None, :] <= t[:, None]) & (stop[None, :] > t[:, None])).sum(axis=1)
    inside = (send >= start) & (send < end)  # half-open: n arrivals a second over a window of n seconds
    littles = float(inside.sum() / (end - start) * (stop[inside] - send[inside]).mean()) if inside.any() else None
    busy_s, area = _busy(send, stop, start, end)
    return {
        "mean": area / (end - start),
        "littles_law": littles,
        "busy_mean": area / busy_s if busy_s > 0 else None,
        "busy_share": busy_s / (end - start),
        "p50": float(np.percentile(curve, 50)),
        "p90": float(np.percentile(curve, 90)),
        "max": float(curve.max()),
    }


def _busy(send: np.ndarray, stop: np.ndarray, start: float, end: float) -> tuple[float, float]:
    """(seconds of [start, end] with at least one request in flight, integral of the in-flight count)."""
    keep = (stop > start) & (send < end)
    a, b = np.clip(send[keep], start, end), np.clip(stop[keep], start, end)
    if a.size == 0:
        return 0.0, 0.0
    times = np.concatenate([a, b])
    steps = np.concatenate([np.ones(a.size), -np.ones(b.size)])
    order = np.lexsort((steps, times))  # at a tie, ends before sends
    times, count = times[order], np.cumsum(steps[order])
    dur = np.diff(times)
    held = count[:-1]
    return float(dur[held > 0].sum()), float((dur * held).sum())


def reissue_delays(df: pd.DataFrame) -> np.ndarray:
    """Per slot, the gap between a request's end and the slot's next send: the closed loop's fidelity.

    In a closed loop in-flight drops below C only inside these gaps, which is why achieved concurrency is the
    gate on them; the raw gaps are kept as well. Empty for records without slots.
    """
    if "slot" not in df or df.empty:
        return np.empty(0)
    keys = ["repeat", "slot"] if "repeat" in df else ["slot"]  # repeats have clocks of their own
    ordered = df[df["slot"] >= 0].sort_values([*keys, "send_s"], kind="stable")  # one sort, not one per slot
    if len(ordered) < 2:
        return np.empty(0)
    same_slot = np.ones(len(ordered) - 1, dtype=bool)
    for k in keys:
        col = ordered[k].to_numpy()
        same_slot &= col[1:] == col[:-1]
    send, end = ordered["send_s"].to_numpy(dtype=float), ordered["end_s"].to_numpy(dtype=float)
    a = (send[1:] - end[:-1])[same_slot]
    return a[np.isfinite(a)]


def chunk_since(send_s: np.ndarray, chunk_s: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Where each chunk's interval starts: the stream's previous chunk, a first chunk's at its request's send
    (`chunk_s` the rows' chunks one after another, `lengths` how many each row has)."""
    since = np.empty_like(chunk_s)
    since[1:] = chunk_s[:-1]
    firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))[lengths > 0]
    since[firsts] = np.asarray(send_s, dtype=float)[lengths > 0]
    return since


def delivered_by(since: np.ndarray, at: np.ndarray, tokens: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Tokens delivered by each edge time, each chunk's tokens spread evenly over (since, at], as the ITL splits a
    gap; a chunk with no interval (sent and delivered at one instant, or no send time) counts at its arrival.

    Why spread: a window's edges fall on a step's end, where that step's chunks of every stream arrive within a
    fraction of a millisecond. Counted whole or not at all by which side of the edge each landed on, a 28-step
    window moved by one step's tokens (~3.5%) on that chance; spread, the closing step counts (nearly) whole and
    the opening one (nearly) not, every time, as in virtual time. Tokens in (a, b] are by(b) - by(a): the
    window's count (`tokens_between`) and its blocks' (`analysis.cells`) are one sum."""
    since, at = np.asarray(since, dtype=float), np.asarray(at, dtype=float)
    tokens, edges = np.asarray(tokens, dtype=float), np.asarray(edges, dtype=float)
    span = at - since
    with np.errstate(invalid="ignore"):
        spread = np.isfinite(span) & (span > 0)
    point = np.isfinite(at) & ~spread
    out = np.zeros(edges.shape)
    if point.any():
        order = np.argsort(at[point], kind="stable")
        t, total = at[point][order], np.cumsum(tokens[point][order])
        i = np.searchsorted(t, edges, side="right")
        out += np.where(i > 0, total[np.maximum(i - 1, 0)], 0.0)
    if spread.any():
        rate = tokens[spread] / span[spread]
        x = np.concatenate([since[spread], at[spread]])
        order = np.argsort(x, kind="stable")
        x, step = x[order], np.concatenate([rate, -rate])[order]
        by_event = np.concatenate(([0.0], np.cumsum(np.cumsum(step)[:-1] * np.diff(x))))
        out += np.interp(edges, x, by_event)
    return out


def flat_chunks(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row, since, at, tokens) of every token-carrying chunk of every row, as flat arrays (`chunk_since`)."""
    times = [np.asarray(x if x is not None else [], dtype=float) for x in df["chunk_s"]]
    toks = [np.asarray(x if x is not None else [], dtype=float) for x in df["chunk_tokens"]]
    lengths = np.array([t.size for t in times], dtype=np.int64)
    if lengths.sum() == 0:
        return np.empty(0, dtype=np.int64), np.empty(0), np.empty(0), np.empty(0)
    at = np.concatenate(times)
    since = chunk_since(df["send_s"].to_numpy(dtype=float), at, lengths)
    return np.repeat(np.arange(len(df)), lengths), since, at, np.concatenate(toks)


def tokens_between(df: pd.DataFrame, start: float, end: float) -> float:
    """Output tokens delivered in (start, end] (all requests: tokens delivered are tokens), each chunk's over its
    interval since the stream's previous chunk (`delivered_by`: why)."""
    _, since, at, toks = flat_chunks(df)
    before, by_end = delivered_by(since, at, toks, np.array([start, end]))
    return float(by_end - before)


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


def output_lengths(df: pd.DataFrame) -> dict[str, Any]:
    """Where the measured answers ended: their lengths (p10, p50, p90, mean) and the share that reached their
    cap (asked length; under a natural stop the rest ended at the model's end of text). With a fixed stop every
    answer is its cap. Over measured (non-ramp) successful requests."""
    m = df["ok"].to_numpy(dtype=bool) & measured(df)
    toks = df["output_tokens"].to_numpy(dtype=float)[m]
    cap = df["expected_output_tokens"].to_numpy(dtype=float)[m]
    if not toks.size:
        return {"n": 0, "mean": None, "p10": None, "p50": None, "p90": None, "cap_share": None}
    p10, p50, p90 = (float(x) for x in np.percentile(toks, [10, 50, 90]))
    return {
        "n": int(toks.size),
        "mean": float(toks.mean()),
        "p10": p10,
        "p50": p50,
        "p90": p90,
        "cap_share": float(np.mean(toks >= cap)),
    }


def accept_lengths_per_request(df: pd.DataFrame) -> dict[str, Any]:
    """Each request's accept length (its tokens over its verify passes) where the engine reports the passes per
    request (SGLang's and the simulated engine's spec_verify_ct): its distribution over the measured requests.
    Engines that report counters only (vLLM) give a cell's mean, not this (n 0)."""
    if "spec_verify_ct" not in df or df.empty:
        return stats([])
    m = (df["spec_verify_ct"].to_numpy() > 0) & df["ok"].to_numpy(dtype=bool) & measured(df)
    sub = df[m]
    toks = np.where(sub["server_output_tokens"] >= 0, sub["server_output_tokens"], sub["output_tokens"])
    return stats(np.asarray(toks, dtype=float) / sub["spec_verify_ct"].to_numpy(dtype=float))


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


def slo_seconds(slos: Mapping[str, Any] | None) -> dict[str, float] | None:
    """SLO limits as seconds keyed ttft_s/tpot_s/e2e_s, from the config's {ttft,tpot,e2e}_ms (or *_s; null = not
    set); None when none is set. An unknown key is an error naming the known ones."""
    out: dict[str, float] = {}
    for key, limit in (slos or {}).items():
        if limit is None:
            continue
        name, _, unit = key.rpartition("_")
        if name not in ("ttft", "tpot", "e2e") or unit not in ("ms", "s"):
            raise ValueError(f"unknown SLO {key!r}; expected one of {SLO_KEYS} (or the same in seconds: *_s)")
        out[f"{name}_s"] = float(limit) * (1e-3 if unit == "ms" else 1.0)
    return out or None


def meets_slos(
    ttft_s: np.ndarray, tpot_s: np.ndarray, e2e_s: np.ndarray, limits_s: Mapping[str, float] | None
) -> np.ndarray:
    """Which requests met every SLO (limits from `slo_seconds`): the one SLO check, for the summary's goodput and
    the analysis's bootstrap. An undefined TPOT (one output token) has no inter-token time to violate: it meets
    its SLO."""
    ok = np.ones(len(ttft_s), dtype=bool)
    for name, values in (("ttft_s", ttft_s), ("tpot_s", tpot_s), ("e2e_s", e2e_s)):
        limit = (limits_s or {}).get(name)
        if limit is not None:
            v = np.asarray(values, dtype=float)
            ok &= (v <= limit) | (np.isnan(v) if name == "tpot_s" else False)
    return ok


def errors_summary(df: pd.DataFrame, max_messages: int = 3) -> dict[str, Any]:
    """Failed requests counted by kind, with the first few distinct messages of each kind (aborted fillers are
    neither failed nor counted)."""
    df = df[~aborted(df)]
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


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """after - before for every counter both snapshots have; a counter going backwards means a restart."""
    d = {k: float(after[k]) - float(before[k]) for k in after if k in before}
    if any(v < 0 for v in d.values()):
        raise ValueError(f"counter went backwards (server restarted?): {d}")
    return d


def prefix_cache(df: pd.DataFrame, deltas: Mapping[str, float] | None) -> dict[str, Any]:
    """Share of prompt tokens the engine served from its prefix cache during one repeat.

    From the requests' own `cached_tokens` (SGLang meta_info, OpenAI usage details) when every successful
    request reports it, else from the engine's counter deltas (vLLM prefix_cache_hits / _queries), else
    unknown. All requests of the repeat count, ramp included: any hit means a cell is not independent.
    """
    ok = df[df["ok"]] if "ok" in df else df
    if "cached_tokens" in ok and len(ok) and (ok["cached_tokens"] >= 0).all():
        cached, prompt = float(ok["cached_tokens"].sum()), float(ok["input_tokens"].sum())
        return {
            "hit_rate": cached / prompt if prompt > 0 else None,
            "hits": cached,
            "queries": prompt,
            "source": "requests",
        }
    if deltas and "prefix_cache_queries" in deltas and "prefix_cache_hits" in deltas:
        q, h = deltas["prefix_cache_queries"], deltas["prefix_cache_hits"]
        return {"hit_rate": h / q if q > 0 else None, "hits": h, "queries": q, "source": "counters"}
    return {"hit_rate": None, "hits": None, "queries": None, "source": None}


def client_figures(
    df: pd.DataFrame, lag: Sequence[float], idle_lag: Sequence[float], client: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What the client did while measuring: CPU shares, loop lag against the host's idle jitter, stamps, and
    the closed loop's reissue delays. Raw figures; `validity` judges them."""
    c = dict(client or {})
    lag_s, idle_s = stats(lag, 1e3), stats(idle_lag, 1e3)
    excess = None
    if lag_s["p99"] is not None:
        excess = max(0.0, float(lag_s["p99"]) - float(idle_s["p99"] or 0.0))
    return {
        "busy_share": c.get("busy_share"),
        "wait_share": c.get("wait_share"),
        "foreign_cpu_share": c.get("foreign_cpu_share"),
        "foreign_cpu_resolution": c.get("foreign_cpu_resolution"),
        "steal_share": c.get("steal_share"),
        "server_cpu_cores": c.get("server_cpu_cores"),
        "cpu_s": c.get("cpu_s"),
        "wall_s": c.get("wall_s"),
        "cpus": c.get("cpus"),
        "shared_cpus": c.get("shared_cpus"),
        "transport": c.get("transport"),
        "stamps": c.get("stamps") or {},
        "loop_lag_ms": lag_s,
        "idle_lag_ms": idle_s,
        "loop_lag_excess_p99_ms": excess,
        "reissue_delay_ms": stats(reissue_delays(df), 1e3),
    }


def _span(df: pd.DataFrame) -> float:
    """First send to last end of the records (NaN when there are none)."""
    if not len(df):
        return math.nan
    return float(np.nanmax(df["end_s"].to_numpy(dtype=float)) - np.nanmin(df["send_s"].to_numpy(dtype=float)))


def goodput_rps(df: pd.DataFrame, slos: Mapping[str, float] | None, start: float, end: float) -> float | None:
    """Measured requests that met every SLO and ended inside the steady window [start, end], per second of it:
    the one goodput (the analysis's bootstrap resamples the same count over the window's blocks). None without
    SLOs or without a window."""
    limits = slo_seconds(slos)
    if not limits or not (end > start):
        return None
    pr = per_request(df)
    ends = df["end_s"].to_numpy(dtype=float)
    meas = df["ok"].to_numpy(dtype=bool) & (df["output_tokens"].to_numpy() > 0) & measured(df)
    meas &= (ends >= start) & (ends <= end)
    good = meets_slos(*(pr[c].to_numpy(dtype=float)[meas] for c in ("ttft", "tpot", "e2e")), limits)
    return float(good.sum() / (end - start))


def repeat_metrics(
    df: pd.DataFrame,
    concurrency: int,
    slos: Mapping[str, float] | None = None,
    lag_samples: Sequence[float] | None = None,
    idle_lag_samples: Sequence[float] | None = None,
    client: Mapping[str, Any] | None = None,
    counters: tuple[Mapping[str, float], Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """All metrics of one repeat (or of pooled records when `df` holds several repeats; see `summarize`).

    Latencies and per-request figures are over measured (non-ramp) successful requests; throughput counts
    every token delivered inside the steady window."""
    pr = per_request(df)
    good = df["ok"].to_numpy(dtype=bool) & (df["output_tokens"].to_numpy() > 0)
    meas = good & measured(df)
    prg = pr[meas]
    itl_tok, itl_chunk = itl(df[meas])
    sends = df["send_s"].to_numpy(dtype=float)
    duration = _span(df)
    start, end = window(df, concurrency)
    steady = end - start
    running = running_requests(df, start, end)
    open_loop = is_open_loop(df)
    in_window = (sends >= start) & (sends < end)
    total_tokens = int(df["output_tokens"].sum())
    n_ok = int(df["ok"].sum())
    goodput = goodput_rps(df, slos, start, end)
    deltas = counter_deltas(*counters) if counters is not None else None

    def rate(x: float, t: float) -> float | None:
        return float(x / t) if t > 0 and math.isfinite(t) else None

    out = {
        "n_requests": int(len(df)),
        "n_measured": int(measured(df).sum()),
        "n_ok": n_ok,
        "n_answered": int((df["output_tokens"].to_numpy() > 0).sum()),
        "output_tokens_total": total_tokens,
        "duration_s": duration if math.isfinite(duration) else None,
        "steady_window": {"start_s": _f(start), "end_s": _f(end)},
        "steady_window_s": _f(steady),
        "output_tok_s_steady": rate(tokens_between(df, start, end), steady),
        "output_tok_s_total": rate(total_tokens, duration),
        "request_throughput_rps": rate(n_ok, duration),
        "goodput_rps": goodput,
        "slos": dict(slos) if slos else {},
        "achieved_concurrency": _f(running["mean"] if running["mean"] is not None else math.nan),
        "running_requests_mean": running["mean"],
        "running_requests": running,
        "load": "open" if open_loop else "closed",
        "achieved_rate_rps": rate(float(in_window.sum()), steady) if open_loop else None,
        "send_lag_ms": stats(send_lag(df), 1e3),
        "held_share": held_share(df),
        "ttft_ms": stats(prg["ttft"], 1e3),
        "tpot_ms": stats(prg["tpot"], 1e3),
        "itl_token_ms": stats(itl_tok, 1e3),
        "itl_chunk_ms": stats(itl_chunk, 1e3),
        "e2e_ms": stats(prg["e2e"], 1e3),
        "request_tok_s": stats(prg["tok_s"]),
        "tokens_per_chunk": tokens_per_chunk(df[good]),
        "accept_length": accept_length_from_records(df),
        "accept_length_per_request": accept_lengths_per_request(df),
        "output_lengths": output_lengths(df),
        "loop_lag_ms": stats(np.asarray(lag_samples if lag_samples is not None else [], dtype=float), 1e3),
        "client": client_figures(df, lag_samples or [], idle_lag_samples or [], client),
        "prefix_cache": prefix_cache(df, deltas),
        "counter_deltas": deltas,
        "errors": errors_summary(df),
    }
    return out


def _f(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def measure_summary(
    records: pd.DataFrame,
    concurrency: int,
    repeats: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """What was measured, judged by nothing: {metrics (pooled over repeats), repeats[{repeat, metrics}]}.

    `repeats[i]` holds what was measured beside repeat i's records: `lag`, `idle_lag` (seconds), `client`
    (CPU shares, stamps), `counters` ((before, after) engine counters or None). Pooled: latency/ITL/token
    distributions over all requests of all repeats; per-repeat scalars as the mean over repeats, with their
    spread in `repeat_spread`; counter deltas summed. Gates and SLOs are applied by `judge`, so that changing
    them never needs a new measurement.
    """
    if "repeat" not in records:
        records = records.assign(repeat=0)
    reps = sorted(int(r) for r in records["repeat"].unique())
    meta = {i: dict(repeats[i]) for i in range(len(repeats))} if repeats else {}
    per_rep: list[dict[str, Any]] = []
    for r in reps:
        sub = records[records["repeat"] == r]
        x = meta.get(r, {})
        m = repeat_metrics(sub, concurrency, None, x.get("lag"), x.get("idle_lag"), x.get("client"), x.get("counters"))
        per_rep.append({"repeat": r, "metrics": m})
    all_lag = [x for r in reps for x in meta.get(r, {}).get("lag") or []]
    all_idle = [x for r in reps for x in meta.get(r, {}).get("idle_lag") or []]
    return {"metrics": pooled_metrics(records, concurrency, per_rep, all_lag, all_idle), "repeats": per_rep}


def pooled_metrics(
    records: pd.DataFrame,
    concurrency: int,
    per_rep: list[dict[str, Any]],
    lag: Sequence[float] = (),
    idle_lag: Sequence[float] = (),
) -> dict[str, Any]:
    """The pooled metrics of a cell from all its records and its repeats' own metrics (`measure_summary`, and a
    cell merged from several server instances, whose lag samples were not kept: its pooled lag is then empty,
    the gates judge each repeat's own)."""
    pooled = repeat_metrics(records, concurrency, None, list(lag), list(idle_lag)) if len(records) else {}
    if pooled:
        _pool_repeats(pooled, per_rep)
    return pooled


def _pool_repeats(pooled: dict[str, Any], per_rep: list[dict[str, Any]]) -> None:
    """Per-repeat scalars as the mean over repeats (with their spread), worst client, summed counters."""
    spread: dict[str, Any] = {}
    for key in REPEAT_SCALARS:
        vals = [p["metrics"][key] for p in per_rep if p["metrics"].get(key) is not None]
        pooled[key] = float(np.mean(vals)) if vals else None
        spread[key] = stats(vals)
    pooled["steady_window"] = None  # per repeat only: windows of different repeats share no clock origin
    # in-flight figures are per window too (pooled records would stack the repeats' requests): their mean
    runs = [p["metrics"]["running_requests"] for p in per_rep]
    pooled["running_requests"] = {
        k: (float(np.mean(v)) if (v := [r[k] for r in runs if r.get(k) is not None]) else None) for k in runs[0]
    }
    pooled["repeat_spread"] = spread
    pooled["n_repeats"] = len(per_rep)
    pooled["client"] = _worst_client([p["metrics"]["client"] for p in per_rep], pooled["client"])
    pooled["prefix_cache"] = _pooled_cache([p["metrics"]["prefix_cache"] for p in per_rep])
    deltas = [p["metrics"]["counter_deltas"] for p in per_rep]
    if deltas and all(d is not None for d in deltas):
        total = {k: float(sum(d.get(k, 0.0) for d in deltas)) for k in set().union(*deltas)}
        pooled["counter_deltas"] = total
        if "num_drafts" in total:
            c = accept_length_from_counters({}, total)
            pooled["spec_counters"] = c
            if c["accept_length"] is not None:
                pooled["accept_length"] = c["accept_length"]


def _worst_client(per_rep: list[dict[str, Any]], pooled: dict[str, Any]) -> dict[str, Any]:
    """The pooled client figures: lag over all samples, the worst repeat's CPU shares and stamp share."""
    out = dict(pooled)
    for key, pick in (("busy_share", max), ("wait_share", max), ("steal_share", max)):
        vals = [c[key] for c in per_rep if c.get(key) is not None]
        out[key] = pick(vals) if vals else None
    # the repeat whose foreign share stands furthest above its own resolution, with that resolution
    known = [c for c in per_rep if c.get("foreign_cpu_share") is not None]
    worst = max(known, key=lambda c: c["foreign_cpu_share"] - (c.get("foreign_cpu_resolution") or 0.0), default={})
    out["foreign_cpu_share"] = worst.get("foreign_cpu_share")
    out["foreign_cpu_resolution"] = worst.get("foreign_cpu_resolution")
    shares = [(c.get("stamps") or {}).get("kernel_share") for c in per_rep]
    known = [s for s in shares if s is not None]
    out["stamps"] = {"kernel_share": min(known) if known else None}
    out["transport"] = next((c.get("transport") for c in per_rep if c.get("transport")), None)
    out["cpus"] = next((c.get("cpus") for c in per_rep if c.get("cpus")), None)
    out["shared_cpus"] = next((c.get("shared_cpus") for c in per_rep if c.get("shared_cpus")), None)
    return out


def _pooled_cache(per_rep: list[dict[str, Any]]) -> dict[str, Any]:
    srcs = {c["source"] for c in per_rep}
    if None in srcs or not per_rep:
        return {"hit_rate": None, "hits": None, "queries": None, "source": None}
    hits = sum(float(c["hits"] or 0.0) for c in per_rep)
    queries = sum(float(c["queries"] or 0.0) for c in per_rep)
    return {
        "hit_rate": hits / queries if queries > 0 else None,
        "hits": hits,
        "queries": queries,
        "source": srcs.pop() if len(srcs) == 1 else "mixed",
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
