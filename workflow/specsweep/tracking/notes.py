"""One-paragraph descriptions of specsweep's MLflow runs (the run page's Description, `mlflow.note.content`).

Why: a run's page should say what the run is and how to read it without opening docs: which arm and variant,
simulated or real engine, which levels are valid, and for the crossover run what the crossover and the threshold
mean, with links to the sweeps it used.
"""

from __future__ import annotations

import math
from typing import Any

from specsweep.measure.summary import cell_level


def _source(source: Any) -> str:
    return "simulated engine" if source == "simulated" else "real engine"


def _c(v: Any) -> str:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        return "-"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def cell_note(summary: dict[str, Any]) -> str:
    cell, w, validity = summary["cell"], summary["workload"], summary["validity"]
    verdict = "valid" if validity["valid"] else "INVALID: " + "; ".join(validity.get("reasons") or [])
    load = cell.get("load", "closed")
    at = {"closed": f"concurrency C={cell['concurrency']}", "open": f"{cell.get('level')} requests/s"}
    where = f"{cell['variant']}/{cell['arm']} at " + at.get(load, f"trace time scale {cell.get('level')}")
    loop = "a closed loop" if load == "closed" else f"an open loop ({load})"
    return (
        f"Cell {where} ({_source(summary['source'])}):"
        f" {w.get('n_requests')} measured requests of {w.get('output_tokens')} output tokens in {loop};"
        f" {verdict}. Metrics use summary.json's names; the sweep run above charts the headline ones against C."
    )


def sweep_note(variant: str, arm: str, summaries: list[dict[str, Any]]) -> str:
    levels = [f"{cell_level(s['cell']):g}" for s in summaries]
    bad = [f"{cell_level(s['cell']):g}" for s in summaries if not s["validity"]["valid"]]
    source = _source((summaries[0] if summaries else {}).get("source"))
    gaps = (
        f" Invalid (left off the curves, reasons in tag specsweep.invalid_cells): C={', '.join(map(str, bad))}."
        if bad
        else " Every cell is valid."
    )
    return (
        f"Sweep of arm **{arm}** on variant **{variant}** ({source}): the headline metrics (aggregate_tok_s,"
        f" tpot_p50_s, tpot_p99_s, e2e_p50_s, ...) logged with step = concurrency C at levels"
        f" {', '.join(map(str, levels))}; valid cells only.{gaps} `cell_valid` is 1/0 at every level. One nested"
        " run per cell holds its full metrics and summary.json."
    )


def crossover_note(data: dict[str, Any], variant: str, sweep_runs: dict[str, str], experiment_id: str) -> str:
    """Per speculative arm: the crossover with its interval and what it means, the threshold (or why there is
    none), the policy proof; then links to the sweep runs."""
    lines = [
        f"Crossover of variant **{variant}** ({_source(data.get('source'))}). Speedup = speculative arm / baseline"
        f" on {next(iter((data.get('arms') or {}).values()), {}).get('primary_metric', 'aggregate_tok_s')},"
        " logged per concurrency as `<arm>.speedup` (step = C; `_lo`/`_hi` the 95% interval).",
        "",
    ]
    if data.get("content_warning"):  # before any figure: the threshold is not one to paste
        lines += [f"**{data['content_warning']}**", ""]
    for arm, result in (data.get("arms") or {}).items():
        lo, hi = result.get("crossover_ci_low"), result.get("crossover_ci_high")
        est = result.get("crossover_concurrency")
        verdict = (result.get("verdict") or {}).get("kind", "-")
        threshold = result.get("threshold")
        if est is not None:
            up = ((result.get("crossings") or [{}])[0]).get("direction") == "up"
            meaning = "below it slower, above it faster" if up else "below it faster, above it slower"
            cross = f"crossover at C = {_c(est)} [{_c(lo)}, {_c(hi)}]: speculation is {meaning}"
        else:
            cross = f"no crossover inside the measured levels (verdict: {verdict})"
        if threshold is not None:
            act = (
                f"threshold N = {threshold}: speculate while running requests <= {threshold}"
                " (the interval's conservative end; policy.yaml holds the engine's setting)"
            )
        else:
            reason = (result.get("verdict") or {}).get("reason", "")
            act = f"no threshold: verdict {verdict}" + (f" ({reason})" if reason else "")
        lines.append(f"- **{arm}**: {cross}; {act}.")
    for proof in (data.get("policy_proof") or {}).values():
        if proof.get("per_level"):
            status = proof_status(proof)
            status = f"FAILS at C={proof.get('failing_levels')}" if status == "fails" else status
            if status == "not applied":
                status = f"the engine did not apply the schedule at C={proof.get('not_applied_levels')}"
            lines.append(
                f"- **{proof['policy_arm']}** (serves the schedule): {status}; `policy_over_best` per C is its"
                " throughput over the best fixed arm's."
            )
    if sweep_runs:
        links = ", ".join(
            f"[{variant}/{a} sweep](#/experiments/{experiment_id}/runs/{r})" for a, r in sweep_runs.items()
        )
        lines += ["", f"Sweeps: {links}."]
    return "\n".join(lines)


def proof_status(proof: dict[str, Any]) -> str:
    """A policy proof in one word: not applied (the engine served another K than the schedule's at a level, said
    before any throughput verdict), fails (a level below the margin), holds, not decided (a level straddles the
    margin: more rounds decide it) or not judged; `holds` null is never read as a failure."""
    if proof.get("not_applied_levels"):
        return "not applied"
    if proof.get("failing_levels"):
        return "fails"
    if proof.get("holds"):
        return "holds"
    return "not decided" if proof.get("undecided_levels") else "not judged"
