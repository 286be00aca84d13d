"""Refer an output difference to a server of the target model: was the first differing token a near-tie?

Greedy speculative decoding is lossless in exact arithmetic, but the verify pass scores K+1 tokens in one batch
and a busy server batches requests differently from one step to the next, so two greedy runs can part where the
model's top two tokens are a rounding step apart (on vLLM's CPU build the baseline differs from itself between
C=1 and C=16 on 8 of 48 prompts, each time at top-2 log-probabilities 0-0.008 nats apart). A broken draft or
verify path parts where the model clearly prefers one token. The server tells which: asked for the
log-probabilities of the next token after the prompt plus the two outputs' common prefix (teacher-forced, a
prefill: no speculation runs in it), it returns its top candidates; the margin between the reference's token and
the other arm's says near-tie or not.

The common prefix is forced from its last whitespace (a token boundary for BPE and SentencePiece vocabularies,
whose tokens carry their leading space) and walked forward one shared token at a time, so the question is asked
exactly at the token where the outputs part.

APIs: SGLang's /generate (`return_logprob`, `top_logprobs_num`, `return_text_in_logprobs`: meta_info
`output_top_logprobs`, [logprob, token id, text] per candidate, read in SGLang's `tokenizer_manager`), OpenAI
completions (`logprobs: k`: `choices[0].logprobs.top_logprobs[0]`, token text -> logprob) and chat
(`continue_final_message` with the prefix as the assistant's message, `logprobs`/`top_logprobs`:
`choices[0].logprobs.content[0].top_logprobs`), as vLLM's `completion/protocol.py` and
`chat_completion/protocol.py` define them.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from specsweep.client.backends import RequestSpec

__all__ = ["TOP_K", "Referral", "SelfCheck", "forced_start", "next_tokens", "refer", "self_check"]

TOP_K = 5  # candidates asked for: the two arms' tokens are usually the top two; a third near-tie shows too
MAX_STEPS = 8  # shared tokens walked from the forced whitespace to the token where the outputs part
_BACK_CHARS = 64  # how far back from the difference a whitespace boundary is looked for

Prompt = str | Sequence[Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class Referral:
    """Where two greedy outputs part and what the reference server's model made of that token.

    `margin_nats`: the reference's token's log-probability minus the other arm's (None when the other arm's
    token is not among the server's top TOP_K: a clear difference). `error`: why it could not be asked (the
    figures are then None)."""

    char: int  # the first differing character of the outputs
    token_char: int  # where the differing token starts (the forced prefix's length)
    reference_token: str | None = None
    other_token: str | None = None
    reference_logprob: float | None = None
    other_logprob: float | None = None
    margin_nats: float | None = None
    steps: int = 0  # requests sent
    error: str | None = None
    other_head: str = ""  # the other output's text from token_char on (names it where its token is not a candidate)


def forced_start(text: str, char: int) -> int:
    """The prefix length to force: the last whitespace at or before `char` (within _BACK_CHARS), else `char`."""
    lo = max(0, char - _BACK_CHARS)
    for i in range(char, lo - 1, -1):
        if i < len(text) and text[i].isspace():
            return i
    return 0 if char <= _BACK_CHARS else char


def _payload(spec: RequestSpec, prompt: Prompt, forced: str, k: int) -> dict[str, Any]:
    if spec.backend == "sglang":
        if not isinstance(prompt, str):
            raise ValueError("/generate takes text, not chat messages")
        return {
            "text": prompt + forced,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "top_logprobs_num": k,
            "return_text_in_logprobs": True,
            "stream": False,
        }
    body: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0, "stream": False}
    if spec.model:
        body["model"] = spec.model
    if spec.endpoint == "chat":
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if forced:
            messages.append({"role": "assistant", "content": forced})
            body.update(continue_final_message=True, add_generation_prompt=False)
        body.update(messages=messages, logprobs=True, top_logprobs=k)
    else:
        if not isinstance(prompt, str):
            raise ValueError("/v1/completions takes text, not chat messages")
        body.update(prompt=prompt + forced, logprobs=k)
    return body


def _candidates(spec: RequestSpec, obj: dict[str, Any]) -> list[tuple[str, float]]:
    """The next token's candidates, most likely first."""
    if spec.backend == "sglang":
        top = obj["meta_info"]["output_top_logprobs"][0]
        pairs = [(str(c[2]), float(c[0])) for c in top]
    elif spec.endpoint == "chat":
        top = obj["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        pairs = [(str(c["token"]), float(c["logprob"])) for c in top]
    else:
        top = obj["choices"][0]["logprobs"]["top_logprobs"][0]
        pairs = [(str(t), float(lp)) for t, lp in top.items()]
    return sorted(pairs, key=lambda p: -p[1])


async def next_tokens(
    session: aiohttp.ClientSession, spec: RequestSpec, prompt: Prompt, forced: str, k: int = TOP_K
) -> list[tuple[str, float]]:
    """The server's top-k candidates (text, log-probability) for the token after `prompt` + `forced`, greedy."""
    url = spec.url.rstrip("/") + spec.path()
    headers = {k_: v for k_, v in spec.headers().items() if k_ != "Accept"}
    async with asyncio.timeout(spec.request_timeout_s):
        async with session.post(url, data=json.dumps(_payload(spec, prompt, forced, k)), headers=headers) as resp:
            body = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {body[:300]}")
    return _candidates(spec, json.loads(body))


def _token_of(rest: str, candidates: list[tuple[str, float]]) -> tuple[str, float] | None:
    """The longest candidate that `rest` starts with (" an" over " a" for " an apple")."""
    fits = [c for c in candidates if c[0] and rest.startswith(c[0])]
    return max(fits, key=lambda c: len(c[0])) if fits else None


async def refer(
    session: aiohttp.ClientSession, spec: RequestSpec, prompt: Prompt, reference: str, other: str
) -> Referral:
    """Ask the server of `spec` where `reference` (its own arm's output) and `other` part, and how close the
    two tokens there were. Never raises for the server's faults: they come back as the referral's `error`."""
    char = len(os.path.commonprefix([reference, other]))
    at = forced_start(reference, char)
    steps = 0
    try:
        while steps < MAX_STEPS:
            candidates = await next_tokens(session, spec, prompt, reference[:at])
            steps += 1
            ref_tok = _token_of(reference[at:], candidates)
            other_tok = _token_of(other[at:], candidates)
            if ref_tok is None:
                return Referral(
                    char, at, steps=steps, error=f"the reference's own next token is not among the top {TOP_K} here"
                )
            if other_tok is not None and other_tok[0] == ref_tok[0] and at + len(ref_tok[0]) <= char:
                at += len(ref_tok[0])  # a token both outputs share: walk on
                continue
            found = Referral(
                char, at, ref_tok[0], reference_logprob=ref_tok[1], steps=steps, other_head=other[at : at + 24]
            )
            if other_tok is None or other_tok[0] == ref_tok[0]:
                return found  # the other arm's token is not among the candidates: a clear difference
            return replace(
                found, other_token=other_tok[0], other_logprob=other_tok[1], margin_nats=ref_tok[1] - other_tok[1]
            )
    except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError, ValueError, LookupError, TypeError) as e:
        return Referral(char, at, steps=steps, error=f"{type(e).__name__}: {e}"[:300])
    return Referral(char, at, steps=steps, error=f"no parting token within {MAX_STEPS} tokens of the forced prefix")


@dataclass(frozen=True, slots=True)
class SelfCheck:
    """Whether the server, forced with half of the reference's own output, names the reference's next token
    as its top candidate: the referral's questions are then asked as the outputs were generated (the prompt,
    the template and the forced prefix tokenized alike). `error`: why it could not be asked."""

    char: int
    agrees: bool = False
    expected: str = ""  # the reference's text from `char` on
    top: str | None = None  # the server's top candidate there
    error: str | None = None


async def self_check(session: aiohttp.ClientSession, spec: RequestSpec, prompt: Prompt, text: str) -> SelfCheck:
    """Ask for the token after the prompt and the first half of `text` (from its whitespace): it must be the
    one `text` continues with. Never raises for the server's faults."""
    at = forced_start(text, len(text) // 2)
    expected = text[at : at + 24]
    try:
        top = (await next_tokens(session, spec, prompt, text[:at]))[0][0]
    except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError, ValueError, LookupError, TypeError) as e:
        return SelfCheck(at, expected=expected, error=f"{type(e).__name__}: {e}"[:300])
    return SelfCheck(at, bool(top) and text[at:].startswith(top), expected, top)
