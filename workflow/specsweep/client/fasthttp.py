"""A lean HTTP/1.1 streaming client on raw asyncio protocols, for the measuring path only.

Why not aiohttp here: aiohttp hands each network read to a StreamReader and wakes the reading task (often
twice per chunk under chunked transfer encoding): ~55-60 us of CPU per chunk against ~35 us for this client
(benchmarks/client_capacity.py), and a chunk is stamped only when that task runs, after every socket read of
the same loop iteration, so under an engine step that emits C chunks at once late stamps pile up. Here the
response is de-chunked, split into SSE lines and handed to the line parser inside `data_received`, the moment
the event loop reads the socket: one callback per network read, no task switch. On Linux over http, each read
is stamped with the kernel's receive time of its packet (`_RawTransport`), so even a busy loop stamps chunks
within tens of microseconds of their arrival; elsewhere with the `SelectClock`. Auxiliary calls (flush,
tokenize) keep using aiohttp.

Scope (deliberately small): POST with a body, HTTP/1.1 keep-alive, chunked / Content-Length / until-close
bodies, http and https. One connection per in-flight request; idle connections are reused; a reused connection
that the server closed while idle is retried once on a fresh one.
"""

from __future__ import annotations

import asyncio
import math
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from time import monotonic
from urllib.parse import urlsplit

LineFn = Callable[[float, bytes], None]  # (arrival monotonic time, one body line without its "\n")
_MAX_HEAD = 65536
_ERR_HEAD = 300

_HEAD, _BODY_LEN, _BODY_CHUNKED, _BODY_CLOSE, _DONE = range(5)


