"""MLflow logging, fed from the local result files (the source of truth).

Layout for the MLflow UI: per variant x arm a *sweep* run whose metrics are logged with step = concurrency (the
chart view draws curves against concurrency, variants side by side), the *cell* runs nested under it, and a
*crossover* run per variant. Logging is idempotent: a cell whose summary.json is unchanged keeps its run; a
re-measured cell gets a new run tagged with its cell key, and the run it replaces is marked superseded and
deleted (restorable in MLflow; the files it came from were overwritten by the rerun anyway).

Only a complete run is kept: `finish` is a run's last write, so the run of a job that an outage cut short
(status still RUNNING) is replaced by the rerun, not reused. Jobs logging the same content at the same time
(two checkouts, a job retried while its first try still runs) settle on one run: after logging, the runs of
the key are read again and every job keeps the complete one with the lowest id (`Tracker.settle`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from specsweep.config import LEVEL_PREFIX, defaults
from specsweep.io import read_json
from specsweep.mlflow_view import view_arms, view_tag, view_url
from specsweep.redact import redact_text, redact_uri, split_uri_credentials
from specsweep.run_notes import cell_note, crossover_note, sweep_note
from specsweep.stack_facts import stack_facts
from specsweep.summary import cell_level, cell_step, level_step, read_judged

TAG = "specsweep"
NOTE = "mlflow.note.content"  # the run's description on its page
# bumped when the run layout changes, so unchanged results are re-logged once in the new layout
LAYOUT = "layout-2"
# MLflow's own variables: the credentials of a tracking server, and how long one request may take
USER_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
HTTP_ENV = {"http_max_retries": "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "http_timeout_s": "MLFLOW_HTTP_REQUEST_TIMEOUT"}
# what a request that never got an answer says (requests/urllib3 through MLflow's "failed with exception")
UNREACHABLE = (
    "Max retries exceeded",
    "Connection refused",
    "Failed to establish",
    "timed out",
    "Connection aborted",
    "RemoteDisconnected",
    "Connection reset",
    "too many 5",
)
AUTH_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")


def resolve_tracking_uri(uri: str) -> str:
    """Make a relative sqlite path absolute so every process (and the printed UI command) agrees on it."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


def is_server_uri(uri: str) -> bool:
    """A tracking server (http/https), as opposed to a store this process writes itself (sqlite, files)."""
    return urlsplit(uri).scheme in ("http", "https")


def credentials_to_env(uri: str) -> str:
    """The tracking URI without a user:password@ of its own; those go to MLflow's variables instead
    (MLFLOW_TRACKING_USERNAME / _PASSWORD), which this process and the jobs it starts read. Why: in the URI the
    password would travel into marker files, rule params Snakemake prints, and MLflow's "View run at" lines."""
    bare, user, password = split_uri_credentials(uri)
    if user:
        os.environ[USER_ENV] = user
    if password:
        os.environ[PASSWORD_ENV] = password
    return bare


def http_env(mlflow_cfg: dict[str, Any]) -> None:
    """Few retries and a bounded wait per request (`mlflow.http_*`): with MLflow's defaults (7 retries with
    back-off, 120 s a request) a job against a server that is down hangs for minutes before it fails."""
    base = defaults("mlflow")
    for key, var in HTTP_ENV.items():
        os.environ[var] = str(mlflow_cfg.get(key, base[key]))


def ui_command(config: dict[str, Any]) -> str:
    """How to open the UI: a local store needs `mlflow ui` on it; a tracking server is its own UI."""
    uri = resolve_tracking_uri(split_uri_credentials(config["mlflow"]["tracking_uri"])[0])
    if is_server_uri(uri):
        return uri
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def ui_base(config: dict[str, Any]) -> str:
    """The UI's address: the tracking server's, or the one `ui_command` serves a local store on."""
    uri = split_uri_credentials(config["mlflow"]["tracking_uri"])[0]
    return uri if is_server_uri(uri) else "http://127.0.0.1:5000"


