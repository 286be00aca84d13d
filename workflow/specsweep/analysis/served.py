"""The draft length an engine served at a policy level, from its own counters, beside the one the schedule asked for.

A schedule is a request to the engine; whether the engine honoured it is a measurement. vLLM (and the simulator,
which mirrors it) count per cell the drafts (`vllm:spec_decode_num_drafts_total`: one per sequence and verify
pass), their draft tokens (`..._num_draft_tokens_total`) and the accepted ones; the cell's summary holds the deltas
(`metrics.spec_counters`) and the tokens it received (`metrics.output_tokens_total`, `answered`). From them:

- `while_drafting`: draft tokens / drafts, the K of the passes that drafted (the counters' own ratio);
- `drafting_share`: drafts over the cell's decode steps, each step of a sequence yielding one token plus its
  accepted drafts (decode steps = output tokens - one prefill token per request - accepted tokens);
- `per_step`: draft tokens per decode step, the two multiplied.

The K served is the K whose own fixed arm, measured at the same level, drafted the nearest number of tokens per
decode step (K=0: none; a fixed arm without counters counts K per step, as EAGLE drafts). Why not the ratio alone:
a closed loop's batch falls below its level at times (below), where a threshold schedule drafts again, so a
correctly served K=0 level may still count drafts at the smaller batches, and their ratio is those batches' K; an
engine ignoring the schedule drafts at nearly every step. And n-gram drafts propose fewer than K tokens where
their match is short, so the fixed arm of each K, not K itself, says what serving K looks like on this workload.

A closed loop's batch also falls below its level while requests turn over: each finishing request leaves its slot
empty for about `TURNOVER_STEPS` engine steps (its stream's end, the client's next request, its admission), so a
level whose turnover reaches a batch size where the schedule switches K serves both Ks, by design. There the served
figure lies between the two Ks' references ("mixed", applied); where it sits at the other K's own figure, an engine
whose batch stayed below the switch and one that ignores the schedule look alike ("not resolved", not a mismatch); a
level clear of every switch decides it.

SGLang reports no draft tokens per cell (its per-request `spec_verify_ct` counts verify passes, not their K), so
its served K is `None`, "not reported": a missing figure is never a number.
"""

from __future__ import annotations

import math
from typing import Any

from specsweep.analysis.verdict import levels_text
from specsweep.engines.speculation import schedule_not_applied_causes

__all__ = [
    "TURNOVER_STEPS",
    "counters_per_step",
    "mismatch_text",
    "scheduled_k",
    "served_k_of",
    "served_k_text",
    "turnover_ks",
]

TURNOVER_STEPS = 2  # engine steps a finishing request's slot stays empty in a closed loop (see the docstring)
MIXED_EDGE = 0.1  # share of the gap between two Ks' figures within which a cell reads as the nearer K alone


def answered(metrics: dict[str, Any]) -> int | None:
    """The requests whose prefill yielded a token (fillers aborted mid-answer included: the counters count their
    steps too); a cell measured before fillers existed: its requests that ended without error, the same count."""
    n = metrics.get("n_answered")
    return metrics.get("n_ok") if n is None else n


def counters_per_step(summary: dict[str, Any] | None) -> dict[str, float | None] | None:
    """A cell's drafts, draft tokens, K while drafting, share of decode steps that drafted and draft tokens per
    decode step; None where the engine's counters were not read for every round."""
    metrics = (summary or {}).get("metrics") or {}
    c = metrics.get("spec_counters") or {}
    drafts, tokens = c.get("num_drafts"), c.get("num_draft_tokens")
    if drafts is None or tokens is None:
        return None
    accepted = c.get("num_accepted_tokens")
    total, requests = metrics.get("output_tokens_total"), answered(metrics)
    share: float | None = 0.0 if drafts == 0 else None
    if drafts > 0 and None not in (accepted, total, requests):
        steps = float(total) - float(requests) - float(accepted)
        share = min(1.0, drafts / steps) if steps > 0 else None
    while_drafting = tokens / drafts if drafts > 0 else None
    return {
        "drafts": float(drafts),
        "draft_tokens": float(tokens),
        "while_drafting": while_drafting,
        "drafting_share": share,
        "per_step": 0.0 if drafts == 0 else (None if share is None else share * (while_drafting or 0.0)),
        "steps_per_request": _steps_per_request(metrics, accepted),
    }


