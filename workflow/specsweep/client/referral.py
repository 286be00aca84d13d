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

How the two tokens are found: the replay's own token is known by its id where the API gives ids (SGLang), else by
its text; the other arm's output is recorded as text, so its token is the longest candidate its text starts with.
A candidate whose text alone is no whole character (a byte piece of a multi-byte character decodes alone to
U+FFFD, or to nothing) matches no output text, so it is never matched, and it may be the token a text found no
match for. Where the other arm's token is matched the margin is measured; where it is not, its log-probability is
at most the likeliest candidate it could still be (an unmatched partial character, else the last candidate: a
token outside the top k scores at most that), and the referral records that lower bound on the margin
(`margin_at_least_nats`): the analysis calls it clear only where the bound exceeds its tie margin.

APIs (non-streamed; `ignore_eos` only where the workload's stop is fixed, as measured: a natural stop ends
where the model's text ends, `RequestSpec.stop`): SGLang's /generate (`return_logprob`, `top_logprobs_num`,
`return_text_in_logprobs`: meta_info `output_token_logprobs` and `output_top_logprobs`, [logprob, token id,
text] per token and candidate, as SGLang's `tokenizer_manager` builds them), OpenAI completions (`logprobs: k`:
`choices[0].logprobs.tokens`, `.token_logprobs` and `.top_logprobs`, token text -> logprob) and chat (`logprobs`,
`top_logprobs`: `choices[0].logprobs.content[i]`), as vLLM's `completion/protocol.py` and
`chat_completion/protocol.py` define. vLLM gives a token's text or, with `return_tokens_as_token_ids`, its id (as
"token_id:<n>"), never both: the walk along the output needs the texts, so its replays are matched by text.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from specsweep.client.backends import RequestSpec

__all__ = [
    "TOP_K",
    "Referral",
    "Replay",
    "SelfCheck",
    "is_partial",
    "judge",
    "read_replay",
    "refer",
    "replay",
    "request_body",
    "self_check",
]

TOP_K = 5  # candidates asked per token: the two arms' tokens are usually the top two; a third near-tie shows too
_SLACK_TOKENS = 8  # replayed past the difference's estimated token, so it is always covered
_FAULTS = (TimeoutError, aiohttp.ClientError, OSError, RuntimeError, ValueError, LookupError, TypeError)

Prompt = str | Sequence[Mapping[str, str]]
Candidate = tuple[str, float, int | None]  # text, log-probability, token id (where the API gives ids)
Candidates = list[Candidate]


def is_partial(text: str) -> bool:
    """A token whose text alone is no whole character (a byte piece decodes alone to U+FFFD, or to nothing): no
    output's text can show where it stands."""
    return not text or "\ufffd" in text


@dataclass(frozen=True, slots=True)
class Replay:
    """The reference server's greedy replay of a prompt: its tokens' texts, each position's top candidates (most
    likely first) and the text it returned; its tokens' ids and log-probabilities where the API gives them (empty
    lists where it gives none)."""

    tokens: list[str]
    top: list[Candidates]
    text: str
    ids: list[int | None] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Referral:
    """Where two greedy outputs part and what the reference server's model made of that token.

    `margin_nats`: the reference's token's log-probability minus the other arm's, where both are matched among
    the candidates. Where the other arm's token is not: `margin_at_least_nats`, the reference's log-probability
    minus the highest the other's could have (the candidate at `bound_rank`, from 1: a partial character it may
    be, or the last candidate, which every token outside the top k scores at most), a lower bound on the margin.
    `error`: why it could not be judged (the figures are then None)."""

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
    reference_id: int | None = None  # token ids, where the API gives them
    other_id: int | None = None
    margin_at_least_nats: float | None = None
    bound_rank: int | None = None
    bound_token: str | None = None


def request_body(spec: RequestSpec, prompt: Prompt, max_tokens: int, k: int) -> dict[str, Any]:
    """The replay's body: the measured request's prompt, greedy, `max_tokens`, the top-k of every token; its stop
    as measured (`ignore_eos` for a fixed stop only: a natural one ends at the model's end of text)."""
    eos = {"ignore_eos": True} if spec.stop == "fixed" else {}
    if spec.backend == "sglang":
        if not isinstance(prompt, str):
            raise ValueError("/generate takes text, not chat messages")
        return {
            "text": prompt,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, **eos},
            "return_logprob": True,
            "top_logprobs_num": k,
            "return_text_in_logprobs": True,
            "stream": False,
        }
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, **eos, "stream": False}
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


def _ranked(cands: Candidates) -> Candidates:
    return sorted(cands, key=lambda c: -c[1])


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


def _id(x: Any) -> int | None:
    return None if x is None else int(x)


def read_replay(spec: RequestSpec, obj: dict[str, Any]) -> Replay:
    """A replay's answer, as each API writes it."""
    if spec.backend == "sglang":
        meta = obj["meta_info"]
        own = meta["output_token_logprobs"]
        top = [[(str(c[2]), float(c[0]), _id(c[1])) for c in pos] for pos in meta["output_top_logprobs"]]
        return Replay(
            [str(t[2]) for t in own],
            [_ranked(c) for c in top],
            str(obj["text"]),
            [_id(t[1]) for t in own],
            [_float(t[0]) for t in own],
        )
    choice = obj["choices"][0]
    if spec.endpoint == "chat":
        content = choice["logprobs"]["content"]
        tokens = [str(t["token"]) for t in content]
        top = [_ranked([(str(c["token"]), float(c["logprob"]), None) for c in t["top_logprobs"]]) for t in content]
        own_lp = [_float(t.get("logprob")) for t in content]
        return Replay(tokens, top, str(choice["message"]["content"]), logprobs=own_lp)
    lp = choice["logprobs"]
    top = [_ranked([(str(t), float(x), None) for t, x in (pos or {}).items()]) for pos in lp["top_logprobs"]]
    own_lp = [_float(x) for x in lp.get("token_logprobs") or []]
    return Replay([str(t) for t in lp["tokens"]], top, str(choice["text"]), logprobs=own_lp)


