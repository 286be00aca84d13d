"""Streaming request backends: send one request, time every token-carrying chunk, classify failures.

Two layers: a per-API line parser (`SGLangParser`, `OpenAIParser`) that turns SSE `data:` lines into a
`RequestRecord`, and a transport that delivers lines with their arrival time. The default transport is
`specsweep.client.fasthttp` (raw asyncio, parses inside `data_received`: no task switch per chunk); aiohttp is
the alternative (`transport="aiohttp"`): ~1.5x the CPU per chunk, and it stamps a chunk only when the reading
task runs (see docs/metrics.md, "Client keep-up").

Times are absolute `time.monotonic()` seconds here; the load generator makes them relative to the level's t0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import aiohttp

from specsweep.client.fasthttp import FastPool, HTTPStatusError

BACKENDS = ("sglang", "openai")
ENDPOINTS = ("completions", "chat")
STOPS = ("fixed", "natural")  # workload.stop: every request its full length (ignore_eos), or the model's end of text
CONTENT_HEADER = "X-Specsweep-Content"  # a request's content class; real engines ignore it, the simulated one reads it
TRANSPORTS = ("fast", "aiohttp")
ABORTED = "aborted"  # a filler the closed loop stopped when the last measured request ended: not a failure
ERROR_KINDS = ("http", "timeout", "connection", "malformed", "truncated", "short_output")
_BODY_HEAD = 300  # characters of an error body kept in the message


@dataclass(slots=True)
class RequestRecord:
    """One request's raw measurements (absolute monotonic times). See docs/ARCHITECTURE.md for the columns."""

    request_index: int
    prompt_index: int
    expected_output_tokens: int
    input_tokens: int
    slot: int = -1  # the closed loop's client slot (worker) that sent it
    ramp: bool = False  # a slot's first, shortened request that staggers the slots (not a measured request)
    filler: bool = False  # sent after the measured requests ran out, to keep every slot busy until the last of
    # them ends; aborted then (error_kind ABORTED) if still running. Not a measured request
    scheduled_s: float = float("nan")  # open loop: the planned send time (NaN in a closed loop)
    held_s: float = 0.0  # open loop: seconds the in-flight cap held the request back past its planned time
    send_s: float = float("nan")
    first_token_s: float = float("nan")
    end_s: float = float("nan")
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    server_chunk_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    server_output_tokens: int = -1
    spec_verify_ct: int = -1
    cached_tokens: int = -1  # prompt tokens served from the engine's prefix cache (-1: not reported)
    output_sha256: str = ""  # of the generated text: speculative arms must generate what the baseline does
    output_prefix: str = ""  # its first OUTPUT_PREFIX_CHARS characters, to show where outputs differ
    # the whole text, in memory only (not a requests.parquet column): the level job refers a difference to the
    # reference arm's server while it is up (client/referral.py)
    output_text: str = ""
    content: str = ""  # the content class of its prompt (workload.classes; "" when the workload has one content)
    finish_reason: str = ""  # why the server ended it: "stop" (end of text), "length" (the cap), "" not reported
    ok: bool = False
    error_kind: str = ""
    error: str = ""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send: the backend, where, and the generation parameters shared by all requests of a level."""

    url: str  # server base URL, e.g. http://127.0.0.1:30000
    backend: str = "sglang"  # "sglang" (native /generate) or "openai"
    endpoint: str = "completions"  # openai only: "completions" or "chat"
    model: str | None = None  # openai "model" field (servers with one model accept any/none)
    temperature: float = 0.0
    request_timeout_s: float = 120.0
    api_key: str | None = None  # sent as Authorization: Bearer; never logged or stored
    transport: str = "fast"  # "fast" (specsweep.client.fasthttp) or "aiohttp"
    stop: str = "fixed"  # "fixed": exactly the asked tokens (ignore_eos); "natural": the asked tokens are a cap

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {self.endpoint!r}; expected one of {ENDPOINTS}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {self.transport!r}; expected one of {TRANSPORTS}")
        if self.stop not in STOPS:
            raise ValueError(f"unknown stop {self.stop!r}; expected one of {STOPS}")

    def __repr__(self) -> str:  # keep the key out of any log line that prints the spec
        key = "***" if self.api_key else None
        return (
            f"RequestSpec(url={self.url!r}, backend={self.backend!r}, endpoint={self.endpoint!r}, "
            f"model={self.model!r}, temperature={self.temperature}, "
            f"request_timeout_s={self.request_timeout_s}, transport={self.transport!r}, stop={self.stop!r}, "
            f"api_key={key})"
        )

    def headers(self, content: str = "") -> dict[str, str]:
        """The request's headers; `content` names its content class (`CONTENT_HEADER`) where the workload has
        several."""
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if content:
            h[CONTENT_HEADER] = content
        return h

    def path(self) -> str:
        if self.backend == "sglang":
            return "/generate"
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    @property
    def sends_messages(self) -> bool:
        """Chat messages go on the wire (the engine applies the chat template); else text does."""
        return self.backend == "openai" and self.endpoint == "chat"

    def payload(self, prompt: str | Sequence[Mapping[str, str]], max_tokens: int) -> dict[str, Any]:
        """The request body. `prompt` is text, or chat messages for a chat endpoint (text goes there as one
        user message); /generate and completions take text only (a chat template applied beforehand). A fixed
        stop asks for `max_tokens` exactly (ignore_eos); a natural one for at most that many."""
        if not isinstance(prompt, str) and not self.sends_messages:
            raise ValueError(f"{self.path()} takes text, not chat messages; apply a chat template first")
        if self.backend == "sglang":
            return {
                "text": prompt,
                "sampling_params": {
                    "max_new_tokens": max_tokens,
                    "temperature": self.temperature,
                    **({"ignore_eos": True} if self.stop == "fixed" else {}),
                },
                "stream": True,
            }
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            **({"ignore_eos": True} if self.stop == "fixed" else {}),
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.model:
            body["model"] = self.model
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        else:
            body["prompt"] = prompt
        return body


class _StreamError(Exception):
    """A classified failure inside the stream (kind is one of ERROR_KINDS)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


