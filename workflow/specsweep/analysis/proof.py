"""Proof that a policy works: the policy arm against the best fixed arm, level by level ("policy regret").

A schedule derived from the sweep is a claim: "serving this gets the best of every draft length at every
load". The policy arm serves it and is measured like any arm; here its primary metric is divided by that of
the best fixed arm at the same level (the baseline or any draft length of its family, chosen by point value),
with the interval of the ratio from the same bootstrap as every speedup. With an equivalence margin m
(`policy.margin`, 2%): the policy fails at a level where the whole interval lies below 1 - m, holds where it lies
above 1 - m, and is not decided where it straddles 1 - m, with the rounds that would decide it. Why a margin: a
policy serving the same K as a fixed arm is an A/A comparison, and on the vLLM CPU example such pairs read 1-3%
below 1 with intervals just under 1 (an instance's own speed, the per-batch-size path's bookkeeping): "fails"
there would call a tie a loss.

Two things come before that judgement. Where the engine's own counters show it served another K than the schedule's
(`analysis/served.py`), the level is `not applied`: its throughput measures what ran, not the schedule, and the
verdict names the engine's known causes first. Where the rule chose a smaller K than the best fixed arm's on purpose
(inside the crossover interval, or a K within the noise: `analysis/caution.py`), the level is judged against the
loss the sweep allowed there, not against 1 - m: `caution`, not a failure, while it stays within it.

Choosing the best of several noisy arms by point value favours an arm that was lucky, so the comparison
leans against the policy: a policy that holds here holds against the fixed arms as they were measured.
"""

from __future__ import annotations

import math
from typing import Any

from scipy import special

from specsweep.analysis.analyze import analyze_arm
from specsweep.analysis.bootstrap import METRICS, CellBootstrap
from specsweep.analysis.caution import caution_at, caution_text
from specsweep.analysis.cells import Cell, load_cell
from specsweep.analysis.paired import paired
from specsweep.analysis.served import mismatch_text, scheduled_k, served_k_of
from specsweep.analysis.settings import AnalysisSettings
from specsweep.analysis.verdict import levels_text
from specsweep.engines.speculation import static_k

__all__ = ["best_fixed", "policy_proof"]

ENVELOPE = "best fixed arm"


def best_fixed(cells: dict[str, dict[float, Cell]], arms: list[str], metric: str, c: float) -> str | None:
    """The arm with the best point value of `metric` at level `c` among valid cells of `arms`."""
    spec = next(m for m in METRICS if m.name == metric)
    scored = []
    for arm in arms:
        cell = cells.get(arm, {}).get(c)
        if cell is None or not cell.valid:
            continue
        v = spec.value(cell.summary)
        if v == v:  # not NaN
            scored.append((v if spec.higher_is_better else -v, arm))
    return max(scored)[1] if scored else None


def paired_reference(policy_cell: Cell, settings: AnalysisSettings) -> Cell | None:
    """The re-measurement of the fixed arm a policy cell serves, taken in interleaved blocks with it
    (`reference/` beside the policy cell; specsweep.measure.interleave), judged like every cell; None without one."""
    ref = policy_cell.path / "reference"
    if not (ref / "summary.json").is_file():
        return None
    cell = load_cell(ref, concurrency=policy_cell.concurrency, gates=settings.gates, slos=settings.slo_ms)
    if not paired(cell, policy_cell):
        return None
    # its own key: the fixed arm's cell of the sweep has the same identity, and bootstraps are cached by key
    cell.summary["cell"] = {**cell.summary["cell"], "key": f"{policy_cell.key}/reference"}
    return cell


def rounds_to_decide(ratio: float, lo: float, hi: float, floor: float, rounds: int | None) -> int | None:
    """Interleaved rounds that would put the interval on one side of `floor` (1 - margin), were the ratio and
    the rounds' spread to stay as measured: the half-width (in log) shrinks as 1/sqrt(rounds). None: the level
    was not measured in rounds, or the ratio sits on the floor (no number of rounds decides it)."""
    half = (math.log(hi) - math.log(lo)) / 2
    distance = abs(math.log(ratio) - math.log(floor))
    if not rounds or distance <= 0 or ratio <= 0:
        return None
    return max(rounds + 1, math.ceil(rounds * (half / distance) ** 2))


