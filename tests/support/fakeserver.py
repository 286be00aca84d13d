"""A tiny in-process fake engine for tests: each prompt `mode:<name> ...` picks a behaviour (ok, faults).

Why in-process on 127.0.0.1 with an ephemeral port: the tests need exact, reproducible faults (malformed line,
truncated stream, HTTP 500, stall, reset) that a real engine will not produce on demand.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from time import monotonic
from typing import Any

from aiohttp import web

SEEN = web.AppKey("seen", list)


def _text(body: dict[str, Any]) -> str:
    return body.get("text") or body.get("prompt") or body["messages"][0]["content"]


def _mode(body: dict[str, Any]) -> str:
    text = _text(body)
    first = text.split()[0] if text.split() else ""
    return first[5:] if first.startswith("mode:") else "ok"


def _remember(request: web.Request, body: dict[str, Any]) -> None:
    """Every prompt the server was sent, in order (tests check that no measured prompt repeats)."""
    request.app[SEEN].append(_text(body))


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def _send(resp: web.StreamResponse, obj: Any) -> None:
    if isinstance(obj, dict):
        obj = dict(obj, sim_sent_at=monotonic())
    payload = obj if isinstance(obj, str) else json.dumps(obj)
    await resp.write(f"data: {payload}\n\n".encode())


async def generate(request: web.Request) -> web.StreamResponse:
    """SGLang-native /generate with modes ok (chunks of 1,2,1 tokens), malformed, truncated, ..."""
    body = await request.json()
    _remember(request, body)
    mode = _mode(body)
    n = body["sampling_params"]["max_new_tokens"]
    if mode == "http500":
        return web.Response(status=500, text="boom: internal error")
    resp = await _sse(request)
    if mode == "malformed":
        await _send(resp, {"text": "a", "meta_info": {"completion_tokens": 1}})
        await resp.write(b"data: {not json\n\n")
        return resp
    if mode == "zero":
        await _send(
            resp,
            {
                "text": "",
                "meta_info": {"prompt_tokens": 3, "completion_tokens": 0, "finish_reason": {"type": "abort"}},
            },
        )
        await _send(resp, "[DONE]")
        return resp
    if mode == "stall":
        await _send(resp, {"text": "a", "meta_info": {"completion_tokens": 1}})
        await asyncio.sleep(30)
        return resp
    if mode == "reset":
        await _send(resp, {"text": "a", "meta_info": {"completion_tokens": 1}})
        assert request.transport is not None
        request.transport.abort()
        return resp
    steps = [1, 2, 1] + [1] * max(0, n - 4)
    if mode == "short":
        steps = [1, 1]
    ct = 0
    for i, k in enumerate(steps):
        ct += k
        meta: dict[str, Any] = {
            "prompt_tokens": 7,
            "completion_tokens": ct,
            "spec_verify_ct": i + 1,
            "finish_reason": None,
        }
        if mode == "truncated" and i == 1:
            return resp
        if i == len(steps) - 1:
            meta["finish_reason"] = {"type": "length", "length": ct}
            meta["e2e_latency"] = 0.01
        await _send(resp, {"text": "x" * ct, "meta_info": meta})
        await asyncio.sleep(0.002)
    await _send(resp, "[DONE]")
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    """OpenAI /v1/completions and /v1/chat/completions; mode `nousage` omits per-chunk usage."""
    body = await request.json()
    _remember(request, body)
    mode = _mode(body)
    chat = request.path.endswith("chat/completions")
    n = body["max_tokens"]
    resp = await _sse(request)
    steps = [1, 2] + [1] * max(0, n - 3)
    ct = 0
    if chat:
        await _send(
            resp,
            {
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 0},
            },
        )
    for i, k in enumerate(steps):
        ct += k
        fin = "length" if i == len(steps) - 1 else None
        choice: dict[str, Any] = {"index": 0, "finish_reason": fin}
        if chat:
            choice["delta"] = {"content": "w " * k}
        else:
            choice["text"] = "w " * k
        obj: dict[str, Any] = {"choices": [choice]}
        if mode != "nousage":
            obj["usage"] = {"prompt_tokens": 5, "completion_tokens": ct, "total_tokens": 5 + ct}
        await _send(resp, obj)
        await asyncio.sleep(0.002)
    await _send(resp, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": ct}})
    await _send(resp, "[DONE]")
    return resp


async def tokenize(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"count": len(body["prompt"].split())})


class FlushState:
    """/flush_cache answers 400 `busy` times before 200 (SGLang while requests run)."""

    def __init__(self, busy: int = 0) -> None:
        self.busy = busy
        self.calls = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.calls <= self.busy:
            return web.Response(status=400, text="requests running")
        return web.Response(status=200, text="ok")


@asynccontextmanager
async def fake_server(
    flush: FlushState | None = None, with_tokenize: bool = True, seen: list[str] | None = None
) -> AsyncIterator[str]:
    """Run the fake engine on 127.0.0.1:<ephemeral>; always stopped on exit, even when the test fails.

    `seen` collects the prompts sent, in arrival order."""
    app = web.Application()
    app[SEEN] = seen if seen is not None else []
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    if with_tokenize:
        app.router.add_post("/tokenize", tokenize)
    if flush is not None:
        app.router.add_post("/flush_cache", flush.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