async def send_request(
    session: FastPool | aiohttp.ClientSession,
    spec: RequestSpec,
    prompt: str | Sequence[Mapping[str, str]],
    record: RequestRecord,
) -> RequestRecord:
    """Send one streaming request and fill `record`. Never raises for server/network faults; never hangs.

    `session` is a FastPool (the default transport) or an aiohttp session. The whole request (connect, head,
    every chunk) runs under one deadline of `spec.request_timeout_s`, so a stalled stream ends as a `timeout`
    error instead of blocking the worker.
    """
    url = spec.url.rstrip("/") + spec.path()
    body = json.dumps(spec.payload(prompt, record.expected_output_tokens)).encode()
    headers = spec.headers(record.content)
    parser: SGLangParser | OpenAIParser = (
        SGLangParser(record) if spec.backend == "sglang" else OpenAIParser(record, spec.endpoint == "chat")
    )
    try:
        async with asyncio.timeout(spec.request_timeout_s):
            record.send_s = monotonic()
            if isinstance(session, FastPool):
                tail = await session.post_stream(url, body, headers, parser.feed)
            else:
                tail = await _aiohttp_stream(session, url, body, headers, parser.feed)
        parser.finish(tail)
    except _StreamError as e:
        _fail(record, e.kind, str(e))
    except HTTPStatusError as e:
        _fail(record, "http", str(e))
    except TimeoutError:
        _fail(record, "timeout", f"no complete response within {spec.request_timeout_s:g} s")
    except (aiohttp.ClientError, ConnectionError, OSError) as e:
        _fail(record, "connection", f"{type(e).__name__}: {e}")
    except Exception as e:  # a response this client cannot make sense of must fail one request, not the level
        _fail(record, "malformed", f"unexpected {type(e).__name__}: {e}")
    else:
        record.end_s = monotonic()
        _check_output(record, spec.stop)
    return record


async def _aiohttp_stream(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], on_line: Any
) -> bytes:
    """The aiohttp transport: FastPool.post_stream's contract (lines stamped when the task reads them)."""
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            head = (await resp.content.read(_BODY_HEAD)).decode("utf-8", "replace")
            raise HTTPStatusError(resp.status, head)
        readany = resp.content.readany
        buf = b""
        while data := await readany():
            now = monotonic()
            if buf:
                data = buf + data
            lines = data.split(b"\n")
            buf = lines.pop()
            for line in lines:
                on_line(now, line)
        return buf


def _fail(record: RequestRecord, kind: str, message: str) -> None:
    record.end_s = monotonic()
    record.ok = False
    record.error_kind = kind
    record.error = message