async def replay(
    session: aiohttp.ClientSession,
    spec: RequestSpec,
    prompt: Prompt,
    max_tokens: int,
    k: int = TOP_K,
    content: str = "",
) -> Replay:
    """The server of `spec` generates `prompt` again (greedy, alone) with the top-k candidates of every token;
    `content`: the measured request's content class, sent as it was (the simulated engine ends a natural stop's
    answer by it)."""
    url = spec.url.rstrip("/") + spec.path()
    headers = {h: v for h, v in spec.headers(content).items() if h != "Accept"}
    body = json.dumps(request_body(spec, prompt, max_tokens, k))
    async with asyncio.timeout(spec.request_timeout_s):
        async with session.post(url, data=body, headers=headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {text[:300]}")
    return read_replay(spec, json.loads(text))


def _token_of(rest: str, candidates: Candidates, skip: int | None = None) -> int | None:
    """The longest whole candidate that `rest` starts with (" an" over " a" for " an apple"; of equal texts, the
    likeliest), `skip` aside; a partial character is never matched (its text is not the output's)."""
    fits = [i for i, c in enumerate(candidates) if i != skip and not is_partial(c[0]) and rest.startswith(c[0])]
    return max(fits, key=lambda i: (len(candidates[i][0]), candidates[i][1])) if fits else None


def _own(r: Replay, i: int) -> int | None:
    """The replay's own token `i` among its candidates: by id and text where the API gives ids, else by its text
    (where that is whole: partial characters share one text)."""
    tok, cands = r.tokens[i], r.top[i]
    tid = r.ids[i] if i < len(r.ids) else None
    if tid is None and is_partial(tok):
        return None
    return next((j for j, c in enumerate(cands) if c[0] == tok and (tid is None or c[2] == tid)), None)


def _parting(r: Replay, i: int, pos: int, char: int, reference: str, other: str) -> Referral:
    """Both arms' tokens at the replay's token `i` (at `pos`), where the outputs part at `char`: the replay's
    own token where an output follows it, else the candidate its text matches."""
    cands, top = list(r.top[i]), r.top[i]
    own = _own(r, i)
    own_lp = r.logprobs[i] if i < len(r.logprobs) else None
    if own is None and own_lp is not None and not is_partial(r.tokens[i]):  # scored, though no candidate
        cands.append((r.tokens[i], own_lp, r.ids[i] if i < len(r.ids) else None))
        own = len(cands) - 1
    found = Referral(char, pos, steps=1, other_head=other[pos : pos + 24])

    def side(text: str, skip: int | None) -> int | None:
        if own is not None and own != skip and text.startswith(r.tokens[i], pos):
            return own
        return _token_of(text[pos:], cands, skip)

    ref = side(reference, None)
    if ref is None:
        return replace(found, error=f"the reference's own token at char {pos} is not among the replay's top {len(top)}")
    rc = cands[ref]
    found = replace(found, reference_token=rc[0], reference_logprob=rc[1], reference_id=rc[2])
    oth = side(other, ref)
    if oth is not None:
        oc = cands[oth]
        return replace(found, other_token=oc[0], other_logprob=oc[1], other_id=oc[2], margin_nats=rc[1] - oc[1])
    if not top:
        return found  # nothing bounds the other's log-probability
    # the other arm's token is a candidate its text cannot match (a partial character) or outside the top k,
    # where it scores at most the last candidate: the likeliest of those bounds the margin from below
    k = min([j for j, c in enumerate(top) if j != ref and is_partial(c[0])] + [len(top) - 1])
    return replace(found, margin_at_least_nats=rc[1] - top[k][1], bound_rank=k + 1, bound_token=top[k][0])


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
    for i, (tok, cands) in enumerate(zip(r.tokens, r.top, strict=False)):
        if not tok:
            continue  # a token whose text shows with the next one (a partial character)
        end = pos + len(tok)
        if end > char:
            return _parting(r, i, pos, char, reference, other)
        if reference[pos:end] != tok:  # the replay parts from the reference's recorded output first
            a, b = (cands + [("", float("nan"), None)] * 2)[:2]
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
    session: aiohttp.ClientSession,
    spec: RequestSpec,
    prompt: Prompt,
    reference: str,
    other: str,
    n_tokens: int,
    content: str = "",
) -> Referral:
    """Ask the server of `spec` (the reference arm's) where `reference` (its arm's output of `n_tokens` tokens)
    and `other` part and how close the two tokens there were (`content`: the prompt's content class, as
    measured). Never raises for the server's faults: they come back as the referral's `error`."""
    char = len(os.path.commonprefix([reference, other]))
    try:
        r = await replay(session, spec, prompt, tokens_through(reference, char, n_tokens), content=content)
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
    session: aiohttp.ClientSession, spec: RequestSpec, prompt: Prompt, text: str, n_tokens: int, content: str = ""
) -> SelfCheck:
    """Replay one recorded output of `n_tokens` tokens (`content`: its content class, as measured) and read it
    back. Never raises for the server's faults."""
    try:
        r = await replay(session, spec, prompt, n_tokens, content=content)
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