def _steps_per_request(metrics: dict[str, Any], accepted: float | None) -> float | None:
    """A request's decode steps in the cell (output tokens less its prefill token and its accepted drafts)."""
    total, requests = metrics.get("output_tokens_total"), answered(metrics)
    if None in (accepted, total, requests) or not requests:
        return None
    steps = (float(total) - float(requests) - float(accepted)) / float(requests)
    return steps if steps > 0 else None


def scheduled_k(schedule: list[list[int]] | None, level: float) -> int | None:
    """The K the schedule serves at `level` running requests (None: no range covers it, or no schedule)."""
    return next((int(k) for start, end, k in schedule or [] if start <= level <= end), None)


def turnover_ks(schedule: list[list[int]] | None, level: float, steps_per_request: float | None) -> dict[int, int]:
    """The K the schedule serves at each batch size a closed loop at `level` runs at: the level, and below it the
    slots its turning-over requests leave empty (`TURNOVER_STEPS` of a request's decode steps, at least one)."""
    top = int(level)
    dip = 1 if not steps_per_request else max(1, math.ceil(TURNOVER_STEPS * top / steps_per_request))
    ks = {batch: scheduled_k(schedule, batch) for batch in range(max(1, top - dip), top + 1)}
    return {batch: k for batch, k in ks.items() if k is not None}


def _not_reported(scheduled: int | None, why: str, **known: Any) -> dict[str, Any]:
    out = {
        "scheduled": scheduled,
        "served": None,
        "per_step": None,
        "while_drafting": None,
        "drafting_share": None,
        "drafts": None,
        "draft_tokens": None,
        "references": None,
        "turnover": None,
        "applied": None,
        "note": f"served K not reported: {why}",
    }
    return {**out, **{k: v for k, v in known.items() if k in out}}


