"""The cell, sweep and crossover runs, logged from the local result files, and `track`: what `specsweep track`
logs, with one line that says where, what and the fix when it cannot."""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specsweep.config import defaults
from specsweep.io import atomic_write_json, read_json
from specsweep.measure.summary import cell_level, cell_step, read_judged, read_summary
from specsweep.records import CROSSOVER_FIX, Crossover, read
from specsweep.redact import redact_text, redact_uri
from specsweep.tracking.notes import cell_note, crossover_note, proof_status, sweep_note
from specsweep.tracking.payloads import (
    RUN_COLOR_TAG,
    cell_metrics,
    cell_params,
    cell_run_name,
    crossover_numbers,
    curves,
    finite_number,
    flatten,
    headline_metrics,
    level_text,
    measured_span,
    primary_metric,
    prompt_dataset,
    prompt_sets_by_level,
    sweep_colour,
    sweep_params,
    verdict_tags,
)
from specsweep.tracking.private import digest_mark, private_note, shareable
from specsweep.tracking.store import LAYOUT, NOTE, TAG, Tracker
from specsweep.tracking.uri import AUTH_CODES, error_code, failure_text, unreachable


def judged_cell(tracker: Tracker, summary_path: Path) -> dict[str, Any]:
    """The cell's summary judged by the experiment's gates and SLOs (`summary.read_judged`)."""
    gates = {**defaults("gates"), **(tracker.config.get("gates") or {})}
    return read_judged(Path(summary_path).parent, gates, tracker.config.get("slo"))[0]


def log_cell(tracker: Tracker, summary_path: Path, summary: dict[str, Any]) -> str:
    """The cell's run: reused when summary.json and its judgement are unchanged, else a new one that
    supersedes the old (a changed gate or SLO re-logs the cell without re-measuring it)."""
    key = summary["cell"]["key"]
    judgement = json.dumps(summary.get("judged_with"), sort_keys=True).encode()
    layout = (LAYOUT + digest_mark(tracker.config)).encode()
    digest = hashlib.sha256(Path(summary_path).read_bytes() + judgement + layout).hexdigest()
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
        f"{TAG}.backend": str(summary["client_backend"]),
        f"{TAG}.source": str(summary["source"]),
        f"{TAG}.valid": str(bool(validity["valid"])).lower(),
        f"{TAG}.invalid_reasons": private_note("; ".join(validity.get("reasons") or []), tracker.config)[:5000],
        f"{TAG}.summary_sha256": digest,
        NOTE: private_note(cell_note(summary), tracker.config, summary),
    }
    start_ms, end_ms = measured_span([summary])
    name = cell_run_name(
        cell["variant"], cell["arm"], cell["concurrency"], cell.get("load", "closed"), cell.get("level")
    )
    run_id = tracker.new_run(name, tags, cell_params(summary), cell_metrics(summary), start_time_ms=start_ms)
    with tracker.writing(run_id):
        dataset = prompt_dataset(summary)
        if dataset is not None:
            tracker.log_inputs(run_id, [dataset])
        with shareable(Path(summary_path), tracker.config) as shared:  # its texts kept local unless opted in
            tracker.client.log_artifact(run_id, str(shared))
        tracker.finish(run_id, end_time_ms=end_ms)
    return tracker.settle({"cell_key": key}, "summary_sha256", digest, why="cell re-measured or re-judged")


