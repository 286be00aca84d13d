"""The key structure of summary.json and crossover.json, to hold them to a recorded contract.

Why key paths and not values: the simulated engine runs in real time, so the figures differ run to run, while a
key that goes missing breaks every reader (the analysis, MLflow, the user's scripts). The items of the lists
that always hold some (`repeats`, `per_level`) are one path (`[]`) with the keys every item has; other lists (flags,
reasons, invalid cells) may be empty and are not descended into. A path counts only where every file of the
recorded run has it, so optional keys (an `attempts` block, a cell's counters) are not part of the contract.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEPTH = 3  # a.b.c: deeper keys (a metric's percentiles, an interpolant's methods) come and go with the data
NON_EMPTY_LISTS = ("repeats", "per_level")


def key_paths(obj: Any, depth: int = DEPTH) -> set[str]:
    """Dotted key paths of `obj` down to `depth` levels of dicts, and below each of `NON_EMPTY_LISTS` the keys
    every item has (`per_level.[].speedup`)."""
    if depth == 0 or not isinstance(obj, dict):
        return set()
    out: set[str] = set()
    for k, v in obj.items():
        out.add(str(k))
        if isinstance(v, dict):
            out |= {f"{k}.{p}" for p in key_paths(v, depth - 1)}
        elif k in NON_EMPTY_LISTS and isinstance(v, list) and v:
            common = set.intersection(*(set(item) if isinstance(item, dict) else set() for item in v))
            out |= {f"{k}.[]"} | {f"{k}.[].{p}" for p in common}
    return out


def common_paths(files: Iterable[Path], depth: int = DEPTH) -> set[str]:
    """The key paths every one of `files` (JSON) has."""
    sets = [key_paths(json.loads(Path(f).read_text()), depth) for f in files]
    if not sets:
        raise ValueError("no files to read a contract from")
    return set.intersection(*sets)


def missing(recorded: Path, files: Iterable[Path], depth: int = DEPTH) -> list[str]:
    """The recorded contract's paths that some of `files` lack."""
    want = set(json.loads(recorded.read_text())["paths"])
    return sorted(want - common_paths(files, depth))
