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
from specsweep.client.loadgen import RECORD_SCHEMA, LevelResult, arrow_table
from specsweep.client.prompts import LevelPrompts
from specsweep.engines import served_as_asked
from specsweep.io import atomic_path
from specsweep.measure.gates import judge
from specsweep.measure.metrics import jsonable, measure_summary
from specsweep.records import SUMMARY_FIX, CellSummary, MeasuredLevel, RecordError, check
from specsweep.records.summary import SUMMARY_SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "cell_identity",
    "cell_key",
    "cell_level",
    "cell_step",
    "level_step",
    "judged",
    "level_summary",
    "read_judged",
    "read_records",
    "read_summary",
    "summary_body",
    "write_cell",
]

SCHEMA_VERSION = SUMMARY_SCHEMA_VERSION  # 3: no validity or goodput stored (judged when read)


def cell_key(experiment: str, variant: str, arm: str, concurrency: int, level: str | None = None) -> str:
    """The key that names a cell everywhere (summaries, MLflow, the analysis): `exp/variant/arm/cC`, or the
    open or trace level's folder name (`r2.5`, `t1`) in place of `cC`."""
    return f"{experiment}/{variant}/{arm}/{level or f'c{int(concurrency)}'}"


def cell_identity(
    experiment: str,
    variant: str,
    arm: str,
    concurrency: int,
    speculative: bool,
    load: str = "closed",
    level: float | None = None,
) -> dict[str, Any]:
    """summary.json's `cell` block. Open and trace cells add their load mode and level (requests/s, time
    scale); their `concurrency` is the in-flight cap."""
    from specsweep.config import level_name

    name = level_name(load, level) if load != "closed" and level is not None else None
    out = {
        "experiment": experiment,
        "variant": variant,
        "arm": arm,
        "concurrency": int(concurrency),
        "key": cell_key(experiment, variant, arm, concurrency, name),
        "speculative": bool(speculative),
    }
    if name is not None:
        out.update(load=load, level=level)
    return out


def cell_level(cell: dict[str, Any]) -> float:
    """A summary's `cell` block -> its level: C (closed loop), requests/s (open) or time scale (trace)."""
    return float(cell["level"]) if cell.get("level") is not None else float(cell["concurrency"])


STEP_SCALE = {"closed": 1, "open": 1000, "trace": 1000}  # MLflow steps are integers: C, or 1000 x rate / scale


def level_step(level: float, load: str = "closed") -> int:
    """The MLflow step of a level: C itself, or 1000 x the open level's requests/s (trace: time scale)."""
    return int(round(float(level) * STEP_SCALE[load]))


def cell_step(cell: dict[str, Any]) -> int:
    """The MLflow step of a summary's `cell` block (`level_step` of its level)."""
    return level_step(cell_level(cell), cell.get("load", "closed"))


def summary_body(
    records: pd.DataFrame,
    concurrency: int,
    repeats: list[dict[str, Any]] | None = None,
    server_max_running: int | None = None,
    workload: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The measured part of summary.json from request records (`metrics.measure_summary`): the one builder
    used by the cell runner and `bench` (through `level_summary`) and by the synthetic-data writer.

    It holds no validity and no goodput: those are judgements under the experiment's gates and SLOs, made
    by `judged` whenever the cell is read, so changing a gate or an SLO never re-measures a cell.
    """
    s = measure_summary(records, concurrency, repeats)
    return {
        "schema_version": SCHEMA_VERSION,
        "concurrency": int(concurrency),
        "workload": dict(workload or {}),
        "metrics": s["metrics"],
        "repeats": s["repeats"],
        "server_max_running": server_max_running,
        "measurement": {"reasons": [], "flags": []},
        **(extra or {}),
    }


def judged(
    summary: dict[str, Any],
    records: pd.DataFrame,
    gates: dict[str, Any],
    slos: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    """summary.json judged by `gates` and `slos` (`gates.judge`): the same layout with `validity`, goodput
    and `judged_with` filled in. The measuring process's own `measurement.reasons` (a cell it knows to be
    broken) invalidate whatever the gates; its `measurement.flags` are shown beside the gates' flags. A server
    that reports not doing what its command asked (fusion, adaptive speculation: `engines.served_as_asked`)
    invalidates the cell too."""
    version = summary.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{summary.get('cell', {}).get('key', 'a cell')}: summary.json schema {version} is not {SCHEMA_VERSION}; "
            "re-measure it (snakemake --forcerun <its summary.json>)"
        )
    slos = {k: v for k, v in (slos or {}).items() if v is not None}
    allowed = float(summary["workload"].get("expected_prefix_share") or 0.0)
    if allowed:  # a trace's own prefix reuse is expected; hits beyond it mean an earlier cell's cache
        gates = {**gates, "max_prefix_cache_hit_rate": gates["max_prefix_cache_hit_rate"] + allowed}
    j = judge(summary, records, int(summary["concurrency"]), gates, slos, summary.get("server_max_running"))
    taken = summary["measurement"]
    server = summary.get("server") or {}
    unmet, unjudged = served_as_asked(summary.get("engine"), server.get("argv") or [], server.get("info") or {})
    validity = j["validity"]
    validity["reasons"] = [*taken.get("reasons", []), *unmet, *validity["reasons"]]
    validity["flags"] = list(dict.fromkeys([*validity["flags"], *unjudged, *taken.get("flags", [])]))
    validity["valid"] = validity["valid"] and not taken.get("reasons") and not unmet
    return {**summary, **jsonable(j), "judged_with": {"gates": dict(gates), "slo": slos}}


def level_summary(
    level: LevelResult,
    prompts: LevelPrompts,
    spec: RequestSpec,
    output_tokens: Any,
    server_max_running: int | None = None,
    extra: dict[str, Any] | None = None,
    cpus: CpuPlan | None = None,
) -> dict[str, Any]:
    """The summary.json body for one measured level (the cell runner adds `cell`, `server`, `source`...).

    Unjudged: read it through `judged` with the experiment's gates and SLOs."""
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
        "stop": spec.stop,
        "temperature": spec.temperature,
        "request_timeout_s": spec.request_timeout_s,
        "repeats": len(level.repeats),
        **prompts.describe(),
        # a record's input_tokens: the server's count where it reports one (always for chat: its template's)
        "input_tokens_counted_by": "server" if spec.endpoint == "chat" else "server where reported, else the client",
    }
    records = level.records
    ok = records[records["ok"]] if len(records) else records
    workload["input_tokens_recorded_mean"] = float(ok["input_tokens"].mean()) if len(ok) else None
    s = summary_body(
        records,
        level.concurrency,
        meta,
        server_max_running,
        workload,
        {"t0_unix": level.t0_unix, **(extra or {})},
    )
    for rep_out, rep in zip(s["repeats"], level.repeats, strict=False):
        rep_out["t0_unix"] = rep.t0_unix
        rep_out["cache_reset"] = rep.cache_reset
        rep_out["prompt_set_sha256"] = rep.prompts.sha256 if rep.prompts is not None else None
        rep_out["server_state"] = rep.server_state
    if level.warmup_errors:
        s["measurement"]["flags"].append(f"{level.warmup_errors} warm-up request(s) failed")
    if not prompts.unique:
        s["measurement"]["flags"].append("the dataset is shorter than the level needs: prompts repeat")
    return jsonable(s)


