"""Seeded prompt sets: the same prompts, by seed, in every arm, at an exact token length where possible.

Token length is made exact with the first tokenizer that can be had, in this order:
1. the server's `POST /tokenize {"prompt": text}` -> `{"count": n}` (vLLM's and the simulated engine's shape);
2. the model's `tokenizer.json` through the optional `tokenizers` package;
3. otherwise an approximation: one token per whitespace word (exact for the simulated engine, and close for
   real BPE tokenizers on the short common English words used here).

A dataset (`workload.dataset`, read by `specsweep.client.datasets`) replaces the synthetic words: its entries are
split into the same disjoint, paired sets (`_file_level_prompts`), and the same tokenizer chain measures its
reference answers when `workload.output_tokens` is `{reference: {min, max}}`.
"""

from __future__ import annotations

import hashlib
import json
import random
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from specsweep.client.datasets import Dataset, Message

# Short, common words: each is a single token in the usual BPE vocabularies when preceded by a space.
WORDS: tuple[str, ...] = tuple(
    """the of and to in is was for on that with as by at from his her they this be are have had not
    but what all were when we there can an your which their said if do will each about how up out them
    then she many some so these would other into has more two like him see time could no make than first
    been its who now people my made over did down only way find use may water long little very after
    words called just where most know get through back much before go good new write our used me man too
    any day same right look think also around another came come work three word must because does part
    even place well such here take why things help put years different away again off went old number
    great tell men say small every found still between name should home big give air line set own under
    read last never us left end along while might next sound below saw something thought both few those
    always looked show large often together asked house world going want school important until form food
    keep children feet land side without boy once animals life enough took sometimes four head above kind
    began almost live page got earth need far hand high year mother light parts country father let night
    following picture being study second eyes soon times story boys since white days paper
    hard near""".split()
)

Tokenizer = Callable[[str], Awaitable[int]]
OutputSpec = int | dict[str, Any] | None  # workload.output_tokens: fixed, {"uniform": [lo, hi]}, {"reference": ...}
Messages = tuple[Message, ...]


@dataclass
class PromptSet:
    """Prompts plus what is known about them. `sha256` identifies the set in every summary."""

    prompts: list[str]
    input_tokens: list[int]  # token count per prompt (exact when `exact`, else the approximation)
    output_tokens: list[int | None]  # per-prompt output length from a dataset (None: use the level's)
    source: str  # "synthetic" or the dataset's path
    tokenizer: str  # "server", "<local>=server" (a local counter agreeing with it), "tokenizers", "words", "file"
    exact: bool
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # chat messages per prompt, for a dataset with conversations (None: each prompt is one user message)
    messages: list[Messages] | None = None
    # the text sent to SGLang's /generate where the chat template was applied client-side (`templated`)
    templated: list[str] | None = None
    dataset: dict[str, Any] | None = None  # the dataset's facts (Dataset.describe), None for synthetic prompts
    # each prompt's content class (workload.classes; client/contents.py), None: the workload has one content
    contents: list[str] | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def sha256(self) -> str:
        return prompt_set_hash(self.prompts, self.output_tokens, self.messages)

    def head(self, n: int) -> PromptSet:
        """The set's first n prompts: a round that measured fewer requests than its set holds (the stopping
        rule builds each round's set for the largest block it may grow to)."""
        if n >= len(self.prompts):
            return self

        def cut(x: list[Any] | None) -> list[Any] | None:
            return None if x is None else x[:n]

        return replace(
            self,
            prompts=self.prompts[:n],
            input_tokens=self.input_tokens[:n],
            output_tokens=self.output_tokens[:n],
            messages=cut(self.messages),
            templated=cut(self.templated),
            contents=cut(self.contents),
        )

    def content(self, i: int) -> str:
        """Prompt i's content class ("" where the workload has one content)."""
        return self.contents[i] if self.contents is not None else ""

    def request(self, i: int, chat: bool) -> str | Messages:
        """What request i sends: text (templated where a chat template was applied here), or, to a chat
        endpoint, the entry's messages (a plain prompt goes as one user message: `RequestSpec.payload`)."""
        if self.templated is not None:
            return self.templated[i]
        if chat and self.messages is not None:
            return self.messages[i]
        return self.prompts[i]

    def describe(self) -> dict[str, Any]:
        """JSON-able facts for the summary's workload section."""
        return {
            "prompt_set_sha256": self.sha256,
            "prompt_source": self.source,
            "prompt_count": len(self.prompts),
            "prompt_tokenizer": self.tokenizer,
            "prompt_tokens_exact": self.exact,
            "prompt_seed": self.seed,
            "input_tokens_mean": (sum(self.input_tokens) / len(self.input_tokens)) if self.input_tokens else None,
            **(self.dataset or {}),
            "chat_template": "client" if self.templated is not None else None,
        }


