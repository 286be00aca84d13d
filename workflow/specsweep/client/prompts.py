"""Seeded prompt sets: the same prompts, by seed, in every arm, at an exact token length where possible.

Token length is made exact with the first tokenizer that can be had, in this order:
1. the server's `POST /tokenize {"prompt": text}` -> `{"count": n}` (vLLM's and the simulated engine's shape);
2. the model's `tokenizer.json` through the optional `tokenizers` package;
3. otherwise an approximation: one token per whitespace word (exact for the simulated engine, and close for
   real BPE tokenizers on the short common English words used here).
"""

from __future__ import annotations

import hashlib
import json
import random
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

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
OutputSpec = int | dict[str, Any] | None  # workload.output_tokens: fixed, or {"uniform": [lo, hi]}


@dataclass
class PromptSet:
    """Prompts plus what is known about them. `sha256` identifies the set in every summary."""

    prompts: list[str]
    input_tokens: list[int]  # token count per prompt (exact when `exact`, else the approximation)
    output_tokens: list[int | None]  # per-prompt output length from a prompts file (None: use the level's)
    source: str  # "synthetic" or the prompts file path
    tokenizer: str  # "server", "tokenizers", "words" (approximation) or "file"
    exact: bool
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def sha256(self) -> str:
        return prompt_set_hash(self.prompts, self.output_tokens)

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
        }


def prompt_set_hash(prompts: list[str], output_tokens: list[int | None] | None = None) -> str:
    """sha256 over a canonical JSON of the prompts (and per-prompt output lengths when given)."""
    outs = output_tokens or [None] * len(prompts)
    canon = json.dumps([[p, o] for p, o in zip(prompts, outs, strict=True)], ensure_ascii=False)
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
    if isinstance(spec, int | None) or spec is None:
        return [None] * n
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
    """Add or drop words until the tokenizer says `target` tokens; returns the text and its final count."""
    words = list(words)
    n = await count(" ".join(words))
    for _ in range(64):
        if n == target:
            break
        if n < target:
            words.extend(pool.choice(WORDS) for _ in range(max(1, (target - n) // 2)))
        else:
            drop = max(1, (n - target) // 2)
            if len(words) - drop < 1:
                break
            del words[-drop:]
        n = await count(" ".join(words))
    return " ".join(words), n


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
    """Call `build(tokenizer, name)` with the first tokenizer that works (see module doc)."""
    if url:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            tok = server_tokenizer(s, url, model, headers)
            if await _works(tok):
                return await build(tok, "server")
    if tokenizer_path:
        try:
            ftok: Tokenizer | None = file_tokenizer(tokenizer_path)
        except Exception:  # any failure (package missing, file unreadable) means: fall back
            ftok = None
        if ftok is not None:
            return await build(ftok, "tokenizers")
    return await build(None, "words")


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
        return {
            **first,
            "prompt_set_sha256": prompt_set_hash(
                [p for s in self.repeats for p in s.prompts], [o for s in self.repeats for o in s.output_tokens]
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
    prompts_file: str | Path | None = None,
    url: str | None = None,
    model: str | None = None,
    tokenizer_path: str | None = None,
    headers: dict[str, str] | None = None,
) -> LevelPrompts:
    """The warm-up set and the measured sets of one level (see LevelPrompts), fitted with one tokenizer."""
    if prompts_file:
        return _file_level_prompts(Path(prompts_file), concurrency, n_per_repeat, repeats, n_warmup, seed, output)

    async def build(tok: Tokenizer | None, name: str) -> LevelPrompts:
        async def one(n: int, tag: str, out: OutputSpec) -> PromptSet:
            return await make_prompts(n, input_tokens, set_seed(seed, tag), tok, name, tag, out)

        warm = await one(n_warmup, warmup_tag(concurrency), None)  # warm-up lengths are the caller's (short)
        sets = [await one(n_per_repeat, cell_tag(concurrency, r), output) for r in range(repeats)]
        return LevelPrompts(warm, sets, unique=True)

    return await _with_tokenizer(build, url, model, tokenizer_path, headers)


def _file_level_prompts(
    path: Path, concurrency: int, n_per_repeat: int, repeats: int, n_warmup: int, seed: int, output: OutputSpec
) -> LevelPrompts:
    """A prompts file split into disjoint sets where it is long enough; cycled (and said so) where not."""
    base = load_prompts_file(path)
    n = len(base)
    need = n_warmup + repeats * n_per_repeat
    start = set_seed(seed, f"c{concurrency}") % n  # levels start at different places in the file

    def take(offset: int, count: int, tag: str) -> PromptSet:
        idx = [(start + offset + i) % n for i in range(count)]
        outs = [base.output_tokens[i] for i in idx]
        if all(o is None for o in outs):
            outs = output_lengths(count, output, set_seed(seed, tag))
        return PromptSet(
            [base.prompts[i] for i in idx],
            [base.input_tokens[i] for i in idx],
            outs,
            base.source,
            "words",
            False,
            None,
            {"tag": tag},
        )

    sets = [take(n_warmup + r * n_per_repeat, n_per_repeat, cell_tag(concurrency, r)) for r in range(repeats)]
    return LevelPrompts(take(0, n_warmup, warmup_tag(concurrency)), sets, unique=need <= n)


def load_prompts_file(path: str | Path, n_prompts: int | None = None) -> PromptSet:
    """JSONL prompts: `{"prompt": "...", "output_tokens": N?}` per line; cycled to `n_prompts` if shorter."""
    prompts: list[str] = []
    outs: list[int | None] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                prompts.append(str(obj["prompt"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a 'prompt': {e}") from None
            o = obj.get("output_tokens")
            outs.append(int(o) if o is not None else None)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    if n_prompts is not None and n_prompts > len(prompts):
        prompts = [prompts[i % len(prompts)] for i in range(n_prompts)]
        outs = [outs[i % len(outs)] for i in range(n_prompts)]
    counts = [len(p.split()) for p in prompts]
    return PromptSet(prompts, counts, outs, str(path), "words", False, None)