def read_summary(path: str | Path) -> dict[str, Any]:
    """A summary.json checked against its contract: a pipeline cell's (`records.CellSummary`, it has a `cell`
    block) or a `specsweep bench` level's (`records.MeasuredLevel`). A missing or mistyped field is an error
    naming the file, the field and the fix, never a default further on."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RecordError(f"{path} is not JSON ({e}). Fix: {SUMMARY_FIX}") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version is not None and version != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: summary.json schema {version} is not {SCHEMA_VERSION}; re-measure it "
            "(snakemake --forcerun <its summary.json>)"
        )
    record = CellSummary if isinstance(data, dict) and "cell" in data else MeasuredLevel
    check(record, data, str(path), SUMMARY_FIX)
    return data


def read_records(path: str | Path) -> pd.DataFrame:
    """requests.parquet, checked against the request record's columns (`client.loadgen.RECORD_SCHEMA`)."""
    df = pd.read_parquet(path)
    for column in _LATER_COLUMNS:  # a cell measured before they were recorded: unknown, not wrong
        if column not in df.columns:
            df[column] = None
    if missing := _lacking_columns(df):
        raise RecordError(f"{path} lacks the request record's column(s) {missing}. Fix: {SUMMARY_FIX}")
    return df


_LATER_COLUMNS = ("content", "finish_reason", "filler")  # added to the record later; an older cell reads them as null


def _lacking_columns(df: pd.DataFrame) -> str:
    """The request record's columns `df` lacks, as a list in words ("" when none)."""
    return ", ".join(c for c in RECORD_SCHEMA.names if c not in df.columns)


def read_judged(
    cell_dir: str | Path, gates: dict[str, Any], slos: dict[str, float | None] | None = None
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """A cell directory's summary judged by `gates` and `slos`, and its records. Without requests.parquet the
    cell cannot be judged: it is invalid, its measured values kept."""
    cell_dir = Path(cell_dir)
    summary = read_summary(cell_dir / "summary.json")
    parquet = cell_dir / "requests.parquet"
    if not parquet.exists():
        missing = "requests.parquet missing: the cell cannot be judged or given an interval (re-measure it)"
        return {**summary, "validity": {"valid": False, "reasons": [missing], "flags": []}}, None
    records = read_records(parquet)
    return judged(summary, records, gates, slos), records


def write_cell(
    out_dir: str | Path,
    records_df: pd.DataFrame,
    summary: dict[str, Any],
    record: type[MeasuredLevel] = CellSummary,
) -> tuple[Path, Path]:
    """Write `requests.parquet`, then `summary.json` (last: its presence means the cell is complete). The
    summary is checked against its contract first (`record`: a pipeline cell's, or `MeasuredLevel` for
    `specsweep bench`), so a writer that lost a field fails here, before anything is written."""
    out = Path(out_dir)
    body = jsonable(summary)
    check(record, body, f"the summary of {out}", "this is a bug in the writer: report it")
    if lacking := _lacking_columns(records_df):
        raise RecordError(f"the records of {out} lack the column(s) {lacking}: a bug in the writer")
    pq, sj = out / "requests.parquet", out / "summary.json"
    with atomic_path(pq) as tmp:
        pq_write(arrow_table(records_df), str(tmp))
    with atomic_path(sj) as tmp:
        tmp.write_text(json.dumps(body, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return pq, sj