def _check_output(record: RequestRecord, stop: str = "fixed") -> None:
    """A fixed stop (ignore_eos) means every request must produce exactly what was asked: fewer is a failed
    measurement. A natural stop ends where the model's text ends: any length up to the cap is an answer, more
    than the cap is not (the server ignored it)."""
    produced = record.output_tokens
    if record.server_output_tokens >= 0:
        produced = min(produced, record.server_output_tokens) if produced else record.server_output_tokens
    if stop == "natural":
        record.ok = produced <= record.expected_output_tokens
        if not record.ok:
            record.error_kind = "malformed"
            record.error = f"{produced} tokens, past the cap of {record.expected_output_tokens} (max_tokens ignored)"
        return
    if record.output_tokens == 0 or produced < record.expected_output_tokens:
        record.ok = False
        record.error_kind = "short_output"
        record.error = (
            f"{record.output_tokens} tokens streamed (server reports {record.server_output_tokens}), "
            f"{record.expected_output_tokens} asked"
        )
    else:
        record.ok = True


def _maybe_error(payload: bytes) -> str | None:
    """A JSON line carrying an `error` object is a server-reported failure, not a malformed stream."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if isinstance(obj, dict) and "error" in obj:
        return str(obj["error"])[:_BODY_HEAD]
    return None


def _bad_line(payload: bytes, e: Exception) -> _StreamError:
    err = _maybe_error(payload)
    if err is not None:
        return _StreamError("http", f"error in stream: {err}")
    return _StreamError("malformed", f"bad stream line {payload[:120]!r}: {type(e).__name__}: {e}")


def record_chunk(rec: RequestRecord, now: float, n_tokens: int, obj: dict[str, Any]) -> None:
    """One chunk carrying tokens: its arrival, its token count, and the sim's own send time when present."""
    if not rec.chunk_s:
        rec.first_token_s = now
    rec.chunk_s.append(now)
    rec.chunk_tokens.append(n_tokens)
    sent = obj.get("sim_sent_at")
    if sent is not None:
        rec.server_chunk_s.append(sent)


OUTPUT_PREFIX_CHARS = 2048  # a 512-token answer's text: a sequential cell refers its differences against it


def record_output(rec: RequestRecord, text: str) -> None:
    """The generated text's hash and head (files keep these: hashes compare arms cheaply), and the text itself
    for the level job's referral of a difference (never written)."""
    rec.output_text = text
    rec.output_sha256 = hashlib.sha256(text.encode()).hexdigest()
    rec.output_prefix = text[:OUTPUT_PREFIX_CHARS]


