"""Reading measured cells (summary.json + requests.parquet) for the analysis, without the metrics module.

The analysis only needs a few per-request quantities; computing them here from the request records keeps it
independent of `specsweep.metrics` (which writes the official point values into summary.json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Cell",
    "RequestArrays",
    "find_cells",
    "load_cell",
    "metric_value",
    "metric_value_any",
    "request_arrays",
]

_LEVEL_DIR = re.compile(r"^c(\d+(?:\.\d+)?)$")


@dataclass
class RequestArrays:
    """Per-request quantities of one cell, pooled over repeats; `repeat` says which run each row came from."""

    repeat: np.ndarray  # int, repeat index
    tokens: np.ndarray  # float, output tokens received
    busy_s: np.ndarray  # float, end_s - send_s: how long the request held a client slot
    ttft_s: np.ndarray  # float, NaN when no token arrived
    e2e_s: np.ndarray  # float, last token - send (NaN when no token arrived)
    tpot_s: np.ndarray  # float, (e2e - ttft) / (tokens - 1), NaN when tokens < 2
    ok: np.ndarray  # bool

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class Cell:
    """One measured cell: its summary and (when present) its request records."""

    arm: str
    concurrency: float
    path: Path  # the cell directory
    summary: dict[str, Any]
    requests: RequestArrays | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The summary's cell key, else `<variant dir>/<arm>/c<C>` (distinct across variants)."""
        key = self.summary.get("cell", {}).get("key")
        return str(key) if key else f"{self.path.parent.parent.name}/{self.arm}/c{_fmt_c(self.concurrency)}"

    @property
    def valid(self) -> bool:
        return bool(self.summary.get("validity", {}).get("valid", True))

    @property
    def invalid_reasons(self) -> list[str]:
        return [str(r) for r in self.summary.get("validity", {}).get("reasons", [])]

    @property
    def source(self) -> str:
        return str(self.summary.get("source", "unknown"))


def _fmt_c(c: float) -> str:
    return str(int(c)) if float(c).is_integer() else str(c)


def metric_value(summary: dict[str, Any], path: str) -> float:
    """A dotted path into summary['metrics'] (e.g. 'tpot_s.p99'), NaN when absent or not a number."""
    node: Any = summary.get("metrics", {})
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return float("nan")
        node = node[part]
    try:
        return float(node)
    except (TypeError, ValueError):
        return float("nan")


def metric_value_any(summary: dict[str, Any], paths: tuple[tuple[str, float], ...]) -> float:
    """The first present of several (path, factor) spellings of a metric, times its factor; NaN if none."""
    for path, factor in paths:
        v = metric_value(summary, path)
        if np.isfinite(v):
            return v * factor
    return float("nan")


def request_arrays(df: Any) -> RequestArrays:
    """Derive the per-request quantities from a requests.parquet frame (see docs/ARCHITECTURE.md)."""
    n = len(df)
    send = df["send_s"].to_numpy(dtype=float)
    end = df["end_s"].to_numpy(dtype=float)
    first = df["first_token_s"].to_numpy(dtype=float) if "first_token_s" in df else np.full(n, np.nan)
    if "chunk_s" in df:
        last = np.array([float(x[-1]) if x is not None and len(x) else np.nan for x in df["chunk_s"]])
    else:
        last = np.full(n, np.nan)
    last = np.where(np.isfinite(last), last, np.where(np.isfinite(first), end, np.nan))
    if "output_tokens" in df:
        tokens = df["output_tokens"].to_numpy(dtype=float)
    else:
        tokens = np.array([float(np.sum(x)) if x is not None else 0.0 for x in df["chunk_tokens"]])
    ok = df["ok"].to_numpy(dtype=bool) if "ok" in df else np.ones(n, dtype=bool)
    repeat = df["repeat"].to_numpy(dtype=int) if "repeat" in df else np.zeros(n, dtype=int)
    ttft = first - send
    e2e = last - send
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens >= 2, (e2e - ttft) / (tokens - 1.0), np.nan)
    return RequestArrays(repeat=repeat, tokens=tokens, busy_s=end - send, ttft_s=ttft, e2e_s=e2e, tpot_s=tpot, ok=ok)


def load_cell(cell_dir: str | Path, arm: str | None = None, concurrency: float | None = None) -> Cell:
    """Load one cell directory (summary.json required, requests.parquet optional)."""
    cell_dir = Path(cell_dir)
    if cell_dir.name == "summary.json":  # an explicit summary path names its cell directory too
        cell_dir = cell_dir.parent
    summary_path = cell_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    meta = summary.get("cell", {})
    arm = arm or meta.get("arm") or cell_dir.parent.name
    if concurrency is None:
        concurrency = meta.get("concurrency")
        if concurrency is None:
            m = _LEVEL_DIR.match(cell_dir.name)
            if not m:
                raise ValueError(f"cannot tell the concurrency of {cell_dir}")
            concurrency = float(m.group(1))
    cell = Cell(arm=str(arm), concurrency=float(concurrency), path=cell_dir, summary=summary)
    parquet = cell_dir / "requests.parquet"
    if parquet.exists():
        import pandas as pd

        cell.requests = request_arrays(pd.read_parquet(parquet))
    else:
        cell.notes.append("requests.parquet missing: point values only, no interval")
    return cell


def find_cells(
    cells_root: str | Path, arms: list[str] | None = None, levels: list[float] | None = None
) -> dict[str, dict[float, Path]]:
    """Cell directories under `<cells_root>/<arm>/c<C>/summary.json`, filtered to configured arms/levels."""
    root = Path(cells_root)
    out: dict[str, dict[float, Path]] = {}
    for summary in sorted(root.glob("*/c*/summary.json")):
        m = _LEVEL_DIR.match(summary.parent.name)
        if not m:
            continue
        arm, c = summary.parent.parent.name, float(m.group(1))
        if arms is not None and arm not in arms:
            continue
        if levels is not None and c not in {float(x) for x in levels}:
            continue
        out.setdefault(arm, {})[c] = summary.parent
    return out
