"""MLflow logging, fed from the local result files (the source of truth).

Layout for the MLflow UI: per variant x arm a *sweep* run whose metrics are logged with step = concurrency (the
chart view draws curves against concurrency, variants side by side), the *cell* runs nested under it, and a
*crossover* run per variant. Logging is idempotent: a cell whose summary.json is unchanged keeps its run; a
re-measured cell gets a new run tagged with its cell key, and the run it replaces is marked superseded and
deleted (restorable in MLflow; the files it came from were overwritten by the rerun anyway).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from specsweep.config import LEVEL_PREFIX, defaults, load_arg
from specsweep.io import atomic_write_json, read_json
from specsweep.mlflow_view import view_tag, view_url
from specsweep.run_notes import cell_note, crossover_note, sweep_note
from specsweep.stack_facts import stack_facts
from specsweep.summary import cell_level, cell_step, level_step, read_judged

TAG = "specsweep"
NOTE = "mlflow.note.content"  # the run's description on its page
# bumped when the run layout changes, so unchanged results are re-logged once in the new layout
LAYOUT = "layout-2"


def resolve_tracking_uri(uri: str) -> str:
    """Make a relative sqlite path absolute so every process (and the printed UI command) agrees on it."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


def ui_command(config: dict[str, Any]) -> str:
    uri = resolve_tracking_uri(config["mlflow"]["tracking_uri"])
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def ui_view_url(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """Where the printed UI command's server shows the experiment's saved view of the curves."""
    return view_url(base, experiment_id)


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


class Tracker:
    """Thin layer over MlflowClient for the specsweep run layout."""

    def __init__(self, config: dict[str, Any]) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.config = config
        self.uri = resolve_tracking_uri(config["mlflow"]["tracking_uri"])
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._experiment()
        self._save_view()

    def _experiment(self) -> str:
        name = self.config["experiment"]
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        artifacts = (Path(self.config["results_dir"]) / "mlartifacts" / name).resolve()
        # The UI opens on the runs table (not the GenAI overview) for model-development experiments.
        tags = {"mlflow.experimentKind": "custom_model_development", f"{TAG}.experiment": name}
        try:
            return self.client.create_experiment(name, artifact_location=artifacts.as_uri(), tags=tags)
        except Exception:  # created concurrently by another tracking job
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def _save_view(self) -> None:
        """The experiment's saved view (`mlflow_view`): rewritten only when its charts change."""
        arms = self.config.get("view_arms") or {}
        key, value = view_tag(list(arms.get("speculative") or []), list(arms.get("policy") or []))
        current = self.client.get_experiment(self.experiment_id).tags.get(key)
        if current is None or json.loads(current).get("state") != json.loads(value)["state"]:
            self.client.set_experiment_tag(self.experiment_id, key, value)

    def active_runs(self, **tags: str) -> list[Any]:
        flt = " and ".join(f"tags.`{TAG}.{k}` = '{v}'" for k, v in tags.items())
        return self.client.search_runs([self.experiment_id], filter_string=flt, max_results=1000)

    def retire(self, runs: list[Any], keep: str, why: str) -> None:
        for run in runs:
            if run.info.run_id != keep:
                self.client.set_tag(run.info.run_id, f"{TAG}.superseded_by", keep)
                self.client.set_tag(run.info.run_id, f"{TAG}.superseded_reason", why)
                self.client.delete_run(run.info.run_id)

    def new_run(
        self,
        name: str,
        tags: dict[str, str],
        params: dict[str, Any],
        metrics: dict[str, float],
        steps: list[tuple[int, dict[str, float]]] | None = None,
        start_time_ms: int | None = None,
    ) -> str:
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags, start_time=start_time_ms)
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        metric_objs = [Metric(k, v, now, 0) for k, v in metrics.items()]
        for step, values in steps or []:
            metric_objs += [Metric(k, v, now, step) for k, v in values.items()]
        param_objs = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, max(len(metric_objs), len(param_objs), 1), 500):
            self.client.log_batch(
                run_id,
                metrics=metric_objs[i : i + 500],
                params=param_objs[i : i + 100],
                tags=[RunTag(f"{TAG}.logged", "true")] if i == 0 else [],
            )
        for j in range(100, len(param_objs), 100):
            self.client.log_batch(run_id, params=param_objs[j : j + 100])
        return run_id

    def finish(self, run_id: str, status: str = "FINISHED", end_time_ms: int | None = None) -> None:
        self.client.set_terminated(run_id, status=status, end_time=end_time_ms)


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
        "source": summary.get("source"),
    }
    for k, v in (summary.get("workload") or {}).items():
        if not isinstance(v, dict | list):
            params[f"workload.{k}"] = v
    server = summary.get("server") or {}
    params["server.identity"] = server.get("identity")
    info = server.get("info") or {}
    for k in ("speculative_algorithm", "speculative_num_draft_tokens", "max_running_requests"):
        if info.get(k) is not None:
            params[f"server.{k}"] = info[k]
    params.update(stack_facts(summary))
    return {k: v for k, v in params.items() if v is not None}


