"""Streaming parsing and failure classification against the in-process fake engine."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.fasthttp import FastPool
from tests.support.fakeserver import fake_server

pytestmark = pytest.mark.unit


TRANSPORT = {"name": "fast"}


@pytest.fixture(autouse=True, params=["fast", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every test runs on both transports: the lean one (default) and aiohttp."""
    TRANSPORT["name"] = request.param
    return request.param


async def _send(url: str, spec: RequestSpec, prompt: str, rec: RequestRecord) -> RequestRecord:
    if TRANSPORT["name"] == "fast":
        pool = FastPool()
        try:
            return await send_request(pool, spec, prompt, rec)
        finally:
            pool.close()
    async with aiohttp.ClientSession() as s:
        return await send_request(s, spec, prompt, rec)


def _one(prompt: str, n: int = 6, timeout: float = 5.0, **spec_kw: object) -> RequestRecord:
    async def go() -> RequestRecord:
        async with fake_server() as url:
            spec = RequestSpec(url=url, request_timeout_s=timeout, **spec_kw)  # type: ignore[arg-type]
            return await _send(url, spec, prompt, RequestRecord(0, 0, n, 3))

    return asyncio.run(go())


def test_sglang_multi_token_chunks() -> None:
    r = _one("hello there", n=6)
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 2, 1, 1, 1]
    assert r.output_tokens == 6 == r.server_output_tokens
    assert r.spec_verify_ct == 5
    assert r.input_tokens == 7  # server-reported prompt tokens win over the requested count
    assert len(r.chunk_s) == 5 == len(r.server_chunk_s)
    assert r.send_s <= r.first_token_s == r.chunk_s[0] <= r.chunk_s[-1] <= r.end_s
    # debug timestamps are on the same monotonic clock and precede arrival
    assert all(s <= c for s, c in zip(r.server_chunk_s, r.chunk_s, strict=True))


def test_openai_completions_cumulative_usage() -> None:
    r = _one("hi", n=5, backend="openai")
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 2, 1, 1]
    assert r.output_tokens == 5 == r.server_output_tokens
    assert r.input_tokens == 5


def test_openai_chat_skips_role_chunk() -> None:
    r = _one("hi", n=4, backend="openai", endpoint="chat")
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 2, 1]  # the role-only first chunk carries no token


def test_openai_without_usage_spreads_final_count() -> None:
    r = _one("mode:nousage hi", n=5, backend="openai")
    assert r.ok, r.error
    # 4 text chunks counted one each, final usage says 5: the extra token goes to the earliest chunk
    assert r.chunk_tokens == [2, 1, 1, 1]
    assert r.output_tokens == 5


@pytest.mark.parametrize(
    ("prompt", "kind"),
    [
        ("mode:malformed x", "malformed"),
        ("mode:truncated x", "truncated"),
        ("mode:http500 x", "http"),
        ("mode:zero x", "short_output"),
        ("mode:short x", "short_output"),
        ("mode:reset x", "connection"),
    ],
)
def test_failures_are_classified(prompt: str, kind: str) -> None:
    r = _one(prompt, n=6)
    assert not r.ok
    assert r.error_kind == kind, r.error
    assert r.end_s >= r.send_s


def test_http_error_message_has_status_and_body() -> None:
    r = _one("mode:http500 x")
    assert "500" in r.error and "boom" in r.error


def test_zero_output_has_no_first_token() -> None:
    r = _one("mode:zero x")
    assert r.output_tokens == 0 and r.chunk_s == []
    assert r.first_token_s != r.first_token_s  # NaN


def test_stalled_stream_times_out_without_hanging() -> None:
    t = time.monotonic()
    r = _one("mode:stall x", timeout=0.5)
    assert r.error_kind == "timeout"
    assert r.chunk_tokens == [1]  # what arrived before the stall is kept
    assert time.monotonic() - t < 5


def test_connection_refused() -> None:
    async def go() -> RequestRecord:
        spec = RequestSpec(url="http://127.0.0.1:9", request_timeout_s=3)
        return await _send(spec.url, spec, "x", RequestRecord(0, 0, 4, 1))

    r = asyncio.run(go())
    assert r.error_kind == "connection"


def test_api_key_header_and_repr() -> None:
    spec = RequestSpec(url="http://x", api_key="sekrit-value")
    assert spec.headers()["Authorization"] == "Bearer sekrit-value"
    assert "sekrit" not in repr(spec)


def test_payloads() -> None:
    sg = RequestSpec(url="http://x").payload("p", 9)
    assert sg == {
        "text": "p",
        "sampling_params": {"max_new_tokens": 9, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    oa = RequestSpec(url="http://x", backend="openai", model="m").payload("p", 9)
    assert oa["max_tokens"] == 9 and oa["ignore_eos"] and oa["prompt"] == "p" and oa["model"] == "m"
    assert oa["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    ch = RequestSpec(url="http://x", backend="openai", endpoint="chat").payload("p", 9)
    assert ch["messages"] == [{"role": "user", "content": "p"}] and "model" not in ch
    with pytest.raises(ValueError):
        RequestSpec(url="http://x", backend="nope")


def test_keep_alive_connection_is_reused_and_survives_errors() -> None:
    """Sequential requests on one pool: a failed request never poisons the next one."""

    async def go() -> list[RequestRecord]:
        out = []
        async with fake_server() as url:
            spec = RequestSpec(url=url, request_timeout_s=5)
            pool = FastPool()
            try:
                for i, p in enumerate(["a", "mode:http500 x", "b", "mode:malformed x", "c", "mode:truncated x", "d"]):
                    out.append(await send_request(pool, spec, p, RequestRecord(i, 0, 5, 1)))
            finally:
                pool.close()
        return out

    recs = asyncio.run(go())
    assert [r.error_kind for r in recs] == ["", "http", "", "malformed", "", "truncated", ""]
    assert all(r.output_tokens == 5 for r in recs[::2])
