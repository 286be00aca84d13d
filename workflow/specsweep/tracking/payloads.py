"""What a run holds: a cell's and a sweep's params and metrics, a crossover's numbers, curves and verdict tags,
the prompt set as an MLflow dataset. Pure: read from summaries and crossover.json, no MLflow writes."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from specsweep.config import LEVEL_PREFIX
from specsweep.measure.summary import cell_level, level_step
from specsweep.stack.stack_facts import stack_facts
from specsweep.tracking.store import TAG


def flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    """Nested numeric dicts -> {'ttft_s.p50': ...}; non-numbers and non-finite values are left out."""
    if isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, int | float):
        if math.isfinite(value):
            out[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)


def cell_run_name(variant: str, arm: str, concurrency: int, load: str = "closed", level: float | None = None) -> str:
    """`sim/eagle3/c0010`: zero-padded so MLflow's name sort orders cells by variant, arm and concurrency; an
    open or trace cell by its step (`r002500` is 2.5 requests/s)."""
    if load != "closed" and level is not None:
        return f"{variant}/{arm}/{LEVEL_PREFIX[load]}{level_step(level, load):06d}"
    return f"{variant}/{arm}/c{int(concurrency):04d}"


def cell_params(summary: dict[str, Any]) -> dict[str, Any]:
    """Params true for this cell: its coordinates, workload scalars, server identity and the stack facts."""
    cell = summary["cell"]
    params: dict[str, Any] = {
        "variant": cell["variant"],
        "arm": cell["arm"],
        "concurrency": cell["concurrency"],
        "source": summary["source"],
    }
    for k, v in summary["workload"].items():
        if not isinstance(v, dict | list):
            params[f"workload.{k}"] = v
    server = summary["server"]
    params["server.identity"] = server["identity"]
    info = server["info"]
    for k in ("speculative_algorithm", "speculative_num_draft_tokens", "max_running_requests"):
        if info.get(k) is not None:
            params[f"server.{k}"] = info[k]
    params.update(stack_facts(summary))
    return {k: v for k, v in params.items() if v is not None}


def cell_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The cell's own metrics (summary.json's names): no spread over repeats when there is one repeat (it
    carries nothing), no histogram buckets (they stay in the summary.json artifact)."""
    out: dict[str, float] = {}
    metrics = dict(summary["metrics"])
    if (metrics.get("n_repeats") or 1) < 2:
        metrics.pop("repeat_spread", None)
    flatten("", metrics, out)
    out = {k: v for k, v in out.items() if ".histogram." not in k}
    out["valid"] = float(bool(summary["validity"]["valid"]))
    rounds = (summary.get("pairing") or {}).get("precision")
    if rounds:  # measured until its answer was known: what the level spent
        out["rounds"] = float(rounds["rounds"])
        out["rounds_requests_per_block_max"] = float(max(rounds["block_requests"]))
    out.update(serving_metrics(summary))
    return out


# (metric name, block figure's path in server_state, how the blocks are pooled) (docs/metrics.md, "Serving side")
SERVING_METRICS = (
    ("server.granted_share_min", ("cpu", "granted_share"), min),
    ("server.cpu_cores_mean", ("cpu", "cpu_cores"), lambda v: sum(v) / len(v)),
    ("server.cgroup_throttled_share_max", ("cpu", "cgroup_throttled_share"), max),
    ("server.rss_mb_max", ("cpu", "rss_mb"), max),
)
GPU_METRICS = (
    ("gpu.sm_clock_mhz_min", "sm_clock_mhz", min),
    ("gpu.power_w_max", "power_w", max),
    ("gpu.temperature_c_max", "temperature_c", max),
    ("gpu.other_processes_mib_max", "other_processes_mib", max),
)


def serving_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The serving side over the cell's blocks: the least CPU share its server got, the lowest GPU clock, the
    hottest GPU... (the worst block, what the gate looks at); a figure no block has is left out, not zeroed."""
    states = [r.get("server_state") for r in summary["repeats"]]
    out: dict[str, float] = {}
    for name, (part, key), pool in SERVING_METRICS:
        vals = [float(st[part][key]) for st in states if st and st.get(part) and st[part].get(key) is not None]
        if vals:
            out[name] = float(pool(vals))
    gpus = [g for st in states if st for g in st.get("gpus") or []]
    for name, key, pool in GPU_METRICS:
        vals = [float(g[key]) for g in gpus if g.get(key) is not None]
        if vals:
            out[name] = float(pool(vals))
    if gpus:
        out["gpu.throttled_block_gpus"] = float(sum(bool(g.get("throttled_thermal_power")) for g in gpus))
    return out


def headline_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """A sweep's curves: the analysis's own metrics under the names the final table, crossover.json and
    policy.yaml use (`aggregate_tok_s`, `tpot_p99_s`, ...), read by the same `MetricSpec` the analysis reads."""
    from specsweep.analysis.bootstrap import METRICS, PLOTTED
    from specsweep.analysis.cells import metric_value_any

    paths = {m.name: m.summary_paths for m in METRICS} | PLOTTED
    values = {name: metric_value_any(summary, p) for name, p in paths.items()}
    return {k: float(v) for k, v in values.items() if math.isfinite(v)}


def level_text(cell: dict[str, Any]) -> str:
    """A level as the params show it: C, or the open level's requests/s (trace: time scale)."""
    return f"{cell_level(cell):g}"