def log_sweep(tracker: Tracker, variant: str, arm: str, summary_paths: list[Path]) -> dict[str, Any]:
    """The sweep run of one variant x arm, with its cells nested under it."""
    experiment = tracker.config["experiment"]
    cell_runs: dict[int, str] = {}
    steps: list[tuple[int, dict[str, float]]] = []
    summaries: list[dict[str, Any]] = []
    for path in sorted(summary_paths, key=lambda p: cell_level(read_summary(p)["cell"])):
        summary = judged_cell(tracker, path)
        summaries.append(summary)
        c = cell_step(summary["cell"])
        cell_runs[c] = log_cell(tracker, path, summary)
        # the curves hold valid cells only; `cell_valid` (1/0 at every level) shows where the gaps are
        valid = bool(summary["validity"]["valid"])
        steps.append((c, {**(headline_metrics(summary) if valid else {}), "cell_valid": float(valid)}))
    sweep_key = f"{experiment}/{variant}/{arm}"
    layout = LAYOUT + digest_mark(tracker.config)
    digest = hashlib.sha256((json.dumps(sorted(cell_runs.items())) + layout).encode()).hexdigest()
    existing = tracker.active_runs(sweep_key=sweep_key)
    sweep_id = tracker.reusable(existing, "cells_sha256", digest)
    colour = sweep_colour(tracker.config, arm)
    if sweep_id is not None:
        tracker.retire(existing, keep=sweep_id, why="sweep re-logged")
        if colour:  # a run logged before the colour existed, or while the arms were in another order
            tracker.client.set_tag(sweep_id, RUN_COLOR_TAG, colour)
    else:
        first = summaries[0] if summaries else {}
        invalid = {
            level_text(s["cell"]): "; ".join(s["validity"].get("reasons") or [])
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
            f"{TAG}.invalid_cells": private_note(
                " | ".join(f"C={c}: {r}" for c, r in invalid.items()) or "none", tracker.config
            )[:5000],
            NOTE: private_note(sweep_note(variant, arm, summaries), tracker.config),
            **({RUN_COLOR_TAG: colour} if colour else {}),
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
    data = read(Crossover, crossover_path, CROSSOVER_FIX)[1]
    sweeps = [read_json(p) for p in sweep_markers]
    cell_runs = sorted(r for s in sweeps for r in s["cell_run_ids"].values())
    layout = (LAYOUT + digest_mark(tracker.config)).encode()
    digest = hashlib.sha256(crossover_path.read_bytes() + json.dumps(cell_runs).encode() + layout).hexdigest()
    key = f"{experiment}/{variant}"
    existing = tracker.active_runs(crossover_key=key)
    kept = tracker.reusable(existing, "content_sha256", digest)
    if kept is not None:
        tracker.retire(existing, keep=kept, why="duplicate")
        return {"crossover_run_id": kept, "cell_run_ids": cell_runs}
    metrics: dict[str, float] = {}
    for arm_name, result in data["arms"].items():
        flatten(arm_name, crossover_numbers(result), metrics)
    proofs = {f: p for f, p in (data.get("policy_proof") or {}).items() if p.get("per_level")}
    for proof in proofs.values():
        ratios = [r["ratio"] for r in proof["per_level"] if finite_number(r.get("ratio")) is not None]
        flatten(
            proof["policy_arm"],
            {"failing_levels": float(len(proof["failing_levels"]))}
            | ({} if proof["holds"] is None else {"holds": float(bool(proof["holds"]))})
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
        **verdict_tags(data),
        NOTE: private_note(crossover_note(data, variant, sweep_links, tracker.experiment_id), tracker.config, data),
    }
    tags.update({f"{TAG}.policy.{f}": proof_status(p) for f, p in proofs.items()})
    spans = [s.get("span_ms") or [None, None] for s in sweeps]
    start_ms = min((a for a, _ in spans if a is not None), default=None)
    end_ms = max((b for _, b in spans if b is not None), default=None)
    params = {"variant": variant, "metric": primary_metric(data), "baseline_arm": data.get("baseline_arm")}
    run_id = tracker.new_run(
        f"{variant} crossover", tags, {k: v for k, v in params.items() if v}, metrics, start_time_ms=start_ms
    )
    with tracker.writing(run_id):
        metrics_by_level = curves(data)
        for i in range(0, len(metrics_by_level), 1000):  # MLflow takes at most 1000 metrics per batch
            tracker.client.log_batch(run_id, metrics=metrics_by_level[i : i + 1000])
        out_dir = crossover_path.parent
        with shareable(crossover_path, tracker.config) as shared:  # its texts kept local unless opted in
            tracker.client.log_artifact(run_id, str(shared))
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


class TrackingFailed(Exception):
    """A tracking job that could not log: the message is failure_text's line; `bug_traceback` (redacted) is set
    when the failure was no server's refusal or absence, so probably a bug, whose traceback helps."""

    def __init__(self, message: str, bug_traceback: str | None) -> None:
        super().__init__(message)
        self.bug_traceback = bug_traceback


@contextmanager
def failures_named(config: dict[str, Any]) -> Iterator[None]:
    """Any failure to log as TrackingFailed: failure_text's line (where, what, the fix), with the redacted
    traceback when it was no server's refusal or absence."""
    try:
        yield
    except Exception as exc:
        bug = not (unreachable(exc) or error_code(exc) in AUTH_CODES)
        raise TrackingFailed(failure_text(exc, config), redact_text(traceback.format_exc()) if bug else None) from exc


def sweep_marker(tracker: Tracker, variant: str, arm: str, summaries: list[Path]) -> dict[str, Any]:
    """One arm's sweep logged, as its marker; none for a policy arm whose family got no schedule."""
    if not summaries:
        marker = {"arm": arm, "sweep_run_id": None, "cell_run_ids": {}, "note": "no cells: the arm served no schedule"}
    else:
        marker = log_sweep(tracker, variant, arm, summaries)
    marker["tracking_uri"] = redact_uri(tracker.uri)
    return marker


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
    """What `specsweep track sweep|crossover` logs: `what` "sweep" (one variant x arm: its `summaries`, none for a
    policy arm that served no schedule) or "crossover" (the variant's `crossover` with its `sweeps` markers).
    Returns the marker (its run ids and the redacted tracking URI); TrackingFailed says where, what and the fix."""
    if not ((what == "sweep" and arm) or (what == "crossover" and crossover)):
        raise ValueError(f"track: a sweep is logged with its arm, a crossover with its crossover.json (got {what!r})")
    with failures_named(config):
        tracker = Tracker(config)
        if what == "sweep":
            marker = sweep_marker(tracker, variant, str(arm), list(summaries or []))
        else:
            marker = log_crossover(tracker, variant, Path(str(crossover)), list(sweeps or []))
            marker["tracking_uri"] = redact_uri(tracker.uri)
        tracker.save_view()  # again: a concurrent job's write may have taken this config's arms away
    return marker


def track_variant(
    config: dict[str, Any], variant: str, cells: list[Path], crossover: Path, sweep_markers: list[Path]
) -> dict[str, Any]:
    """What `specsweep track variant` logs: every arm's sweep, then the crossover, through one connection. An
    arm's cells are the `cells` under its marker's folder (<variant>/<arm>/c<C>/summary.json beside
    <variant>/<arm>/mlflow_sweep.json); each marker is written as soon as its sweep is logged, so a failure
    later in the job keeps what was logged. Returns the crossover's marker."""
    with failures_named(config):
        tracker = Tracker(config)
        for path in sweep_markers:
            arm_cells = [c for c in cells if c.parent.parent == path.parent]
            atomic_write_json(path, sweep_marker(tracker, variant, path.parent.name, arm_cells))
        marker = log_crossover(tracker, variant, crossover, sweep_markers)
        marker["tracking_uri"] = redact_uri(tracker.uri)
        tracker.save_view()  # again: a concurrent job's write may have taken this config's arms away
    return marker