def what_it_compares(served: int | None, best_k: int | None) -> str:
    """What a proof row's ratio measures: at a level where the schedule serves the best fixed arm's own K, the
    mechanism that serves it (the per-batch-size path against the static flag; a K=0 range against the server
    without speculation); elsewhere the schedule's choice of K as well."""
    if served is None or best_k is None:
        return "unknown"
    if served != best_k:
        return "schedule"
    return "mechanism, K=0 range vs the baseline server" if served == 0 else f"mechanism, K={served} as the static flag"


def mechanism_cost(rows: list[dict[str, Any]], confidence: float) -> dict[str, Any]:
    """The mechanism's own cost per kind (same K > 0; K=0 range vs the baseline): the geometric mean of its rows'
    ratios with a t interval from their paired standard errors (Welch-Satterthwaite degrees of freedom). Levels
    are measured apart, so their errors add; a kind without a paired row is absent."""
    out: dict[str, Any] = {}
    for kind in sorted({r["compares"] for r in rows if r["compares"].startswith("mechanism")}):
        mine = [r for r in rows if r["compares"] == kind and r.get("log_se") and r.get("ratio") and r.get("df")]
        if not mine:
            continue
        n = len(mine)
        logs = [math.log(r["ratio"]) for r in mine]
        var = sum(r["log_se"] ** 2 for r in mine) / n**2
        df = (sum(r["log_se"] ** 2 for r in mine) ** 2) / sum(r["log_se"] ** 4 / r["df"] for r in mine)
        half = float(special.stdtrit(max(1.0, df), 0.5 + confidence / 2)) * math.sqrt(var)
        mean = sum(logs) / n
        out[kind] = {
            "ratio": math.exp(mean),
            "ratio_lo": math.exp(mean - half),
            "ratio_hi": math.exp(mean + half),
            "levels": [r["concurrency"] for r in mine],
        }
    return out


STATUSES = ("better", "holds", "caution", "fails", "not decided", "not judged", "not applied")


def judge(
    r: dict[str, Any], floor: float, band: tuple[float, float] | None, rounds: int | None
) -> tuple[str, int | None]:
    """A level's status against `floor` (1 - margin; at a level of the rule's caution, the loss it allows times
    1 - margin), with the rounds that would decide it where its interval straddles the floor."""
    lo, hi = r.get("speedup_lo"), r.get("speedup_hi")
    if not r["used"] or lo is None or hi is None:
        return "not judged", None
    if hi < floor and band is not None and r["speedup"] >= band[0]:
        return "holds", None  # below 1, but inside the level's A/A band: as far from 1 as two copies of one arm get
    if hi < floor:
        return "fails", None
    if lo > 1.0:
        return "better", None
    if lo >= floor:
        return "holds", None  # within the margin of the best fixed arm, or above it
    return "not decided", rounds_to_decide(r["speedup"], lo, hi, floor, rounds)


