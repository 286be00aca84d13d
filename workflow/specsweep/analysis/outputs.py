"""Same answer, only faster? The share of a speculative cell's outputs that equal the baseline's.

Speculative decoding is lossless at temperature 0: for the same prompt it must generate what plain decoding
generates. A broken draft or verify path can produce different text faster and win a throughput race, so each
request's output is recorded (hash and head, `requests.parquet` `output_sha256`, `output_prefix`) and each
speculative cell is compared with the baseline cell of the same level, prompt by prompt (the prompt sets are
the same in every arm: `client/prompts.py`). Exact equality is not guaranteed on GPUs (batch-size dependent
kernels), so a low share is reported and flagged (`analysis.min_output_match`), not made invalid.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

__all__ = ["OUTPUT_COLUMNS", "output_match"]

OUTPUT_COLUMNS = ("repeat", "prompt_index", "expected_output_tokens", "ok", "output_sha256", "output_prefix")


def _recorded(df: pd.DataFrame | None) -> pd.DataFrame | None:
    if df is None or "output_sha256" not in df:
        return None
    out = df[df["ok"] & (df["output_sha256"] != "")]
    return out if len(out) else None


def output_match(baseline: pd.DataFrame | None, spec: pd.DataFrame | None) -> dict[str, Any] | None:
    """{share, compared, differ, first_difference, example} over the prompts both cells completed with the
    same requested length; None when either cell recorded no outputs (older cells, virtual-time cells)."""
    b, s = _recorded(baseline), _recorded(spec)
    if b is None or s is None:
        return None
    m = s.merge(b, on=["repeat", "prompt_index"], suffixes=("", "_base"))
    m = m[m["expected_output_tokens"] == m["expected_output_tokens_base"]]
    if m.empty:
        return None
    same = (m["output_sha256"] == m["output_sha256_base"]).to_numpy()
    out: dict[str, Any] = {
        "share": float(same.mean()),
        "compared": int(len(m)),
        "differ": int((~same).sum()),
        "first_difference": None,
        "example": None,
    }
    if out["differ"]:
        bad = m[~same]
        positions = [
            len(os.path.commonprefix([a, c]))
            for a, c in zip(bad["output_prefix"], bad["output_prefix_base"], strict=True)
        ]
        i = min(range(len(positions)), key=positions.__getitem__)
        pos, row = positions[i], bad.iloc[i]
        # a difference past the recorded head shows as its length: "at or after" that character
        out["first_difference"] = {
            "char": pos,
            "beyond_prefix": pos >= min(len(row["output_prefix"]), len(row["output_prefix_base"])),
        }
        out["example"] = {
            "repeat": int(row["repeat"]),
            "prompt_index": int(row["prompt_index"]),
            "baseline": row["output_prefix_base"][max(0, pos - 20) : pos + 40],
            "spec": row["output_prefix"][max(0, pos - 20) : pos + 40],
        }
    return out
