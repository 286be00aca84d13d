"""Open-loop arrival schedules: Poisson or gamma (bursty) request times by seed, and Mooncake trace replay.

Why a schedule computed up front: an open loop sends each request at its planned time whatever the server
does, so the plan is a pure function of (rate, shape, count, seed) or of the trace file and its time scale.
Every arm and variant then receives the same requests at the same offsets (the comparison stays paired), and a
request's lateness (sent - planned) measures the client, not the server.

Gamma inter-arrival times with shape k and mean 1/rate have a coefficient of variation 1/sqrt(k): k = 1 is
Poisson, k < 1 burstier, k > 1 smoother (vLLM `bench serve --burstiness` uses the same parameterization).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specsweep.client.prompts import WORDS, PromptSet, set_seed

__all__ = [
    "ARRIVALS",
    "ArrivalPlan",
    "Trace",
    "TraceError",
    "gamma_times",
    "load_mooncake_trace",
    "expected_prefix_share",
    "trace_plan",
    "trace_prompts",
]

ARRIVALS = ("poisson", "gamma")
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake traces count prefix blocks (`hash_ids`) of 512 tokens


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file, line, field and the fix."""


@dataclass
class ArrivalPlan:
    """When each request of a level is sent (seconds from the level's start) and, for traces, its lengths."""

    times_s: list[float]
    input_tokens: list[int] | None = None  # per request (traces); None: the workload's
    output_tokens: list[int] | None = None
    prefix_blocks: list[list[int]] | None = None  # Mooncake hash ids: requests sharing ids share a prefix
    source: str = "poisson"
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.times_s)

    @property
    def offered_rate_rps(self) -> float | None:
        """Requests per second over the plan's span (n-1 gaps over first-to-last); None for one request."""
        if len(self.times_s) < 2 or self.times_s[-1] <= self.times_s[0]:
            return None
        return (len(self.times_s) - 1) / (self.times_s[-1] - self.times_s[0])


def gamma_times(rate_rps: float, n: int, seed: int, shape: float = 1.0) -> list[float]:
    """`n` send times with gamma(shape) inter-arrival gaps of mean 1/rate; the first request at 0.

    shape 1 is a Poisson process. The gaps come from a seeded generator, so every arm gets the same times."""
    if not rate_rps > 0 or not shape > 0:
        raise ValueError(f"rate ({rate_rps}) and shape ({shape}) must be > 0")
    if n <= 0:
        return []
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape, 1.0 / (shape * rate_rps), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


@dataclass
class Trace:
    """A Mooncake-format trace: per request its timestamp (ms), input and output length, prefix hash ids."""

    path: str
    timestamps_ms: list[float]
    input_tokens: list[int]
    output_tokens: list[int]
    hash_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.timestamps_ms)

    @property
    def duration_s(self) -> float:
        return (max(self.timestamps_ms) - min(self.timestamps_ms)) / 1e3 if self.timestamps_ms else 0.0


def _field(obj: dict, key: str, path: Path, lineno: int, kind: type, required: bool = True) -> object:
    """One field of a trace line, type-checked, with an error naming the file, line and field."""
    if key not in obj:
        if not required:
            return None
        raise TraceError(
            f"{path}:{lineno}: missing field '{key}' (Mooncake trace lines carry timestamp, "
            "input_length, output_length and optionally hash_ids)"
        )
    v = obj[key]
    if kind is float and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
        return float(v)
    if kind is int and isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return v
    if kind is list and isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    want = {float: "a number >= 0", int: "an integer >= 1", list: "a list of integers"}[kind]
    raise TraceError(f"{path}:{lineno}: field '{key}' must be {want}, got {v!r}")


