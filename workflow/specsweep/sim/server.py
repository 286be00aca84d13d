"""The simulated engine in real time, behind an aiohttp server that speaks SGLang's and the OpenAI API.

One engine loop runs steps on the monotonic clock: step k+1 starts at step k's absolute end time, so sleep
overshoot never accumulates into drift. Each step wakes every stream that got tokens once; a stream writes
whatever accumulated since its last write as one chunk (several tokens under speculation, as real engines do).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import signal
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from aiohttp import web

from specsweep.aio import cancel_and_wait
from specsweep.client.backends import CONTENT_HEADER
from specsweep.sim.engine import (
    ADMISSION_MAX_S,
    Engine,
    Schedule,
    SimRequest,
    StepResult,
)
from specsweep.sim.faults import FaultConfig, FaultState, HostDrift
from specsweep.sim.prefixcache import PrefixCache
from specsweep.sim.profile import ANSWER_SPREAD, Profile

SIM_VERSION = "0.1.0-sim"
LAG_RESET_S = 0.05  # behind schedule by more than this: restart the schedule instead of bursting to catch up


def prompt_hash(tokens: list[str]) -> int:
    return zlib.crc32(" ".join(tokens).encode())


TIE_NATS = 0.004  # a near-tie step: its top two words this far apart (a bf16 rounding step or two)
CLEAR_NATS = 2.5  # every other step: the top word clearly ahead
TIE_STATES_PER_MILLE = 50  # the share of steps that are near-ties (most 64-word outputs hold one)


def next_words(state: int, k: int = 2) -> list[tuple[str, float]]:
    """The sim's "model" at a decoding state: its top-k next words with log-probabilities, most likely first.

    The state is the CRC-32 of everything before the word (prompt and output words, space-joined), so a
    continuation of the prompt plus part of its output is answered as the output went on: a server can be
    asked what it would have generated after any prefix (client/referral.py asks at a difference)."""
    top = state % 99_991
    alt = (state // 99_991) % 99_991
    if alt == top:
        alt = (alt + 1) % 99_991
    gap = TIE_NATS if (state >> 20) % 1000 < TIE_STATES_PER_MILLE else CLEAR_NATS
    lp = -0.05
    out = [(f"w{top}", lp), (f"w{alt}", lp - gap)]
    out += [(f"w{(alt + 7 * i) % 99_991}", lp - gap - 3.0 * i) for i in range(1, max(0, k - 2) + 1)]
    return out[:k]


def output_words(tokens: list[str], n: int, corrupt: bool = False, flip_tie: bool = False) -> list[str]:
    """The output for a prompt: n greedy words determined by the prompt alone, the same in every arm and run
    (greedy decoding is deterministic, and speculative decoding must not change it); each word carries its
    leading space, as a BPE token does, and whitespace splitting gives one word per token.

    `corrupt` replaces the middle word, as a broken draft or verify path would; `flip_tie` takes the second word
    at the first near-tie step, as other batch numerics do (both are faults of a speculative sim server)."""
    state = prompt_hash(tokens)
    words: list[str] = []
    for i in range(n):
        (top, top_lp), (alt, alt_lp) = next_words(state)
        word = top
        if flip_tie and top_lp - alt_lp < CLEAR_NATS:
            word, flip_tie = alt, False
        if corrupt and i == n // 2:
            word = "CORRUPTED"  # and the words after it follow from it, as a model's would
        words.append(" " + word)
        state = zlib.crc32((" " + word).encode(), state)
    return words


def answer_length(tokens: list[str], mean: int | None, cap: int) -> int:
    """Where a prompt's answer ends at a natural stop: log-normal around its class's `mean` (`ANSWER_SPREAD`),
    drawn from the prompt alone, so every arm and run ends it at the same token, as greedy decoding does; the
    cap where the class has no natural end (`mean` None) or the answer would run past it."""
    if mean is None:
        return cap
    u = (zlib.crc32(b"answer-length", prompt_hash(tokens)) + 0.5) / 2**32
    z = NormalDist().inv_cdf(u)
    return max(1, min(cap, round(mean * math.exp(ANSWER_SPREAD * z - ANSWER_SPREAD**2 / 2))))


def prompt_words(text: Any) -> list[str]:
    """A prompt's tokens (words), from text, a list of texts or a list of token ids."""
    if isinstance(text, list):
        if text and isinstance(text[0], int):
            return [str(t) for t in text]
        return " ".join(map(str, text)).split()
    return str(text or "").split()