class StampStats:
    """How chunks were stamped: reads in all, reads stamped by the kernel, and each such read's delay.

    A read's delay (the loop's read time minus the kernel's receive time of its last packet) is how long
    data waited in the socket for a busy or descheduled client. With kernel stamps it does not move a
    chunk's time, so the validity gates read `kernel_share` to decide whether loop lag can damage stamps."""

    __slots__ = ("reads", "kernel", "delays")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start counting afresh (connections keep a reference to this object)."""
        self.reads = 0
        self.kernel = 0
        self.delays: list[float] = []

    def summary(self) -> dict[str, float | int | None]:
        d = sorted(self.delays)
        pick = (lambda q: d[min(len(d) - 1, int(q * len(d)))] * 1e3) if d else (lambda q: None)
        return {
            "reads": self.reads,
            "kernel_share": (self.kernel / self.reads) if self.reads else None,
            "read_delay_p50_ms": pick(0.5),
            "read_delay_p99_ms": pick(0.99),
            "read_delay_max_ms": (d[-1] * 1e3) if d else None,
        }


class HTTPStatusError(Exception):
    """The server answered with a status other than 200 (body head kept for the message)."""

    def __init__(self, status: int, body_head: str) -> None:
        super().__init__(f"HTTP {status}: {body_head}")
        self.status = status
        self.body_head = body_head


class _Stale(ConnectionError):
    """A reused idle connection was closed by the server before any response byte: safe to retry."""


class SelectClock:
    """The time the event loop's last `select()` returned: when it learnt that sockets had data.

    Why: in one loop iteration the protocol callbacks of all ready sockets run one after another, so stamping
    each chunk with `monotonic()` inside its callback makes the k-th chunk of an engine step's burst k
    callbacks late. Every byte handled in an iteration was already in the kernel when `select()` returned, so
    that instant is the better arrival time. Installed by wrapping the selector of the default asyncio loop;
    with another loop (no `_selector`), chunks are stamped in their callback instead.
    """

    def __init__(self) -> None:
        self.t = 0.0
        self._selector: object | None = None
        self._orig: Callable[..., object] | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> bool:
        selector = getattr(loop, "_selector", None)
        if selector is None or getattr(selector, "_specsweep_clock", None) is not None:
            return False
        orig = selector.select
        clock = self

        def select(timeout: float | None = None) -> object:
            events = orig(timeout)
            clock.t = monotonic()
            return events

        selector.select = select
        selector._specsweep_clock = self
        self._selector, self._orig = selector, orig
        self.t = monotonic()
        return True

    def uninstall(self) -> None:
        sel = self._selector
        if sel is not None and getattr(sel, "_specsweep_clock", None) is self:
            del sel.select  # the instance attribute shadowed the class method
            del sel._specsweep_clock
        self._selector = self._orig = None


# Linux SO_TIMESTAMPNS (asm-generic value; SCM_TIMESTAMPNS is the same number): the kernel stamps each received
# packet (CLOCK_REALTIME), and recvmsg() returns the stamp of the last packet it read.
_SO_TIMESTAMPNS = 35
_OFFSET_READ_MAX_S = 20e-6  # a realtime read bracketed by monotonic reads further apart was preempted: read again


def realtime_offset() -> float:
    """CLOCK_REALTIME - CLOCK_MONOTONIC from reads taken back to back: the realtime read between two monotonic
    reads, against their midpoint. Why: the offset was once `time.time() - now` with `now` read earlier in the
    callback, so a preemption between the two reads (a VM pause of a few ms) made a kernel stamp earlier than the
    server sent the chunk (-0.3 ms in a CI run of tests/unit/test_client_accuracy.py)."""
    best_span, offset = math.inf, 0.0
    for _ in range(3):
        m0 = monotonic()
        r = time.time()
        m1 = monotonic()
        if m1 - m0 < best_span:
            best_span, offset = m1 - m0, r - 0.5 * (m0 + m1)
        if best_span <= _OFFSET_READ_MAX_S:
            break
    return offset


_KERNEL_TS = sys.platform.startswith("linux")
_TS = struct.Struct("qq")


class _RawTransport:
    """A plain non-blocking TCP socket read with recvmsg() for the kernel's receive timestamps.

    Why: the kernel knows when each chunk arrived; Python only learns it when the event loop gets to the
    socket. With kernel stamps a busy client loop (a burst of C chunks from one engine step) delays the parsing
    but not the timestamps. Used for http:// on Linux; https and other systems use asyncio transports.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: _Conn) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._conn = conn
        self._out = b""
        self._kernel_ts = True
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        conn = self._conn
        try:
            data, anc, _, _ = self._sock.recvmsg(262144, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._close(e)
            return
        if not data:
            self._close(None)
            return
        now = monotonic()
        stamp = None
        stats = conn.stats
        if anc and anc[0][1] == _SO_TIMESTAMPNS and len(anc[0][2]) >= _TS.size:
            sec, nsec = _TS.unpack_from(anc[0][2])
            # realtime -> monotonic with the current offset; never later than now (clock steps, rounding)
            stamp = min(now, sec + nsec * 1e-9 - realtime_offset())
            if stats is not None:
                stats.kernel += 1
                stats.delays.append(now - stamp)
        elif conn.clock is not None:
            stamp = conn.clock.t
        if stats is not None:
            stats.reads += 1
        conn.data_received(data, stamp if stamp is not None else now)

    def write(self, data: bytes) -> None:
        if self._out:
            self._out += data
            return
        try:
            n = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            self._close(e)
            return
        if n < len(data):
            self._out = data[n:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            n = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._close(e)
            return
        self._out = self._out[n:]
        if not self._out:
            self._loop.remove_writer(self._fd)

    def abort(self) -> None:
        self._close(None)

    def _close(self, exc: Exception | None) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._sock.close()
        self._fd = -1
        self._conn.connection_lost(exc)


async def _raw_connect(loop: asyncio.AbstractEventLoop, host: str, port: int, conn: _Conn) -> _Conn:
    """Connect a plain socket with kernel receive timestamps enabled, wrapped in a _RawTransport."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    err: OSError | None = None
    for family, type_, proto, _, addr in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, addr)
        except OSError as e:
            sock.close()
            err = e
            continue
        conn.transport = _RawTransport(loop, sock, conn)  # type: ignore[assignment]
        return conn
    raise err or OSError(f"cannot connect to {host}:{port}")


class _Conn(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time entirely inside the protocol callbacks."""

    def __init__(self, clock: SelectClock | None = None, stats: StampStats | None = None) -> None:
        self.clock = clock
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._fut: asyncio.Future[bytes] | None = None
        self._on_line: LineFn | None = None
        self._floor = 0.0  # earliest valid stamp: the request's send time, then the previous read's stamp
        self._reset()

    def _reset(self) -> None:
        self._state = _HEAD
        self._hbuf = b""
        self._cbuf = b""
        self._lbuf = b""
        self._left = 0  # Content-Length left, or chunk bytes left (-2: expecting the CRLF after chunk data)
        self._trailer = False
        self._status = 0
        self._errbuf = b""
        self._got_bytes = False
        self._keep_alive = True

    # ---- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        fut = self._fut
        if fut is None or fut.done():
            return
        if self._state == _BODY_CLOSE and exc is None:
            self._finish()
        elif not self._got_bytes:
            fut.set_exception(_Stale(f"connection closed before a response ({exc or 'EOF'})"))
        else:
            fut.set_exception(ConnectionResetError(f"connection closed mid-response ({exc or 'EOF'})"))

    def data_received(self, data: bytes, now: float | None = None) -> None:
        if now is None:  # an asyncio transport (https, no kernel stamps)
            now = self.clock.t if self.clock is not None else monotonic()
            if self.stats is not None:
                self.stats.reads += 1
        if now < self._floor:  # a wall-clock step under kernel stamps: never before the send or a prior read
            now = self._floor
        self._floor = now
        fut = self._fut
        if fut is None or fut.done():
            self.reusable = False  # bytes outside a request: do not trust this connection again
            return
        self._got_bytes = True
        try:
            if self._state == _HEAD:
                data = self._head(data)
                if self._state == _HEAD:
                    return
            if self._state == _BODY_CHUNKED:
                self._chunked(data, now)
            elif self._state == _BODY_LEN:
                take = data[: self._left]
                self._left -= len(take)
                self._body(take, now)
                if self._left == 0:
                    self._finish()
            elif self._state == _BODY_CLOSE:
                self._body(data, now)
        except (ValueError, IndexError) as e:  # bad framing (status line, chunk size, header value)
            self._abort(ConnectionError(f"invalid HTTP response: {e}"))
        except BaseException as e:  # a line parser's verdict (malformed line, error event) ends the request
            self._abort(e)

    # ---- parsing ------------------------------------------------------------------------------------------
    def _head(self, data: bytes) -> bytes:
        buf = self._hbuf + data if self._hbuf else data
        i = buf.find(b"\r\n\r\n")
        if i < 0:
            if len(buf) > _MAX_HEAD:
                raise ConnectionError("response head too large")
            self._hbuf = buf
            return b""
        head, rest = buf[:i].decode("latin-1"), buf[i + 4 :]
        self._hbuf = b""
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ConnectionError(f"bad status line {lines[0][:80]!r}")
        self._status = int(parts[1])
        if self._status == 100:  # interim response: the real head follows
            return self._head(rest)
        self._keep_alive = parts[0] == "HTTP/1.1"
        length = None
        chunked = False
        for h in lines[1:]:
            name, _, value = h.partition(":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "content-length":
                length = int(value)
            elif name == "connection":
                self._keep_alive = "close" not in value
        if chunked:
            self._state = _BODY_CHUNKED
        elif length is not None:
            self._state = _BODY_LEN
            self._left = length
            if length == 0:
                self._finish()
        else:
            self._state = _BODY_CLOSE
            self._keep_alive = False
        return rest

    def _chunked(self, data: bytes, now: float) -> None:
        buf = self._cbuf + data if self._cbuf else data
        pos, n = 0, len(buf)
        while pos < n and self._state == _BODY_CHUNKED:
            left = self._left
            if left > 0:
                end = pos + left if pos + left < n else n
                self._body(buf[pos:end], now)
                self._left -= end - pos
                pos = end
                if self._left == 0:
                    self._left = -2
            elif left == -2:
                if n - pos < 2:
                    break
                pos += 2
                self._left = 0
            else:
                j = buf.find(b"\r\n", pos)
                if j < 0:
                    break
                line = buf[pos:j]
                pos = j + 2
                if self._trailer:
                    if not line:
                        self._finish()
                    continue
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    self._trailer = True
                else:
                    self._left = size
        self._cbuf = buf[pos:] if self._state == _BODY_CHUNKED else b""

    def _body(self, data: bytes, now: float) -> None:
        if self._status != 200:
            self._errbuf += data
            if len(self._errbuf) >= _ERR_HEAD:
                self._finish()
            return
        if self._lbuf:
            data = self._lbuf + data
        lines = data.split(b"\n")
        self._lbuf = lines.pop()
        on_line = self._on_line
        assert on_line is not None
        for line in lines:
            on_line(now, line)

    def _finish(self) -> None:
        fut = self._fut
        self._state = _DONE
        if fut is None or fut.done():
            return
        if self._status != 200:
            self.reusable = False
            head = self._errbuf[:_ERR_HEAD].decode("utf-8", "replace")
            fut.set_exception(HTTPStatusError(self._status, head))
            return
        self.reusable = self._keep_alive and not self.closed
        fut.set_result(self._lbuf)

    def _abort(self, exc: BaseException) -> None:
        self.reusable = False
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        self.close()

    # ---- API ----------------------------------------------------------------------------------------------
    def request(self, raw: bytes, on_line: LineFn) -> asyncio.Future[bytes]:
        """Send one request; the future resolves with the unterminated last body line (b"" normally)."""
        assert self.transport is not None
        self._reset()
        self.reusable = False
        self._on_line = on_line
        self._fut = asyncio.get_running_loop().create_future()
        self._floor = monotonic()
        self.transport.write(raw)
        return self._fut

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.abort()


class FastPool:
    """Connections by (scheme, host, port); `post_stream` borrows one per request and returns it if clean."""

    def __init__(
        self, ssl_context: ssl.SSLContext | None = None, select_clock: bool = True, kernel_ts: bool = True
    ) -> None:
        self._kernel_ts = kernel_ts and _KERNEL_TS
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._all: set[_Conn] = set()
        self._ssl = ssl_context
        self._want_clock = select_clock
        self._clock: SelectClock | None = None
        self.stats = StampStats()

    async def _connect(self, scheme: str, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        ctx = None
        if scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
        if ctx is None and self._kernel_ts:
            # the kernel stamps every read: the loop's selector stays as asyncio made it (a read without a stamp,
            # which has not been seen on Linux, takes its own read time)
            conn = await _raw_connect(loop, host, port, _Conn(None, self.stats))
        else:
            clock = self._select_clock(loop)
            _, conn = await loop.create_connection(lambda: _Conn(clock, self.stats), host, port, ssl=ctx)
        self._all.add(conn)
        return conn

    def _select_clock(self, loop: asyncio.AbstractEventLoop) -> SelectClock | None:
        """The select clock for connections without kernel stamps (https; kernel stamps off or unavailable),
        installed on the loop at the first such connection."""
        if self._want_clock and self._clock is None:
            clock = SelectClock()
            if clock.install(loop):
                self._clock = clock
            else:
                self._want_clock = False
        return self._clock

    async def prewarm(self, url: str, n: int) -> int:
        """Open up to `n` idle connections to `url`'s server; returns how many were opened.

        Why: otherwise the first C sends also pay C connects, and that CPU burst delays the stamps of the
        first chunks (TTFT) arriving meanwhile.
        """
        u = urlsplit(url)
        scheme = u.scheme or "http"
        host = u.hostname or "127.0.0.1"
        port = u.port or (443 if scheme == "https" else 80)
        idle = self._idle.setdefault((scheme, host, port), [])
        need = n - sum(1 for c in idle if c.reusable and not c.closed)
        if need <= 0:
            return 0
        made = await asyncio.gather(*(self._connect(scheme, host, port) for _ in range(need)), return_exceptions=True)
        opened = 0
        for c in made:
            if isinstance(c, _Conn):
                c.reusable = True
                idle.append(c)
                opened += 1
        return opened

    async def post_stream(self, url: str, body: bytes, headers: dict[str, str], on_line: LineFn) -> bytes:
        """POST `body` to `url`; every complete body line goes to `on_line(arrival_time, line)` as it arrives.

        Returns the unterminated tail of the body (b"" for a well-formed SSE stream). Raises HTTPStatusError,
        ConnectionError/OSError; on cancellation (a caller's timeout) the connection is closed, never reused.
        """
        u = urlsplit(url)
        scheme = u.scheme or "http"
        host = u.hostname or "127.0.0.1"
        port = u.port or (443 if scheme == "https" else 80)
        key = (scheme, host, port)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        hdr = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        raw = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Length: {len(body)}\r\n{hdr}\r\n").encode(
            "latin-1"
        ) + body
        idle = self._idle.setdefault(key, [])
        for attempt in (0, 1):
            reused = False
            conn = None
            while idle:
                c = idle.pop()
                if not c.closed and c.reusable:
                    conn, reused = c, True
                    break
                self._all.discard(c)
            if conn is None:
                conn = await self._connect(scheme, host, port)
            done = False
            try:
                tail = await conn.request(raw, on_line)
                done = True
            except _Stale:
                conn.close()
                self._all.discard(conn)
                if reused and attempt == 0:
                    continue
                raise
            finally:
                if not done:
                    conn.close()
                    self._all.discard(conn)
            if conn.reusable:
                idle.append(conn)
            else:
                conn.close()
                self._all.discard(conn)
            return tail
        raise ConnectionError("unreachable")  # pragma: no cover - the loop always returns or raises

    def close(self) -> None:
        """Close every connection (idle or in use)."""
        for c in list(self._all):
            c.close()
        self._all.clear()
        self._idle.clear()
        if self._clock is not None:
            self._clock.uninstall()
            self._clock = None