def prompt_set_hash(
    prompts: list[str], output_tokens: list[int | None] | None = None, messages: list[Messages] | None = None
) -> str:
    """sha256 over a canonical JSON of the prompts (their chat messages where a dataset has conversations) and
    per-prompt output lengths: what is asked, not how a backend's template renders it."""
    outs = output_tokens or [None] * len(prompts)
    items: list[Any] = [list(map(dict, m)) for m in messages] if messages is not None else list(prompts)
    canon = json.dumps([[p, o] for p, o in zip(items, outs, strict=True)], ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def set_seed(seed: int, tag: str) -> int:
    """A prompt set's own seed: the experiment's seed and the set's tag, stable across Python runs."""
    return zlib.crc32(f"{seed}:{tag}".encode())


def cell_tag(concurrency: int, repeat: int) -> str:
    """The tag of a measured prompt set: one per (level, repeat), the same in every arm and variant."""
    return f"c{concurrency}r{repeat}n"


def warmup_tag(concurrency: int) -> str:
    """The warm-up set's tag: never equal to a measured set's, so warm-up leaves no measured prefix cached."""
    return f"w{concurrency}n"


def synthetic_words(n_prompts: int, n_words: int, seed: int, tag: str = "p") -> list[list[str]]:
    """Seeded word lists. The first word, `<tag><i>`, is unique to the set and the prompt: no two prompts sent
    to a server share a cached prefix (beyond a BOS token)."""
    rng = random.Random(seed)
    out = []
    for i in range(n_prompts):
        words = [f"{tag}{i}"] + [rng.choice(WORDS) for _ in range(max(0, n_words - 1))]
        out.append(words[:n_words] if n_words > 0 else [])
    return out


def output_lengths(n: int, spec: OutputSpec, seed: int) -> list[int | None]:
    """Per-request output lengths: None (the level's fixed length) or seeded draws from `{uniform: [lo, hi]}`."""
    if not isinstance(spec, dict) or "uniform" not in spec:
        return [None] * n  # a fixed length (the level's), or reference lengths (`_file_level_prompts`)
    lo, hi = (int(x) for x in spec["uniform"])
    rng = random.Random(seed ^ 0x5EED)
    return [rng.randint(lo, hi) for _ in range(n)]


def server_tokenizer(
    session: aiohttp.ClientSession, url: str, model: str | None = None, headers: dict[str, str] | None = None
) -> Tokenizer:
    """A tokenizer calling the server's POST /tokenize (vLLM and the simulated engine answer {"count": n})."""

    async def count(text: str) -> int:
        # The server's defaults (BOS included) are what it applies to a completion prompt: count the same way.
        body: dict[str, Any] = {"prompt": text}
        if model:
            body["model"] = model
        async with session.post(url.rstrip("/") + "/tokenize", json=body, headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"/tokenize answered HTTP {r.status}")
            data = await r.json(content_type=None)
        if "count" in data:
            return int(data["count"])
        return len(data["tokens"])

    return count


def file_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer from a model's tokenizer.json via the optional `tokenizers` package."""
    from tokenizers import Tokenizer as HFTokenizer  # optional dependency

    p = Path(path)
    tok = HFTokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p))

    async def count(text: str) -> int:
        return len(tok.encode(text).ids)  # special tokens (BOS) included, as the server counts a prompt

    return count