@dataclass(eq=False)
class Stream:
    """A request's link from the engine loop to its HTTP handler."""

    req: SimRequest
    sent_at: float
    pending: int = 0  # tokens emitted by the engine, not yet written
    verify_ct: int = 0  # verify passes behind the tokens delivered so far (the engine may be a step ahead)
    cached: int = 0  # prompt tokens served from the prefix cache
    done: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)


class SimServer:
    """Engine + real-time loop + HTTP handlers."""

    def __init__(
        self,
        profile: Profile,
        speculative: bool = False,
        seed: int = 0,
        max_running_requests: int | None = None,
        debug_timestamps: bool = False,
        faults: FaultConfig | None = None,
        api_key: str | None = None,
        schedule: Schedule | None = None,
        draws_by_prompt: bool = True,
    ) -> None:
        """`draws_by_prompt`: a greedy request's acceptance draws are keyed by its prompt (`Engine.new_request`);
        off, by request id, which `virtual.predict` replays request by request."""
        self.profile = profile
        self.draws_by_prompt = draws_by_prompt
        self.api_key = api_key
        self.speculative = speculative
        self.seed = seed
        self.engine = Engine(
            profile, speculative, seed=seed, max_running_requests=max_running_requests, schedule=schedule
        )
        self.debug_timestamps = debug_timestamps
        self.faults = faults or FaultConfig()
        self.fault_state = FaultState(self.faults, seed)
        self.drift = HostDrift.from_env()  # tests: every sim server on the host slows during a window
        self.prefix_cache = PrefixCache()
        self.model_name = f"specsweep-sim/{profile.name}"
        self.started_at = time.monotonic()
        self.tokens_emitted = 0
        self.requests_total = 0
        self.loop_resets = 0  # times the loop fell more than LAG_RESET_S behind and restarted its schedule
        self.loop_late_max_s = 0.0  # worst lateness of a step end (sleep overshoot or a busy event loop)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- engine loop -------------------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Like SGLang with --api-key: every endpoint but the health checks needs `Authorization: Bearer`."""
        if self.api_key and request.path not in ("/health", "/health_generate"):
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": "invalid or missing API key"}, status=401)
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        r.add_get("/metrics", self.metrics)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.started_at = time.monotonic()
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run_engine())

    async def _on_cleanup(self, app: web.Application) -> None:
        await cancel_and_wait(self._task)

    async def _run_engine(self) -> None:
        """The engine loop; a bug in it ends the process: a server that never emits would hang clients."""
        try:
            await self._engine_loop()
        except asyncio.CancelledError:
            raise
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)

    async def _engine_loop(self) -> None:
        assert self._wake is not None
        next_start: float | None = None
        while True:
            if not self.engine.has_work:
                self._wake.clear()
                await self._wake.wait()
                await self._take_arrivals()
                next_start = None
            now = time.monotonic()
            if next_start is not None and now - next_start >= LAG_RESET_S:
                self.loop_resets += 1
                next_start = None
            start = now if next_start is None else next_start
            res = self.engine.step(start)
            end = start + res.duration * self.drift.factor()
            delay = end - time.monotonic()
            await asyncio.sleep(delay if delay > 0 else 0)
            self.loop_late_max_s = max(self.loop_late_max_s, time.monotonic() - end)
            self._deliver(res)
            next_start = end
            stall = self.fault_state.take_stall(self.tokens_emitted)
            if stall:
                await asyncio.sleep(stall)
                next_start = None

    async def _take_arrivals(self) -> None:
        """Take the arrivals of this instant: yield to the event loop, again while a pass brings another request
        (at most ADMISSION_MAX_S), so a burst forms one batch and a lone request starts its step at once
        (engine.py)."""
        first = time.monotonic()
        seen = self.requests_total
        await asyncio.sleep(0)
        while self.requests_total != seen and time.monotonic() - first < ADMISSION_MAX_S:
            seen = self.requests_total
            await asyncio.sleep(0)

    def _deliver(self, res: StepResult) -> None:
        for req, n in res.emissions:
            stream: Stream = req.tag  # type: ignore[assignment]
            stream.pending += n
            stream.verify_ct = req.verify_ct
            if req.done:
                stream.done = True
            stream.event.set()
        self.tokens_emitted += res.tokens
        if self.fault_state.should_crash(self.tokens_emitted):
            sys.stdout.flush()
            os._exit(3)

    def _submit(self, tokens: list[str], max_new_tokens: int, content: str = "", greedy: bool = False) -> Stream:
        now = time.monotonic()
        cached = self.prefix_cache.lookup_and_insert(tokens)
        accept = self.profile.accept_prob(content)
        key = str(prompt_hash(tokens)) if greedy and self.draws_by_prompt else None
        req = self.engine.new_request(len(tokens), max_new_tokens, now, cached, accept, key)
        stream = Stream(req=req, sent_at=now, cached=req.prefilled)
        req.tag = stream
        self.requests_total += 1
        assert self._wake is not None
        self._wake.set()
        return stream

    async def _chunks(self, stream: Stream) -> Any:
        """Yield (first_token_index, n_tokens, finished) each time the engine emitted for this stream."""
        pos = 0
        while True:
            await stream.event.wait()
            stream.event.clear()
            n, stream.pending = stream.pending, 0
            if n:
                yield pos, n, stream.done
                pos += n
            if stream.done:
                return

    # ---- helpers -----------------------------------------------------------------------------------------
    def _ready(self) -> bool:
        return time.monotonic() - self.started_at >= self.faults.slow_start_s

    def _check_request(self, prompt_tokens: int, max_new: int) -> web.Response | None:
        if not self._ready():
            return web.json_response({"error": "server is starting"}, status=503)
        if max_new < 1:
            return web.json_response({"error": "max tokens must be >= 1"}, status=400)
        if prompt_tokens + max_new > self.profile.batching.max_model_len:
            return web.json_response(
                {
                    "error": f"prompt ({prompt_tokens}) + max tokens ({max_new}) exceeds max_model_len "
                    f"{self.profile.batching.max_model_len}"
                },
                status=400,
            )
        if self.fault_state.http_error():
            return web.json_response({"error": "injected fault: internal server error"}, status=500)
        return None

    async def _start_sse(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        return resp

    async def _write(self, resp: web.StreamResponse, obj: dict[str, Any]) -> None:
        if self.debug_timestamps:
            obj["sim_sent_at"] = time.monotonic()
        await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    async def _maybe_faults(self, resp: web.StreamResponse, stream: Stream) -> bool:
        """Inject the one-shot stream faults; True when the stream must end now (truncated)."""
        if self.fault_state.take_malformed(self.tokens_emitted):
            await resp.write(b"data: {this is not json\n\n")
        if self.fault_state.take_truncate(self.tokens_emitted):
            self.engine.abort(stream.req)
            await resp.write_eof()
            return True
        return False

    # ---- endpoints ---------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if not self._ready():
            return web.Response(status=503, text="starting")
        return web.Response(text="ok")

    def info(self) -> dict[str, Any]:
        p = self.profile
        spec = self.speculative
        accept = round(self.engine.avg_accept_length(), 4) if spec else None
        return {
            "engine": "specsweep-sim",
            "version": SIM_VERSION,
            "model_path": self.model_name,
            "served_model_name": self.model_name,
            "tp_size": p.model.tensor_parallel,
            "max_running_requests": self.engine.cap,
            "chunked_prefill_size": p.batching.prefill_chunk_tokens,
            "context_length": p.batching.max_model_len,
            "speculative_algorithm": p.speculative.algorithm if spec else None,
            "num_speculative_tokens_per_batch_size": [list(e) for e in self.engine.schedule or []] or None,
            "speculation_switches": self.engine.switches,
            "speculative_num_steps": p.speculative.draft_tokens if spec else None,
            "speculative_eagle_topk": 1 if spec else None,
            "speculative_num_draft_tokens": p.speculative.draft_tokens + 1 if spec else None,
            "avg_spec_accept_length": accept,
            "internal_states": [{"avg_spec_accept_length": accept}],
            "random_seed": self.seed,
            "profile": p.name,
            "profile_illustrative": p.illustrative,
            "profile_params": p.to_dict(),
            "debug_timestamps": self.debug_timestamps,
            "faults": self.faults.active(),
            "drift": self.drift.active(),
            "sim_loop": {
                "steps": self.engine.steps,
                "schedule_resets": self.loop_resets,
                "late_max_s": round(self.loop_late_max_s, 6),
                "requests_total": self.requests_total,
                "tokens_emitted": self.tokens_emitted,
                "gc_frozen_objects": gc.get_freeze_count(),
            },
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.info())

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang's: 400 while requests run, else the prefix cache is emptied."""
        if self.engine.has_work:
            return web.Response(status=400, text="Cache not flushed. Please check if there are running requests.")
        self.prefix_cache.reset()
        return web.Response(text="Cache flushed.\n")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's (dev mode): `{"success": false}` while running requests hold blocks."""
        if self.engine.has_work:
            return web.json_response({"success": False})
        self.prefix_cache.reset()
        return web.json_response({"success": True})

    async def metrics(self, request: web.Request) -> web.Response:
        e = self.engine
        label = f'{{model_name="{self.model_name}"}}'
        lines = [
            "# TYPE sglang:num_running_reqs gauge",
            f"sglang:num_running_reqs{label} {len(e.running)}",
            "# TYPE sglang:num_queue_reqs gauge",
            f"sglang:num_queue_reqs{label} {len(e.waiting)}",
            "# TYPE sglang:generation_tokens_total counter",
            f"sglang:generation_tokens_total{label} {e.tokens_emitted}",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {len(e.running)}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {len(e.waiting)}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {e.tokens_emitted}",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{label} {self.prefix_cache.queries}",
            "# TYPE vllm:prefix_cache_hits counter",
            f"vllm:prefix_cache_hits_total{label} {self.prefix_cache.hits}",
        ]
        if self.speculative:
            lines += [
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                f"vllm:spec_decode_num_drafts_total{label} {e.verify_steps}",
                "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                f"vllm:spec_decode_num_draft_tokens_total{label} {e.draft_tokens}",  # the K each pass served
                "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                f"vllm:spec_decode_num_accepted_tokens_total{label} {e.accepted_draft_tokens}",
            ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            return web.json_response({"error": "prompt must be a string"}, status=400)
        words = prompt.split()
        return web.json_response(
            {
                "count": len(words),
                "tokens": [zlib.crc32(w.encode()) % 100_000 for w in words],
                "max_model_len": self.profile.batching.max_model_len,
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "specsweep-sim",
                        "max_model_len": self.profile.batching.max_model_len,
                    }
                ],
            }
        )

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang native /generate: cumulative `text`, `meta_info` per chunk, `data: [DONE]` at the end."""
        body = await _json_body(request)
        if "input_ids" in body and body["input_ids"] is not None:
            tokens = prompt_words(list(body["input_ids"]))
        else:
            tokens = prompt_words(body.get("text", ""))
        prompt_tokens = len(tokens)
        sp = body.get("sampling_params") or {}
        cap = int(sp.get("max_new_tokens", 128))
        max_new, content = self._length(request, tokens, cap, bool(sp.get("ignore_eos")))
        finish = "length" if max_new >= cap else "stop"
        if body.get("return_logprob") and body.get("top_logprobs_num") and not body.get("stream"):
            words, tops = self._scored(tokens, max_new, int(body["top_logprobs_num"]))
            meta = {"prompt_tokens": prompt_tokens, "completion_tokens": max_new, "finish_reason": {"type": finish}}
            meta["output_token_logprobs"] = [[dict(t).get(w, -99.0), 0, w] for w, t in zip(words, tops, strict=True)]
            meta["output_top_logprobs"] = [[[lp, i, w] for i, (w, lp) in enumerate(t)] for t in tops]
            return web.json_response({"text": "".join(words), "meta_info": meta})
        err = self._check_request(prompt_tokens, cap)
        if err is not None:
            return err
        stream = self._submit(tokens, max_new, content, _greedy(sp.get("temperature")))
        cached = stream.cached
        rid = f"{stream.req.rid:032x}"
        words = self._words(tokens, max_new)

        def obj(pos: int, finished: bool) -> dict[str, Any]:
            meta: dict[str, Any] = {
                "id": rid,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": pos,
                "cached_tokens": cached,
                "finish_reason": ({"type": "length", "length": pos} if finish == "length" else {"type": "stop"})
                if finished
                else None,
            }
            if finished:
                meta["e2e_latency"] = time.monotonic() - stream.sent_at
            if self.speculative:
                meta["spec_verify_ct"] = stream.verify_ct
            return {"text": "".join(words[:pos]), "meta_info": meta}

        try:
            if not body.get("stream"):
                await _drain(self._chunks(stream))
                return web.json_response(obj(max_new, True))
            resp = await self._start_sse(request)
            async for pos, n, finished in self._chunks(stream):
                if await self._maybe_faults(resp, stream):
                    return resp
                await self._write(resp, obj(pos + n, finished))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            if not stream.done:
                self.engine.abort(stream.req)

    def _length(self, request: web.Request, tokens: list[str], max_new: int, ignore_eos: bool) -> tuple[int, str]:
        """(tokens the answer has, its content class): all `max_new` under ignore_eos, else where the class's
        answers end (`answer_length`)."""
        content = request.headers.get(CONTENT_HEADER, "")
        if ignore_eos:
            return max_new, content
        return answer_length(tokens, self.profile.content(content).answer_tokens, max_new), content

    def _words(self, tokens: list[str], max_new: int) -> list[str]:
        h = prompt_hash(tokens)
        return output_words(tokens, max_new, self.fault_state.corrupts(h), self.fault_state.flips_tie(h))

    def _scored(self, tokens: list[str], max_new: int, k: int) -> tuple[list[str], list[list[tuple[str, float]]]]:
        """This server's words for a prompt (its faults included) and, at every one, the sim model's top-k
        candidates (each with its leading space, as the words are sent)."""
        words = self._words(tokens, max_new)
        state, tops = prompt_hash(tokens), []
        for w in words:
            tops.append([(" " + c, lp) for c, lp in next_words(state, max(1, k))])
            state = zlib.crc32(w.encode(), state)
        return words, tops

    def _replay_logprobs(
        self, body: dict[str, Any], tokens: list[str], chat: bool, max_new: int, finish: str
    ) -> web.Response:
        """A greedy request with log-probabilities (client/referral.py's replay), answered at once, outside the
        timing model. Completions: `logprobs: k`; chat: `logprobs: true`, `top_logprobs: k`."""
        k = int(body.get("top_logprobs") or 1) if chat else int(body["logprobs"])
        words, tops = self._scored(tokens, max_new, k)
        text = "".join(words)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            content = [
                {
                    "token": w,
                    "logprob": dict(t).get(w, -99.0),
                    "top_logprobs": [{"token": c, "logprob": lp} for c, lp in t],
                }
                for w, t in zip(words, tops, strict=True)
            ]
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = {"content": content}
        else:
            offsets = [sum(len(x) for x in words[:i]) for i in range(len(words))]
            choice["text"] = text
            choice["logprobs"] = {
                "text_offset": offsets,
                "token_logprobs": [dict(t).get(w, -99.0) for w, t in zip(words, tops, strict=True)],
                "tokens": words,
                "top_logprobs": [dict(t) for t in tops],
            }
        usage = {"prompt_tokens": len(tokens), "completion_tokens": max_new, "total_tokens": len(tokens) + max_new}
        kind = "chat.completion" if chat else "text_completion"
        return web.json_response({"id": "cmpl-logprobs", "object": kind, "choices": [choice], "usage": usage})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """OpenAI completions / chat completions, with vLLM's continuous_usage_stats option."""
        body = await _json_body(request)
        tokens = _chat_prompt(body) if chat else _completion_prompt(body)
        prompt_tokens = len(tokens)
        cap = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        max_new, content = self._length(request, tokens, cap, bool(body.get("ignore_eos")))
        finish = "length" if max_new >= cap else "stop"
        if body.get("logprobs") and not body.get("stream"):
            return self._replay_logprobs(body, tokens, chat, max_new, finish)
        err = self._check_request(prompt_tokens, cap)
        if err is not None:
            return err
        stream = self._submit(tokens, max_new, content, _greedy(body.get("temperature")))
        cached = stream.cached
        words = self._words(tokens, max_new)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{stream.req.rid:016x}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = include_usage and bool(opts.get("continuous_usage_stats"))

        def usage(n: int) -> dict[str, Any]:
            return {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": cached},
            }

        try:
            if not body.get("stream"):
                await _drain(self._chunks(stream))
                text = "".join(words[:max_new])
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                return web.json_response(
                    {
                        "id": rid,
                        "object": kind,
                        "created": created,
                        "model": self.model_name,
                        "choices": [choice],
                        "usage": usage(max_new),
                    }
                )
            resp = await self._start_sse(request)
            chunk_kind = "chat.completion.chunk" if chat else "text_completion"
            async for pos, n, finished in self._chunks(stream):
                if await self._maybe_faults(resp, stream):
                    return resp
                delta = "".join(words[pos : pos + n])
                ch: dict[str, Any] = {
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": finish if finished else None,
                }
                if chat:
                    ch["delta"] = {"role": "assistant", "content": delta} if pos == 0 else {"content": delta}
                else:
                    ch["text"] = delta
                out: dict[str, Any] = {
                    "id": rid,
                    "object": chunk_kind,
                    "created": created,
                    "model": self.model_name,
                    "choices": [ch],
                }
                if continuous:
                    out["usage"] = usage(pos + n)
                await self._write(resp, out)
            if include_usage:
                await self._write(
                    resp,
                    {
                        "id": rid,
                        "object": chunk_kind,
                        "created": created,
                        "model": self.model_name,
                        "choices": [],
                        "usage": usage(max_new),
                    },
                )
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            if not stream.done:
                self.engine.abort(stream.req)


async def _drain(chunks: Any) -> None:
    """Run a stream to its end without sending anything (a non-streamed request answers once, at the end)."""
    async for _ in chunks:
        continue


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise web.HTTPBadRequest(text=f"invalid JSON body: {e}") from e
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="JSON body must be an object")
    return body


