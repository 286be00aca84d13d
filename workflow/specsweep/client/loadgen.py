"""Closed-loop load generator: exactly C requests in flight until the level's request count is used up.

Why closed loop: the question is "what does the server do with C concurrent users", so each finished request
is replaced at once by the next, and the steady window (all C slots busy) is well defined. C slot coroutines
pull request indices from one shared iterator; the first request of each slot is shortened so that the slots
turn over at spread times (no lockstep waves). `measure_level` is the single measuring path (warm-up, cache
reset, idle-jitter probe, counters, CPU accounting) of the pipeline and `specsweep bench`.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, Protocol

import aiohttp
import pandas as pd
import pyarrow as pa

from specsweep.client.arrivals import ArrivalPlan
from specsweep.client.backends import ABORTED, RequestRecord, RequestSpec, send_request
from specsweep.client.cpu import host_snapshot, usage_now
from specsweep.client.fasthttp import FastPool
from specsweep.client.looplag import LoopLagMonitor
from specsweep.client.prompts import LevelPrompts, PromptSet
from specsweep.telemetry.gpu import gpu_watch

# One row of requests.parquet (docs/ARCHITECTURE.md "Request record"): the single description of a record's
# columns and their Arrow types; every requests.parquet has this schema, even an empty or all-failed cell.
RECORD_SCHEMA = pa.schema(
    [
        ("repeat", pa.int64()),
        ("request_index", pa.int64()),
        ("prompt_index", pa.int64()),
        ("slot", pa.int64()),
        ("ramp", pa.bool_()),
        ("filler", pa.bool_()),
        ("scheduled_s", pa.float64()),
        ("held_s", pa.float64()),
        ("send_s", pa.float64()),
        ("first_token_s", pa.float64()),
        ("end_s", pa.float64()),
        ("chunk_s", pa.list_(pa.float64())),
        ("chunk_tokens", pa.list_(pa.int64())),
        ("server_chunk_s", pa.list_(pa.float64())),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("server_output_tokens", pa.int64()),
        ("expected_output_tokens", pa.int64()),
        ("spec_verify_ct", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("output_sha256", pa.string()),
        ("output_prefix", pa.string()),
        ("content", pa.string()),
        ("finish_reason", pa.string()),
        ("ok", pa.bool_()),
        ("error_kind", pa.string()),
        ("error", pa.string()),
    ]
)
RECORD_COLUMNS: tuple[str, ...] = tuple(RECORD_SCHEMA.names)
_TIME_COLUMNS = ("send_s", "first_token_s", "end_s", "scheduled_s")
_TIME_LIST_COLUMNS = ("chunk_s", "server_chunk_s")

ProgressFn = Callable[[RequestRecord], None]


class ServerHooks(Protocol):
    """What the load generator asks of the engine between repeats (engines/*.py implement it)."""

    async def reset_cache(self, session: aiohttp.ClientSession, base_url: str) -> str:
        """Empty the server's prefix cache; returns the outcome ('flushed', 'reset', 'unsupported', ...)."""
        ...

    async def counters(self, session: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
        """Cumulative spec-decode and prefix-cache counters, None when they cannot be read."""
        ...


@dataclass
class RepeatResult:
    """One repeat of a level: its records (absolute times), t0, and what the client saw of itself."""

    repeat: int
    records: list[RequestRecord]
    t0: float  # monotonic time of the first send
    t0_unix: float  # wall-clock time at t0
    lag_samples: list[float]  # event-loop lag while measuring
    cache_reset: str  # outcome of the prefix-cache reset before this repeat
    idle_lag_samples: list[float] = field(default_factory=list)  # the same timer with nothing in flight
    counters: tuple[dict[str, float], dict[str, float]] | None = None  # engine counters before, after
    client: dict[str, Any] = field(default_factory=dict)  # CPU shares and stamp statistics
    prompts: PromptSet | None = None
    server_state: dict[str, Any] | None = None  # the serving side during it (records.ServerState); None: not watched


@dataclass
class LevelResult:
    """All repeats of one concurrency level. `records`: every repeat, times relative to its own t0."""

    concurrency: int
    n_requests: int  # measured (non-ramp) requests asked for per repeat
    repeats: list[RepeatResult]
    warmup_errors: int = 0
    stagger: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> pd.DataFrame:
        if not self.repeats:
            return records_frame([], 0.0, 0)
        return pd.concat([records_frame(r.records, r.t0, r.repeat) for r in self.repeats], ignore_index=True)

    @property
    def t0_unix(self) -> float | None:
        return self.repeats[0].t0_unix if self.repeats else None


def records_frame(records: list[RequestRecord], t0: float, repeat: int) -> pd.DataFrame:
    """Records -> the requests.parquet frame, times relative to `t0` (the server's monotonic clock too)."""
    cols: dict[str, list[Any]] = {c: [] for c in RECORD_COLUMNS}
    for r in records:
        for c in RECORD_COLUMNS:
            if c == "repeat":
                cols[c].append(repeat)
            elif c in _TIME_COLUMNS:
                cols[c].append(getattr(r, c) - t0)
            elif c in _TIME_LIST_COLUMNS:
                cols[c].append([x - t0 for x in getattr(r, c)])
            elif c == "chunk_tokens":
                cols[c].append(list(r.chunk_tokens))
            else:
                cols[c].append(getattr(r, c))
    return pa.Table.from_pydict(cols, schema=RECORD_SCHEMA).to_pandas()


def arrow_table(df: pd.DataFrame) -> pa.Table:
    """The records frame as an Arrow table with the contract's column types (other columns as inferred)."""
    types = {f.name: f.type for f in RECORD_SCHEMA}
    inferred = pa.Schema.from_pandas(df, preserve_index=False)
    schema = pa.schema([pa.field(f.name, types.get(f.name, f.type)) for f in inferred])
    return pa.Table.from_pandas(df, schema=schema, preserve_index=False)


def new_session(concurrency: int = 0) -> aiohttp.ClientSession:
    """An aiohttp session without a connection cap, so C requests really are in flight at once."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


WARMUP_TOKENS = 32  # a warm-up request's output cap: enough decode steps at batch size C, little time


def warmup_count(warmup: int, concurrency: int) -> int:
    """Warm-up requests of a level: at least one per slot, so the server meets every batch size up to C (graph
    capture, kernel selection, allocations) before it is measured; none when `warmup` is 0."""
    return max(warmup, concurrency) if warmup > 0 else 0


def filler_count(concurrency: int, stagger: bool) -> int:
    """Prompts a staggered closed loop keeps for fillers after its measured ones (`run_closed_loop`): two per
    slot. A slot whose last measured request ends before the level's last one needs one filler where answers
    are alike in length; with one per slot, blocks of the vLLM example and of the demo ran out (a filler ended
    first: speculation's acceptance, answers of their own lengths) and their window ended early."""
    return 2 * concurrency if stagger else 0


def ramp_length(nominal: int, slot: int, concurrency: int) -> int:
    """Output tokens of slot `slot`'s first request: its share (slot+1)/C of the nominal length."""
    return max(1, math.ceil(nominal * (slot + 1) / concurrency))


async def run_closed_loop(
    session: FastPool | aiohttp.ClientSession,
    spec: RequestSpec,
    prompts: PromptSet,
    output_tokens: int,
    concurrency: int,
    n_requests: int,
    *,
    stagger: bool = False,
    duration_s: float | None = None,
    on_done: ProgressFn | None = None,
) -> list[RequestRecord]:
    """C client slots; each sends its next request the moment its previous one ends.

    Without `stagger`: `n_requests` requests, prompts 0..n-1. With `stagger`, slot k first sends a *ramp*
    request of `ramp_length(L, k, C)` tokens (prompt k): the slots then turn over at evenly spread times and,
    with a fixed output length, stay spread, instead of all C requests starting, finishing and restarting
    together in waves that real traffic does not have. The `n_requests` measured requests (prompts C, C+1, ...)
    follow, then *fillers*: a slot whose measured requests ran out sends the set's next prompts (those after
    the measured ones: `filler_count`) until the last measured request ends, and the fillers still running then
    are aborted (error_kind ABORTED). So the batch stays at C until then: the steady window (which ends at the
    first end no send follows) runs to the last measured end instead of into a drain, and every measured
    request ran at C in flight. `duration_s` stops issuing measured requests that long after the first send
    (the count is then a cap). Records are returned in send order (`request_index`).
    """
    n_prompts = len(prompts)
    first_measured = concurrency if stagger else 0
    if n_prompts < first_measured + n_requests:
        raise ValueError(f"{n_prompts} prompts for {first_measured} ramp and {n_requests} measured requests")
    records: list[RequestRecord] = []
    indices = iter(range(n_requests))  # shared: each slot takes the next index when its request ends
    fill_prompts = iter(range(first_measured + n_requests, n_prompts) if stagger else ())
    deadline = [math.inf]
    measured_open = [0]  # measured requests sent and not yet ended
    issuing = [True]  # measured requests may still be sent
    done = asyncio.Event()  # every measured request has ended: the fillers still running are aborted
    running_fillers: set[asyncio.Task[None]] = set()

    def nominal(pi: int) -> int:
        return prompts.output_tokens[pi] or output_tokens

    def check_done() -> None:
        if not issuing[0] and measured_open[0] == 0 and not done.is_set():
            done.set()
            for task in running_fillers:
                task.cancel()

    async def send(pi: int, out: int, slot: int, kind: str) -> None:
        rec = RequestRecord(
            len(records), pi, out, prompts.input_tokens[pi], slot=slot, ramp=kind == "ramp", filler=kind == "filler"
        )
        rec.content = prompts.content(pi)
        records.append(rec)
        if kind == "measured":
            measured_open[0] += 1
        try:
            await send_request(session, spec, prompts.request(pi, spec.sends_messages), rec)
        except asyncio.CancelledError:
            if rec.filler and done.is_set():
                rec.end_s = monotonic()
                rec.error_kind, rec.error = ABORTED, "a filler still running when the last measured request ended"
            raise
        if deadline[0] == math.inf and duration_s is not None:
            deadline[0] = records[0].send_s + duration_s
        if kind == "measured":
            measured_open[0] -= 1
            check_done()
        if on_done is not None:
            on_done(rec)

    async def slot(k: int) -> None:
        if stagger:
            await send(k, ramp_length(nominal(k), k, concurrency), k, "ramp")
        for i in indices:
            if monotonic() >= deadline[0]:
                break
            pi = first_measured + i
            await send(pi, nominal(pi), k, "measured")
        issuing[0] = False
        check_done()
        for pi in fill_prompts:
            if done.is_set():
                break
            task = asyncio.ensure_future(send(pi, nominal(pi), k, "filler"))
            running_fillers.add(task)
            try:
                await asyncio.wait({task})  # returns when it ends or is aborted (cancelled)
            finally:
                running_fillers.discard(task)
                if not task.done():  # the slot itself was cancelled: its filler with it
                    task.cancel()
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error

    n_slots = concurrency if stagger else min(concurrency, n_requests)
    await asyncio.gather(*(slot(k) for k in range(n_slots)))
    records.sort(key=lambda r: r.request_index)
    return records


OPEN_PREWARM = 64  # connections opened ahead of an open level (the pool opens more on demand)
OPEN_LOOP_LEAD_S = 0.05  # the plan starts this long after the call: the first sends are not late by set-up


async def run_open_loop(
    session: FastPool | aiohttp.ClientSession,
    spec: RequestSpec,
    prompts: PromptSet,
    output_tokens: int,
    plan: ArrivalPlan,
    max_in_flight: int,
    *,
    on_done: ProgressFn | None = None,
) -> list[RequestRecord]:
    """Send request i at the plan's time i whatever the server does, with at most `max_in_flight` in flight.

    Why open loop: real traffic arrives at its own rate, and a slower server then holds more requests at once;
    a closed loop fixes that number instead. Each record keeps its planned time (`scheduled_s`) and how long
    the cap held it back (`held_s`), so lateness the client caused (send - planned - held) is told apart from
    waiting the cap imposed (at a rate the server cannot keep up with, the level then becomes a closed loop
    at the cap). Prompt i goes with planned time i; records are returned in send order.
    """
    n = len(plan)
    if len(prompts) < n:
        raise ValueError(f"{len(prompts)} prompts for {n} planned requests")
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    free = asyncio.Semaphore(max_in_flight)
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []

    async def send(rec: RequestRecord, prompt: str) -> None:
        try:
            await send_request(session, spec, prompt, rec)
        finally:
            free.release()
        if on_done is not None:
            on_done(rec)

    start = monotonic() + OPEN_LOOP_LEAD_S
    cap_wait_end = -math.inf  # when the loop last came out of a wait for a free slot
    for i, at in enumerate(plan.times_s):
        planned = start + at
        wait = planned - monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if free.locked():  # every slot busy: the request waits for one to end
            await free.acquire()
            cap_wait_end = monotonic()
        else:
            await free.acquire()
        # behind the cap: its own wait, or the loop still held up by an earlier request's after this one was due
        held = monotonic() - planned if cap_wait_end > planned else 0.0
        out = prompts.output_tokens[i] or output_tokens
        rec = RequestRecord(i, i, out, prompts.input_tokens[i], slot=-1, ramp=False)
        rec.scheduled_s = planned
        rec.held_s = held
        rec.content = prompts.content(i)
        records.append(rec)
        tasks.append(asyncio.create_task(send(rec, prompts.prompts[i])))
    await asyncio.gather(*tasks)
    return records


def serving_state(
    cpu: dict[str, Any] | None, watch_gpus: tuple[int, ...] | None, gpus: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """A block's `server_state` (records.ServerState): the server tree's CPU figures and each watched GPU's.
    None where nothing of the server was watched (`specsweep bench` against a server elsewhere)."""
    if cpu is None and watch_gpus is None:
        return None
    return {"cpu": cpu, "gpus_watched": watch_gpus is not None, "gpus": gpus}


async def probe_idle(seconds: float, interval_s: float) -> list[float]:
    """Loop-lag samples with nothing in flight: the host's own timer jitter, against which the measured
    repeat's lag is judged (a VM's jitter is no sign of a saturated client)."""
    if seconds <= 0:
        return []
    monitor = LoopLagMonitor(interval_s).start()
    await asyncio.sleep(seconds)
    return await monitor.stop()


async def measure_level(
    spec: RequestSpec,
    concurrency: int,
    n_requests: int,
    prompts: LevelPrompts,
    output_tokens: int,
    *,
    warmup: int = 0,
    repeats: int = 1,
    stagger: bool = True,
    duration_s: float | None = None,
    hooks: ServerHooks | None = None,
    reset_cache: bool = True,
    server_pid: int | None = None,
    watch_cpus: tuple[int, ...] | None = None,
    watch_gpus: tuple[int, ...] | None = None,
    idle_probe_s: float = 0.5,
    lag_interval_s: float = 0.010,
    on_done: ProgressFn | None = None,
    session: aiohttp.ClientSession | None = None,
    plans: list[ArrivalPlan] | None = None,
    max_in_flight: int | None = None,
    warmup_plan: ArrivalPlan | None = None,
) -> LevelResult:
    """Measure one concurrency level: the warm-up, then R repeats, each on its own prompt set.

    The one measuring path of the pipeline and `specsweep bench`. Warm-up (`warmup_count(warmup, C)` requests
    of at most WARMUP_TOKENS tokens from the warm-up set, at concurrency C, not recorded) runs once. Before each
    repeat: the engine's prefix cache is reset (`hooks`), the host's idle loop lag is probed, counters are read.
    Around the closed loop: the client's CPU time, run-queue wait and chunk-stamp statistics, and (with
    `server_pid`) the CPU time of the server tree and of other processes on `watch_cpus` (the client's and the
    server's CPUs), the server tree's share of the CPUs it was allowed, and (with `watch_gpus`, () for every GPU)
    the GPUs' clocks, power and throttle reasons sampled through NVML: the block's `server_state`. After it, the
    counters again.

    With `plans` (one ArrivalPlan per repeat) each repeat is an open loop (`run_open_loop`, at most
    `max_in_flight` in flight) instead of the closed loop, and the warm-up replays `warmup_plan` (the
    level's own rate) with the warm-up prompts.
    """
    if concurrency < 1 or n_requests < 1 or repeats < 1:
        raise ValueError("concurrency, n_requests and repeats must be >= 1")
    if len(prompts.repeats) < repeats:
        raise ValueError(f"{len(prompts.repeats)} prompt sets for {repeats} repeats")
    if plans is not None and (len(plans) < repeats or max_in_flight is None):
        raise ValueError(f"{len(plans)} arrival plans for {repeats} repeats, max_in_flight {max_in_flight}")
    own = session is None
    s = session or new_session(concurrency)  # auxiliary calls (reset, counters); aiohttp streams if so configured
    stream: FastPool | aiohttp.ClientSession = FastPool() if spec.transport == "fast" else s
    result = LevelResult(concurrency=concurrency, n_requests=n_requests, repeats=[], stagger=stagger)
    try:
        n_warm = min(warmup_count(warmup, concurrency), len(prompts.warmup))
        if plans is not None and max_in_flight is not None:
            n_warm = 0
            if warmup_plan is not None and len(warmup_plan) and len(prompts.warmup) >= len(warmup_plan):
                wrecs = await run_open_loop(
                    stream, spec, prompts.warmup, min(output_tokens, WARMUP_TOKENS), warmup_plan, max_in_flight
                )
                result.warmup_errors = sum(1 for r in wrecs if not r.ok)
        if n_warm > 0:
            wrecs = await run_closed_loop(
                stream, spec, prompts.warmup, min(output_tokens, WARMUP_TOKENS), min(concurrency, n_warm), n_warm
            )
            result.warmup_errors = sum(1 for r in wrecs if not r.ok)
            if wrecs and all(not r.ok for r in wrecs):
                result.meta["warmup_error"] = f"{wrecs[0].error_kind}: {wrecs[0].error}"
        for rep in range(repeats):
            reset = await hooks.reset_cache(s, spec.url) if (hooks is not None and reset_cache) else "skipped"
            idle = await probe_idle(idle_probe_s, lag_interval_s)
            before = await hooks.counters(s, spec.url) if hooks is not None else None
            if isinstance(stream, FastPool):
                await stream.prewarm(spec.url, min(concurrency, OPEN_PREWARM) if plans is not None else concurrency)
                stream.stats.reset()
            # the young generations only (a full collection of this process's heap took 50-80 ms per block); then
            # every object alive moves out of the collector's way: no multi-ms pauses mid-level
            gc.collect(1)
            gc.freeze()
            monitor = LoopLagMonitor(lag_interval_s).start()
            host0 = host_snapshot(watch_cpus, server_pid)
            gpus = None
            if watch_gpus is not None:
                gpus = gpu_watch(watch_gpus or None, host0.server.pids if host0.server is not None else ())
                if gpus is not None:
                    gpus.start()
            cpu0 = usage_now()
            try:
                if plans is not None and max_in_flight is not None:
                    recs = await run_open_loop(
                        stream, spec, prompts.repeats[rep], output_tokens, plans[rep], max_in_flight, on_done=on_done
                    )
                else:
                    recs = await run_closed_loop(
                        stream,
                        spec,
                        prompts.repeats[rep],
                        output_tokens,
                        concurrency,
                        n_requests,
                        stagger=stagger,
                        duration_s=duration_s,
                        on_done=on_done,
                    )
            finally:
                cpu = usage_now().since(cpu0)
                host = host_snapshot(watch_cpus, server_pid).since(host0)
                gpu_states = None if gpus is None else gpus.stop()
                lag = await monitor.stop()
                gc.unfreeze()
            after = await hooks.counters(s, spec.url) if hooks is not None else None
            stamps = stream.stats.summary() if isinstance(stream, FastPool) else {"reads": None, "kernel_share": 0.0}
            sends = [r.send_s for r in recs if not math.isnan(r.send_s)]
            t0 = min(sends) if sends else monotonic()
            t0_unix = time.time() - (monotonic() - t0)
            counters = (before, after) if before is not None and after is not None else None
            result.repeats.append(
                RepeatResult(
                    rep,
                    recs,
                    t0,
                    t0_unix,
                    lag,
                    reset,
                    idle,
                    counters,
                    {**cpu, **host, "stamps": stamps, "transport": spec.transport},
                    prompts.repeats[rep],
                    serving_state(host.pop("server_state"), watch_gpus, gpu_states),
                )
            )
    finally:
        if isinstance(stream, FastPool):
            stream.close()
        if own:
            await s.close()
    return result
