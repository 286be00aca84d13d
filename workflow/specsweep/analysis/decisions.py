"""Decisions about what to measure, kept while what they were decided on is unchanged.

A refinement round (which levels to add) and a schedule (what the policy arm serves) are decisions about what
to measure next. Re-judging the same cells with other gates or bootstrap settings must not re-decide them: a
bootstrap edit could move an added level or a threshold by one and so measure new cells, which issue 12's
"re-analysis never re-measures" forbids. A decision is stored under a key made of its own settings and the
bytes of every cell it judged; the same key finds the same decision.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specsweep.io import atomic_write_json, read_json

__all__ = ["decision_key", "keep", "kept"]


def decision_key(settings: Any, summaries: Sequence[Path]) -> str:
    """What a decision depends on: its settings and the bytes of every cell it judged."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in sorted(Path(p) for p in summaries):
        h.update(str(path).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:20]


def _path(store: Path, name: str, key: str) -> Path:
    return store / ".decisions" / f"{name}-{key}.json"


def kept(store: Path, name: str, key: str) -> Any | None:
    """The decision made before on the same key, or None."""
    path = _path(store, name, key)
    return read_json(path) if path.is_file() else None


def keep(store: Path, name: str, key: str, decision: Any) -> None:
    atomic_write_json(_path(store, name, key), decision)
