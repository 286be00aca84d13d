"""A measured level as files: `summary.json` (built here, and only here) and `requests.parquet`.

Used by the pipeline's cell runner, `specsweep bench` and the synthetic-data writer, so that every summary
has one layout (docs/ARCHITECTURE.md "Cell outputs"). Writing is atomic, summary last: its presence means the
cell is complete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from pyarrow.parquet import write_table as pq_write

from specsweep.client.backends import RequestSpec
from specsweep.client.cpu import CpuPlan, format_cpus
from specsweep.client.loadgen import LevelResult, arrow_table
from specsweep.client.prompts import LevelPrompts
from specsweep.io import atomic_path
from specsweep.metrics import jsonable, summarize

__all__ = ["SCHEMA_VERSION", "cell_identity", "cell_key", "level_summary", "summary_body", "write_cell"]

SCHEMA_VERSION = 2


def cell_key(experiment: str, variant: str, arm: str, concurrency: int) -> str:
    """The key that names a cell everywhere (summaries, MLflow, the analysis): `exp/variant/arm/cC`."""
    return f"{experiment}/{variant}/{arm}/c{int(concurrency)}"


def cell_identity(experiment: str, variant: str, arm: str, concurrency: int, speculative: bool) -> dict[str, Any]:
    """summary.json's `cell` block."""
    return {
        "experiment": experiment,
        "variant": variant,
        "arm": arm,
        "concurrency": int(concurrency),
        "key": cell_key(experiment, variant, arm, concurrency),
        "speculative": bool(speculative),
    }


def summary_body(
    records: pd.DataFrame,
    concurrency: int,
    gates: dict[str, Any],
    slos: dict[str, float] | None = None,
    repeats: list[dict[str, Any]] | None = None,
    server_max_running: int | None = None,
    workload: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The measured part of summary.json from request records (`metrics.summarize`): the one builder used by the
    cell runner and `bench` (through `level_summary`) and by the synthetic-data writer."""
    s = summarize(records, concurrency, gates, slos, repeats, server_max_running)
    return {
        "schema_version": SCHEMA_VERSION,
        "concurrency": int(concurrency),
        "workload": dict(workload or {}),
        "metrics": s["metrics"],
        "repeats": s["repeats"],
        "validity": s["validity"],
        **(extra or {}),
    }


def level_summary(
    level: LevelResult,
    prompts: LevelPrompts,
    spec: RequestSpec,
    output_tokens: Any,
    gates: dict[str, float],
    slos: dict[str, float] | None = None,
    server_max_running: int | None = None,
    extra: dict[str, Any] | None = None,
    cpus: CpuPlan | None = None,
) -> dict[str, Any]:
    """The summary.json body for one measured level (the cell runner adds `cell`, `server`, `source`...)."""
    meta = [
        {
            "lag": r.lag_samples,
            "idle_lag": r.idle_lag_samples,
            "client": {
                **r.client,
                "cpus": format_cpus(cpus.client) if cpus else None,
                "shared_cpus": format_cpus(cpus.shared) if cpus else None,
            },
            "counters": r.counters,
        }
        for r in level.repeats
    ]
    workload = {
        "backend": spec.backend,
        "endpoint": spec.endpoint if spec.backend == "openai" else "generate",
        "transport": spec.transport,
        "n_requests": level.n_requests,
        "ramp_requests": level.concurrency if level.stagger else 0,
        "stagger": level.stagger,
        "output_tokens": output_tokens,
        "temperature": spec.temperature,
        "request_timeout_s": spec.request_timeout_s,
        "repeats": len(level.repeats),
        **prompts.describe(),
    }
    s = summary_body(
        level.records,
        level.concurrency,
        gates,
        slos,
        meta,
        server_max_running,
        workload,
        {"t0_unix": level.t0_unix, **(extra or {})},
    )
    for rep_out, rep in zip(s["repeats"], level.repeats, strict=False):
        rep_out["t0_unix"] = rep.t0_unix
        rep_out["cache_reset"] = rep.cache_reset
        rep_out["prompt_set_sha256"] = rep.prompts.sha256 if rep.prompts is not None else None
    if level.warmup_errors:
        s["validity"]["flags"].append(f"{level.warmup_errors} warm-up request(s) failed")
    if not prompts.unique:
        s["validity"]["flags"].append("the prompts file is shorter than the level needs: prompts repeat")
    return jsonable(s)


def write_cell(out_dir: str | Path, records_df: pd.DataFrame, summary: dict[str, Any]) -> tuple[Path, Path]:
    """Write `requests.parquet`, then `summary.json` (last: its presence means the cell is complete)."""
    out = Path(out_dir)
    pq, sj = out / "requests.parquet", out / "summary.json"
    with atomic_path(pq) as tmp:
        pq_write(arrow_table(records_df), str(tmp))
    with atomic_path(sj) as tmp:
        tmp.write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return pq, sj
