"""Closed loop, warm-up, repeats, cache flush, prompts and cell writing against the in-process fake engine."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd
import pytest

from specsweep.cli import bench as bench_cli
from specsweep.client.backends import ABORTED, RequestRecord, RequestSpec
from specsweep.client.datasets import DatasetError, load_dataset
from specsweep.client.loadgen import RECORD_COLUMNS, measure_level, ramp_length, records_frame, run_closed_loop
from specsweep.client.prompts import (
    level_prompts,
    make_prompts,
    make_prompts_auto,
    prompt_set_hash,
)
from specsweep.config import defaults
from specsweep.engines.common import post_flush_cache, post_reset_prefix_cache
from specsweep.measure import bench
from specsweep.measure.metrics import errors_summary, measured, steady_window
from specsweep.measure.summary import read_judged, summary_body, write_cell
from specsweep.records import MeasuredLevel, RecordError
from tests.support.fakeserver import FlushState, fake_server
from tests.support.synthetic import correlated_requests

pytestmark = pytest.mark.unit

WORKLOAD = {  # what `summary.level_summary` records of a level's workload (the fields every summary holds)
    "backend": "sglang",
    "endpoint": "generate",
    "n_requests": 0,
    "ramp_requests": 0,
    "stagger": False,
    "output_tokens": 16,
    "temperature": 0.0,
    "request_timeout_s": 10.0,
    "repeats": 1,
}


class FlushHooks:
    """SGLang-style cache reset and no counters: what the load generator asks of an engine."""

    async def reset_cache(self, session: aiohttp.ClientSession, url: str) -> str:
        return await post_flush_cache(session, url, retry_s=0.05)

    async def counters(self, session: aiohttp.ClientSession, url: str) -> None:
        return None


def in_flight_max(rep: pd.DataFrame) -> int:
    now = top = 0
    for _, d in sorted([(s, 1) for s in rep.send_s] + [(e, -1) for e in rep.end_s], key=lambda x: (x[0], x[1])):
        now += d
        top = max(top, now)
    return top


def test_staggered_closed_loop_keeps_c_in_flight_with_its_own_prompts_per_repeat() -> None:
    flush = FlushState(busy=2)
    seen: list[str] = []

    async def go():  # type: ignore[no-untyped-def]
        async with fake_server(flush, seen=seen) as url:
            prompts = await level_prompts(3, 3 + 9, repeats=2, n_warmup=2, input_tokens=16, seed=1, url=url)
            done: list[RequestRecord] = []
            lvl = await measure_level(
                RequestSpec(url=url),
                3,
                9,
                prompts,
                6,
                warmup=2,
                repeats=2,
                hooks=FlushHooks(),
                on_done=done.append,
                idle_probe_s=0.05,
            )
            return lvl, done, prompts

    lvl, done, prompts = asyncio.run(go())
    df = lvl.records
    assert list(df.columns) == list(RECORD_COLUMNS)
    assert len(df) == 2 * (3 + 9) and len(done) == 24  # warm-up requests are not recorded
    assert df["ok"].all(), df["error"].tolist()
    for _, rep in df.groupby("repeat"):
        ramp = rep[rep["ramp"]].sort_values("slot")
        assert ramp["slot"].tolist() == [0, 1, 2]
        assert ramp["expected_output_tokens"].tolist() == [ramp_length(6, k, 3) for k in range(3)] == [2, 4, 6]
        assert (rep[~rep["ramp"]]["expected_output_tokens"] == 6).all()
        assert rep["send_s"].min() == 0.0  # times relative to each repeat's t0
        assert in_flight_max(rep) == 3
        assert set(rep["slot"]) == {0, 1, 2}
        assert rep["request_index"].tolist() == list(range(12))
    # every prompt the server saw is distinct: warm-up, repeat 0 and repeat 1 each have their own set
    assert len(seen) == 2 + 24 and len(set(seen)) == len(seen)
    assert [r.cache_reset for r in lvl.repeats] == ["flushed", "flushed"]
    assert flush.calls == 4  # two 400s (busy) retried, then 200 per repeat
    assert all(len(r.lag_samples) > 0 and len(r.idle_lag_samples) > 0 for r in lvl.repeats)
    for r in lvl.repeats:
        assert 0 <= r.client["busy_share"] <= 1.5 and r.client["stamps"]["reads"] > 0
    assert lvl.t0_unix is not None and lvl.t0_unix > 1e9
    assert prompts.repeats[0].sha256 != prompts.repeats[1].sha256


def test_level_prompts_are_paired_across_arms_and_disjoint_across_cells() -> None:
    async def go():  # type: ignore[no-untyped-def]
        a = await level_prompts(4, 10, repeats=2, n_warmup=2, input_tokens=12, seed=3)
        b = await level_prompts(4, 10, repeats=2, n_warmup=2, input_tokens=12, seed=3)  # another arm, same cell
        c = await level_prompts(8, 10, repeats=1, n_warmup=2, input_tokens=12, seed=3)  # another level
        return a, b, c

    a, b, c = asyncio.run(go())
    assert [s.prompts for s in a.repeats] == [s.prompts for s in b.repeats]  # paired comparison
    every = a.warmup.prompts + [p for s in a.repeats for p in s.prompts] + [p for s in c.repeats for p in s.prompts]
    assert len(set(every)) == len(every)
    firsts = [p.split()[0] for p in every]
    assert len(set(firsts)) == len(firsts)  # no shared first word: no shared cached prefix
    assert a.describe()["prompts_unique"] and len(a.describe()["prompt_sets"]) == 2


def test_output_length_distribution_is_seeded_and_paired() -> None:
    async def go():  # type: ignore[no-untyped-def]
        return [await level_prompts(2, 50, 1, 0, 8, seed=5, output={"uniform": [10, 20]}) for _ in range(2)]

    a, b = asyncio.run(go())
    outs = a.repeats[0].output_tokens
    assert outs == b.repeats[0].output_tokens
    assert all(10 <= o <= 20 for o in outs) and len(set(outs)) > 3


def test_a_refused_flush_is_tried_again_after_waits_that_double_up_to_retry_s(monkeypatch) -> None:
    """The engine drops the fillers a block aborted within a step or two: the first tries come 10, 20, 40 ms
    later, not a fixed retry_s later, and the waits never pass retry_s."""
    from specsweep.engines import common

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(seconds: float, *args: object) -> None:  # the module is asyncio itself: others sleep 0
        if seconds > 0:
            waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(common.asyncio, "sleep", recorded)
    flush = FlushState(busy=7)

    async def go() -> str:
        async with fake_server(flush) as url, aiohttp.ClientSession() as s:
            return await post_flush_cache(s, url, retry_s=0.2)

    assert asyncio.run(go()) == "flushed"
    assert flush.calls == 8
    assert waits == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.2])


def test_cache_reset_outcomes() -> None:
    async def go() -> tuple[str, str, str]:
        async with fake_server() as url, aiohttp.ClientSession() as s:
            a = await post_flush_cache(s, url, timeout_s=1)
            c = await post_reset_prefix_cache(s, url, timeout_s=1)
        async with fake_server(FlushState(busy=10**6)) as url, aiohttp.ClientSession() as s:
            b = await post_flush_cache(s, url, timeout_s=0.5, retry_s=0.05)
        return a, b, c

    assert asyncio.run(go()) == ("unsupported", "timeout", "unsupported")


def test_fillers_keep_every_slot_busy_until_the_last_measured_request_ends() -> None:
    """C=2, three measured requests, the last one long: the slot whose measured requests ran out sends a filler
    (as long), which is still running when the long one ends and is aborted then. The window runs to the last
    measured end at 2 in flight; the aborted filler is no failure and no measured request."""
    lengths = [8, 8, 8, 8, 100, 100, 100]  # two ramp prompts, three measured (the last long), two for fillers

    async def go():  # type: ignore[no-untyped-def]
        async with fake_server() as url:
            prompts = await level_prompts(2, len(lengths), repeats=1, n_warmup=0, input_tokens=8, seed=3)
            one = dataclasses.replace(prompts.repeats[0], output_tokens=list(lengths))
            recs = await run_closed_loop(
                aiohttp_session := aiohttp.ClientSession(), RequestSpec(url=url), one, 8, 2, 3, stagger=True
            )
            await aiohttp_session.close()
            return recs

    df = records_frame(asyncio.run(go()), 0.0, 0)
    meas, fill = df[measured(df)], df[df["filler"]]
    assert len(meas) == 3 and meas["ok"].all() and not meas["ramp"].any()
    assert len(fill) == 1, df[["prompt_index", "slot", "filler", "error_kind"]]
    assert fill["error_kind"].tolist() == [ABORTED] and not fill["ok"].any()
    last = meas["end_s"].max()
    assert (fill["end_s"] >= last).all() and fill["output_tokens"].iloc[0] < 100  # stopped mid-answer
    start, end = steady_window(df["send_s"], df["end_s"], 2)
    assert end == last  # the window runs to the last measured end, no drain
    probe = np.linspace(start, end, 50)[1:-1]
    in_flight = [int(((df["send_s"] <= t) & (df["end_s"] > t)).sum()) for t in probe]
    assert min(in_flight) >= 1 and np.mean(in_flight) > 1.9  # C in flight but for the reissue gaps
    assert errors_summary(df)["count"] == 0


def test_duration_mode_stops_issuing_after_the_duration() -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with fake_server() as url:
            prompts = await level_prompts(2, 2 + 400, 1, 0, 8, seed=0)
            return await measure_level(RequestSpec(url=url), 2, 400, prompts, 30, duration_s=0.3, idle_probe_s=0.0)

    lvl = asyncio.run(go())
    df = lvl.records
    assert 2 < len(df) < 402  # far fewer than the cap
    assert df["send_s"].max() <= 0.3 + 0.05


def test_prompts_seeded_exact_and_hashed() -> None:
    async def go():  # type: ignore[no-untyped-def]
        a = await make_prompts(4, 20, seed=7)
        b = await make_prompts(4, 20, seed=7)
        c = await make_prompts(4, 20, seed=8)
        async with fake_server() as url:
            d = await make_prompts_auto(4, 20, seed=7, url=url)
        async with fake_server(with_tokenize=False) as url:
            e = await make_prompts_auto(4, 20, seed=7, url=url)
        return a, b, c, d, e

    a, b, c, d, e = asyncio.run(go())
    assert a.prompts == b.prompts and a.sha256 == b.sha256
    assert a.sha256 != c.sha256
    assert all(len(p.split()) == 20 for p in a.prompts)
    assert d.tokenizer == "words=server" and d.exact and d.input_tokens == [20] * 4
    assert e.tokenizer == "words" and not e.exact
    assert len({p.split()[0] for p in a.prompts}) == 4  # distinct first words: no shared cached prefix
    assert a.describe()["prompt_set_sha256"] == prompt_set_hash(a.prompts, a.output_tokens)


def test_prompts_file(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one two three", "output_tokens": 5}\n\n{"prompt": "four"}\n')

    async def go():  # type: ignore[no-untyped-def]
        return await level_prompts(1, 3, 1, 0, 3, dataset=load_dataset(f, "prompts-jsonl"))

    level = asyncio.run(go())
    ps = level.repeats[0]
    assert len(ps) == 3 and set(ps.prompts) == {"four", "one two three"} and not level.unique  # cycled: short file
    assert {p: o for p, o in zip(ps.prompts, ps.output_tokens, strict=True)} == {"one two three": 5, "four": None}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(DatasetError, match="bad.jsonl:1: missing field 'prompt'"):
        load_dataset(bad, "prompts-jsonl")


def test_per_prompt_output_tokens_are_used(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a b c", "output_tokens": 5}\n{"prompt": "d e f"}\n')

    async def go():  # type: ignore[no-untyped-def]
        prompts = await level_prompts(1, 2, 1, 0, 3, dataset=load_dataset(f, "prompts-jsonl"))
        async with fake_server() as url:
            return await measure_level(RequestSpec(url=url), 1, 2, prompts, 7, stagger=False, idle_probe_s=0)

    df = asyncio.run(go()).records
    assert sorted(df["expected_output_tokens"].tolist()) == [5, 7]
    assert (df["output_tokens"] == df["expected_output_tokens"]).all()


# `alone`: the cells are judged by the host gates (machine busy, client starved); beside another pytest-xdist worker
# a cell was judged invalid and the test failed (2026-12-03)
@pytest.mark.alone
def test_bench_cli_writes_cells(tmp_path: Path) -> None:
    out = tmp_path / "bench"

    async def go() -> int:
        async with fake_server(FlushState()) as url:  # a fake SGLang: /flush_cache answers
            p = argparse.ArgumentParser()
            bench_cli.add_arguments(p)
            args = p.parse_args(
                [
                    "--url",
                    url,
                    "--concurrency",
                    "1,2",
                    "--input-tokens",
                    "10",
                    "--output-tokens",
                    "5",
                    "--warmup",
                    "1",
                    "--out",
                    str(out),
                    "--max-client-wait-share",
                    "1",
                    "--engine",
                    "sglang",
                    "--slo-ttft-ms",
                    "1000",
                ]
            )
            return await bench.bench(bench_cli.options(args))

    rc = asyncio.run(go())
    for c, n in ((1, 8), (2, 8)):  # the schema's floor of 8 measured requests, plus C ramp requests
        df = pd.read_parquet(out / f"c{c}" / "requests.parquet")
        assert list(df.columns) == list(RECORD_COLUMNS)
        assert int(df["ramp"].sum()) == c and int(measured(df).sum()) == n
        assert int(df["filler"].sum()) <= 2 * c  # at most two filler prompts per slot (C=1: none, its slot ends last)
        assert isinstance(df["chunk_tokens"][0].tolist(), list)
        s = json.loads((out / f"c{c}" / "summary.json").read_text())
        assert "validity" not in s and s["metrics"]["goodput_rps"] is None  # judgements, made when read
        s = read_judged(out / f"c{c}", defaults("gates"), {"ttft_ms": 1000})[0]
        assert s["concurrency"] == c
        assert s["workload"]["prompt_tokenizer"] == "words=server" and len(s["workload"]["prompt_set_sha256"]) == 64
        assert s["metrics"]["ttft_ms"]["n"] == n  # measured requests only
        assert s["metrics"]["goodput_rps"] is not None
        assert s["repeats"][0]["cache_reset"] == "flushed"
        assert s["validity"]["valid"], s["validity"]
    assert not list(out.rglob("*.tmp"))
    assert rc == 0


def test_request_count() -> None:
    from specsweep.config import request_count

    assert request_count(1, 2, 8) == 8
    assert request_count(10, 2, 8) == 20
    assert request_count(10, 1, 8) == 20  # never fewer than 2*C: every slot turns over
    assert request_count(250, 2, 8, 300) == 300


def test_write_cell_replaces_atomically(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from specsweep.client.loadgen import RECORD_SCHEMA, records_frame

    df = records_frame([], 0.0, 0)  # no rows: the parquet still has the record's schema
    body = summary_body(correlated_requests(1, 4, 8, 0.1, np.random.default_rng(0)), 1, workload=WORKLOAD)
    write_cell(tmp_path, df, {**body, "server_max_running": None}, record=MeasuredLevel)
    write_cell(tmp_path, df, {**body, "server_max_running": 8}, record=MeasuredLevel)
    assert json.loads((tmp_path / "summary.json").read_text())["server_max_running"] == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.parquet", "summary.json"]
    # a summary that lost a field is refused before anything is written: the cell on disk stays whole
    with pytest.raises(RecordError, match="metrics: missing"):
        write_cell(tmp_path, df, {k: v for k, v in body.items() if k != "metrics"}, record=MeasuredLevel)
    with pytest.raises(RecordError, match="cell: missing"):  # a pipeline cell's summary names its cell
        write_cell(tmp_path, df, body)
    assert json.loads((tmp_path / "summary.json").read_text())["server_max_running"] == 8
    schema = pq.read_schema(tmp_path / "requests.parquet")
    assert [(f.name, f.type) for f in schema] == [(f.name, f.type) for f in RECORD_SCHEMA]  # even when empty


def test_progress_line_on_a_terminal() -> None:
    import io

    out = io.StringIO()

    async def go() -> None:
        p = bench.Progress(3, label="c=1", enabled=True, stream=out).start()
        p.on_done(RequestRecord(0, 0, 4, 1, output_tokens=4, ok=True))
        p.on_done(RequestRecord(1, 0, 4, 1, output_tokens=2, ok=False))
        await asyncio.sleep(0.6)
        await p.stop()

    asyncio.run(go())
    text = out.getvalue()
    assert "c=1" in text and "2/3" in text and "failed 1" in text and "tok/s" in text
    assert bench.Progress(3, enabled=None, stream=io.StringIO()).enabled is False  # not a TTY: quiet


def test_public_api_imports() -> None:
    import specsweep.client as client
    import specsweep.measure.summary as summary

    assert all(callable(getattr(client, name)) for name in client.__all__ if name[0].islower())
    assert callable(summary.level_summary) and callable(summary.write_cell)


@pytest.mark.parametrize(("server_counts_bos", "expected"), [(False, "words=server"), (True, "server")])
def test_a_local_counter_stands_in_for_the_server_only_where_it_counts_the_same(
    monkeypatch: pytest.MonkeyPatch, server_counts_bos: bool, expected: str
) -> None:
    """Prompts are fitted locally only after the local counter matched the server on every probe text; a server
    that counts one more token (a BOS) keeps counting, and the prompts still come out at its lengths."""
    from specsweep.client import prompts

    calls = {"n": 0}

    def fake_server_tokenizer(*_args: object, **_kwargs: object) -> prompts.Tokenizer:
        async def count(text: str) -> int:
            calls["n"] += 1
            return len(text.split()) + int(server_counts_bos)

        return count

    monkeypatch.setattr(prompts, "server_tokenizer", fake_server_tokenizer)
    got = asyncio.run(prompts.make_prompts_auto(20, 16, seed=3, url="http://127.0.0.1:9"))
    assert got.tokenizer == expected
    assert got.exact and all(n == 16 for n in got.input_tokens)
    if expected == "words=server":
        assert calls["n"] <= 1 + prompts.PROBE_TEXTS  # the liveness check and the probes, no prompt
    else:
        assert calls["n"] > 20  # every prompt counted by the server