async def _fit(words: list[str], target: int, count: Tokenizer, pool: random.Random) -> tuple[str, int]:
    """Add or drop words until the tokenizer says `target` tokens; returns the text and its count (the closest
    reached within 64 counts when no word list hits it exactly).

    Steps scale with the tokens per word seen so far: a small BPE vocabulary (the tiny local model's) splits
    a word into ~3.5 tokens, and steps of one token per word undershot by 3x (a 64-token prompt of 207)."""
    words = list(words)
    n = await count(" ".join(words))
    best = (abs(n - target), " ".join(words), n)
    for _ in range(64):
        if n == target:
            break
        step = round((target - n) * len(words) / max(n, 1))  # words to add (+) or drop (-)
        if step > 0:
            words.extend(pool.choice(WORDS) for _ in range(step))
        elif step < 0:
            words = words[: max(1, len(words) + step)]  # the first word (the set's unique tag) stays
        elif n < target:
            words.append(pool.choice(WORDS))
        elif len(words) > 1:  # within one word of the target: another last word (token counts differ)
            words[-1] = pool.choice(WORDS)
        else:
            break
        n = await count(" ".join(words))
        best = min(best, (abs(n - target), " ".join(words), n))
    return best[1], best[2]


async def make_prompts(
    n_prompts: int,
    input_tokens: int,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
    tokenizer_name: str = "server",
    tag: str = "p",
    output: OutputSpec = None,
) -> PromptSet:
    """Seeded synthetic prompts of `input_tokens` tokens each (exact with a tokenizer that converges).

    `tag` starts every prompt's first word (see `synthetic_words`); `output` gives per-prompt output lengths
    (None or a fixed int: the level's length)."""
    word_lists = synthetic_words(n_prompts, input_tokens, seed, tag)
    outs = output_lengths(n_prompts, output, seed)
    if tokenizer is None:
        texts = [" ".join(w) for w in word_lists]
        return PromptSet(texts, [len(w) for w in word_lists], outs, "synthetic", "words", False, seed, {"tag": tag})
    texts, counts = [], []
    for i, w in enumerate(word_lists):
        text, n = await _fit(w, input_tokens, tokenizer, random.Random(seed * 1_000_003 + i))
        texts.append(text)
        counts.append(n)
    exact = all(c == input_tokens for c in counts)
    return PromptSet(texts, counts, outs, "synthetic", tokenizer_name, exact, seed, {"tag": tag})


async def _works(tok: Tokenizer) -> bool:
    """Whether the server's tokenize endpoint answers (engines without one fall back)."""
    try:
        await tok("hello world")
    except (aiohttp.ClientError, RuntimeError, KeyError, ValueError, TimeoutError):
        return False
    return True


async def _with_tokenizer(
    build: Callable[[Tokenizer | None, str], Awaitable[Any]],
    url: str | None,
    model: str | None,
    tokenizer_path: str | None,
    headers: dict[str, str] | None,
) -> Any:
    """Call `build(tokenizer, name)` with the first tokenizer that works (see module doc).

    When the server answers /tokenize, a local counter that counts every probe text as the server does is used
    in its place, named "<local>=server": the model's tokenizer.json, else one token per word (the simulated
    engine's rule). Fitting a prompt takes several counts, ~4-21 ms each over HTTP on vLLM CPU (3 minutes of
    a C=64 cell of 5 repeats went to /tokenize), microseconds locally. Where they differ, the server counts."""
    ftok: Tokenizer | None = None
    if tokenizer_path:
        try:
            ftok = file_tokenizer(tokenizer_path)
        except Exception:  # any failure (package missing, file unreadable) means: fall back
            ftok = None
    if url:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            tok = server_tokenizer(s, url, model, headers)
            if await _works(tok):
                local = [(ftok, "tokenizers")] if ftok is not None else []
                for candidate, name in [*local, (word_count, "words")]:
                    if await _agree(candidate, tok):
                        return await build(candidate, f"{name}=server")
                return await build(tok, "server")
    if ftok is not None:
        return await build(ftok, "tokenizers")
    return await build(None, "words")


async def word_count(text: str) -> int:
    """One token per whitespace-separated word: the simulated engine's tokenizer."""
    return len(text.split())


PROBE_TEXTS = 8  # texts of 1 to 256 words, the words prompts are made of, with the tags they start with


async def _agree(local: Tokenizer, server: Tokenizer) -> bool:
    """Whether the local tokenizer counts `PROBE_TEXTS` probe texts exactly as the server does."""
    rng = random.Random(0x70C)
    for i in range(PROBE_TEXTS):
        text = f"p{i}x{rng.randrange(10**6)} " + " ".join(rng.choice(WORDS) for _ in range(2**i))
        if await local(text) != await server(text):
            return False
    return True