def _completion_prompt(body: dict[str, Any]) -> list[str]:
    """The prompt's tokens of an OpenAI completions body (text, [text] or token ids)."""
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt_words(prompt)


def _greedy(temperature: Any) -> bool:
    """Whether a request samples greedily (temperature 0; OpenAI's and SGLang's default is 1)."""
    return temperature is not None and float(temperature) == 0.0


def _chat_prompt(body: dict[str, Any]) -> list[str]:
    """The tokens of the sim's chat template: `<|role|>` and the content's words per message, then the
    generation prompt `<|assistant|>` (as a real engine's template, it adds tokens the client does not send:
    a chat request's input length is the server's count)."""
    words: list[str] = []
    for msg in body.get("messages") or []:
        role = str(msg.get("role") or "user") if isinstance(msg, dict) else "user"
        content = msg.get("content", "") if isinstance(msg, dict) else ""
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        words += [f"<|{role}|>", *prompt_words(str(content or ""))]
    # continue_final_message: the last (assistant) message is open, its content continued, no new turn
    return words if body.get("continue_final_message") else [*words, "<|assistant|>"]


def runner_of(server: SimServer) -> web.AppRunner:
    """The server's runner. A client that goes away cancels its request's handler, whose `finally` aborts the
    request in the engine at once, as SGLang and vLLM drop a disconnected request. Without it (aiohttp's default)
    a queued request whose client left was still admitted and prefilled later (it writes nothing until then):
    after a staggered block the flush waited up to 0.45 s for the fillers the client had aborted at C=250."""
    return web.AppRunner(server.app(), access_log=None, handle_signals=False, handler_cancellation=True)


async def serve(server: SimServer, host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT."""
    runner = runner_of(server)
    await runner.setup()
    # What lives from here on (modules, the profile, the app) leaves the collector's scans, as vLLM's engine core
    # freezes its heap after start-up: a full collection then scans only what requests left, 7-15 ms at C=250
    # instead of 77-109 ms, during which no stream is written. Eight C=250 blocks of one server: their closed
    # loops' wall time spread 5.4% (2.19-2.31 s), frozen 0.7-1.1%.
    gc.collect()
    gc.freeze()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    if site._server is not None and getattr(site._server, "sockets", None):  # the real port when port=0
        bound = site._server.sockets[0].getsockname()[1]
    print(
        f"specsweep-sim listening on http://{host}:{bound} profile={server.profile.name} "
        f"speculative={server.speculative} pid={os.getpid()}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
