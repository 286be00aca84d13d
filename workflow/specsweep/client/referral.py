"""Refer an output difference to a server of the target model: was the first differing token a near-tie?

Greedy speculative decoding is lossless in exact arithmetic, but the verify pass scores K+1 tokens in one batch
and a busy server batches requests differently from one step to the next, so two greedy runs can part where the
model's top two tokens are a rounding step apart (on vLLM's CPU build the baseline differed from itself between
C=1 and C=16 on 8 of 48 prompts, each time at top-2 log-probabilities 0-0.008 nats apart). A broken draft or
verify path parts where the model clearly prefers one token. The server tells which.

How it is asked: the reference server generates the prompt again, greedy, alone (batch size 1), with the top-k
log-probabilities of every token (a *replay*, sent exactly as the measured request was: same text or messages,
same template, so tokenized alike). Where the replay follows the reference's recorded output up to the
difference, the replay's candidates at the token where the two outputs part are the model's own scores of both
tokens after the common prefix; their margin says near-tie or not. Forcing the common prefix as text instead
(prompt + prefix, one new token) would retokenize a generated sequence, which a model does not always generate
in its canonical tokenization (the tiny random model of the vLLM example rarely does): the replay never
retokenizes. Where the replay itself parts from the reference's recorded output before the difference (the
reference's own batch numerics), the difference is not referred, and the error says where and by how much.

APIs (non-streamed, `ignore_eos` as measured): SGLang's /generate (`return_logprob`, `top_logprobs_num`,
`return_text_in_logprobs`: meta_info `output_token_logprobs` and `output_top_logprobs`, [logprob, token id,
text] per token and candidate, as SGLang's `tokenizer_manager` builds them), OpenAI completions (`logprobs: k`:
`choices[0].logprobs.tokens` and `.top_logprobs`, token text -> logprob) and chat (`logprobs`, `top_logprobs`:
`choices[0].logprobs.content[i]`), as vLLM's `completion/protocol.py` and `chat_completion/protocol.py` define.
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

__all__ = ["TOP_K", "Referral", "Replay", "SelfCheck", "read_replay", "refer", "replay", "request_body", "self_check"]

TOP_K = 5  # candidates asked per token: the two arms' tokens are usually the top two; a third near-tie shows too
_SLACK_TOKENS = 8  # replayed past the difference's estimated token, so it is always covered
_FAULTS = (TimeoutError, aiohttp.ClientError, OSError, RuntimeError, ValueError, LookupError, TypeError)

Prompt = str | Sequence[Mapping[str, str]]
Candidates = list[tuple[str, float]]


@dataclass(frozen=True, slots=True)
class Replay:
    """The reference server's greedy replay of a prompt: its tokens' texts, each position's top candidates (most
    likely first) and the text it returned."""

    tokens: list[str]
    top: list[Candidates]
    text: str


@dataclass(frozen=True, slots=True)
class Referral:
    """Where two greedy outputs part and what the reference server's model made of that token.

    `margin_nats`: the reference's token's log-probability minus the other arm's (None when the other arm's
    token is not among the server's top TOP_K: a clear difference). `error`: why it could not be judged (the
    figures are then None)."""

    char: int  # the first differing character of the outputs
    token_char: int  # where the token they part at starts
    reference_token: str | None = None
    other_token: str | None = None
    reference_logprob: float | None = None
    other_logprob: float | None = None
    margin_nats: float | None = None
    steps: int = 0  # requests sent
    error: str | None = None
    other_head: str = ""  # the other output's text from token_char on (names it where its token is no candidate)


def request_body(spec: RequestSpec, prompt: Prompt, max_tokens: int, k: int) -> dict[str, Any]:
    """The replay's body: the measured request's prompt, greedy, `max_tokens`, the top-k of every token."""
    if spec.backend == "sglang":
        if not isinstance(prompt, str):
            raise ValueError("/generate takes text, not chat messages")
        return {
            "text": prompt,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True},
            "return_logprob": True,
            "top_logprobs_num": k,
            "return_text_in_logprobs": True,
            "stream": False,
        }
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": False}
    if spec.model:
        body["model"] = spec.model
    if spec.endpoint == "chat":
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        body.update(messages=messages, logprobs=True, top_logprobs=k)
    else:
        if not isinstance(prompt, str):
            raise ValueError("/v1/completions takes text, not chat messages")
        body.update(prompt=prompt, logprobs=k)
    return body


def _ranked(pairs: list[tuple[str, float]]) -> Candidates:
    return sorted(pairs, key=lambda p: -p[1])


def read_replay(spec: RequestSpec, obj: dict[str, Any]) -> Replay:
    """A replay's answer, as each API writes it."""
    if spec.backend == "sglang":
        meta = obj["meta_info"]
        tokens = [str(t[2]) for t in meta["output_token_logprobs"]]
        top = [_ranked([(str(c[2]), float(c[0])) for c in pos]) for pos in meta["output_top_logprobs"]]
        return Replay(tokens, top, str(obj["text"]))
    choice = obj["choices"][0]
    if spec.endpoint == "chat":
        content = choice["logprobs"]["content"]
        tokens = [str(t["token"]) for t in content]
        top = [_ranked([(str(c["token"]), float(c["logprob"])) for c in t["top_logprobs"]]) for t in content]
        return Replay(tokens, top, str(choice["message"]["content"]))
    lp = choice["logprobs"]
    top = [_ranked([(str(t), float(x)) for t, x in pos.items()]) for pos in lp["top_logprobs"]]
    return Replay([str(t) for t in lp["tokens"]], top, str(choice["text"]))


