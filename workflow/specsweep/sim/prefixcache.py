"""A block prefix cache for the simulated engine, as vLLM's and SGLang's work in outline.

Why the simulator has one: a benchmark that resends a prompt measures a warm cache (shorter prefill, lower TTFT)
and not the engine under real traffic. With a cache in the stand-in engine, the pipeline tier shows that cells
are isolated (hit rate near zero) and that a repeated prompt would be caught, on any machine.

A prompt's tokens are cut into blocks of `block_tokens`; block i is identified by the hash of block i and of
every block before it (a prefix), so only a shared prefix can hit. A lookup counts the leading blocks already
cached; the prompt's blocks are then inserted (least recently used blocks are evicted past `capacity_blocks`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

__all__ = ["PrefixCache"]


class PrefixCache:
    """Token-block prefix cache with vLLM-style counters (queried and hit prompt tokens)."""

    def __init__(self, block_tokens: int = 16, capacity_blocks: int = 200_000) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up, since start (like vllm:prefix_cache_queries)
        self.hits = 0  # of which found cached (like vllm:prefix_cache_hits)
        self.resets = 0

    def _keys(self, tokens: list[str]) -> list[bytes]:
        keys, h = [], hashlib.blake2b(digest_size=16)
        for i in range(len(tokens) // self.block_tokens):
            h.update("\x1f".join(tokens[i * self.block_tokens : (i + 1) * self.block_tokens]).encode())
            keys.append(h.copy().digest())
        return keys

    def lookup_and_insert(self, tokens: list[str]) -> int:
        """Prompt tokens served from the cache for `tokens` (whole leading blocks), then cache its blocks."""
        keys = self._keys(tokens)
        hit_blocks = 0
        for k in keys:
            if k not in self._blocks:
                break
            hit_blocks += 1
        for k in keys:
            self._blocks[k] = None
            self._blocks.move_to_end(k)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        cached = hit_blocks * self.block_tokens
        self.queries += len(tokens)
        self.hits += cached
        return cached

    def reset(self) -> None:
        """Drop every cached block (SGLang /flush_cache, vLLM /reset_prefix_cache); counters keep counting."""
        self._blocks.clear()
        self.resets += 1
