"""Each fault option of the simulated server does what the client's failure paths expect."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from specsweep.sim.faults import FaultConfig
from specsweep.sim.profile import load_profile
from specsweep.sim.server import SimServer
from specsweep.virtual.loadcheck import sim_process

pytestmark = [pytest.mark.unit, pytest.mark.faults]

GEN = {"text": "a b", "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}, "stream": True}


def run_with(faults: FaultConfig, fn, seed: int = 0):
    async def main():
        sim = SimServer(load_profile("demo"), seed=seed, faults=faults)
        async with TestClient(TestServer(sim.app(), host="127.0.0.1", port=0)) as client:
            return await fn(client)

    return asyncio.run(main())


async def raw_lines(resp) -> list[tuple[float, str]]:
    out = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line:
            out.append((time.monotonic(), line))
    return out


def test_http_error_fraction_all_and_seeded_part():
    async def all_fail(c):
        a = await c.post("/generate", json=GEN)
        b = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        return a.status, b.status

    assert run_with(FaultConfig(http_error_fraction=1.0), all_fail) == (500, 500)

    async def some(c):
        body = {"text": "a", "sampling_params": {"max_new_tokens": 1}}
        return [(await c.post("/generate", json=body)).status for _ in range(40)]

    a = run_with(FaultConfig(http_error_fraction=0.5), some, seed=4)
    b = run_with(FaultConfig(http_error_fraction=0.5), some, seed=4)
    assert a == b and 5 < a.count(500) < 35 and set(a) == {200, 500}


def test_stall_pauses_streams_once():
    async def go(c):
        lines = await raw_lines(await c.post("/generate", json=GEN))
        times = [t for t, _ in lines]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        return max(gaps), lines[-1][1]

    gap, last = run_with(FaultConfig(stall_after_tokens=5, stall_s=0.4), go)
    assert gap >= 0.35 and last == "data: [DONE]"


def test_malformed_line_once():
    async def go(c):
        first = [line for _, line in await raw_lines(await c.post("/generate", json=GEN))]
        second = [line for _, line in await raw_lines(await c.post("/generate", json=GEN))]
        return first, second

    first, second = run_with(FaultConfig(malformed_after_tokens=3), go)
    bad = []
    for line in first:
        payload = line[len("data: ") :]
        if payload != "[DONE]":
            try:
                json.loads(payload)
            except json.JSONDecodeError:
                bad.append(line)
    assert len(bad) == 1 and bad[0].startswith("data: ")
    assert first[-1] == "data: [DONE]" and all(line == "data: [DONE]" or "{this" not in line for line in second)


def test_truncate_ends_stream_without_done():
    async def go(c):
        lines = [line for _, line in await raw_lines(await c.post("/generate", json=GEN))]
        again = [line for _, line in await raw_lines(await c.post("/generate", json=GEN))]
        return lines, again

    lines, again = run_with(FaultConfig(truncate_after_tokens=4), go)
    assert "data: [DONE]" not in lines
    last = json.loads(lines[-1][len("data: ") :])
    assert last["meta_info"]["finish_reason"] is None and last["meta_info"]["completion_tokens"] < 20
    assert again[-1] == "data: [DONE]"  # one-shot


def test_slow_start_health_503_then_200():
    async def go(c):
        early = [(await c.get(p)).status for p in ("/health", "/health_generate")]
        gen = (await c.post("/generate", json=GEN)).status
        await asyncio.sleep(0.45)
        late = (await c.get("/health")).status
        return early, gen, late

    early, gen, late = run_with(FaultConfig(slow_start_s=0.4), go)
    assert early == [503, 503] and gen == 503 and late == 200


def test_crash_after_tokens_kills_the_process():
    async def go(url: str) -> list[bytes]:
        body = {"text": "a", "sampling_params": {"max_new_tokens": 100}, "stream": True}
        got: list[bytes] = []
        async with aiohttp.ClientSession() as s:
            with contextlib.suppress(aiohttp.ClientError):  # the crash cuts the stream
                async with s.post(url + "/generate", json=body) as r:
                    async for line in r.content:
                        got.append(line)
        return got

    with sim_process("--fault-crash-after-tokens", "10") as (proc, url):
        lines = asyncio.run(go(url))
        assert proc.wait(timeout=10) == 3
        assert b"data: [DONE]\n" not in lines
        with pytest.raises(aiohttp.ClientError):
            asyncio.run(_get(url + "/health"))


async def _get(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status


def test_cli_parses_fault_options_and_exits_cleanly_on_sigterm():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specsweep",
            "serve-sim",
            "--port",
            "0",
            "--profile",
            "demo",
            "--fault-http-error-fraction",
            "0.1",
            "--fault-stall-after-tokens",
            "5",
            "--fault-stall-s",
            "0.1",
            "--fault-slow-start-s",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "specsweep-sim listening on http://127.0.0.1:" in line and "profile=demo" in line
        assert f"pid={proc.pid}" in line and "speculative=False" in line
        url = line.split()[3]
        time.sleep(0.15)
        assert asyncio.run(_get(url + "/health")) == 200
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