def _arm_proof(
    cells: dict[str, dict[float, Cell]],
    policy_arm: str,
    fixed: list[str],
    baseline: str,
    settings: AnalysisSettings,
    cache: dict[str, CellBootstrap],
    schedule: list[list[int]] | None = None,
    members: dict[str, int] | None = None,
    entry: dict[str, Any] | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """One family's proof; `entry` its schedule.json entry (what the rule chose and why), `engine` the engine that
    served it (its counters give the K served)."""
    metric = settings.primary_metric
    envelope: dict[float, Cell] = {}
    best_of: dict[float, str] = {}
    for c, policy_cell in sorted(cells.get(policy_arm, {}).items()):
        reference = paired_reference(policy_cell, settings)
        if reference is not None:  # the fixed arm the policy serves here, measured with it block by block
            envelope[c], best_of[c] = reference, reference.arm
            continue
        arm = best_fixed(cells, fixed, metric, c)
        if arm is not None:
            envelope[c], best_of[c] = cells[arm][c], arm
    regret = analyze_arm(
        {ENVELOPE: envelope, policy_arm: cells.get(policy_arm, {})}, ENVELOPE, policy_arm, settings, cache
    )
    vs_base = analyze_arm(cells, baseline, policy_arm, settings, cache)
    match = {r["concurrency"]: r.get("output_match") for r in vs_base["per_level"]}
    floor = 1.0 - settings.proof_margin
    entry = entry or {}
    rows = []
    for r in regret["per_level"]:
        c = r["concurrency"]
        lo, hi = r.get("speedup_lo"), r.get("speedup_hi")
        rounds = (r.get("paired") or {}).get("blocks")
        band = settings.noise_band_at(c)
        status, decide = judge(r, floor, band, rounds)
        best = best_of.get(c)
        best_k = 0 if best == baseline else (members or {}).get(best or "")
        scheduled = scheduled_k(schedule, c)
        policy_cell = cells.get(policy_arm, {}).get(c)
        fixed_cells = {k: cells.get(arm, {}).get(c) for arm, k in (members or {}).items()}
        refs = {k: None if x is None else x.summary for k, x in fixed_cells.items()}  # what serving K looks like
        served = served_k_of(policy_cell.summary if policy_cell else None, schedule, c, engine, refs)
        caution = None
        if status in ("fails", "not decided"):  # the rule's own caution is judged against what it promises
            caution = caution_at(entry, c, scheduled, best, best_k)
            if caution is not None and caution["bound"] is not None:
                caution["floor"] = caution["bound"] * floor
                status, decide = judge(r, caution["floor"], band, rounds)
                status = "caution" if status in ("holds", "better") else status
            if caution is not None:
                caution["text"] = caution_text(c, caution, r.get("speedup"), lo, hi)
        throughput = status
        if served["applied"] is False:  # named before any throughput verdict: the schedule was not what ran
            status, decide = "not applied", None
        paired_entry = r.get("paired") or {}
        rows.append(
            {
                "concurrency": c,
                "best_fixed_arm": best,
                "compares": what_it_compares(scheduled, best_k),
                "log_se": paired_entry.get("log_se"),
                "df": paired_entry.get("df"),
                "paired": bool((r.get("paired") or {}).get("blocks")),  # against the served arm, interleaved
                "policy_value": r.get("spec_value"),
                "best_value": r.get("baseline_value"),
                "ratio": r.get("speedup"),
                "ratio_lo": lo,
                "ratio_hi": hi,
                "status": status,
                "throughput_status": throughput,
                "rounds": rounds,
                "rounds_to_decide": decide,
                "output_match": match.get(c),
                "scheduled_k": scheduled,
                "served_k": served,
                "caution": caution,
            }
        )
    by = {s: [r["concurrency"] for r in rows if r["status"] == s] for s in STATUSES}
    failing, unjudged, undecided = by["fails"], by["not judged"], by["not decided"]
    not_applied = by["not applied"]
    shares = [m["share"] for m in match.values() if m]
    judged = [r for r in rows if r["status"] != "not applied"]
    verdict = _verdict(rows, judged, by, settings.proof_margin)
    if not_applied:
        verdict = mismatch_text(
            [(r["concurrency"], r["served_k"]) for r in rows if r["status"] == "not applied"], engine
        ) + (f". Elsewhere: {verdict}" if judged else "")
    unresolved = [r for r in rows if r["served_k"]["served"] is None and r["served_k"]["turnover"]]
    missing = [r for r in rows if r["served_k"]["served"] is None and not r["served_k"]["turnover"]]
    if missing:
        verdict += (
            f"; C={levels_text([r['concurrency'] for r in missing])}: {missing[0]['served_k']['note']}: whether the "
            "engine applied the schedule there is not checked"
        )
    if unresolved:
        verdict += (
            f"; C={levels_text([r['concurrency'] for r in unresolved])}: whether the engine applied the schedule "
            "there is not resolved: the level's turnover spans a switch of the schedule (its K served: "
            f"{unresolved[0]['served_k']['note']})"
        )
    holds = None if undecided and not failing else (not failing and len(unjudged) < len(judged))
    return {
        "policy_arm": policy_arm,
        "fixed_arms": fixed,
        "metric": metric,
        "per_level": rows,
        "failing_levels": failing,
        "unjudged_levels": unjudged,
        "undecided_levels": undecided,
        "caution_levels": by["caution"],
        "not_applied_levels": not_applied,
        "margin": settings.proof_margin,
        "mechanism": mechanism_cost(rows, settings.confidence),
        "holds": None if not_applied else holds,
        "verdict": verdict,
        "output_match_min": min(shares) if shares else None,
        "source": regret["source"],
    }


def _verdict(rows: list[dict[str, Any]], judged: list[dict[str, Any]], by: dict[str, list[float]], m: float) -> str:
    """The throughput verdict over the levels where the schedule was applied (or not known not to be)."""
    margin = f"{m:.0%}"
    if by["fails"]:
        verdict = (
            f"POLICY FAILS at C={levels_text(by['fails'])}: below the best fixed arm beyond the noise and the "
            f"{margin} margin"
        )
        cautious_fail = [r["caution"]["text"] for r in rows if r["status"] == "fails" and r.get("caution")]
        if cautious_fail:
            verdict += f", and below even the loss the rule's caution allows ({'; '.join(cautious_fail)})"
    elif not judged or len(by["not judged"]) == len(judged):
        verdict = "not judged: no level with a valid policy cell and a valid fixed arm"
    elif by["not decided"]:
        need = [f"C={r['concurrency']:g}: ~{r['rounds_to_decide']}" for r in rows if r.get("rounds_to_decide")]
        cautious = [r for r in rows if r["status"] == "not decided" and (r.get("caution") or {}).get("bound")]
        also = "; at a level of the rule's caution, the loss it allows" if cautious else ""
        verdict = (
            f"not decided at C={levels_text(by['not decided'])}: the interval reaches below 1 - {margin} (the margin"
            f"{also}) and above it; rounds that would decide it: "
            f"{', '.join(need) if need else 'unknown (not interleaved)'}"
        )
    else:
        verdict = f"holds at every judged level: within {margin} of the best fixed arm (or the A/A noise), or above it"
        if by["caution"]:
            verdict += ", or within the loss the rule's own caution allows"
        if by["not judged"]:
            verdict += f" (C={levels_text(by['not judged'])} not judged: invalid or missing cells)"
    said = [r["caution"]["text"] for r in rows if r["status"] == "caution"]
    if said:
        verdict += f"; the rule's caution, not a failure: {'; '.join(said)}"
    return verdict


def policy_proof(
    cells: dict[str, dict[float, Cell]],
    arms_cfg: dict[str, Any],
    baseline: str,
    settings: AnalysisSettings,
    schedules: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Per family with a policy arm: the schedule it served and its regret per level (crossover.json
    `policy_proof`). Families whose schedule was not derived (inconclusive) say so instead."""
    cache: dict[str, CellBootstrap] = {}
    out: dict[str, Any] = {}
    families = (schedules or {}).get("families", {})
    for name, arm in arms_cfg.items():
        if not arm.get("policy"):
            continue
        family = arm["family"]
        sched = families.get(family, {})
        if sched.get("served_by"):
            k = static_k(sched["schedule"])
            out[family] = {
                "policy_arm": name,
                "schedule": sched["schedule"],
                "served_by": sched["served_by"],
                "verdict": (
                    f"one K (K={k}) over the whole measured range: served by {sched['served_by']}'s own static "
                    "setting, whose cells are its measurement (no policy server started)"
                ),
                "holds": None,
                "failing_levels": [],
            }
            continue
        if not cells.get(name):
            out[family] = {
                "policy_arm": name,
                "schedule": sched.get("schedule"),
                "verdict": f"not measured: {sched.get('reason') or 'no schedule'}",
                "holds": None,
            }
            continue
        fixed = [baseline, *(a for a, c in arms_cfg.items() if c.get("family") == family and not c.get("policy"))]
        proof = _arm_proof(
            cells,
            name,
            fixed,
            baseline,
            settings,
            cache,
            sched.get("schedule"),
            sched.get("members") or {},
            sched,
            (schedules or {}).get("engine"),
        )
        proof.update(
            schedule=sched.get("schedule"),
            schedule_rule=sched.get("rule"),
            approximate=bool(sched.get("approximate")),
        )
        out[family] = proof
    return out
