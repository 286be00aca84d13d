"""A minimal closed-loop streaming client, to check the real-time server against the virtual-time model.

It is deliberately independent of `specsweep.client` (which the sim is used to test): if both agree with
the model, a disagreement elsewhere is the other side's. It shares only the definitions: the slots' ramp
(`loadgen.ramp_length`) and the metrics module's steady window, per-request latencies and window tokens, so
it measures what `predict.simulate_level` predicts (with `fill=False`: this client sends no fillers after its
measured requests, the pipeline's does).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pandas as pd

from specsweep.client.loadgen import ramp_length
from specsweep.measure.metrics import measured, per_request, steady_window, tokens_between


@dataclass
class LevelMeasurement:
    concurrency: int
    n_requests: int  # measured requests (ramp requests not included)
    aggregate_tok_s: float  # steady window (metrics.steady_window), as predict.simulate_level
    aggregate_total_tok_s: float  # all output tokens, ramp included / (last end - first send)
    e2e_s: float  # means over measured requests, metrics.per_request's definitions
    ttft_s: float
    tpot_s: float
    chunks: int
    duration_s: float  # first send to last end
    max_lag_s: float  # largest gap between the server's send time and our receive time (debug timestamps)
    ramp_requests: int = 0
    steady_window_s: float = 0.0


async def _one(session: aiohttp.ClientSession, url: str, prompt: str, rec: dict[str, Any]) -> None:
    """Stream one /generate request of `rec["expected"]` tokens; fill `rec` with its times and chunks."""
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": rec["expected"], "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }
    rec["send_s"] = time.monotonic()
    done_tokens = 0
    lag = 0.0
    async with session.post(url + "/generate", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.monotonic()
            obj = json.loads(line[6:])
            n = obj["meta_info"]["completion_tokens"] - done_tokens
            if n > 0:
                done_tokens += n
                rec["chunk_s"].append(now)
                rec["chunk_tokens"].append(n)
                if math.isnan(rec["first_token_s"]):
                    rec["first_token_s"] = now
            if "sim_sent_at" in obj:
                lag = max(lag, now - obj["sim_sent_at"])
    rec["end_s"] = time.monotonic()
    rec["output_tokens"] = done_tokens
    rec["lag"] = lag
    if done_tokens != rec["expected"]:
        raise RuntimeError(f"got {done_tokens} tokens, asked for {rec['expected']}")


async def closed_loop(
    url: str, concurrency: int, n_requests: int, input_tokens: int, output_tokens: int, stagger: bool = True
) -> LevelMeasurement:
    """C slots, each sending its next request as soon as its previous one finished.

    With `stagger` (as the pipeline's client), slot k first sends a ramp request of `ramp_length(L, k, C)`
    tokens, then the `n_requests` measured requests follow; without, min(C, n) slots send the n requests. Every
    prompt starts with a word of its own, so the server's prefix cache never hits (the model has no cache)."""
    tag = uuid.uuid4().hex[:12]

    def prompt(i: int) -> str:
        return " ".join([f"q{tag}x{i}", *(f"w{j}" for j in range(1, input_tokens))])

    records: list[dict[str, Any]] = []
    indices = iter(range(n_requests))  # shared: each slot takes the next one when its request ends
    n_slots = concurrency if stagger else min(concurrency, n_requests)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
    ) as session:

        async def send(tokens: int, ramp: bool) -> None:
            rec = {"ramp": ramp, "expected": tokens, "first_token_s": math.nan, "chunk_s": [], "chunk_tokens": []}
            i = len(records)
            records.append(rec)
            await _one(session, url, prompt(i), rec)

        async def slot(k: int) -> None:
            if stagger:
                await send(ramp_length(output_tokens, k, concurrency), True)
            for _ in indices:
                await send(output_tokens, False)

        async def touch() -> None:
            async with session.get(url + "/health") as r:
                await r.read()

        # Open the C keep-alive connections first: connection set-up is the client's cost, not the server's.
        await asyncio.gather(*(touch() for _ in range(n_slots)))
        await asyncio.gather(*(slot(k) for k in range(n_slots)))
    df = pd.DataFrame(records).assign(ok=True)
    start, end = steady_window(df["send_s"], df["end_s"], concurrency)
    span = end - start
    pr = per_request(df)[measured(df)]
    t0, last = float(df["send_s"].min()), float(df["end_s"].max())
    return LevelMeasurement(
        concurrency=concurrency,
        n_requests=int(measured(df).sum()),
        aggregate_tok_s=tokens_between(df, start, end) / span if span > 0 else math.nan,
        aggregate_total_tok_s=float(df["output_tokens"].sum()) / (last - t0),
        e2e_s=float(pr["e2e"].mean()),
        ttft_s=float(pr["ttft"].mean()),
        tpot_s=float(pr["tpot"].mean()),
        chunks=int(sum(len(c) for c in df["chunk_s"])),
        duration_s=last - t0,
        max_lag_s=float(df["lag"].max()),
        ramp_requests=int((~measured(df)).sum()),
        steady_window_s=float(span),
    )


@contextmanager
def sim_process(*args: str, timeout_s: float = 20.0) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start `python -m specsweep serve-sim --host 127.0.0.1 --port 0 ARGS` in a subprocess; yield (process, URL);
    always stop it, also when the caller fails. Not starting is an error (RuntimeError), never a skip."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specsweep", "serve-sim", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + timeout_s
        url = None
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        if url is None:
            raise RuntimeError(f"sim server did not start (exit code {proc.poll()})")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def sim_server(*args: str, timeout_s: float = 20.0) -> Iterator[str]:
    """`sim_process`, yielding its URL only."""
    with sim_process(*args, timeout_s=timeout_s) as (_, url):
        yield url