def cell_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The cell's own metrics (summary.json's names): no spread over repeats when there is one repeat (it
    carries nothing), no histogram buckets (they stay in the summary.json artifact)."""
    out: dict[str, float] = {}
    metrics = dict(summary.get("metrics") or {})
    if (metrics.get("n_repeats") or 1) < 2:
        metrics.pop("repeat_spread", None)
    flatten("", metrics, out)
    out = {k: v for k, v in out.items() if ".histogram." not in k}
    out["valid"] = float(bool(summary["validity"]["valid"]))
    return out


def headline_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """A sweep's curves: the analysis's own metrics under the names the final table, crossover.json and
    policy.yaml use (`aggregate_tok_s`, `tpot_p99_s`, ...), read by the same `MetricSpec` the analysis reads."""
    from specsweep.analysis.bootstrap import METRICS, PLOTTED
    from specsweep.analysis.cells import metric_value_any

    paths = {m.name: m.summary_paths for m in METRICS} | PLOTTED
    values = {name: metric_value_any(summary, p) for name, p in paths.items()}
    return {k: float(v) for k, v in values.items() if math.isfinite(v)}


def _level_text(cell: dict[str, Any]) -> str:
    """A level as the params show it: C, or the open level's requests/s (trace: time scale)."""
    return f"{cell_level(cell):g}"