def ui_view_url(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """Where the UI shows the experiment's saved view of the curves."""
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
        self.uri = credentials_to_env(resolve_tracking_uri(config["mlflow"]["tracking_uri"]))
        http_env(config["mlflow"])
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._experiment()
        self.save_view()

    def _experiment(self) -> str:
        """The experiment's id: found, restored when deleted, or created. Jobs of one experiment start together
        (every arm's sweep, other checkouts logging to the same server), so each step may find that another
        job got there first: a create answered RESOURCE_ALREADY_EXISTS, a restore of one already restored."""
        from mlflow.exceptions import MlflowException

        name = self.config["experiment"]
        # A server keeps artifacts where it was told (--artifacts-destination, proxied: every client reaches
        # them); a local store keeps them next to the results.
        artifacts = None
        if not is_server_uri(self.uri):
            artifacts = (Path(self.config["results_dir"]) / "mlartifacts" / name).resolve().as_uri()
        # The UI opens on the runs table (not the GenAI overview) for model-development experiments.
        tags = {"mlflow.experimentKind": "custom_model_development", f"{TAG}.experiment": name}
        for _ in range(3):
            exp = self.client.get_experiment_by_name(name)
            if exp is not None and exp.lifecycle_stage == "deleted":
                with contextlib.suppress(MlflowException):  # restored meanwhile by another job: checked below
                    self.client.restore_experiment(exp.experiment_id)
                exp = self.client.get_experiment(exp.experiment_id)
            if exp is not None and exp.lifecycle_stage == "active":
                return exp.experiment_id
            if exp is None:
                try:
                    return self.client.create_experiment(name, artifact_location=artifacts, tags=tags)
                except MlflowException as exc:
                    if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                        raise
        raise RuntimeError(f"MLflow experiment {name!r} could not be found, restored or created (deleted again?)")

    def save_view(self) -> None:
        """The experiment's saved view (`mlflow_view`) with this config's arms joined to those already in it,
        rewritten only when its charts change. Why joined: two checkouts logging variants of one experiment
        with different arms would otherwise take each other's charts away, the last job winning. A write
        that races another (both read the old view) can still lose an arm: `run` calls this again when a
        job ends, seconds later, which puts it back."""
        from mlflow.exceptions import MlflowException

        arms = self.config.get("view_arms") or {}
        mine = (list(arms.get("speculative") or []), list(arms.get("policy") or []))
        for attempt in range(3):
            key, _ = view_tag([], [])
            current = self.client.get_experiment(self.experiment_id).tags.get(key)
            have = view_arms(current) if current else ([], [])
            want = [h + [a for a in m if a not in h] for h, m in zip(have, mine, strict=True)]
            key, value = view_tag(*want)
            if current is not None and _view_state(current) == json.loads(value)["state"]:
                return
            try:
                self.client.set_experiment_tag(self.experiment_id, key, value)
                return
            except MlflowException:  # another job's first write of the tag won the insert: read it again
                if attempt == 2:
                    raise

    def active_runs(self, **tags: str) -> list[Any]:
        flt = " and ".join(f"tags.`{TAG}.{k}` = '{v}'" for k, v in tags.items())
        return self.client.search_runs([self.experiment_id], filter_string=flt, max_results=1000)

    def retire(self, runs: list[Any], keep: str, why: str) -> None:
        """Mark every run but `keep` superseded and delete it (restorable in MLflow). A run another job
        retired meanwhile is skipped."""
        from mlflow.exceptions import MlflowException

        for run in runs:
            if run.info.run_id == keep:
                continue
            try:
                self.client.set_tag(run.info.run_id, f"{TAG}.superseded_by", keep)
                self.client.set_tag(run.info.run_id, f"{TAG}.superseded_reason", why)
                self.client.delete_run(run.info.run_id)
            except MlflowException as exc:
                if not self._deleted(run.info.run_id, exc):
                    raise

    def _deleted(self, run_id: str, exc: Exception) -> bool:
        """Whether a write into `run_id` failed because another job retired the run; when even asking fails
        (the server is down), the write's own error is the one to tell."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "deleted"
        except MlflowException:
            raise exc from None

    @staticmethod
    def reusable(runs: list[Any], digest_tag: str, digest: str) -> str | None:
        """The run of this content that every job agrees to keep: among the complete ones (FINISHED), the
        lowest id. A run an interrupted job left RUNNING never counts."""
        done = sorted(
            r.info.run_id
            for r in runs
            if r.info.status == "FINISHED" and r.data.tags.get(f"{TAG}.{digest_tag}") == digest
        )
        return done[0] if done else None

    @contextlib.contextmanager
    def writing(self, run_id: str) -> Iterator[None]:
        """The writes into a new run. A concurrent job logging the same content may retire this run once its own
        copy is complete (`settle`); the remaining writes then fail and are moot: `settle` keeps that copy."""
        from mlflow.exceptions import MlflowException

        try:
            yield
        except MlflowException as exc:
            if not self._deleted(run_id, exc):
                raise

    def settle(self, key: dict[str, str], digest_tag: str, digest: str, why: str) -> str:
        """After logging a run: the one run of its key to keep (`reusable`), every other retired, among them
        the run of an interrupted job and the copy of a job logging the same content at the same time. The
        runs are read again, not taken from before: such a job may have finished its copy meanwhile."""
        runs = self.active_runs(**key)
        keep = self.reusable(runs, digest_tag, digest)
        if keep is not None:
            self.retire(runs, keep=keep, why=why)
        if keep is None or self.client.get_run(keep).info.lifecycle_stage != "active":
            raise RuntimeError(
                f"the MLflow run of {key} was retired by another job logging it at the same time; rerun to log it once"
            )
        return keep

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
        """A run's last write: from here on it is complete (`reusable`)."""
        self.client.set_terminated(run_id, status=status, end_time=end_time_ms)


def _view_state(tag_value: str) -> str | None:
    """The UI state inside a saved view's tag value (None for one that is not such JSON)."""
    try:
        return json.loads(tag_value).get("state")
    except (ValueError, AttributeError):
        return None


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
    kept = tracker.reusable(existing, "summary_sha256", digest)
    if kept is not None:
        tracker.retire(existing, keep=kept, why="duplicate")
        return kept
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
    with tracker.writing(run_id):
        dataset = prompt_dataset(summary)
        if dataset is not None:
            tracker.client.log_inputs(run_id, datasets=[dataset])
        tracker.client.log_artifact(run_id, str(summary_path))
        tracker.finish(run_id, end_time_ms=end_ms)
    return tracker.settle({"cell_key": key}, "summary_sha256", digest, why="cell re-measured or re-judged")


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
    sweep_id = tracker.reusable(existing, "cells_sha256", digest)
    if sweep_id is not None:
        tracker.retire(existing, keep=sweep_id, why="sweep re-logged")
    else:
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
        with tracker.writing(sweep_id):
            tracker.client.log_dict(sweep_id, prompt_sets_by_level(summaries), "prompt_sets.json")
            fingerprint = (first.get("stack") or {}).get("fingerprint")
            if fingerprint and Path(fingerprint).is_file():
                tracker.client.log_artifact(sweep_id, fingerprint, artifact_path="stack")
            tracker.finish(sweep_id, end_time_ms=end_ms)
        sweep_id = tracker.settle({"sweep_key": sweep_key}, "cells_sha256", digest, why="sweep re-logged")
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
    kept = tracker.reusable(existing, "content_sha256", digest)
    if kept is not None:
        tracker.retire(existing, keep=kept, why="duplicate")
        return {"crossover_run_id": kept, "cell_run_ids": cell_runs}
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
    with tracker.writing(run_id):
        curves = _curves(data)
        for i in range(0, len(curves), 1000):  # MLflow takes at most 1000 metrics per batch
            tracker.client.log_batch(run_id, metrics=curves[i : i + 1000])
        out_dir = crossover_path.parent
        tracker.client.log_artifact(run_id, str(crossover_path))
        for name in ("policy.yaml", "crossover_table.csv"):
            if (out_dir / name).is_file():
                tracker.client.log_artifact(run_id, str(out_dir / name))
        if (out_dir / "plots").is_dir():  # not Snakemake's .snakemake_timestamp of the directory output
            plots = sorted(p for p in (out_dir / "plots").iterdir() if p.is_file() and not p.name.startswith("."))
            for plot in plots:
                tracker.client.log_artifact(run_id, str(plot), artifact_path="plots")
        tracker.client.log_dict(run_id, {"cell_run_ids": cell_runs, "sweeps": sweeps}, "cell_runs.json")
        tracker.finish(run_id, end_time_ms=end_ms)
    run_id = tracker.settle({"crossover_key": key}, "content_sha256", digest, why="crossover recomputed")
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


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status behind an error: MLflow's own (from its error code), or that of a requests.HTTPError
    (artifact uploads and downloads raise those)."""
    response = getattr(exc, "response", None)
    if getattr(response, "status_code", None) is not None:
        return int(response.status_code)
    return getattr(exc, "get_http_status_code", lambda: None)()


def _error_code(exc: BaseException) -> str | None:
    """MLflow's error code of the failure, an artifact request's 401/403 included."""
    by_status = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}
    return by_status.get(_http_status(exc) or 0, getattr(exc, "error_code", None))


def _unreachable(exc: BaseException) -> bool:
    """A request that got no answer, or only a gateway's "unavailable" (the server behind it is down)."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    return any(s in str(exc) for s in UNREACHABLE) or _http_status(exc) in (502, 503, 504)


def failure_text(exc: BaseException, config: dict[str, Any]) -> str:
    """One line for a tracking job that could not log: where (the server, credentials masked), what went
    wrong, the fix, and that nothing measured is lost (MLflow is fed from the local files)."""
    uri = redact_uri(split_uri_credentials(resolve_tracking_uri(config["mlflow"]["tracking_uri"]))[0])
    where = f"the MLflow server at {uri}" if is_server_uri(uri) else f"the MLflow store {uri}"
    detail = redact_text((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:500]
    code = _error_code(exc)
    rerun = "rerun the same snakemake command"
    if code == "UNAUTHENTICATED":
        problem = f"refused this job's credentials ({code})"
        fix = f"export {USER_ENV} and {PASSWORD_ENV} (or MLFLOW_TRACKING_TOKEN) of an account on it, then {rerun}"
    elif code == "PERMISSION_DENIED":
        user = os.environ.get(USER_ENV) or "this job's user"
        problem = f"refused {user} a change to experiment {config['experiment']!r} ({code})"
        fix = (
            f"give {user} MANAGE on the experiment (specsweep deletes the runs it supersedes; with basic auth, "
            f"default_permission = MANAGE gives it to every user), then {rerun}"
        )
    elif _unreachable(exc):
        problem = "cannot be reached"
        fix = f"start it (or correct mlflow.tracking_uri), then {rerun}"
    else:
        problem = "failed"
        fix = f"see the error above; once it is fixed, {rerun}"
    results = Path(config["results_dir"]) / config["experiment"]
    return (
        f"specsweep track: {where} {problem}: {detail}. Fix: {fix}. Nothing measured is lost: the results under "
        f"{results}/ stay as they are, and the rerun runs only the MLflow jobs, which log each cell once."
    )


class TrackingFailed(Exception):
    """A tracking job that could not log: the message is failure_text's line; `bug_traceback` (redacted) is set
    when the failure was no server's refusal or absence, so probably a bug, whose traceback helps."""

    def __init__(self, message: str, bug_traceback: str | None) -> None:
        super().__init__(message)
        self.bug_traceback = bug_traceback


def track(
    config: dict[str, Any],
    what: str,
    variant: str,
    *,
    arm: str | None = None,
    summaries: list[Path] | None = None,
    crossover: Path | None = None,
    sweeps: list[Path] | None = None,
) -> dict[str, Any]:
    """What `specsweep track` logs: `what` "sweep" (one variant x arm: its `summaries`, none for a policy arm
    that served no schedule) or "crossover" (the variant's `crossover` with its `sweeps` markers). Returns the
    marker (its run ids and the redacted tracking URI); TrackingFailed says where, what and the fix."""
    if not ((what == "sweep" and arm) or (what == "crossover" and crossover)):
        raise ValueError(f"track: a sweep is logged with its arm, a crossover with its crossover.json (got {what!r})")
    try:
        tracker = Tracker(config)
        if what == "sweep" and not summaries:  # a policy arm whose family got no schedule: nothing to log
            note = "no cells: the arm served no schedule"
            marker = {"arm": arm, "sweep_run_id": None, "cell_run_ids": {}, "note": note}
        elif what == "sweep":
            marker = log_sweep(tracker, variant, str(arm), list(summaries or []))
        else:
            marker = log_crossover(tracker, variant, Path(str(crossover)), list(sweeps or []))
        tracker.save_view()  # again: a concurrent job's write may have taken this config's arms away
    except Exception as exc:
        bug = not (_unreachable(exc) or _error_code(exc) in AUTH_CODES)
        raise TrackingFailed(failure_text(exc, config), redact_text(traceback.format_exc()) if bug else None) from exc
    marker["tracking_uri"] = redact_uri(tracker.uri)
    return marker