async def replay(
    session: aiohttp.ClientSession, spec: RequestSpec, prompt: Prompt, max_tokens: int, k: int = TOP_K
) -> Replay:
    """The server of `spec` generates `prompt` again (greedy, alone) with the top-k candidates of every token."""
    url = spec.url.rstrip("/") + spec.path()
    headers = {h: v for h, v in spec.headers().items() if h != "Accept"}
    body = json.dumps(request_body(spec, prompt, max_tokens, k))
    async with asyncio.timeout(spec.request_timeout_s):
        async with session.post(url, data=body, headers=headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {text[:300]}")
    return read_replay(spec, json.loads(text))


def _token_of(rest: str, candidates: Candidates) -> tuple[str, float] | None:
    """The longest candidate that `rest` starts with (" an" over " a" for " an apple")."""
    fits = [c for c in candidates if c[0] and rest.startswith(c[0])]
    return max(fits, key=lambda c: len(c[0])) if fits else None


def tokens_through(text: str, char: int, n_tokens: int) -> int:
    """How many tokens to replay to cover `char` of an output of `n_tokens` tokens (by its characters per token,
    with slack): the replay stops soon after the difference, not at the output's end."""
    if not text:
        return n_tokens
    return min(n_tokens, int((char + 1) * n_tokens / len(text) * 1.25) + _SLACK_TOKENS)


def judge(r: Replay, reference: str, other: str) -> Referral:
    """Walk the replay's tokens along `reference` to the token where `reference` and `other` part."""
    char = len(os.path.commonprefix([reference, other]))
    pos = 0
    for tok, cands in zip(r.tokens, r.top, strict=False):
        if not tok:
            continue  # a token whose text shows with the next one (a partial character)
        end = pos + len(tok)
        if end > char:
            ref_tok, other_tok = _token_of(reference[pos:], cands), _token_of(other[pos:], cands)
            if ref_tok is None:
                why = f"the reference's own token at char {pos} is not among the replay's top {len(cands)}"
                return Referral(char, pos, steps=1, error=why, other_head=other[pos : pos + 24])
            found = Referral(
                char, pos, ref_tok[0], reference_logprob=ref_tok[1], steps=1, other_head=other[pos : pos + 24]
            )
            if other_tok is None or other_tok[0] == ref_tok[0]:
                return found  # the other arm's token is not among the candidates: a clear difference
            return replace(
                found, other_token=other_tok[0], other_logprob=other_tok[1], margin_nats=ref_tok[1] - other_tok[1]
            )
        if reference[pos:end] != tok:  # the replay parts from the reference's recorded output first
            a, b = (cands + [("", float("nan"))] * 2)[:2]
            return Referral(
                char,
                pos,
                steps=1,
                error=(
                    f"the reference server's replay parts from its own recorded output at char {pos}, before the "
                    f"difference at {char} (its top two there {a[0]!r} {b[0]!r}, {a[1] - b[1]:.3g} nats apart)"
                ),
                other_head=other[pos : pos + 24],
            )
        pos = end
    return Referral(char, pos, steps=1, error=f"the replay ended ({len(r.tokens)} tokens) before char {char}")


async def refer(
    session: aiohttp.ClientSession, spec: RequestSpec, prompt: Prompt, reference: str, other: str, n_tokens: int
) -> Referral:
    """Ask the server of `spec` (the reference arm's) where `reference` (its arm's output of `n_tokens` tokens)
    and `other` part and how close the two tokens there were. Never raises for the server's faults: they come
    back as the referral's `error`."""
    char = len(os.path.commonprefix([reference, other]))
    try:
        r = await replay(session, spec, prompt, tokens_through(reference, char, n_tokens))
    except _FAULTS as e:
        return Referral(char, 0, steps=1, error=f"{type(e).__name__}: {e}"[:300])
    return judge(r, reference, other)


@dataclass(frozen=True, slots=True)
class SelfCheck:
    """The replay read back: its tokens' texts joined are the text it returned (`agrees`), so positions in an
    output are positions in the tokens; and whether it reproduced the recorded output it replays. `error`: why it
    could not be asked."""

    char: int  # characters compared
    agrees: bool = False
    expected: str = ""  # the recorded output's head
    top: str | None = None  # the replay's head
    reproduces: bool | None = None  # the replay equals the recorded output over its length
    error: str | None = None


async def self_check(
    session: aiohttp.ClientSession, spec: RequestSpec, prompt: Prompt, text: str, n_tokens: int
) -> SelfCheck:
    """Replay one recorded output of `n_tokens` tokens and read it back. Never raises for the server's faults."""
    try:
        r = await replay(session, spec, prompt, n_tokens)
    except _FAULTS as e:
        return SelfCheck(0, expected=text[:24], error=f"{type(e).__name__}: {e}"[:300])
    joined = "".join(r.tokens)
    return SelfCheck(
        len(joined),
        joined == r.text and len(r.top) == len(r.tokens),
        text[:24],
        r.text[:24],
        text.startswith(r.text) or r.text.startswith(text),
    )