def sweep_params(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Params true for the whole sweep: a cell param only where every cell has the same value; the levels,
    the requests per level and the invalid levels as lists (prompt-set hashes per level: an artifact)."""
    per_cell = [cell_params(s) for s in summaries]
    shared = {
        k: v for k, v in per_cell[0].items() if k not in ("concurrency",) and all(p.get(k) == v for p in per_cell[1:])
    }
    levels = [_level_text(s["cell"]) for s in summaries]
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
        w = s.get("workload") or {}
        out[_level_text(s["cell"])] = {
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

    w = summary.get("workload") or {}
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


def judged_cell(tracker: Tracker, summary_path: Path) -> dict[str, Any]:
    """The cell's summary judged by the experiment's gates and SLOs (`summary.read_judged`)."""
    gates = {**defaults("gates"), **(tracker.config.get("gates") or {})}
    return read_judged(Path(summary_path).parent, gates, tracker.config.get("slo"))[0]


def log_cell(tracker: Tracker, summary_path: Path, summary: dict[str, Any]) -> str:
    """The cell's run: reused when summary.json and its judgement are unchanged, else a new one that
    supersedes the old (a changed gate or SLO re-logs the cell without re-measuring it)."""
    key = summary["cell"]["key"]
    judgement = json.dumps(summary.get("judged_with"), sort_keys=True).encode()
    digest = hashlib.sha256(Path(summary_path).read_bytes() + judgement + LAYOUT.encode()).hexdigest()
    existing = tracker.active_runs(cell_key=key)
    for run in existing:
        if run.data.tags.get(f"{TAG}.summary_sha256") == digest:
            tracker.retire(existing, keep=run.info.run_id, why="duplicate")
            return run.info.run_id
    validity = summary["validity"]
    cell = summary["cell"]
    tags = {
        f"{TAG}.kind": "cell",
        f"{TAG}.cell_key": key,
        f"{TAG}.experiment": cell["experiment"],
        f"{TAG}.variant": cell["variant"],
        f"{TAG}.arm": cell["arm"],
        f"{TAG}.backend": str(summary.get("client_backend", "")),
        f"{TAG}.source": str(summary.get("source")),
        f"{TAG}.valid": str(bool(validity["valid"])).lower(),
        f"{TAG}.invalid_reasons": "; ".join(validity.get("reasons") or [])[:5000],
        f"{TAG}.summary_sha256": digest,
        NOTE: cell_note(summary),
    }
    start_ms, end_ms = measured_span([summary])
    name = cell_run_name(
        cell["variant"], cell["arm"], cell["concurrency"], cell.get("load", "closed"), cell.get("level")
    )
    run_id = tracker.new_run(name, tags, cell_params(summary), cell_metrics(summary), start_time_ms=start_ms)
    dataset = prompt_dataset(summary)
    if dataset is not None:
        tracker.client.log_inputs(run_id, datasets=[dataset])
    tracker.client.log_artifact(run_id, str(summary_path))
    tracker.finish(run_id, end_time_ms=end_ms)
    tracker.retire(existing, keep=run_id, why="cell re-measured or re-judged")
    return run_id


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


def log_sweep(tracker: Tracker, variant: str, arm: str, summary_paths: list[Path]) -> dict[str, Any]:
    """The sweep run of one variant x arm, with its cells nested under it."""
    experiment = tracker.config["experiment"]
    cell_runs: dict[int, str] = {}
    steps: list[tuple[int, dict[str, float]]] = []
    summaries: list[dict[str, Any]] = []
    for path in sorted(summary_paths, key=lambda p: cell_level(read_json(p)["cell"])):
        summary = judged_cell(tracker, path)
        summaries.append(summary)
        c = cell_step(summary["cell"])
        cell_runs[c] = log_cell(tracker, path, summary)
        # the curves hold valid cells only; `cell_valid` (1/0 at every level) shows where the gaps are
        valid = bool(summary["validity"]["valid"])
        steps.append((c, {**(headline_metrics(summary) if valid else {}), "cell_valid": float(valid)}))
    sweep_key = f"{experiment}/{variant}/{arm}"
    digest = hashlib.sha256((json.dumps(sorted(cell_runs.items())) + LAYOUT).encode()).hexdigest()
    existing = tracker.active_runs(sweep_key=sweep_key)
    sweep_id = next((r.info.run_id for r in existing if r.data.tags.get(f"{TAG}.cells_sha256") == digest), None)
    if sweep_id is None:
        first = summaries[0] if summaries else {}
        invalid = {
            _level_text(s["cell"]): "; ".join(s["validity"].get("reasons") or [])
            for s in summaries
            if not s["validity"]["valid"]
        }
        tags = {
            f"{TAG}.kind": "sweep",
            f"{TAG}.sweep_key": sweep_key,
            f"{TAG}.experiment": experiment,
            f"{TAG}.variant": variant,
            f"{TAG}.arm": arm,
            f"{TAG}.source": str(first.get("source")),
            f"{TAG}.cells_sha256": digest,
            f"{TAG}.invalid_cells": (" | ".join(f"C={c}: {r}" for c, r in invalid.items()) or "none")[:5000],
            NOTE: sweep_note(variant, arm, summaries),
        }
        params = {"variant": variant, "arm": arm, **sweep_params(summaries)} if summaries else {"arm": arm}
        start_ms, end_ms = measured_span(summaries)
        sweep_id = tracker.new_run(f"{variant}/{arm} sweep", tags, params, {}, steps, start_time_ms=start_ms)
        tracker.client.log_dict(sweep_id, prompt_sets_by_level(summaries), "prompt_sets.json")
        fingerprint = (first.get("stack") or {}).get("fingerprint")
        if fingerprint and Path(fingerprint).is_file():
            tracker.client.log_artifact(sweep_id, fingerprint, artifact_path="stack")
        tracker.finish(sweep_id, end_time_ms=end_ms)
    tracker.retire(existing, keep=sweep_id, why="sweep re-logged")
    for run_id in cell_runs.values():
        tracker.client.set_tag(run_id, "mlflow.parentRunId", sweep_id)
    return {
        "variant": variant,
        "arm": arm,
        "sweep_run_id": sweep_id,
        "cell_run_ids": {str(c): r for c, r in cell_runs.items()},
        "span_ms": list(measured_span(summaries)),
        "tracking_uri": tracker.uri,
        "experiment_id": tracker.experiment_id,
    }


def log_crossover(tracker: Tracker, variant: str, crossover_path: Path, sweep_markers: list[Path]) -> dict[str, Any]:
    """The crossover run of one variant: speedup per C (step-logged), crossover and threshold with their
    meaning in the run's description, links to the sweeps it used, plots and policy as artifacts."""
    experiment = tracker.config["experiment"]
    data = read_json(crossover_path)
    sweeps = [read_json(p) for p in sweep_markers]
    cell_runs = sorted(r for s in sweeps for r in s["cell_run_ids"].values())
    digest = hashlib.sha256(crossover_path.read_bytes() + json.dumps(cell_runs).encode() + LAYOUT.encode()).hexdigest()
    key = f"{experiment}/{variant}"
    existing = tracker.active_runs(crossover_key=key)
    for run in existing:
        if run.data.tags.get(f"{TAG}.content_sha256") == digest:
            return {"crossover_run_id": run.info.run_id, "cell_run_ids": cell_runs}
    metrics: dict[str, float] = {}
    for arm_name, result in (data.get("arms") or {}).items():
        flatten(arm_name, _crossover_numbers(result), metrics)
    proofs = {f: p for f, p in (data.get("policy_proof") or {}).items() if p.get("per_level")}
    for proof in proofs.values():
        ratios = [r["ratio"] for r in proof["per_level"] if _number(r.get("ratio")) is not None]
        flatten(
            proof["policy_arm"],
            {"holds": float(bool(proof["holds"])), "failing_levels": float(len(proof["failing_levels"]))}
            | ({"policy_over_best_min": min(ratios)} if ratios else {}),
            metrics,
        )
    sweep_links = {
        s.get("arm") or Path(m).parent.name: s["sweep_run_id"] for m, s in zip(sweep_markers, sweeps, strict=True)
    }
    sweep_links = {a: r for a, r in sweep_links.items() if r}
    tags = {
        f"{TAG}.kind": "crossover",
        f"{TAG}.crossover_key": key,
        f"{TAG}.experiment": experiment,
        f"{TAG}.variant": variant,
        f"{TAG}.source": str(data.get("source")),
        f"{TAG}.content_sha256": digest,
        **{f"{TAG}.sweep_run.{a}": r for a, r in sweep_links.items()},
        **_verdict_tags(data),
        NOTE: crossover_note(data, variant, sweep_links, tracker.experiment_id),
    }
    tags.update({f"{TAG}.policy.{f}": "holds" if p["holds"] else "fails" for f, p in proofs.items()})
    spans = [s.get("span_ms") or [None, None] for s in sweeps]
    start_ms = min((a for a, _ in spans if a is not None), default=None)
    end_ms = max((b for _, b in spans if b is not None), default=None)
    params = {"variant": variant, "metric": _primary_metric(data), "baseline_arm": data.get("baseline_arm")}
    run_id = tracker.new_run(
        f"{variant} crossover", tags, {k: v for k, v in params.items() if v}, metrics, start_time_ms=start_ms
    )
    curves = _curves(data)
    for i in range(0, len(curves), 1000):  # MLflow takes at most 1000 metrics per batch
        tracker.client.log_batch(run_id, metrics=curves[i : i + 1000])
    out_dir = crossover_path.parent
    tracker.client.log_artifact(run_id, str(crossover_path))
    for name in ("policy.yaml", "crossover_table.csv"):
        if (out_dir / name).is_file():
            tracker.client.log_artifact(run_id, str(out_dir / name))
    if (out_dir / "plots").is_dir():  # not Snakemake's .snakemake_timestamp of the directory output
        for plot in sorted(p for p in (out_dir / "plots").iterdir() if p.is_file() and not p.name.startswith(".")):
            tracker.client.log_artifact(run_id, str(plot), artifact_path="plots")
    tracker.client.log_dict(run_id, {"cell_run_ids": cell_runs, "sweeps": sweeps}, "cell_runs.json")
    tracker.finish(run_id, end_time_ms=end_ms)
    tracker.retire(existing, keep=run_id, why="crossover recomputed")
    return {"crossover_run_id": run_id, "cell_run_ids": cell_runs}


def _primary_metric(data: dict[str, Any]) -> str | None:
    return next((r.get("primary_metric") for r in (data.get("arms") or {}).values() if r.get("primary_metric")), None)


def _curves(data: dict[str, Any]) -> list[Any]:
    """Per-level metrics of the crossover run, step = concurrency (MLflow charts them against C): each arm's
    speedup with its interval, and each policy arm's throughput over the best fixed arm's."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    out = []
    load = data.get("load", "closed")
    for arm_name, result in (data.get("arms") or {}).items():
        for r in result.get("per_level") or []:
            for key in ("speedup", "speedup_lo", "speedup_hi"):
                v = _number(r.get(key)) if r.get("used") else None
                if v is not None:
                    out.append(Metric(f"{arm_name}.{key}", v, now, level_step(r["concurrency"], load)))
    for proof in (data.get("policy_proof") or {}).values():
        for r in proof.get("per_level") or []:
            for key in ("ratio", "ratio_lo", "ratio_hi"):
                v = _number(r.get(key))
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


def _number(v: Any) -> float | None:
    """A finite number from JSON (null, NaN, booleans and text are not numbers to log)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _crossover_numbers(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one arm's crossover result worth a metric (docs/analysis.md, crossover.json).

    Crossover concurrency and its interval (null where out of range: not logged), the policy threshold only
    when there is one (an inconclusive verdict writes `threshold: null`: no threshold metric), `conclusive`
    (1/0) from the verdict, and the spread of the interpolants' estimates.
    """
    primary = result.get("primary") or result  # older layouts nested these under "primary"
    out: dict[str, Any] = {}
    for k in ("crossover_concurrency", "crossover_ci_low", "crossover_ci_high", "threshold"):
        v = _number(primary.get(k))
        if v is not None:
            out[k] = v
    ci = primary.get("crossover_ci") or []
    if len(ci) == 2 and all(_number(x) is not None for x in ci):
        out["crossover_ci_low"], out["crossover_ci_high"] = float(ci[0]), float(ci[1])
    verdict = primary.get("verdict")
    if isinstance(verdict, dict) and verdict.get("kind"):
        out["conclusive"] = float(verdict["kind"] != "inconclusive")
    interp = primary.get("interpolation")
    if isinstance(interp, dict):
        for src, dst in (("estimate_min", "interpolation_min"), ("estimate_max", "interpolation_max")):
            v = _number(interp.get(src))
            if v is not None:
                out[dst] = v
    return out


def _verdict_tags(data: dict[str, Any]) -> dict[str, str]:
    """`specsweep.verdict.<arm>`: crossover / wins_everywhere / loses_everywhere / inconclusive, per arm."""
    tags = {}
    for arm_name, result in (data.get("arms") or {}).items():
        verdict = (result or {}).get("verdict") if isinstance(result, dict) else None
        if isinstance(verdict, dict) and verdict.get("kind"):
            tags[f"{TAG}.verdict.{arm_name}"] = str(verdict["kind"])
    return tags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True)
    sw = sub.add_parser("sweep", help="log one variant x arm: its cells and the sweep run")
    sw.add_argument("--config", required=True, help="config as JSON text or a YAML/JSON file")
    sw.add_argument("--variant", required=True)
    sw.add_argument("--arm", required=True)
    sw.add_argument("--out", required=True, type=Path, help="marker JSON with the run ids")
    sw.add_argument("summaries", nargs="*", type=Path, help="none: a policy arm that served no schedule")
    cx = sub.add_parser("crossover", help="log one variant's crossover run")
    cx.add_argument("--config", required=True)
    cx.add_argument("--variant", required=True)
    cx.add_argument("--crossover", required=True, type=Path)
    cx.add_argument("--out", required=True, type=Path)
    cx.add_argument("sweeps", nargs="+", type=Path)


def run(args: argparse.Namespace) -> int:
    config = load_arg(args.config)
    tracker = Tracker(config)
    if args.what == "sweep" and not args.summaries:  # a policy arm whose family got no schedule: nothing to log
        note = "no cells: the arm served no schedule"
        marker = {"arm": args.arm, "sweep_run_id": None, "cell_run_ids": {}, "note": note}
    elif args.what == "sweep":
        marker = log_sweep(tracker, args.variant, args.arm, list(args.summaries))
    else:
        marker = log_crossover(tracker, args.variant, args.crossover, list(args.sweeps))
    marker["tracking_uri"] = tracker.uri
    atomic_write_json(args.out, marker)
    print(json.dumps(marker, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specsweep.tracking", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
