"""The lean HTTP/1.1 transport against a raw socket server: framings, fragmentation, keep-alive edge cases."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.fasthttp import FastPool

pytestmark = pytest.mark.unit


def sse(n: int) -> bytes:
    """An SGLang-shaped stream of n one-token chunks."""
    out = b""
    for i in range(1, n + 1):
        fin = b'{"type":"length"}' if i == n else b"null"
        out += b'data: {"text":"","meta_info":{"completion_tokens":%d,"finish_reason":%s}}\n\n' % (i, fin)
    return out + b"data: [DONE]\n\n"


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-Trailer: t\r\n\r\n"


Responder = Callable[[int], tuple[bytes, bool]]  # request number -> (raw response, close after)


@asynccontextmanager
async def raw_server(respond: Responder, drip: bool = False, drop_second: bool = False) -> AsyncIterator[str]:
    """Answers each request with scripted bytes; `drip` writes them 7 bytes at a time to fragment reads;
    `drop_second` closes a connection, unanswered, on its second request (an idle keep-alive timed out)."""
    count = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        on_conn = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                on_conn += 1
                if drop_second and on_conn == 2:
                    break
                raw, close = respond(count)
                count += 1
                if drip:
                    for i in range(0, len(raw), 7):
                        writer.write(raw[i : i + 7])
                        await writer.drain()
                        await asyncio.sleep(0)
                else:
                    writer.write(raw)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the client went away: nothing more to serve
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def run(respond: Responder, n_requests: int = 1, drip: bool = False, drop_second: bool = False) -> list[RequestRecord]:
    async def go() -> list[RequestRecord]:
        out = []
        async with raw_server(respond, drip, drop_second) as url:
            pool = FastPool()
            try:
                for i in range(n_requests):
                    out.append(await send_request(pool, RequestSpec(url=url), "p", RequestRecord(i, 0, 5, 1)))
            finally:
                pool.close()
        return out

    return asyncio.run(go())


def test_chunked_fragmented_with_extensions_and_trailers() -> None:
    recs = run(lambda i: (CHUNKED_HEAD + chunked(sse(5), 13), False), n_requests=2, drip=True)
    assert [r.ok for r in recs] == [True, True], [r.error for r in recs]
    assert recs[0].chunk_tokens == [1] * 5


def test_content_length_body() -> None:
    body = sse(5)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    (r,) = run(lambda i: (head + body, False))
    assert r.ok and r.output_tokens == 5


def test_body_until_close() -> None:
    (r,) = run(lambda i: (b"HTTP/1.0 200 OK\r\n\r\n" + sse(5), True))
    assert r.ok and r.output_tokens == 5


def test_server_closing_after_response_is_not_reused() -> None:
    recs = run(lambda i: (CHUNKED_HEAD + chunked(sse(5), 4096), True), n_requests=3)
    assert all(r.ok for r in recs), [r.error for r in recs]


def test_stale_keep_alive_connection_is_retried_once() -> None:
    recs = run(lambda i: (CHUNKED_HEAD + chunked(sse(5), 4096), False), n_requests=3, drop_second=True)
    assert all(r.ok for r in recs), [r.error for r in recs]


def test_connection_close_header_is_honoured() -> None:
    head = b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
    recs = run(lambda i: (head + chunked(sse(5), 50), True), n_requests=2)
    assert all(r.ok for r in recs), [r.error for r in recs]


def test_error_status_with_chunked_body() -> None:
    head = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
    (r,) = run(lambda i: (head + chunked(b"server is starting", 5), False))
    assert r.error_kind == "http" and "503" in r.error and "server is starting" in r.error


def test_reset_mid_body_is_a_connection_error() -> None:
    (r,) = run(lambda i: (CHUNKED_HEAD + chunked(sse(5), 4096)[:60], True))
    assert r.error_kind == "connection"


def test_garbage_status_line() -> None:
    (r,) = run(lambda i: (b"SSH-2.0-OpenSSH\r\n\r\n", True))
    assert r.error_kind == "connection" and "bad status line" in r.error


def test_prewarm_opens_idle_connections() -> None:
    async def go() -> tuple[int, int, bool]:
        async with raw_server(lambda i: (CHUNKED_HEAD + chunked(sse(5), 4096), False)) as url:
            pool = FastPool()
            try:
                a = await pool.prewarm(url, 3)
                b = await pool.prewarm(url, 3)
                r = await send_request(pool, RequestSpec(url=url), "p", RequestRecord(0, 0, 5, 1))
            finally:
                pool.close()
        return a, b, r.ok

    assert asyncio.run(go()) == (3, 0, True)


def test_bad_chunk_size_fails_one_request_only() -> None:
    bad = CHUNKED_HEAD + b"zz\r\nhello\r\n"
    recs = run(lambda i: (bad, True) if i == 0 else (CHUNKED_HEAD + chunked(sse(5), 64), False), n_requests=2)
    assert recs[0].error_kind == "connection" and "invalid HTTP response" in recs[0].error
    assert recs[1].ok


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel receive timestamps are Linux-only")
def test_kernel_timestamps_survive_a_blocked_event_loop() -> None:
    """Chunks that arrive while the client's loop is blocked keep their arrival time, not the unblock time."""
    import threading

    from tests.support.fakeserver import fake_server

    ready: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        async def main() -> None:
            async with fake_server() as url:
                ready.append(url)
                while not stop.is_set():
                    await asyncio.sleep(0.01)

        asyncio.run(main())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        for _ in range(500):
            if ready:
                break
            time.sleep(0.01)

        async def go() -> RequestRecord:
            pool = FastPool()
            try:
                await pool.prewarm(ready[0], 1)
                req = asyncio.ensure_future(
                    send_request(pool, RequestSpec(url=ready[0]), "p", RequestRecord(0, 0, 8, 1))
                )
                await asyncio.sleep(0.001)
                time.sleep(0.08)  # the client's loop is stuck while the server streams every chunk
                return await req
            finally:
                pool.close()

        r = asyncio.run(go())
    finally:
        stop.set()
        t.join(5)
    assert r.ok, r.error
    delivery = [c - s for c, s in zip(r.chunk_s, r.server_chunk_s, strict=True)]
    assert max(delivery) < 0.02, delivery  # per-callback stamps would be up to ~80 ms late


@pytest.mark.parametrize("kernel_ts", [True, False])
def test_the_loops_selector_is_wrapped_only_without_kernel_stamps(kernel_ts: bool) -> None:
    """With kernel stamps on every read the pool leaves asyncio's private selector alone; without them it
    wraps `select()` to stamp chunks when the loop learnt of them, and unwraps it on close."""
    from specsweep.client import fasthttp

    if kernel_ts and not fasthttp._KERNEL_TS:
        pytest.skip("kernel receive timestamps are Linux-only")

    async def go() -> tuple[bool, bool, bool]:
        selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
        async with raw_server(lambda i: (CHUNKED_HEAD + chunked(sse(5), 64), False)) as url:
            pool = FastPool(kernel_ts=kernel_ts)
            try:
                r = await send_request(pool, RequestSpec(url=url), "p", RequestRecord(0, 0, 5, 1))
                wrapped = "select" in vars(selector)
            finally:
                pool.close()
        return r.ok, wrapped, "select" in vars(selector)

    ok, wrapped, after_close = asyncio.run(go())
    assert ok and wrapped is (not kernel_ts) and not after_close
