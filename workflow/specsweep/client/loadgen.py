"""Closed-loop load generator: exactly C requests in flight until the level's request count is used up.

Why closed loop: the question is "what does the server do with C concurrent users", so each finished request
is replaced at once by the next, and the steady window (all C slots busy) is well defined. C worker coroutines
pull request indices from one shared iterator over one aiohttp session whose connector has no connection cap.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import pandas as pd
import pyarrow as pa

from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.fasthttp import FastPool
from specsweep.client.looplag import LoopLagMonitor
from specsweep.client.prompts import PromptSet

# requests.parquet columns, in order (docs/ARCHITECTURE.md "Request record").
RECORD_COLUMNS: tuple[str, ...] = (
    "repeat",
    "request_index",
    "prompt_index",
    "send_s",
    "first_token_s",
    "end_s",
    "chunk_s",
    "chunk_tokens",
    "server_chunk_s",
    "input_tokens",
    "output_tokens",
    "server_output_tokens",
    "expected_output_tokens",
    "spec_verify_ct",
    "ok",
    "error_kind",
    "error",
)

# Arrow types of the columns: every requests.parquet has one schema (even an empty or all-failed cell).
RECORD_TYPES: dict[str, pa.DataType] = {
    "repeat": pa.int64(),
    "request_index": pa.int64(),
    "prompt_index": pa.int64(),
    "send_s": pa.float64(),
    "first_token_s": pa.float64(),
    "end_s": pa.float64(),
    "chunk_s": pa.list_(pa.float64()),
    "chunk_tokens": pa.list_(pa.int64()),
    "server_chunk_s": pa.list_(pa.float64()),
    "input_tokens": pa.int64(),
    "output_tokens": pa.int64(),
    "server_output_tokens": pa.int64(),
    "expected_output_tokens": pa.int64(),
    "spec_verify_ct": pa.int64(),
    "ok": pa.bool_(),
    "error_kind": pa.string(),
    "error": pa.string(),
}

ProgressFn = Callable[[RequestRecord], None]


@dataclass
class RepeatResult:
    """One repeat of a level: its records (absolute times), its t0 and its loop-lag samples."""

    repeat: int
    records: list[RequestRecord]
    t0: float  # monotonic time of the first measured send
    t0_unix: float  # wall-clock time at t0
    lag_samples: list[float]
    flush: str  # outcome of the cache flush before this repeat


@dataclass
class LevelResult:
    """All repeats of one concurrency level. `records`: every repeat, times relative to its own t0."""

    concurrency: int
    n_requests: int
    repeats: list[RepeatResult]
    warmup_errors: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> pd.DataFrame:
        if not self.repeats:
            return records_frame([], 0.0, 0)
        return pd.concat([records_frame(r.records, r.t0, r.repeat) for r in self.repeats], ignore_index=True)

    @property
    def t0_unix(self) -> float | None:
        return self.repeats[0].t0_unix if self.repeats else None

    @property
    def lag_samples(self) -> list[list[float]]:
        return [r.lag_samples for r in self.repeats]


def records_frame(records: list[RequestRecord], t0: float, repeat: int) -> pd.DataFrame:
    """Records -> the requests.parquet frame, times relative to `t0` (the server's monotonic clock too)."""
    cols: dict[str, list[Any]] = {c: [] for c in RECORD_COLUMNS}
    for r in records:
        cols["repeat"].append(repeat)
        cols["request_index"].append(r.request_index)
        cols["prompt_index"].append(r.prompt_index)
        cols["send_s"].append(r.send_s - t0)
        cols["first_token_s"].append(r.first_token_s - t0)
        cols["end_s"].append(r.end_s - t0)
        cols["chunk_s"].append([x - t0 for x in r.chunk_s])
        cols["chunk_tokens"].append(list(r.chunk_tokens))
        cols["server_chunk_s"].append([x - t0 for x in r.server_chunk_s])
        cols["input_tokens"].append(r.input_tokens)
        cols["output_tokens"].append(r.output_tokens)
        cols["server_output_tokens"].append(r.server_output_tokens)
        cols["expected_output_tokens"].append(r.expected_output_tokens)
        cols["spec_verify_ct"].append(r.spec_verify_ct)
        cols["ok"].append(r.ok)
        cols["error_kind"].append(r.error_kind)
        cols["error"].append(r.error)
    df = pd.DataFrame(cols, columns=list(RECORD_COLUMNS))
    ints = (
        "repeat",
        "request_index",
        "prompt_index",
        "input_tokens",
        "output_tokens",
        "server_output_tokens",
        "expected_output_tokens",
        "spec_verify_ct",
    )
    for c in ints:
        df[c] = df[c].astype("int64")
    for c in ("send_s", "first_token_s", "end_s"):
        df[c] = df[c].astype("float64")
    for c in ("chunk_s", "chunk_tokens", "server_chunk_s"):
        df[c] = df[c].astype(object)  # lists, also when there are no rows
    df["ok"] = df["ok"].astype(bool)
    df["error_kind"] = df["error_kind"].astype(str)
    df["error"] = df["error"].astype(str)
    return df


def arrow_table(df: pd.DataFrame) -> pa.Table:
    """The records frame as an Arrow table with the contract's column types (other columns as inferred)."""
    inferred = pa.Schema.from_pandas(df, preserve_index=False)
    schema = pa.schema([pa.field(f.name, RECORD_TYPES.get(f.name, f.type)) for f in inferred])
    return pa.Table.from_pandas(df, schema=schema, preserve_index=False)


def new_session(concurrency: int = 0) -> aiohttp.ClientSession:
    """An aiohttp session without a connection cap, so C requests really are in flight at once."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def run_closed_loop(
    session: FastPool | aiohttp.ClientSession,
    spec: RequestSpec,
    prompts: PromptSet,
    output_tokens: int,
    concurrency: int,
    n_requests: int,
    on_done: ProgressFn | None = None,
    prompt_offset: int = 0,
) -> list[RequestRecord]:
    """Run `n_requests` requests with exactly `concurrency` in flight (fewer only once requests run out)."""
    n_prompts = len(prompts)
    records: list[RequestRecord] = []
    indices = iter(range(n_requests))  # shared: each worker takes the next index when its request ends

    def build(i: int) -> RequestRecord:
        pi = (prompt_offset + i) % n_prompts
        out = prompts.output_tokens[pi] or output_tokens
        return RequestRecord(i, pi, out, prompts.input_tokens[pi])

    async def worker() -> None:
        for i in indices:
            rec = build(i)
            records.append(rec)
            await send_request(session, spec, prompts.prompts[rec.prompt_index], rec)
            if on_done is not None:
                on_done(rec)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, n_requests))))
    records.sort(key=lambda r: r.request_index)
    return records


async def flush_cache(
    session: aiohttp.ClientSession,
    url: str,
    timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
    retry_s: float = 0.2,
) -> str:
    """POST /flush_cache until it answers 200 (SGLang answers 400 while requests run).

    Returns "flushed", "unsupported" (404/405: engines without the endpoint, skipped silently), "timeout" or
    "error: ..." so the caller can record the outcome rather than fail the level.
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            async with session.post(
                url.rstrip("/") + "/flush_cache", headers=headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                if r.status == 200:
                    return "flushed"
                if r.status in (404, 405):
                    return "unsupported"
                last = f"HTTP {r.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() + retry_s > deadline:
            return "timeout" if last.startswith("HTTP") else f"error: {last}"
        await asyncio.sleep(retry_s)


async def measure_level(
    spec: RequestSpec,
    concurrency: int,
    n_requests: int,
    prompts: PromptSet,
    output_tokens: int,
    warmup: int = 0,
    repeats: int = 1,
    flush: bool = True,
    flush_timeout_s: float = 60.0,
    lag_interval_s: float = 0.010,
    on_done: ProgressFn | None = None,
    session: aiohttp.ClientSession | None = None,
) -> LevelResult:
    """Measure one concurrency level: warm-up (not recorded), then R repeats, each after a cache flush.

    Prompt i of every repeat is prompt i of the seeded set, so every arm and repeat sends the same requests.
    Warm-up requests use prompts from the end of the set to leave the measured prompts' caches cold
    (and the flush clears whatever they left).
    """
    if concurrency < 1 or n_requests < 1 or repeats < 1:
        raise ValueError("concurrency, n_requests and repeats must be >= 1")
    own = session is None
    s = session or new_session(concurrency)  # auxiliary calls (flush); aiohttp streams too if so configured
    stream: FastPool | aiohttp.ClientSession = FastPool() if spec.transport == "fast" else s
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else None
    result = LevelResult(concurrency=concurrency, n_requests=n_requests, repeats=[])
    try:
        if warmup > 0:
            wrecs = await run_closed_loop(
                stream,
                spec,
                prompts,
                output_tokens,
                min(concurrency, warmup),
                warmup,
                prompt_offset=(len(prompts) - warmup) % len(prompts),
            )
            result.warmup_errors = sum(1 for r in wrecs if not r.ok)
            if wrecs and all(not r.ok for r in wrecs):
                result.meta["warmup_error"] = f"{wrecs[0].error_kind}: {wrecs[0].error}"
        for rep in range(repeats):
            flushed = await flush_cache(s, spec.url, flush_timeout_s, headers) if flush else "skipped"
            if isinstance(stream, FastPool):
                await stream.prewarm(spec.url, concurrency)
            gc.collect()
            gc.freeze()  # long-lived objects out of the collector's way: no multi-ms pauses mid-level
            monitor = LoopLagMonitor(lag_interval_s).start()
            try:
                recs = await run_closed_loop(stream, spec, prompts, output_tokens, concurrency, n_requests, on_done)
            finally:
                lag = await monitor.stop()
                gc.unfreeze()
            sends = [r.send_s for r in recs if not np.isnan(r.send_s)]
            t0 = min(sends) if sends else time.monotonic()
            t0_unix = time.time() - (time.monotonic() - t0)
            result.repeats.append(RepeatResult(rep, recs, t0, t0_unix, lag, flushed))
    finally:
        if isinstance(stream, FastPool):
            stream.close()
        if own:
            await s.close()
    return result
