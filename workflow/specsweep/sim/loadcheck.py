"""A minimal closed-loop streaming client, to check the real-time server against the virtual-time model.

It is deliberately independent of `specsweep.client` (which the sim is used to test): if both agree with
the model, a disagreement elsewhere is the other side's. Metrics use predict's definitions.
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp


@dataclass
class LevelMeasurement:
    concurrency: int
    n_requests: int
    aggregate_tok_s: float  # steady window, as predict.simulate_level
    aggregate_total_tok_s: float
    e2e_s: float
    ttft_s: float
    chunks: int
    duration_s: float  # first send to last end
    max_lag_s: float  # largest gap between the server's send time and our receive time (debug timestamps)


async def _one(
    session: aiohttp.ClientSession, url: str, prompt: str, output_tokens: int, chunks: list[tuple[float, int]]
) -> tuple[float, float, float, float]:
    """Stream one /generate request; return (send, first token, end, max lag)."""
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": output_tokens, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }
    send = time.monotonic()
    first = math.nan
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
                chunks.append((now, n))
                if math.isnan(first):
                    first = now
            if "sim_sent_at" in obj:
                lag = max(lag, now - obj["sim_sent_at"])
    if done_tokens != output_tokens:
        raise RuntimeError(f"got {done_tokens} tokens, asked for {output_tokens}")
    return send, first, time.monotonic(), lag


async def closed_loop(
    url: str, concurrency: int, n_requests: int, input_tokens: int, output_tokens: int
) -> LevelMeasurement:
    """C workers, each sending the next request as soon as its previous one finished."""
    prompt = " ".join(f"w{i}" for i in range(input_tokens))
    chunks: list[tuple[float, int]] = []
    results: list[tuple[float, float, float, float]] = []
    remaining = [n_requests]
    ends: list[float] = []
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
    ) as session:

        async def worker() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                r = await _one(session, url, prompt, output_tokens, chunks)
                results.append(r)
                ends.append(r[2])

        async def touch() -> None:
            async with session.get(url + "/health") as r:
                await r.read()

        # Open the C keep-alive connections first: connection set-up is the client's cost, not the server's.
        await asyncio.gather(*(touch() for _ in range(min(concurrency, n_requests))))
        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, n_requests))))
    ends.sort()
    # In-flight drops below C at the completion after the last send: the (N - C + 1)-th completion.
    window_end = ends[max(0, n_requests - concurrency)]
    win_tokens = sum(n for t, n in chunks if t <= window_end)
    last = ends[-1]
    return LevelMeasurement(
        concurrency=concurrency,
        n_requests=n_requests,
        aggregate_tok_s=win_tokens / (window_end - t0),
        aggregate_total_tok_s=n_requests * output_tokens / (last - t0),
        e2e_s=sum(r[2] - r[0] for r in results) / len(results),
        ttft_s=sum(r[1] - r[0] for r in results) / len(results),
        chunks=len(chunks),
        duration_s=last - t0,
        max_lag_s=max(r[3] for r in results),
    )


@contextmanager
def sim_server(*args: str, timeout_s: float = 20.0) -> Iterator[str]:
    """Start `python -m specsweep.sim.server --port 0 ARGS` in a subprocess; yield its URL; always stop it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specsweep.sim.server", "--port", "0", *args],
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
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
