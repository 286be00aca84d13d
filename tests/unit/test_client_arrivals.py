"""Open-loop arrivals: seeded Poisson/gamma plans, Mooncake traces (and their errors), trace prompts, the open
loop against the simulated engine, and the open-loop metrics and gates."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from aiohttp.test_utils import TestServer

from specsweep.client.arrivals import (
    ArrivalPlan,
    TraceError,
    expected_prefix_share,
    gamma_times,
    load_mooncake_trace,
    trace_plan,
    trace_prompts,
)
from specsweep.client.backends import RequestSpec
from specsweep.client.loadgen import RECORD_COLUMNS, measure_level
from specsweep.client.prompts import level_prompts
from specsweep.config import defaults
from specsweep.measure.gates import judge
from specsweep.measure.metrics import measure_summary, open_window, running_requests
from specsweep.sim.profile import load_profile
from specsweep.sim.server import SimServer
from tests.unit.test_client_loadgen import in_flight_max

pytestmark = pytest.mark.unit


def test_gamma_plans_are_seeded_and_have_the_asked_rate_and_burstiness() -> None:
    assert gamma_times(4.0, 50, seed=1) == gamma_times(4.0, 50, seed=1)
    assert gamma_times(4.0, 50, seed=1) != gamma_times(4.0, 50, seed=2)
    for shape in (0.25, 1.0, 4.0):
        gaps = np.diff(gamma_times(5.0, 20001, seed=3, shape=shape))
        assert gaps.mean() == pytest.approx(0.2, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(shape), rel=0.07)
    assert gamma_times(2.0, 1, seed=0) == [0.0]
    with pytest.raises(ValueError):
        gamma_times(0.0, 3, seed=0)


def write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_trace_replays_scaled_and_in_part(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 30, "output_length": 8, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 20, "output_length": 5, "hash_ids": [1, 3]},
        {"timestamp": 3000, "input_length": 10, "output_length": 4},
    ]
    trace = load_mooncake_trace(write_trace(tmp_path / "t.jsonl", rows))
    assert len(trace) == 3 and trace.duration_s == 2.0 and trace.hash_ids[2] == []
    plan = trace_plan(trace, time_scale=2.0)
    assert plan.times_s == [0.0, 0.25, 1.0]  # twice as fast, from 0
    assert plan.input_tokens == [30, 20, 10] and plan.output_tokens == [8, 5, 4]
    assert len(trace_plan(trace, 1.0, max_requests=2)) == 2
    assert plan.offered_rate_rps == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"timestamp": 0, "output_length": 3}\n', "t.jsonl:1: missing field 'input_length'"),
        (
            '{"timestamp": 0, "input_length": 3, "output_length": 2}\n{"timestamp": 1, "input_length": "x", '
            '"output_length": 2}\n',
            "t.jsonl:2: field 'input_length' must be an integer >= 1",
        ),
        ("not json\n", "t.jsonl:1: not JSON"),
        ("[1, 2]\n", "t.jsonl:1: expected a JSON object"),
        ("\n\n", "no requests (an empty trace)"),
        (
            '{"timestamp": 5, "input_length": 3, "output_length": 2}\n{"timestamp": 1, "input_length": 3, '
            '"output_length": 2}\n',
            "timestamps go backwards at request 2",
        ),
        ('{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [1, "a"]}\n', "'hash_ids' must be"),
    ],
)
def test_a_bad_trace_names_file_line_and_field(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(text)
    with pytest.raises(TraceError, match=None) as e:
        load_mooncake_trace(p)
    assert needle in str(e.value), str(e.value)


def test_trace_prompts_share_the_blocks_they_name_and_nothing_across_cells() -> None:
    plan = ArrivalPlan([0.0, 0.1, 0.2], [12, 12, 6], [3, 3, 3], [[1, 2], [1, 3], []])
    a = trace_prompts(plan, seed=0, tag="t1r0n", block_tokens=4)
    assert a.input_tokens == [12, 12, 6] and [len(p.split()) for p in a.prompts] == [12, 12, 6]
    w0, w1 = a.prompts[0].split(), a.prompts[1].split()
    assert w0[:4] == w1[:4] and w0[4:8] != w1[4:8]  # block 1 shared, blocks 2 and 3 not
    b = trace_prompts(plan, seed=0, tag="t1r1n", block_tokens=4)  # another repeat or level
    assert not set(a.prompts[0].split()[:1]) & set(b.prompts[0].split()[:1])
    assert a.prompts == trace_prompts(plan, seed=0, tag="t1r0n", block_tokens=4).prompts  # the same in every arm
    # request 1 may reuse block 1 (4 of its 12 tokens): 4 / 30 prompt tokens
    assert expected_prefix_share(plan, 4) == pytest.approx(4 / 30)


def open_level(profile: str, rate: float, n: int, cap: int, output: int = 16) -> pd.DataFrame:
    """An open level against an in-process simulated engine (always stopped)."""

    async def go() -> pd.DataFrame:
        sim = SimServer(load_profile(profile))
        server = TestServer(sim.app(), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            prompts = await level_prompts(rate, n, 1, 4, 16, seed=1)
            plans = [ArrivalPlan(gamma_times(rate, n, seed=2))]
            lvl = await measure_level(
                RequestSpec(url=url),
                cap,
                n,
                prompts,
                output,
                warmup=1,
                plans=plans,
                max_in_flight=cap,
                warmup_plan=ArrivalPlan(gamma_times(rate, 4, seed=3)),
                idle_probe_s=0.05,
            )
            return lvl.records
        finally:
            await server.close()

    return asyncio.run(go())


def test_open_loop_sends_on_plan_and_the_cap_holds_arrivals_back() -> None:
    free = open_level("demo", rate=40.0, n=40, cap=64)
    assert list(free.columns) == list(RECORD_COLUMNS) and free["ok"].all()
    lateness = free.send_s - free.scheduled_s - free.held_s
    assert (free.held_s == 0).all() and lateness.max() < 0.05  # on plan, within the host's jitter
    assert (free.slot == -1).all() and not free.ramp.any()
    capped = open_level("demo", rate=200.0, n=40, cap=2, output=24)
    assert in_flight_max(capped) <= 2
    assert (capped.held_s > 0.001).mean() > 0.5  # the server cannot keep up: arrivals wait for a free slot
    s = measure_summary(capped, 2)["metrics"]
    assert s["load"] == "open" and s["held_share"] > 0.5
    j = judge(measure_summary(capped, 2), capped, 2, defaults("gates"))
    assert any("in-flight cap held back" in f for f in j["validity"]["flags"])


def records(sends: list[float], ends: list[float], scheduled: list[float] | None = None) -> pd.DataFrame:
    n = len(sends)
    return pd.DataFrame(
        {
            "repeat": [0] * n,
            "send_s": sends,
            "end_s": ends,
            "first_token_s": [s + 0.01 for s in sends],
            "chunk_s": [[s + 0.01, e] for s, e in zip(sends, ends, strict=True)],
            "chunk_tokens": [[1, 1]] * n,
            "output_tokens": [2] * n,
            "expected_output_tokens": [2] * n,
            "server_output_tokens": [2] * n,
            "input_tokens": [4] * n,
            "cached_tokens": [0] * n,
            "spec_verify_ct": [-1] * n,
            "ok": [True] * n,
            "error_kind": [""] * n,
            "error": [""] * n,
            "ramp": [False] * n,
            "filler": [False] * n,
            "slot": [-1] * n,
            "scheduled_s": scheduled if scheduled is not None else [math.nan] * n,
            "held_s": [0.0] * n,
        }
    )


def test_open_window_and_running_requests_by_the_in_flight_curve_and_littles_law() -> None:
    # one arrival per second, each in the system 2 s: 2 running, by both measures
    sends = [float(i) for i in range(10)]
    ends = [s + 2.0 for s in sends]
    df = records(sends, ends, scheduled=sends)
    assert open_window(sends, ends) == (2.0, 9.0)  # first end .. last send
    r = running_requests(df, 2.0, 9.0)
    assert r["mean"] == pytest.approx(2.0, abs=0.02) and r["littles_law"] == pytest.approx(2.0)
    m = measure_summary(df, 1024)["metrics"]
    assert m["running_requests_mean"] == pytest.approx(2.0, abs=0.02)
    assert m["achieved_rate_rps"] == pytest.approx(1.0, rel=0.2)


def test_repeats_pool_running_requests_per_window_not_over_stacked_records() -> None:
    sends = [float(i) for i in range(10)]
    one = records(sends, [s + 2.0 for s in sends], scheduled=sends)
    two = pd.concat([one, one.assign(repeat=1)], ignore_index=True)  # two repeats, each on its own clock
    m = measure_summary(two, 1024)["metrics"]
    assert m["running_requests_mean"] == pytest.approx(2.0, abs=0.02)
    assert m["running_requests"]["littles_law"] == pytest.approx(2.0) and m["running_requests"]["mean"] < 2.1


def test_open_loop_gates_tell_a_late_client_from_the_hosts_jitter() -> None:
    sends = [float(i) for i in range(40)]
    ends = [s + 2.0 for s in sends]
    gates = defaults("gates")

    def judged(late_s: list[float]) -> dict:
        df = records(
            [s + d for s, d in zip(sends, late_s, strict=True)],
            [e + d for e, d in zip(ends, late_s, strict=True)],
            scheduled=sends,
        )
        meta = [{"lag": [0.001] * 50, "idle_lag": [0.002] * 50, "client": {}}]
        return judge(measure_summary(df, 1024, meta), df, 1024, gates)["validity"]

    def late(v: dict) -> list[str]:
        return [r for r in v["reasons"] if "sent late" in r]

    assert not late(judged([0.003] * 40))  # 3 ms: within 5 ms of the idle jitter
    everyone = judged([0.050] * 40)  # a client 50 ms behind its plan throughout: not the planned arrivals
    assert late(everyone) and "100% of requests" in late(everyone)[0]
    assert not [r for r in everyone["reasons"] if "achieved concurrency" in r]  # no closed-loop gate here
    stall = judged([0.050 if i in (16, 17) else 0.001 for i in range(40)])  # one host stall: 2 of 40 late
    assert not late(stall) and any("5.0% of requests sent late" in f for f in stall["flags"]), stall
    assert late(judged([0.050 if i % 10 < 3 else 0.001 for i in range(40)]))  # 30% late: a starved client