async def make_prompts_auto(
    n_prompts: int,
    input_tokens: int,
    seed: int = 0,
    url: str | None = None,
    model: str | None = None,
    tokenizer_path: str | None = None,
    headers: dict[str, str] | None = None,
) -> PromptSet:
    """Try the server's /tokenize, then a tokenizer file, then the word approximation (see module doc)."""

    async def build(tok: Tokenizer | None, name: str) -> PromptSet:
        return await make_prompts(n_prompts, input_tokens, seed, tok, name)

    return await _with_tokenizer(build, url, model, tokenizer_path, headers)


@dataclass
class LevelPrompts:
    """A level's prompts: the warm-up set and one measured set per repeat, pairwise disjoint.

    Why per repeat: a prompt sent twice to one server can be answered from its prefix cache, which makes the
    later measurement faster than the first; sets are derived from (seed, C, repeat), so every arm and variant
    sends the same requests in the same cell (the comparison stays paired) and no measured prompt repeats."""

    warmup: PromptSet
    repeats: list[PromptSet]
    unique: bool  # False when a prompts file had to be cycled: prompts then repeat, only a cache reset helps

    def describe(self) -> dict[str, Any]:
        first = self.repeats[0].describe()
        chats = self.repeats[0].messages is not None
        return {
            **first,
            "prompt_set_sha256": prompt_set_hash(
                [p for s in self.repeats for p in s.prompts],
                [o for s in self.repeats for o in s.output_tokens],
                [m for s in self.repeats for m in s.messages or ()] if chats else None,
            ),
            "prompt_count": sum(len(s) for s in self.repeats),
            "prompt_sets": [{"tag": s.meta.get("tag"), "sha256": s.sha256, "count": len(s)} for s in self.repeats],
            "prompts_unique": self.unique,
            "warmup_prompt_set_sha256": self.warmup.sha256 if len(self.warmup) else None,
        }


async def level_prompts(
    concurrency: int,
    n_per_repeat: int,
    repeats: int,
    n_warmup: int,
    input_tokens: int,
    seed: int = 0,
    output: OutputSpec = None,
    dataset: Dataset | None = None,
    url: str | None = None,
    model: str | None = None,
    tokenizer_path: str | None = None,
    headers: dict[str, str] | None = None,
) -> LevelPrompts:
    """The warm-up set and the measured sets of one level (see LevelPrompts), fitted with one tokenizer: the
    synthetic words, or the entries of `dataset`."""

    async def build(tok: Tokenizer | None, name: str) -> LevelPrompts:
        if dataset is not None:
            return await _file_level_prompts(dataset, concurrency, n_per_repeat, repeats, n_warmup, seed, output, tok)

        async def one(n: int, tag: str, out: OutputSpec) -> PromptSet:
            return await make_prompts(n, input_tokens, set_seed(seed, tag), tok, name, tag, out)

        warm = await one(n_warmup, warmup_tag(concurrency), None)  # warm-up lengths are the caller's (short)
        sets = [await one(n_per_repeat, cell_tag(concurrency, r), output) for r in range(repeats)]
        return LevelPrompts(warm, sets, unique=True)

    needs_tokenizer = dataset is None or (isinstance(output, dict) and "reference" in output)
    if not needs_tokenizer:
        return await build(None, "words")
    return await _with_tokenizer(build, url, model, tokenizer_path, headers)


async def reference_lengths(references: list[str | None], bounds: dict[str, int], count: Tokenizer | None) -> list[int]:
    """Reference answers' token lengths, clipped to [min, max]: the tokenizer's count less what it adds to an
    empty text (a BOS token belongs to prompts, not answers), or the word count without a tokenizer."""
    lo, hi = int(bounds["min"]), int(bounds["max"])
    overhead = await count("") if count is not None else 0
    out = []
    for ref in references:
        if ref is None:
            raise ValueError("an entry without a reference answer reached reference lengths (config validation)")
        n = (await count(ref)) - overhead if count is not None else len(ref.split())
        out.append(min(hi, max(lo, n)))
    return out


