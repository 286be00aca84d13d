"""Engine HTTP probes against small aiohttp servers on 127.0.0.1 (always stopped): SGLang's /server_info
fallback, vLLM's /metrics counters and /version."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specsweep.engines import sglang as sglang_mod
from specsweep.engines import vllm as vllm_mod
from specsweep.engines.prometheus import samples
from specsweep.measure.metrics import accept_length_from_counters

pytestmark = pytest.mark.unit

SERVER_INFO = {
    "model_path": "/models/Kimi-K2.5",
    "tp_size": 8,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "max_running_requests": 256,
    "max_total_num_tokens": 500000,
    "internal_states": [{"avg_spec_accept_length": 2.7, "effective_max_running_requests_per_dp": 256}],
    "version": "0.5.6.post2",
}

METRICS = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 115.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79593865040201e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 324.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 220.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 85.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 69.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
vllm:generation_tokens_total{engine="0",model_name="m"} 40.0
"""

BASELINE_METRICS = """\
vllm:num_requests_running{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
"""


async def _with_server(routes: list[web.RouteDef], body: Callable[[str, aiohttp.ClientSession], Awaitable[Any]]):
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            return await body(f"http://127.0.0.1:{port}", session)
    finally:
        await runner.cleanup()


def run(routes: list[web.RouteDef], body: Callable[[str, aiohttp.ClientSession], Awaitable[Any]]) -> Any:
    return asyncio.run(_with_server(routes, body))


def _json(payload: Any) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(payload)

    return handler


def test_sglang_server_info_fallback_to_get_server_info() -> None:
    # an older SGLang: /server_info does not exist (aiohttp answers 404), /get_server_info does
    routes = [web.get("/get_server_info", _json(SERVER_INFO))]
    info = run(routes, lambda url, s: sglang_mod.SGLangEngine().server_info(s, url))
    assert info["endpoint"] == "/get_server_info"
    assert info["version"] == "0.5.6.post2"
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["speculative_num_steps"] == 3
    assert info["speculative_eagle_topk"] == 1
    assert info["speculative_num_draft_tokens"] == 4
    assert info["max_running_requests"] == 256
    assert info["effective_max_running_requests_per_dp"] == 256
    assert info["avg_spec_accept_length_cumulative"] == 2.7
    assert info["raw"] == SERVER_INFO


def test_sglang_server_info_prefers_server_info() -> None:
    newer = dict(SERVER_INFO, version="0.5.23")
    routes = [web.get("/server_info", _json(newer)), web.get("/get_server_info", _json(SERVER_INFO))]
    info = run(routes, lambda url, s: sglang_mod.SGLangEngine().server_info(s, url))
    assert info["endpoint"] == "/server_info" and info["version"] == "0.5.23"


def test_sglang_server_info_unavailable_is_empty() -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    routes = [web.get("/server_info", broken)]
    assert run(routes, lambda url, s: sglang_mod.SGLangEngine().server_info(s, url)) == {}

    # nothing listening at all
    async def closed(url: str, s: aiohttp.ClientSession) -> Any:
        return await sglang_mod.SGLangEngine().server_info(s, "http://127.0.0.1:9")

    assert run([], closed) == {}


def test_sglang_counters_none_and_flush_is_its_reset() -> None:
    assert asyncio.run(sglang_mod.SGLangEngine().counters(None, "http://127.0.0.1:9")) is None
    calls = {"n": 0}

    async def flush(request: web.Request) -> web.Response:
        calls["n"] += 1
        return web.Response(status=400 if calls["n"] == 1 else 200, text="busy" if calls["n"] == 1 else "ok")

    got = run([web.post("/flush_cache", flush)], lambda url, s: sglang_mod.SGLangEngine().reset_cache(s, url))
    assert got == "flushed" and calls["n"] == 2


def test_vllm_counters_from_metrics() -> None:
    text = (
        METRICS + 'vllm:prefix_cache_queries_total{engine="0"} 640.0\nvllm:prefix_cache_hits_total{engine="0"} 32.0\n'
    )

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    got = run([web.get("/metrics", metrics)], lambda url, s: vllm_mod.VLLMEngine().counters(s, url))
    assert got["num_drafts"] == 120.0  # summed over label sets
    assert got["num_draft_tokens"] == 324.0
    assert got["num_accepted_tokens"] == 220.0  # the _per_pos_ series is a different metric
    assert got["prefix_cache_queries"] == 640.0 and got["prefix_cache_hits"] == 32.0


