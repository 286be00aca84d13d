"""CPU sets and CPU accounting: the plan that gives the client a core, and the figures that tell a starved or
saturated client and a busy machine from a jittery host."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from specsweep.client.backends import RequestSpec
from specsweep.client.cpu import format_cpus, host_snapshot, parse_cpus, plan_cpus, usage_now
from specsweep.client.loadgen import measure_level
from specsweep.client.prompts import level_prompts
from specsweep.config import defaults
from specsweep.measure.gates import summarize
from tests.conftest import missing
from tests.support.fakeserver import fake_server

pytestmark = pytest.mark.unit

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
HOG = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < {s}: pass\n"


def test_parse_and_format_cpu_lists() -> None:
    assert parse_cpus("0-2,5") == (0, 1, 2, 5) and parse_cpus(3) == (3,) and parse_cpus([1, 0]) == (0, 1)
    assert parse_cpus(None) is None
    assert format_cpus((0, 1, 2, 5)) == "0-2,5" and format_cpus((7,)) == "7" and format_cpus(None) is None
    for bad in ("a", "3-1", ","):
        with pytest.raises(ValueError, match="bad CPU list"):
            parse_cpus(bad)


def test_auto_plan_gives_the_client_a_core_of_its_own() -> None:
    p = plan_cpus("auto", "auto", available=(0, 1, 2, 3))
    assert p.client == (3,) and p.server == (0, 1, 2) and not p.note and p.watched == (0, 1, 2, 3)
    one = plan_cpus("auto", "auto", available=(0,))
    assert one.client is None and one.server is None and "one CPU" in one.note
    shared = plan_cpus("0", "0", available=(0, 1))
    assert "share CPUs 0" in shared.note
    assert plan_cpus(None, None, available=(0, 1)).watched is None
    with pytest.raises(ValueError, match="not all available"):
        plan_cpus("5", "auto", available=(0, 1))


def hogs_on_my_core(n: int) -> Iterator[tuple[int, list[int]]]:
    """`n` busy processes pinned to the last CPU, this test process pinned there too. Always stopped."""
    if not TWO_CPUS:
        missing("two CPUs (this host has one): the hog test pins the client and the hogs to one of two")
    mine = os.sched_getaffinity(0)
    cpu = max(mine)
    os.sched_setaffinity(0, {cpu})
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(s=30)]) for _ in range(n)]
    try:
        for h in hogs:
            os.sched_setaffinity(h.pid, {cpu})
        yield cpu, [h.pid for h in hogs]
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        os.sched_setaffinity(0, mine)


@pytest.fixture
def hog_on_my_core() -> Iterator[tuple[int, int]]:
    for cpu, pids in hogs_on_my_core(1):
        yield cpu, pids[0]


@pytest.fixture
def engine_threads_on_my_core() -> Iterator[tuple[int, list[int]]]:
    """An engine's compute threads (vLLM's CPU build runs one per core plus a scheduler) on the client's core.

    One CPU-bound competitor is not enough to starve an event loop that sleeps most of the time (the kernel's
    scheduler favours the task that woke up: measured wait share about 2%, loop lag p99 about 1 ms, a valid
    cell); four are (wait share about 20-35%)."""
    yield from hogs_on_my_core(4)


def test_run_queue_wait_and_foreign_cpu_are_measured(hog_on_my_core: tuple[int, int]) -> None:
    cpu, hog = hog_on_my_core
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # a server doing nothing
    try:
        time.sleep(0.2)
        u0, as_server0, as_other0 = usage_now(), host_snapshot((cpu,), hog), host_snapshot((cpu,), idle.pid)
        t, spins = time.monotonic(), 0
        while time.monotonic() - t < 0.6:  # compete with the hog for the one CPU
            spins += 1
        u = usage_now().since(u0)
        as_server = host_snapshot((cpu,), hog).since(as_server0)
        as_other = host_snapshot((cpu,), idle.pid).since(as_other0)
    finally:
        idle.kill()
        idle.wait()
    assert u["wait_share"] is not None and u["wait_share"] > 0.3, u  # about half the time on the run queue
    assert 0.3 < u["busy_share"] < 0.75, u
    # the hog as the server: nothing else ran there; the hog as someone else's work: foreign, about half the CPU
    assert as_server["foreign_cpu_share"] < 0.1 and 0.3 < as_server["server_cpu_cores"] < 0.75, as_server
    assert 0.3 < as_other["foreign_cpu_share"] < 0.75, as_other
    # one CPU and one server process over ~0.6 s: 3 ticks of 10 ms, about 5% of it
    assert as_other["foreign_cpu_resolution"] == pytest.approx(3 / os.sysconf("SC_CLK_TCK") / 0.6, rel=0.1)
    assert host_snapshot((cpu,), None).since(as_other0)["foreign_cpu_share"] is None  # server unknown


def test_a_starved_client_is_caught_by_the_gates(engine_threads_on_my_core: tuple[int, list[int]]) -> None:
    """Client and a busy engine on one core: the cell is invalid for starvation, whatever the loop lag says."""

    async def go():  # type: ignore[no-untyped-def]
        async with fake_server() as url:
            prompts = await level_prompts(4, 4 + 40, 1, 0, 8, seed=0, url=url)
            return await measure_level(RequestSpec(url=url), 4, 40, prompts, 30, idle_probe_s=0.2)

    lvl = asyncio.run(go())
    rep = lvl.repeats[0]
    s = summarize(
        lvl.records,
        4,
        defaults("gates"),
        repeats=[{"lag": rep.lag_samples, "idle_lag": rep.idle_lag_samples, "client": rep.client}],
    )
    reasons = s["validity"]["reasons"]
    assert any("client starved" in r for r in reasons), (s["metrics"]["client"], reasons)
