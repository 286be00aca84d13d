"""Synthetic cells with a known truth, for the analysis tests and for trying the analysis without a server.

A closed loop of C slots; each request's end-to-end time is lognormal around a mean with a known value, so the
true aggregate throughput is C * tokens / mean_e2e (Little's law) and the true speedup between two arms is the
ratio of their means.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsweep.analysis.bootstrap import METRICS, _estimate
from specsweep.analysis.cells import request_arrays
from specsweep.io import atomic_write_text

__all__ = ["synthetic_requests", "write_synthetic_cell", "write_synthetic_variant"]


def synthetic_requests(
    concurrency: int,
    n_requests: int,
    tokens: int,
    mean_e2e_s: float,
    sigma: float,
    rng: np.random.Generator,
    repeats: int = 1,
    ttft_frac: float = 0.05,
    tokens_per_chunk: int = 1,
) -> pd.DataFrame:
    """Request records (the requests.parquet columns) of a closed loop with lognormal end-to-end times."""
    rows: list[dict[str, Any]] = []
    for r in range(repeats):
        e2e = mean_e2e_s * rng.lognormal(-0.5 * sigma**2, sigma, size=n_requests)  # mean exactly mean_e2e_s
        slot_free = np.zeros(concurrency)
        for i in range(n_requests):
            j = int(np.argmin(slot_free))
            send = float(slot_free[j])
            first = send + ttft_frac * e2e[i]
            end = send + e2e[i]
            n_chunks = max(1, math.ceil(tokens / tokens_per_chunk))
            chunk_tokens = [tokens_per_chunk] * (n_chunks - 1) + [tokens - tokens_per_chunk * (n_chunks - 1)]
            chunk_s = list(np.linspace(first, end, n_chunks))
            slot_free[j] = end
            rows.append(
                {
                    "repeat": r,
                    "request_index": i,
                    "prompt_index": i,
                    "send_s": send,
                    "first_token_s": first,
                    "end_s": end,
                    "chunk_s": chunk_s,
                    "chunk_tokens": chunk_tokens,
                    "server_chunk_s": [],
                    "input_tokens": 128,
                    "output_tokens": tokens,
                    "server_output_tokens": tokens,
                    "expected_output_tokens": tokens,
                    "spec_verify_ct": -1,
                    "ok": True,
                    "error_kind": "",
                    "error": "",
                }
            )
    return pd.DataFrame(rows)


def _summary_metrics(df: pd.DataFrame, concurrency: float, layout: str = "metrics") -> dict[str, Any]:
    """Point metrics from the bootstrap's own estimators, in summary.json's layout.

    layout "metrics": the names specsweep.metrics writes (output_tok_s_steady, request_tok_s, *_ms);
    layout "seconds": the seconds-based names (aggregate_tok_s, per_request_tok_s, *_s). The analysis reads
    both.
    """
    req = request_arrays(df)
    idx = np.arange(len(req))[None, :]
    est = _estimate(req, concurrency, idx, np.ones_like(idx, dtype=bool), None)
    v = {m.name: float(est[m.name][0]) for m in METRICS if m.name in est}
    ttft = req.ttft_s[req.ok]
    ttft50 = float(np.nanmedian(ttft)) if ttft.size else None
    if layout == "seconds":
        return {
            "aggregate_tok_s": v["aggregate_tok_s"],
            "aggregate_tok_s_total": v["aggregate_tok_s"],
            "per_request_tok_s": {"mean": v["per_request_tok_s_mean"]},
            "tpot_s": {"p50": v["tpot_p50_s"], "p99": v["tpot_p99_s"]},
            "ttft_s": {"p50": ttft50},
            "e2e_s": {"p50": v["e2e_p50_s"]},
        }
    return {
        "output_tok_s_steady": v["aggregate_tok_s"],
        "output_tok_s_total": v["aggregate_tok_s"],
        "request_tok_s": {"mean": v["per_request_tok_s_mean"]},
        "tpot_ms": {"p50": 1e3 * v["tpot_p50_s"], "p99": 1e3 * v["tpot_p99_s"]},
        "ttft_ms": {"p50": None if ttft50 is None else 1e3 * ttft50},
        "e2e_ms": {"p50": 1e3 * v["e2e_p50_s"]},
    }


def write_synthetic_cell(
    variant_dir: str | Path,
    arm: str,
    concurrency: int,
    df: pd.DataFrame,
    *,
    experiment: str = "synthetic",
    variant: str = "synthetic",
    valid: bool = True,
    reasons: list[str] | None = None,
    accept_length: float | None = None,
    source: str = "simulated",
    engine: str = "sim",
    layout: str = "metrics",
) -> Path:
    """Write `<variant_dir>/<arm>/c<C>/{requests.parquet,summary.json}` and return the cell directory."""
    d = Path(variant_dir) / arm / f"c{concurrency}"
    d.mkdir(parents=True, exist_ok=True)
    df.to_parquet(d / "requests.parquet", index=False)
    metrics = _summary_metrics(df, concurrency, layout)
    if accept_length is not None:
        metrics["accept_length"] = accept_length
    summary = {
        "schema_version": 1,
        "cell": {
            "experiment": experiment,
            "variant": variant,
            "arm": arm,
            "concurrency": concurrency,
            "key": f"{variant}/{arm}/c{concurrency}",
        },
        "source": source,
        "engine": engine,
        "metrics": metrics,
        "repeats": [],
        "validity": {"valid": valid, "reasons": list(reasons or []), "flags": []},
    }
    atomic_write_text(d / "summary.json", json.dumps(summary, indent=1))
    return d


def write_synthetic_variant(
    variant_dir: str | Path,
    levels: list[int],
    speedup: Callable[[float], float],
    *,
    spec_arm: str = "eagle3",
    tokens: int = 64,
    sigma: float = 0.3,
    requests_per_level: Callable[[int], int] = lambda c: max(8, 2 * c),
    base_tpot_s: Callable[[float], float] = lambda c: 0.01 + 0.0004 * c,
    seed: int = 0,
    invalid: tuple[tuple[str, int], ...] = (),
    repeats: int = 1,
    experiment: str = "synthetic",
    variant: str = "synthetic",
    layout: str = "metrics",
) -> None:
    """A baseline and a speculative arm whose true throughput ratio at level C is `speedup(C)`."""
    rng = np.random.default_rng(seed)
    for c in levels:
        base_e2e = tokens * base_tpot_s(c)
        for arm, mean in (("baseline", base_e2e), (spec_arm, base_e2e / speedup(c))):
            df = synthetic_requests(c, requests_per_level(c), tokens, mean, sigma, rng, repeats=repeats)
            bad = (arm, c) in invalid
            write_synthetic_cell(
                variant_dir,
                arm,
                c,
                df,
                experiment=experiment,
                variant=variant,
                valid=not bad,
                reasons=["client_lag"] if bad else None,
                layout=layout,
                accept_length=(2.5 - 0.1 * math.log(c)) if arm != "baseline" else None,
            )