class _SSEParser:
    """SSE framing shared by both APIs: `data:` lines, `data: [DONE]`, and the checks at the stream's end.

    Subclasses parse one data payload in `_data` and fill the record's totals in `_totals`; `pieces` collects
    the generated text.
    """

    __slots__ = ("rec", "prev", "finished", "done", "pieces")

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self.prev = 0  # tokens counted so far
        self.finished = False  # a finish_reason was seen
        self.done = False  # data: [DONE] was seen
        self.pieces: list[str] = []

    def feed(self, now: float, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # blank separators, SSE comments, event: lines
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        self._data(now, payload)

    def finish(self, tail: bytes) -> None:
        if tail.strip():  # a last line without "\n" still counts if complete
            try:
                self.feed(monotonic(), tail)
            except _StreamError:
                raise _StreamError("truncated", f"stream ended inside a line: {tail[:120]!r}") from None
        if not (self.done or self.finished):
            raise _StreamError("truncated", f"stream ended after {self.prev} tokens without finish_reason or [DONE]")
        self._totals()

    def _data(self, now: float, payload: bytes) -> None:
        raise TypeError(f"{type(self).__name__} must parse data lines")

    def _totals(self) -> None:
        raise TypeError(f"{type(self).__name__} must fill the totals")


class SGLangParser(_SSEParser):
    """SGLang /generate: `data: {...}` lines, cumulative meta_info.completion_tokens, then `data: [DONE]`.

    Tokens in a chunk = the increase of completion_tokens; chunks that add none (e.g. a final meta line) are
    not token chunks. `sim_sent_at` (simulated engine, --debug-timestamps) goes to server_chunk_s.
    """

    __slots__ = ("meta",)

    def __init__(self, rec: RequestRecord) -> None:
        super().__init__(rec)
        self.meta: dict[str, Any] = {}

    def _data(self, now: float, payload: bytes) -> None:
        try:
            obj = _loads(payload)
            meta = obj["meta_info"]
            ct = meta["completion_tokens"]
            n = ct - self.prev
        except (ValueError, KeyError, TypeError) as e:
            raise _bad_line(payload, e) from None
        self.meta = meta
        text = obj.get("text")
        if isinstance(text, str) and text:
            # cumulative text (SGLang's default) replaces; incremental streaming output appends
            last = self.pieces[-1] if self.pieces else ""
            if text.startswith(last):
                self.pieces[-1:] = [text]
            else:
                self.pieces.append(text)
        if n > 0:
            record_chunk(self.rec, now, n, obj)
            self.prev = ct
        if meta.get("finish_reason") is not None:
            self.finished = True
            reason = meta["finish_reason"]
            self.rec.finish_reason = str(reason.get("type", "") if isinstance(reason, dict) else reason)

    def _totals(self) -> None:
        rec, meta = self.rec, self.meta
        record_output(rec, "".join(self.pieces))
        rec.output_tokens = self.prev
        rec.server_output_tokens = int(meta.get("completion_tokens", self.prev))
        if "prompt_tokens" in meta:
            rec.input_tokens = int(meta["prompt_tokens"])
        svc = meta.get("spec_verify_ct")
        if svc is not None:
            rec.spec_verify_ct = int(svc)
        cached = meta.get("cached_tokens")
        if cached is not None:
            rec.cached_tokens = int(cached)


class OpenAIParser(_SSEParser):
    """OpenAI streaming: tokens per chunk from cumulative usage.completion_tokens (continuous usage stats).

    Fallback when the server sends no per-chunk usage: each chunk with non-empty text counts one token; if the
    final usage chunk then reports more tokens than were counted, the excess is spread evenly over the chunks
    (earliest first) so that output_tokens and throughput match the server; per-chunk counts are estimates.
    """

    __slots__ = ("chat", "usage_seen", "final_usage")

    def __init__(self, rec: RequestRecord, chat: bool) -> None:
        super().__init__(rec)
        self.chat = chat
        self.usage_seen = False
        self.final_usage: dict[str, Any] | None = None

    def _data(self, now: float, payload: bytes) -> None:
        try:
            obj = _loads(payload)
            choices = obj["choices"]
            usage = obj.get("usage")
            if choices:
                choice = choices[0]
                text = choice["delta"].get("content") if self.chat else choice.get("text")
                fin = choice.get("finish_reason")
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            raise _bad_line(payload, e) from None
        if not choices:
            if usage:
                self.final_usage = usage
            return
        if text:
            self.pieces.append(text)
        if usage:
            self.usage_seen = True
            self.final_usage = usage
            ct = usage.get("completion_tokens", self.prev)
            n = ct - self.prev
            if ct > self.prev:
                self.prev = ct
        else:
            n = 1 if text else 0
            self.prev += n
        if n > 0:
            record_chunk(self.rec, now, n, obj)
        if fin is not None:
            self.finished = True
            self.rec.finish_reason = str(fin)

    def _totals(self) -> None:
        rec = self.rec
        record_output(rec, "".join(self.pieces))
        usage = self.final_usage
        if usage is not None:
            server_ct = int(usage.get("completion_tokens", -1))
            rec.server_output_tokens = server_ct
            if "prompt_tokens" in usage:
                rec.input_tokens = int(usage["prompt_tokens"])
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                rec.cached_tokens = int(details["cached_tokens"])
            if not self.usage_seen and rec.chunk_tokens and server_ct > self.prev:
                _spread(rec.chunk_tokens, server_ct - self.prev)
                self.prev = server_ct
        rec.output_tokens = self.prev


_raw_decode = json.JSONDecoder().raw_decode


def _loads(payload: bytes) -> Any:
    """json.loads minus its per-call layers (encoding detection, whitespace regexes): the hot path."""
    text = payload.decode()
    obj, end = _raw_decode(text)
    if end != len(text):
        raise ValueError(f"extra data after JSON at {end}")
    return obj


def _spread(chunk_tokens: list[int], extra: int) -> None:
    """Distribute `extra` tokens evenly over the chunks (the documented no-usage fallback)."""
    q, r = divmod(extra, len(chunk_tokens))
    for i in range(len(chunk_tokens)):
        chunk_tokens[i] += q + (1 if i < r else 0)