def load_mooncake_trace(path: str | Path) -> Trace:
    """Read a Mooncake trace (JSONL: `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [..]}`).

    Checked whole before anything is sent: a bad line stops the run with its file, line and field. Lines are
    kept in file order; timestamps need not start at 0 (the replay starts at the first)."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file {p} does not exist; fix load.trace.path")
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    ids: list[list[int]] = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise TraceError(
                    f"{p}:{lineno}: not JSON ({e}); a Mooncake trace has one JSON object per line"
                ) from None
            if not isinstance(obj, dict):
                raise TraceError(f"{p}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            ts.append(_field(obj, "timestamp", p, lineno, float))  # type: ignore[arg-type]
            ins.append(_field(obj, "input_length", p, lineno, int))  # type: ignore[arg-type]
            outs.append(_field(obj, "output_length", p, lineno, int))  # type: ignore[arg-type]
            ids.append(_field(obj, "hash_ids", p, lineno, list, required=False) or [])  # type: ignore[arg-type]
    if not ts:
        raise TraceError(f"{p}: no requests (an empty trace); give a Mooncake JSONL trace with one request per line")
    if any(b < a for a, b in zip(ts, ts[1:], strict=False)):
        bad = next(i for i, (a, b) in enumerate(zip(ts, ts[1:], strict=False)) if b < a) + 2
        raise TraceError(f"{p}: timestamps go backwards at request {bad}; sort the trace by 'timestamp'")
    return Trace(str(p), ts, ins, outs, ids)


def trace_plan(trace: Trace, time_scale: float = 1.0, max_requests: int | None = None) -> ArrivalPlan:
    """The trace on its own clock, times divided by `time_scale` (2 replays it twice as fast), from 0.

    `max_requests` keeps the first requests only (a long production trace, replayed in part)."""
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    n = len(trace) if max_requests is None else min(len(trace), max_requests)
    t0 = trace.timestamps_ms[0]
    times = [(t - t0) / 1e3 / time_scale for t in trace.timestamps_ms[:n]]
    return ArrivalPlan(
        times,
        list(trace.input_tokens[:n]),
        list(trace.output_tokens[:n]),
        [list(h) for h in trace.hash_ids[:n]],
        source="trace",
        meta={"trace_path": trace.path, "time_scale": time_scale, "trace_requests": len(trace)},
    )


def expected_prefix_share(plan: ArrivalPlan, block_tokens: int) -> float:
    """Share of the plan's prompt tokens inside a prefix block an earlier request of the plan already sent:
    what an engine's prefix cache may serve within one replay (the trace's own reuse, not an earlier cell's)."""
    if not plan.prefix_blocks or not plan.input_tokens:
        return 0.0
    seen: set[int] = set()
    shared = total = 0
    for blocks, n in zip(plan.prefix_blocks, plan.input_tokens, strict=True):
        covered = 0
        for b in blocks:
            if covered >= n or b not in seen:
                break
            covered += block_tokens
        shared += min(covered, n)
        total += n
        seen.update(blocks)
    return shared / total if total else 0.0


def _block_words(block: int, tag: str, seed: int, block_tokens: int) -> list[str]:
    """The words of one prefix block: a function of (cell tag, block id), so requests of one replay that name
    the same block share it, and no block is shared with another cell (whose tag differs)."""
    rng = random.Random(set_seed(seed, f"{tag}b{block}"))
    return [f"{tag}b{block}"] + [rng.choice(WORDS) for _ in range(block_tokens - 1)]


def trace_prompts(plan: ArrivalPlan, seed: int, tag: str, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> PromptSet:
    """The trace's prompts: request i's words are its prefix blocks' words, then words of its own, cut to its
    input length (one word per token: exact on the simulated engine; real engines report their own count)."""
    if plan.input_tokens is None:
        raise ValueError("a trace plan carries per-request input lengths")
    texts, counts = [], []
    for i, n in enumerate(plan.input_tokens):
        words: list[str] = []
        for b in (plan.prefix_blocks or [[]] * len(plan))[i]:
            if len(words) >= n:
                break
            words += _block_words(b, tag, seed, block_tokens)
        rng = random.Random(set_seed(seed, f"{tag}r{i}"))
        if len(words) < n:
            words += [f"{tag}r{i}"] + [rng.choice(WORDS) for _ in range(n - len(words) - 1)]
        words = words[:n]
        texts.append(" ".join(words))
        counts.append(len(words))
    outs: list[int | None] = list(plan.output_tokens) if plan.output_tokens is not None else [None] * len(texts)
    return PromptSet(texts, counts, outs, f"trace:{plan.meta.get('trace_path')}", "words", False, seed, {"tag": tag})
