"""Client timestamps vs the simulated engine's own send times (`--debug-timestamps`, same monotonic clock).

Why: TTFT and ITL are only as good as the moment the client notices a chunk. At C=100 the client must see each
chunk within 1 ms (p99) of the server writing it, or the sweep measures the client instead of the server.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
import pytest

from specsweep.client.backends import RequestSpec
from specsweep.client.loadgen import measure_level
from specsweep.client.prompts import level_prompts
from specsweep.config import defaults
from specsweep.measure.gates import summarize
from specsweep.virtual.loadcheck import sim_process
from tests.conftest import HOST_DISTURBED

# `alone`: the 1 ms check is of the client, so the test command runs it in its second phase, one test at a time;
# beside another pytest-xdist worker the engine's stamps were disturbed and it skipped (CI, 2026-12-03)
pytestmark = [pytest.mark.unit, pytest.mark.alone]

TOLERANCE_S = 0.001


@pytest.fixture(params=[False, True], ids=["baseline", "speculative"])
def sim(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """A simulated engine on an ephemeral port; stopped in the finalizer whatever the test does.

    Client and server get a core each (as a load test on separate hosts would), so neither is preempted by the
    other between stamping a chunk and sending or receiving it; the reference times stay the server's own.
    """
    with ExitStack() as stack:
        try:
            proc, url = stack.enter_context(
                sim_process("--debug-timestamps", *(["--speculative"] if request.param else []))
            )
        except (OSError, RuntimeError) as e:  # the simulator is the project's own: not starting is a bug
            pytest.fail(f"the simulated engine did not start: {e}")
        own_cpus = os.sched_getaffinity(0)
        if len(own_cpus) >= 2:
            server_cpu = max(own_cpus)
            os.sched_setaffinity(proc.pid, {server_cpu})
            os.sched_setaffinity(0, own_cpus - {server_cpu})
        try:
            yield url, proc.pid
        finally:
            os.sched_setaffinity(0, own_cpus)


def _busy_jiffies() -> int:
    """CPU time used by the whole machine so far (all cores, /proc/stat), in clock ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal


def _proc_jiffies(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _errors(df) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """(client TTFT - server-side TTFT per request, |client gap - server gap| per chunk gap), seconds."""
    ttft_err, gap_err = [], []
    for cs, ss in zip(df["chunk_s"], df["server_chunk_s"], strict=True):
        cs, ss = np.asarray(cs), np.asarray(ss)
        assert len(cs) == len(ss) > 0
        ttft_err.append(cs[0] - ss[0])  # the same send time cancels
        gap_err.extend(np.diff(cs) - np.diff(ss))
    return np.asarray(ttft_err), np.abs(np.asarray(gap_err))


def _wait_s(pid: int) -> float:
    """Seconds the process's threads spent ready to run but waiting for a CPU (/proc/<pid>/task/*/schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        except OSError:  # a thread that just ended
            continue
    return total / 1e9


def _steal_s() -> float:
    with open("/proc/stat") as f:
        v = f.readline().split()[1:]
    return int(v[7]) / os.sysconf("SC_CLK_TCK") if len(v) > 7 else 0.0


@pytest.mark.timeout(90)
def test_client_times_match_server_send_times_at_c100(sim: tuple[str, int], request: pytest.FixtureRequest) -> None:
    """p99 of both errors under 1 ms at C=100, measured once.

    The reference is the engine's own stamp taken just before it writes a chunk: when the engine is preempted
    between stamping and writing (another process on its core, or the hypervisor taking the VM), the reference
    is off, not the client. That disturbance is measured (the engine's run-queue wait, stolen time, other
    processes' CPU); above the limits below the figures are printed and the test skips, otherwise a miss fails.
    """
    url, sim_pid = sim
    backend = "openai" if "speculative" in request.node.callspec.id else "sglang"  # each API once, both arms

    async def go():  # type: ignore[no-untyped-def]
        prompts = await level_prompts(100, 300, 1, 4, 32, seed=0, url=url)
        assert prompts.repeats[0].exact and prompts.repeats[0].tokenizer == "words=server"
        spec = RequestSpec(url=url, backend=backend, request_timeout_s=30)
        return await measure_level(spec, 100, 200, prompts, 24, warmup=4, idle_probe_s=0.1)

    tick = os.sysconf("SC_CLK_TCK")
    b0, s0, o0, t0 = _busy_jiffies(), _proc_jiffies(sim_pid), _proc_jiffies(os.getpid()), time.monotonic()
    w0, st0 = _wait_s(sim_pid), _steal_s()
    lvl = asyncio.run(go())
    wall = time.monotonic() - t0
    own = (_proc_jiffies(sim_pid) - s0) + (_proc_jiffies(os.getpid()) - o0)
    foreign = max(0.0, (_busy_jiffies() - b0 - own) / tick / wall)
    engine_wait, steal = (_wait_s(sim_pid) - w0) / wall, (_steal_s() - st0) / wall
    df = lvl.records
    assert df["ok"].all(), df.loc[~df["ok"], "error"].head().tolist()
    assert (df["output_tokens"] == df["expected_output_tokens"]).all()
    assert (df["server_output_tokens"] == df["expected_output_tokens"]).all()
    ttft_err, gap_err = _errors(df)
    assert (ttft_err > -1e-4).all()  # a chunk is never seen before it was sent (same clock)
    rep = lvl.repeats[0]
    s = summarize(df, 100, defaults("gates"), repeats=[{"lag": rep.lag_samples, "client": rep.client}])
    assert s["metrics"]["achieved_concurrency"] >= 95
    assert rep.client["stamps"]["kernel_share"] == 1.0  # every read stamped by the kernel on Linux over http
    t99, g99 = np.percentile(ttft_err, 99), np.percentile(gap_err, 99)
    msg = (
        f"TTFT error p99 {t99 * 1e3:.3f} ms, gap error p99 {g99 * 1e3:.3f} ms, loop lag p99 "
        f"{s['metrics']['loop_lag_ms']['p99']:.2f} ms; engine waited {engine_wait:.2%} of the time, stolen "
        f"{steal:.2%}, other processes {foreign:.2f} cores; {int(df['chunk_tokens'].map(len).sum())} chunks"
    )
    print(msg)
    if t99 < TOLERANCE_S and g99 < TOLERANCE_S:
        return
    if engine_wait > 0.005 or steal > 0.005 or foreign > 0.25:
        pytest.skip(f"{HOST_DISTURBED} the engine's own stamps were disturbed; accuracy not measurable: {msg}")
    pytest.fail(f"client timestamps off on a quiet machine: {msg}")


def test_realtime_offset_comes_from_reads_taken_back_to_back() -> None:
    """The offset that turns a kernel stamp into monotonic time agrees with a fresh pair of reads to well
    under the accuracy test's 0.1 ms tolerance (it once took reads a preemption apart)."""
    from specsweep.client.fasthttp import realtime_offset

    offsets = [realtime_offset() for _ in range(200)]
    assert max(offsets) - min(offsets) < 1e-4, (min(offsets), max(offsets))
    assert abs(offsets[0] - (time.time() - time.monotonic())) < 1e-3