async def _file_level_prompts(
    dataset: Dataset,
    concurrency: int,
    n_per_repeat: int,
    repeats: int,
    n_warmup: int,
    seed: int,
    output: OutputSpec,
    count: Tokenizer | None,
) -> LevelPrompts:
    """A dataset split into disjoint sets where it is long enough; cycled (and said so) where not.

    The warm-up set comes first, then one set per repeat, from a start that depends on (seed, C) only: every
    arm and variant sends the same entries in the same cell. An entry's own output length wins; else
    `{reference: ...}` measures its reference answer, `{uniform: ...}` draws by the set's seed, a number leaves
    it to the level."""
    entries = dataset.entries
    n = len(entries)
    need = n_warmup + repeats * n_per_repeat
    start = set_seed(seed, f"c{concurrency}") % n  # levels start at different places in the file
    chats = dataset.conversational

    async def take(offset: int, count_: int, tag: str, spec: OutputSpec) -> PromptSet:
        chosen = [entries[(start + offset + i) % n] for i in range(count_)]
        if isinstance(spec, dict) and "reference" in spec:
            pending = [e.reference for e in chosen if e.output_tokens is None]
            measured = iter(await reference_lengths(pending, spec["reference"], count))
            drawn: list[int | None] = [None if e.output_tokens is not None else next(measured) for e in chosen]
        else:
            drawn = output_lengths(count_, spec, set_seed(seed, tag))
        outs = [e.output_tokens if e.output_tokens is not None else d for e, d in zip(chosen, drawn, strict=True)]
        return PromptSet(
            [e.text for e in chosen],
            [len(e.text.split()) for e in chosen],
            outs,
            dataset.path,
            "words",
            False,
            None,
            {"tag": tag},
            [e.messages for e in chosen] if chats else None,
            dataset=dataset.describe(),
        )

    sets = [
        await take(n_warmup + r * n_per_repeat, n_per_repeat, cell_tag(concurrency, r), output) for r in range(repeats)
    ]
    warm = await take(0, n_warmup, warmup_tag(concurrency), None)
    warm = replace(warm, output_tokens=[None] * len(warm))  # warm-up lengths are the caller's (short), not the file's
    return LevelPrompts(warm, sets, unique=need <= n)


ChatRender = Callable[[Messages], str]


class ChatTemplateUnavailable(RuntimeError):
    """No chat template can be applied client-side; the message names the fix."""


def hf_chat_template(model_path: str | None) -> ChatRender:
    """The model's chat template, applied here for SGLang's native /generate (which applies none).

    This is what SGLang's own `bench_serving --apply-chat-template` does for its `sglang` (/generate) backend
    (python/sglang/bench_serving.py, `sample_sharegpt_requests`): `tokenizer.apply_chat_template(messages,
    add_generation_prompt=True, tokenize=False)`, then the tokenizer's BOS text removed, because /generate
    tokenizes the text and adds BOS itself. Here only a leading BOS is removed: a multi-turn template may carry
    BOS inside, which the server keeps too. `transformers` is optional and the model must be local."""
    fix = "set the variant's client_backend: openai (the engine applies the template), or install transformers"
    try:
        from transformers import AutoTokenizer  # optional dependency
    except ImportError:
        raise ChatTemplateUnavailable(f"chat requests to /generate need transformers; {fix}") from None
    if not model_path:
        raise ChatTemplateUnavailable(
            f"chat requests to /generate need the model's tokenizer, and none is local; {fix}"
        )
    try:
        tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except Exception as e:  # any failure to load (missing files, unknown class) has the same fix
        raise ChatTemplateUnavailable(
            f"no tokenizer loads from {model_path} ({type(e).__name__}: {e}); {fix}"
        ) from None
    if not getattr(tok, "chat_template", None):
        raise ChatTemplateUnavailable(f"the tokenizer of {model_path} has no chat template; {fix}")
    bos = tok.bos_token or ""

    def render(messages: Messages) -> str:
        text = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return text[len(bos) :] if bos and text.startswith(bos) else text

    return render


def templated(level: LevelPrompts, render: ChatRender) -> LevelPrompts:
    """Every set with its chat-templated text to send, its messages kept (the hashes stay what was asked)."""

    def one(ps: PromptSet) -> PromptSet:
        msgs = ps.messages if ps.messages is not None else [({"role": "user", "content": p},) for p in ps.prompts]
        return replace(ps, templated=[render(m) for m in msgs])

    return LevelPrompts(one(level.warmup), [one(s) for s in level.repeats], level.unique)