def served_k_of(
    summary: dict[str, Any] | None,
    schedule: list[list[int]] | None,
    level: float,
    engine: str | None,
    references: dict[int, dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """The K the engine served in a policy cell (`summary`) at `level`, beside the one the `schedule` serves there.
    `references`: per K > 0 of the family, the summary of its fixed arm at the same level (None: no cell);
    `applied` is whether served and scheduled agree, a level whose turnover spans a switch of the schedule
    serving both (None: not reported, not resolved, or nothing scheduled there)."""
    scheduled = scheduled_k(schedule, level)
    if engine == "sglang":
        return _not_reported(
            scheduled, "SGLang reports no draft tokens per cell (spec_verify_ct counts verify passes, not their K)"
        )
    mine = counters_per_step(summary)
    if mine is None:
        return _not_reported(scheduled, "the engine's spec-decode counters were not read for every round of the cell")
    if mine["per_step"] is None:
        why = "the cell's decode steps are unknown (no output token or accepted count)"
        return _not_reported(scheduled, why, **mine)
    turnover = turnover_ks(schedule, level, mine.pop("steps_per_request"))
    refs: dict[str, dict[str, Any]] = {"0": {"per_step": 0.0, "source": "no drafting"}}
    for k, ref in sorted((references or {}).items()):
        got = counters_per_step(ref) if ref is not None else None
        if got is not None and got["per_step"] is not None and got["drafts"]:
            refs[str(k)] = {"per_step": got["per_step"], "source": "its fixed arm at this level"}
        else:
            refs[str(k)] = {"per_step": float(k), "source": "nominal: K every decode step"}
    for k in {scheduled, *turnover.values()} - {None}:
        refs.setdefault(str(k), {"per_step": float(k), "source": "nominal: K every decode step"})
    m = mine["per_step"]
    # the nearest K; a tie goes to the scheduled K, then to the smaller
    served = int(min(refs, key=lambda k: (abs(m - refs[k]["per_step"]), k != str(scheduled), int(k))))
    out = {
        "scheduled": scheduled,
        "served": served,
        **mine,
        "references": refs,
        "turnover": None,
        "applied": None if scheduled is None else served == scheduled,
    }
    switch = sorted(set(turnover.values()))
    if scheduled is not None and served != scheduled and served in switch:
        out["turnover"] = {str(b): k for b, k in sorted(turnover.items())}
        ours, theirs = refs[str(scheduled)]["per_step"], refs[str(served)]["per_step"]
        if abs(m - theirs) > MIXED_EDGE * abs(theirs - ours):
            out["applied"] = True  # both Ks, as the batch crossed the switch: what the schedule serves there
        else:
            out["served"], out["applied"] = None, None
    out["note"] = _note(out, level)
    return out


def _note(s: dict[str, Any], level: float) -> str:
    if s["turnover"] and s["served"] is None:
        return (
            f"served K not resolved at C={level:g}: the level's turnover runs batches "
            f"{_batches(s['turnover'])}, and the cell drafted {s['per_step']:.3g} tokens per decode step, K="
            f"{_other_k(s)}'s own figure: a batch that stayed below the switch or an engine ignoring the schedule "
            "read alike; a level clear of the switch decides it"
        )
    said = f"served K={s['served']} (scheduled K={'-' if s['scheduled'] is None else s['scheduled']})"
    if s["drafts"] == 0:
        return f"{said}: no decode step drafted"
    text = (
        f"{said}: {s['per_step']:.3g} draft tokens per decode step ({s['drafting_share']:.0%} of the steps drafted, "
        f"{s['while_drafting']:.3g} each), nearest K={s['served']}'s "
        f"{s['references'][str(s['served'])]['per_step']:.3g}"
    )
    if s["turnover"]:
        text += f"; both Ks served as the level's turnover ran batches {_batches(s['turnover'])}, as scheduled"
    return text


def _batches(turnover: dict[str, int]) -> str:
    """'9 (K=3) to 10 (K=0)': the lowest and highest batch of a level's turnover and their Ks."""
    lo, hi = min(turnover, key=int), max(turnover, key=int)
    return f"{lo} (K={turnover[lo]}) to {hi} (K={turnover[hi]})"


def _other_k(s: dict[str, Any]) -> int:
    return next(k for k in sorted(set(s["turnover"].values())) if k != s["scheduled"])


def mismatch_text(levels: list[tuple[float, dict[str, Any]]], engine: str | None, symbol: str = "C") -> str:
    """The proof's first words where the engine served another K than the schedule's: each level's K scheduled and
    served, and the engine's known causes."""
    where = ", ".join(f"{symbol}={c:g} (scheduled K={s['scheduled']}, served K={s['served']})" for c, s in levels)
    return (
        f"THE ENGINE DID NOT APPLY THE SCHEDULE at {where}: {schedule_not_applied_causes(engine)}; the throughput "
        "there measures what it served, not the schedule, and is not judged"
    )


def served_k_text(levels: list[tuple[float, dict[str, Any]]], symbol: str = "C") -> str:
    """'C=2 3/3, C=10 3/0 (turnover 9-10: both), C=100 0/0' (served / scheduled) and, where the engine reports
    none or the level's turnover leaves it unresolved, why."""

    def one(c: float, s: dict[str, Any]) -> str:
        said = f"{symbol}={c:g} {s['served']}/{'-' if s['scheduled'] is None else s['scheduled']}"
        if s.get("applied") is False:
            return f"{said} NOT APPLIED"
        if s.get("turnover"):
            return f"{said} (turnover {min(s['turnover'], key=int)}-{max(s['turnover'], key=int)}: both Ks)"
        return said

    parts = [one(c, s) for c, s in levels if s.get("served") is not None]
    unresolved = [c for c, s in levels if s.get("served") is None and s.get("turnover")]
    if unresolved:
        parts.append(f"{symbol}={levels_text(unresolved)} not resolved (the level's turnover spans the switch)")
    missing = [(c, s) for c, s in levels if s.get("served") is None and not s.get("turnover")]
    out = ", ".join(parts)
    if missing:
        said = f"{symbol}={levels_text([c for c, _ in missing])}: {missing[0][1]['note']}"
        out = f"{out}; {said}" if out else said
    return out
