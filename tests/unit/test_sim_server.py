"""API shapes of every simulated-server endpoint, served in-process on an ephemeral port."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from specsweep.sim.profile import load_profile
from specsweep.sim.server import SimServer, output_words, runner_of
from specsweep.virtual.loadcheck import sim_process

pytestmark = pytest.mark.unit


def with_client(fn: Callable[[TestClient, SimServer], Awaitable[Any]], **kw: Any) -> Any:
    """Run fn(client, sim) against a fresh in-process server; always shut it down."""

    async def main() -> Any:
        sim = SimServer(load_profile(kw.pop("profile", "demo")), **kw)
        async with TestClient(TestServer(sim.app(), host="127.0.0.1", port=0)) as client:
            return await fn(client, sim)

    return asyncio.run(main())


async def sse(resp) -> list[Any]:
    """Parsed `data:` payloads of a stream ('[DONE]' kept as a string)."""
    out = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_health_info_models_tokenize_metrics():
    async def go(c: TestClient, sim: SimServer):
        for path in ("/health", "/health_generate"):
            assert (await c.get(path)).status == 200
        for path in ("/server_info", "/get_server_info"):
            info = await (await c.get(path)).json()
            assert info["engine"] == "specsweep-sim" and info["profile"] == "demo"
            assert info["speculative_algorithm"] == "EAGLE3"
            assert info["speculative_num_draft_tokens"] == 4 and info["max_running_requests"] == 256
            assert "version" in info and "avg_spec_accept_length" in info
            assert info["profile_params"]["step"]["fixed_s"] > 0
        models = await (await c.get("/v1/models")).json()
        assert models["data"][0]["id"] == sim.model_name
        tok = await (await c.post("/tokenize", json={"prompt": "one two  three"})).json()
        assert tok["count"] == 3 and len(tok["tokens"]) == 3 and tok["max_model_len"] == 4096
        text = await (await c.get("/metrics")).text()
        for name in (
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total",
        ):
            assert name in text

    with_client(go, speculative=True)


def test_baseline_info_has_no_speculation():
    async def go(c: TestClient, sim: SimServer):
        info = await (await c.get("/server_info")).json()
        assert info["speculative_algorithm"] is None and info["avg_spec_accept_length"] is None
        assert "spec_decode" not in await (await c.get("/metrics")).text()

    with_client(go)


def test_generate_stream_sglang_shape_and_accept_length():
    async def go(c: TestClient, sim: SimServer):
        body = {
            "text": "a b c d",
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True},
            "stream": True,
        }
        chunks = await sse(await c.post("/generate", json=body))
        assert chunks[-1] == "[DONE]"
        objs = chunks[:-1]
        counts = [o["meta_info"]["completion_tokens"] for o in objs]
        assert counts == sorted(counts) and counts[-1] == 40 and len(set(counts)) == len(counts)
        assert any(b - a > 1 for a, b in zip([0] + counts, counts, strict=False))  # multi-token chunks
        for o in objs:
            assert len(o["text"].split()) == o["meta_info"]["completion_tokens"]
            assert o["meta_info"]["prompt_tokens"] == 4
        assert all(o["meta_info"]["finish_reason"] is None for o in objs[:-1])
        last = objs[-1]["meta_info"]
        assert last["finish_reason"] == {"type": "length", "length": 40} and last["e2e_latency"] > 0
        assert 1 <= 40 / last["spec_verify_ct"] <= 4
        info = await (await c.get("/server_info")).json()
        assert info["avg_spec_accept_length"] > 1
        m = await (await c.get("/metrics")).text()
        drafts = next(float(x.split()[-1]) for x in m.splitlines() if x.startswith("vllm:spec_decode_num_drafts_total"))
        assert drafts == last["spec_verify_ct"]
        assert "sim_sent_at" not in objs[0]

    with_client(go, speculative=True)


def test_generate_non_stream_and_input_ids():
    async def go(c: TestClient, sim: SimServer):
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 7}}
        out = await (await c.post("/generate", json=body)).json()
        assert out["meta_info"]["completion_tokens"] == 7 and out["meta_info"]["prompt_tokens"] == 3
        assert out["text"] == "".join(output_words(["1", "2", "3"], 7))  # the prompt's own output
        assert len(out["text"].split()) == 7
        assert "spec_verify_ct" not in out["meta_info"]

    with_client(go)


def test_openai_completions_stream_with_usage_and_timestamps():
    async def go(c: TestClient, sim: SimServer):
        body = {
            "prompt": "x y z",
            "max_tokens": 9,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        t0 = time.monotonic()
        chunks = await sse(await c.post("/v1/completions", json=body))
        assert chunks[-1] == "[DONE]"
        usage_chunk = chunks[-2]
        assert usage_chunk["choices"] == [] and usage_chunk["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 9,
            "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        content = chunks[:-2]
        text = "".join(o["choices"][0]["text"] for o in content)
        assert len(text.split()) == 9
        assert [o["usage"]["completion_tokens"] for o in content][-1] == 9
        assert content[-1]["choices"][0]["finish_reason"] == "length"
        sent = [o["sim_sent_at"] for o in chunks[:-1]]
        assert sent == sorted(sent) and t0 < sent[0] < time.monotonic()

    with_client(go, debug_timestamps=True)


def test_openai_chat_stream_and_non_stream():
    async def go(c: TestClient, sim: SimServer):
        msgs = [{"role": "user", "content": "hello there friend"}]
        body = {"messages": msgs, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
        chunks = await sse(await c.post("/v1/chat/completions", json=body))
        assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["prompt_tokens"] == 5  # <|user|> 3 words <|assistant|>
        content = chunks[:-2]
        assert content[0]["object"] == "chat.completion.chunk"
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "usage" not in content[0]  # continuous usage only when asked
        assert len("".join(o["choices"][0]["delta"]["content"] for o in content).split()) == 5
        out = await (await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4})).json()
        assert len(out["choices"][0]["message"]["content"].split()) == 4
        assert out["usage"]["completion_tokens"] == 4
        out = await (await c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2})).json()
        assert out["usage"] == {
            "prompt_tokens": 2,
            "completion_tokens": 2,
            "total_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    with_client(go)


def test_flush_cache_400_while_busy_200_when_idle():
    async def go(c: TestClient, sim: SimServer):
        body = {"text": "a", "sampling_params": {"max_new_tokens": 200}, "stream": False}
        task = asyncio.create_task(c.post("/generate", json=body))
        while not sim.engine.has_work:
            await asyncio.sleep(0.005)
        busy = await c.post("/flush_cache")
        assert busy.status == 400
        running = await (await c.get("/metrics")).text()
        assert 'sglang:num_running_reqs{model_name="specsweep-sim/demo"} 1' in running
        resp = await task
        assert resp.status == 200
        assert (await c.post("/flush_cache")).status == 200
        assert (await c.get("/flush_cache")).status == 200

    with_client(go)


def test_prefix_cache_hits_a_repeated_prompt_until_reset():
    """A resent prompt is served from the prefix cache (as in vLLM and SGLang): shorter prefill, counted hits;
    /flush_cache (SGLang) and /reset_prefix_cache (vLLM) empty it."""
    prompt = " ".join(f"w{i}" for i in range(40))  # two full 16-token blocks and a partial one

    async def cached(c: TestClient) -> int:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 2}, "stream": False}
        return (await (await c.post("/generate", json=body)).json())["meta_info"]["cached_tokens"]

    async def go(c: TestClient, sim: SimServer):
        assert await cached(c) == 0
        assert await cached(c) == 32
        metrics = await (await c.get("/metrics")).text()
        assert "vllm:prefix_cache_queries_total" in metrics and sim.prefix_cache.hits == 32
        assert sim.prefix_cache.queries == 80
        assert (await c.post("/flush_cache")).status == 200
        assert await cached(c) == 0
        assert await (await c.post("/reset_prefix_cache")).json() == {"success": True}
        assert await cached(c) == 0
        other = {"prompt": "x " + prompt, "max_tokens": 2}  # a different first token: no shared prefix
        usage = (await (await c.post("/v1/completions", json=other)).json())["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}

    with_client(go)


def test_bad_requests():
    async def go(c: TestClient, sim: SimServer):
        assert (await c.post("/generate", data=b"{not json")).status == 400
        too_long = {"text": "a", "sampling_params": {"max_new_tokens": 5000}}
        assert (await c.post("/generate", json=too_long)).status == 400
        assert (await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 0})).status in (200, 400)

    with_client(go)


def test_max_running_requests_flag_caps_the_batch():
    async def go(c: TestClient, sim: SimServer):
        body = {"text": "a", "sampling_params": {"max_new_tokens": 30}}
        tasks = [asyncio.create_task(c.post("/generate", json=body)) for _ in range(5)]
        peak = 0
        while not all(t.done() for t in tasks):
            peak = max(peak, len(sim.engine.running))
            await asyncio.sleep(0.002)
        assert peak == 2
        assert [(await t).status for t in tasks] == [200] * 5
        info = await (await c.get("/server_info")).json()
        assert info["max_running_requests"] == 2

    with_client(go, max_running_requests=2)


def test_speculation_schedule_is_served_and_reported():
    async def go(c: TestClient, sim: SimServer):
        info = await (await c.get("/server_info")).json()
        assert info["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 1024, 0]]
        body = {"text": "a b c", "sampling_params": {"max_new_tokens": 6}}
        out = await (await c.post("/generate", json=body)).json()  # alone: batch 1, drafting on
        assert out["meta_info"]["spec_verify_ct"] < 6

    with_client(go, speculative=True, schedule=[(1, 2, 3), (3, 1024, 0)])


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--spec-schedule", "[[1, 4, 3]]"], "needs --speculative"),
        (["--speculative", "--spec-schedule", "[[4, 1, 3]]"], "1 <= start <= end"),
    ],
)
def test_bad_speculation_schedule_stops_the_server(argv: list[str], why: str) -> None:
    import argparse

    from specsweep.cli import serve_sim

    parser = argparse.ArgumentParser()
    serve_sim.add_arguments(parser)
    with pytest.raises(SystemExit, match=why):
        serve_sim.run(parser.parse_args(argv))


def test_greedy_requests_draw_acceptance_by_prompt():
    """Two servers sent the same greedy prompts in another order verify each prompt in the same number of passes
    (a real engine at temperature 0 accepts the same drafts for the same prompt): a same-K comparison is paired on
    content. Sampled requests (temperature 1) and `draws_by_prompt=False` draw by request id instead."""
    prompts = [f"p{i} alpha beta gamma" for i in range(12)]

    def verify_passes(order: list[int], temperature: float, warm: int, by_prompt: bool = True) -> dict[int, int]:
        async def go(c: TestClient, sim: SimServer) -> dict[int, int]:
            for w in range(warm):  # other requests first: other request ids for the same prompts
                await c.post("/generate", json={"text": f"warm {w}", "sampling_params": {"max_new_tokens": 4}})
            out = {}
            for i in order:
                body = {
                    "text": prompts[i],
                    "sampling_params": {"max_new_tokens": 64, "ignore_eos": True, "temperature": temperature},
                    "stream": True,
                }
                chunks = await sse(await c.post("/generate", json=body))
                out[i] = chunks[-2]["meta_info"]["spec_verify_ct"]
            return out

        return with_client(go, speculative=True, draws_by_prompt=by_prompt)

    forward, backward = list(range(12)), list(range(11, -1, -1))
    greedy = verify_passes(forward, 0.0, 0)
    assert verify_passes(backward, 0.0, 3) == greedy
    assert len(set(greedy.values())) > 1  # the prompts' draws differ: the key is the prompt, not one shared stream
    assert verify_passes(backward, 1.0, 3) != verify_passes(forward, 1.0, 0)
    assert verify_passes(backward, 0.0, 3, by_prompt=False) != greedy


def test_a_queued_request_whose_client_goes_away_leaves_the_queue_at_once():
    """A request waiting for a running slot writes nothing, so only the handler's cancellation tells the engine
    its client left (`runner_of`, as `serve` runs it): it leaves the queue at once, as SGLang and vLLM drop it,
    instead of being admitted and prefilled later."""

    async def go() -> tuple[bool, float]:
        sim = SimServer(load_profile("demo"), max_running_requests=1)
        runner = runner_of(sim)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/generate"
        body = {"text": "a b c", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}, "stream": True}
        try:
            async with aiohttp.ClientSession() as s:
                running = await s.post(url, json=body)
                await running.content.readline()  # the only slot is taken
                queued = await s.post(url, json={**body, "text": "d e f"})  # its headers come at once
                started = time.monotonic()
                while not sim.engine.waiting and time.monotonic() - started < 2.0:
                    await asyncio.sleep(0.005)
                assert len(sim.engine.waiting) == 1, "the second request never queued"
                queued.close()  # its client goes away before its answer starts
                started = time.monotonic()
                while sim.engine.waiting and time.monotonic() - started < 1.0:
                    await asyncio.sleep(0.005)
                left, waited = not sim.engine.waiting, time.monotonic() - started
                running.close()
        finally:
            await runner.cleanup()
        return left, waited

    left, waited = asyncio.run(go())
    assert left and waited < 0.2, f"the queued request stayed {waited:.2f} s after its client left"


def test_the_served_engine_freezes_its_start_up_heap() -> None:
    """`serve` (what `specsweep serve-sim` runs) moves its start-up objects out of the collector's scans: a full
    collection of the whole heap took 77-109 ms at C=250, no stream written meanwhile (`gc_frozen_objects`)."""

    async def info(url: str) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s, s.get(f"{url}/server_info") as r:
            return await r.json()

    with sim_process() as (_, url):
        frozen = asyncio.run(info(url))["sim_loop"]["gc_frozen_objects"]
    assert frozen > 10_000, frozen  # the imported modules alone are tens of thousands of objects


def test_an_idle_engine_starts_a_lone_request_at_once():
    """An idle engine takes the arrivals of the instant and steps (engine.py): no fixed admission wait, which at
    2 ms made each idle moment cost ~4 ms and, at C=2, as often as the host's timing had both slots end in one
    step. The step starts within a few event-loop passes of the request's arrival (median of five requests, a
    millisecond of room for a busy host; a 2 ms window could never start sooner than 2 ms)."""

    async def go(c: TestClient, sim: SimServer) -> list[float]:
        gaps: list[float] = []
        step = sim.engine.step

        def recording(now: float):  # each step's start, beside the arrival of a request it admits from idle
            if not sim.engine.running:
                gaps.append(now - min(r.arrival for r in sim.engine.waiting))
            return step(now)

        sim.engine.step = recording  # type: ignore[method-assign]
        for i in range(5):
            body = {"text": f"w{i}", "sampling_params": {"max_new_tokens": 1}}
            assert (await c.post("/generate", json=body)).status == 200
        return gaps

    gaps = with_client(go)
    assert sorted(gaps)[2] < 0.0015, f"steps started {[round(g * 1e3, 2) for g in gaps]} ms after the arrival"