def sweep_params(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Params true for the whole sweep: a cell param only where every cell has the same value; the levels,
    the requests per level and the invalid levels as lists (prompt-set hashes per level: an artifact)."""
    per_cell = [cell_params(s) for s in summaries]
    shared = {
        k: v for k, v in per_cell[0].items() if k not in ("concurrency",) and all(p.get(k) == v for p in per_cell[1:])
    }
    levels = [level_text(s["cell"]) for s in summaries]
    shared["levels"] = ",".join(map(str, levels))
    shared["n_requests_by_level"] = ",".join(
        f"{c}:{(s.get('workload') or {}).get('n_requests')}" for c, s in zip(levels, summaries, strict=True)
    )
    bad = [c for c, s in zip(levels, summaries, strict=True) if not s["validity"]["valid"]]
    shared["invalid_levels"] = ",".join(map(str, bad)) or "none"
    load = summaries[0]["cell"].get("load", "closed") if summaries else "closed"
    shared["step"] = {"closed": "concurrency C", "open": "1000 x requests/s", "trace": "1000 x time scale"}[load]
    return shared


def prompt_sets_by_level(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Each level's prompt set(s): hash, count, source (the sweep's artifact `prompt_sets.json`)."""
    out: dict[str, Any] = {}
    for s in summaries:
        w = s["workload"]
        out[level_text(s["cell"])] = {
            "prompt_source": w.get("prompt_source"),
            "prompt_set_sha256": w.get("prompt_set_sha256"),
            "prompt_count": w.get("prompt_count"),
            "prompt_sets": w.get("prompt_sets"),
            "warmup_prompt_set_sha256": w.get("warmup_prompt_set_sha256"),
        }
    return out


def prompt_dataset(summary: dict[str, Any]) -> Any:
    """The cell's prompt set as an MLflow dataset input (name, digest = the prompt set's hash), so the UI's
    Dataset column and filter tell cells that saw the same prompts from those that did not."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    w = summary["workload"]
    sha = w.get("prompt_set_sha256")
    if not sha:
        return None
    source = str(w.get("prompt_source") or "prompts")
    label = w.get("dataset") or source  # a workload file by its name, else the synthetic words
    name = f"{label}-{w.get('input_tokens_mean', w.get('input_tokens'))}in-{w.get('output_tokens')}out"
    facts = {"prompt_source": source, "seed": w.get("prompt_seed"), "sha256": sha}
    if w.get("dataset_sha256"):
        facts["dataset_sha256"] = w["dataset_sha256"]
    ds = Dataset(
        name=name,
        digest=str(sha)[:20],
        source_type="specsweep",
        source=json.dumps(facts),
        schema=json.dumps({"count": w.get("prompt_count"), "tokens_exact": w.get("prompt_tokens_exact")}),
    )
    return DatasetInput(ds, tags=[InputTag("mlflow.data.context", "prompts")])


def measured_span(summaries: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """(start, end) in ms of the cells' measurements, so the UI's dates and durations are benchmark time."""
    starts, ends = [], []
    for s in summaries:
        t0, span = s.get("t0_unix"), s.get("measured_s")
        if isinstance(t0, int | float):
            starts.append(t0)
            if isinstance(span, int | float):
                ends.append(t0 + span)
    return (int(min(starts) * 1000) if starts else None, int(max(ends) * 1000) if ends else None)


def primary_metric(data: dict[str, Any]) -> str | None:
    return next((r.get("primary_metric") for r in (data.get("arms") or {}).values() if r.get("primary_metric")), None)


def curves(data: dict[str, Any]) -> list[Any]:
    """Per-level metrics of the crossover run, step = concurrency (MLflow charts them against C): each arm's
    speedup with its interval, and each policy arm's throughput over the best fixed arm's."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    out = []
    load = data.get("load", "closed")
    for arm_name, result in (data.get("arms") or {}).items():
        for r in result.get("per_level") or []:
            for key in ("speedup", "speedup_lo", "speedup_hi"):
                v = finite_number(r.get(key)) if r.get("used") else None
                if v is not None:
                    out.append(Metric(f"{arm_name}.{key}", v, now, level_step(r["concurrency"], load)))
            # how precise each level came out (analysis/precision.py; its variance components stay in the
            # crossover.json artifact): named after the speedup they qualify, so its chart stays the first
            precision = r.get("precision") or {}
            figures = {
                "speedup_half_width": finite_number(precision.get("half_width")),
                "speedup_rounds": finite_number(precision.get("rounds")),
                "speedup_target_met": float(precision["met"]) if precision.get("target") is not None else None,
            }
            # same output, only faster? (analysis/outputs.py): the share equal to the baseline's, the share that
            # differs at near-ties (batch numerics) and the clear differences (another text)
            match = r.get("output_match") or {}
            figures |= {
                "same_output": finite_number(match.get("share")),
                "near_tie_output": finite_number(match.get("tie_share")),
                "clear_output_differences": finite_number((match.get("referral") or {}).get("clear")),
            }
            for key, v in figures.items():
                if v is not None:
                    out.append(Metric(f"{arm_name}.{key}", v, now, level_step(r["concurrency"], load)))
    for proof in (data.get("policy_proof") or {}).values():
        for r in proof.get("per_level") or []:
            for key in ("ratio", "ratio_lo", "ratio_hi"):
                v = finite_number(r.get(key))
                if v is not None:
                    out.append(
                        Metric(
                            f"{proof['policy_arm']}.policy_over_best{key[5:]}",
                            v,
                            now,
                            level_step(r["concurrency"], load),
                        )
                    )
    return out


def finite_number(v: Any) -> float | None:
    """A finite number from JSON (null, NaN, booleans and text are not numbers to log)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def crossover_numbers(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one arm's crossover result worth a metric (docs/analysis.md, crossover.json).

    Crossover concurrency and its interval (null where out of range: not logged), the policy threshold only
    when there is one (an inconclusive verdict writes `threshold: null`: no threshold metric), `conclusive`
    (1/0) from the verdict, and the spread of the interpolants' estimates.
    """
    primary = result.get("primary") or result  # older layouts nested these under "primary"
    out: dict[str, Any] = {}
    for k in ("crossover_concurrency", "crossover_ci_low", "crossover_ci_high", "threshold"):
        v = finite_number(primary.get(k))
        if v is not None:
            out[k] = v
    ci = primary.get("crossover_ci") or []
    if len(ci) == 2 and all(finite_number(x) is not None for x in ci):
        out["crossover_ci_low"], out["crossover_ci_high"] = float(ci[0]), float(ci[1])
    verdict = primary.get("verdict")
    if isinstance(verdict, dict) and verdict.get("kind"):
        out["conclusive"] = float(verdict["kind"] != "inconclusive")
    interp = primary.get("interpolation")
    if isinstance(interp, dict):
        for src, dst in (("estimate_min", "interpolation_min"), ("estimate_max", "interpolation_max")):
            v = finite_number(interp.get(src))
            if v is not None:
                out[dst] = v
    return out


def verdict_tags(data: dict[str, Any]) -> dict[str, str]:
    """`specsweep.verdict.<arm>`: crossover / wins_everywhere / loses_everywhere / inconclusive, per arm; what the
    requests held (`content`, `prompts`, `stop`) and the content warning where there is one."""
    tags = {}
    for arm_name, result in (data.get("arms") or {}).items():
        verdict = (result or {}).get("verdict") if isinstance(result, dict) else None
        if isinstance(verdict, dict) and verdict.get("kind"):
            tags[f"{TAG}.verdict.{arm_name}"] = str(verdict["kind"])
    facts = data.get("content")
    if isinstance(facts, dict):  # what the requests held: the UI filters crossovers by it
        tags[f"{TAG}.content"] = str(facts.get("content") or "one")
        tags[f"{TAG}.prompts"] = str(facts.get("prompts"))[:500]
        tags[f"{TAG}.stop"] = str(facts.get("stop"))
    if data.get("content_warning"):
        tags[f"{TAG}.content_warning"] = str(data["content_warning"])[:5000]
    return tags


# The MLflow UI colours a run by its `mlflow.runColor` tag, where it has one (the tag its colour picker writes),
# else by a hash of the run id: two sweep runs then share a colour now and then, and a chart of the arms against C
# draws them alike. Tableau 10: distinct in hue and lightness.
RUN_COLOR_TAG = "mlflow.runColor"
SWEEP_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)


def sweep_colour(config: dict[str, Any], arm: str) -> str | None:
    """The colour of an arm's sweep runs: its place among the experiment's arms (`arms` of the tracking spec, in
    the config's order), so that up to ten arms are told apart in every chart; an arm keeps its colour in every
    variant (the run's name says which). None for an arm the spec does not list: MLflow's own colour then."""
    arms = list(config.get("arms") or [])
    return SWEEP_COLOURS[arms.index(arm) % len(SWEEP_COLOURS)] if arm in arms else None