def test_vllm_counters_baseline_and_failure() -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=BASELINE_METRICS, content_type="text/plain")

    got = run([web.get("/metrics", metrics)], lambda url, s: vllm_mod.VLLMEngine().counters(s, url))
    assert got == {}  # a server without speculation exports no spec-decode counters
    # a failed read is None, never {}: an empty dict would act as a zero baseline and turn the server's
    # totals since start into one cell's deltas
    assert run([], lambda url, s: vllm_mod.VLLMEngine().counters(s, url)) is None  # 404
    assert asyncio.run(_closed_counters()) is None  # nothing listening


async def _closed_counters() -> Any:
    async with aiohttp.ClientSession() as s:
        return await vllm_mod.VLLMEngine().counters(s, "http://127.0.0.1:9")


def test_vllm_reset_prefix_cache_retries_until_success() -> None:
    calls = {"n": 0}

    async def reset(request: web.Request) -> web.Response:
        calls["n"] += 1
        return web.json_response({"success": calls["n"] >= 3})  # blocks still held twice

    got = run([web.post("/reset_prefix_cache", reset)], lambda url, s: vllm_mod.VLLMEngine().reset_cache(s, url))
    assert got == "reset" and calls["n"] == 3
    # without VLLM_SERVER_DEV_MODE the route does not exist: said so, not hidden
    assert run([], lambda url, s: vllm_mod.VLLMEngine().reset_cache(s, url)) == "unsupported"


def test_vllm_launch_env_enables_reset_and_binds_omp_threads() -> None:
    spec = vllm_mod.VLLMEngine().server_spec({"model": "/m", "cpus": "0-2"}, "baseline", {}, "127.0.0.1", 5, "py")
    assert spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-2" and spec.cpus == (0, 1, 2)
    own = {"model": "/m", "cpus": "0", "env_vars": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}}
    assert vllm_mod.VLLMEngine().server_spec(own, "b", {}, "h", 5, "py").env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    gpu = vllm_mod.VLLMEngine().server_spec({"model": "/m", "cpus": "0", "gpus": "0"}, "b", {}, "h", 5, "py")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in gpu.env


def test_accept_length_from_deltas() -> None:
    before = {"num_drafts": 100.0, "num_accepted_tokens": 150.0, "num_draft_tokens": 300.0}
    after = {"num_drafts": 200.0, "num_accepted_tokens": 350.0, "num_draft_tokens": 600.0}
    assert accept_length_from_counters(before, after)["accept_length"] == pytest.approx(3.0)
    assert accept_length_from_counters(after, after)["accept_length"] is None


def test_parse_prometheus_edge_cases() -> None:
    text = 'a_total 1\na_total{x="1"} 2 1700000000\n# comment\nbad line here\nb NaN\nc{l="a b"} +Inf\n'
    got = samples(text)
    assert got["a_total"] == 3.0 and "b" not in got and got["c"] == math.inf


def test_vllm_server_info_version_and_spec_config() -> None:
    engine = vllm_mod.VLLMEngine()
    models = {"object": "list", "data": [{"id": "/tmp/tiny", "max_model_len": 2048}]}

    async def body(url: str, s: aiohttp.ClientSession) -> Any:
        host, port = url.rsplit(":", 1)
        arm = {
            "speculative": True,
            "server_args": ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'],
        }
        engine.server_spec({"model": "/tmp/tiny"}, "ngram", arm, "127.0.0.1", int(port), "py")
        return await engine.server_info(s, url)

    routes = [web.get("/version", _json({"version": "0.32.0"})), web.get("/v1/models", _json(models))]
    info = run(routes, body)
    assert info["version"] == "0.32.0"
    assert info["max_model_len"] == 2048 and info["served_model"] == "/tmp/tiny"
    assert info["speculative_method"] == "ngram" and info["num_speculative_tokens"] == 3
