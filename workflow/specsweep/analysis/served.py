"""The draft length an engine served at a policy level, from its own counters, beside the one the schedule asked for.

A schedule is a request to the engine; whether the engine honoured it is a measurement. vLLM (and the simulator,
which mirrors it) count per cell the drafts (`vllm:spec_decode_num_drafts_total`: one per sequence and verify
pass), their draft tokens (`..._num_draft_tokens_total`) and the accepted ones; the cell's summary holds the deltas
(`metrics.spec_counters`) and the tokens it received (`metrics.output_tokens_total`, `n_ok`). From them:

- `while_drafting`: draft tokens / drafts, the K of the passes that drafted (the counters' own ratio);
- `drafting_share`: drafts over the cell's decode steps, each step of a sequence yielding one token plus its
  accepted drafts (decode steps = output tokens - one prefill token per request - accepted tokens);
- `per_step`: draft tokens per decode step, the two multiplied.

The K served is the K whose own fixed arm, measured at the same level, drafted the nearest number of tokens per
decode step (K=0: none; a fixed arm without counters counts K per step, as EAGLE drafts). Why not the ratio alone:
a closed loop's last requests drain the batch below the level, where a threshold schedule drafts again, so a
correctly served K=0 level still counts drafts at the smaller batches, and their ratio is those batches' K; an
engine ignoring the schedule drafts at nearly every step. And n-gram drafts propose fewer than K tokens where
their match is short, so the fixed arm of each K, not K itself, says what serving K looks like on this workload.

SGLang reports no draft tokens per cell (its per-request `spec_verify_ct` counts verify passes, not their K), so
its served K is `None`, "not reported": a missing figure is never a number.
"""

from __future__ import annotations

from typing import Any

from specsweep.analysis.verdict import levels_text
from specsweep.engines.speculation import schedule_not_applied_causes

__all__ = ["counters_per_step", "mismatch_text", "served_k_of", "served_k_text"]


def counters_per_step(summary: dict[str, Any] | None) -> dict[str, float | None] | None:
    """A cell's drafts, draft tokens, K while drafting, share of decode steps that drafted and draft tokens per
    decode step; None where the engine's counters were not read for every round."""
    metrics = (summary or {}).get("metrics") or {}
    c = metrics.get("spec_counters") or {}
    drafts, tokens = c.get("num_drafts"), c.get("num_draft_tokens")
    if drafts is None or tokens is None:
        return None
    accepted = c.get("num_accepted_tokens")
    total, requests = metrics.get("output_tokens_total"), metrics.get("n_ok")
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
    }


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
        "applied": None,
        "note": f"served K not reported: {why}",
    }
    return {**out, **known}


def served_k_of(
    summary: dict[str, Any] | None,
    scheduled: int | None,
    engine: str | None,
    references: dict[int, dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """The K the engine served in a policy cell (`summary`), beside the `scheduled` one. `references`: per K > 0 of
    the family, the summary of its fixed arm at the same level (None: no cell); `applied` is whether served and
    scheduled agree (None: not reported, or nothing scheduled there)."""
    if engine == "sglang":
        return _not_reported(
            scheduled, "SGLang reports no draft tokens per cell (spec_verify_ct counts verify passes, not their K)"
        )
    mine = counters_per_step(summary)
    if mine is None:
        return _not_reported(scheduled, "the engine's spec-decode counters were not read for every round of the cell")
    if mine["per_step"] is None:
        why = "the cell's decode steps are unknown (no output token or accepted count)"
        return _not_reported(scheduled, why, **{k: v for k, v in mine.items() if k != "per_step"})
    refs: dict[str, dict[str, Any]] = {"0": {"per_step": 0.0, "source": "no drafting"}}
    for k, ref in sorted((references or {}).items()):
        got = counters_per_step(ref) if ref is not None else None
        if got is not None and got["per_step"] is not None and got["drafts"]:
            refs[str(k)] = {"per_step": got["per_step"], "source": "its fixed arm at this level"}
        else:
            refs[str(k)] = {"per_step": float(k), "source": "nominal: K every decode step"}
    if scheduled is not None and str(scheduled) not in refs:
        refs[str(scheduled)] = {"per_step": float(scheduled), "source": "nominal: K every decode step"}
    m = mine["per_step"]
    # the nearest K; a tie goes to the scheduled K, then to the smaller
    served = min(refs, key=lambda k: (abs(m - refs[k]["per_step"]), k != str(scheduled), int(k)))
    out = {
        "scheduled": scheduled,
        "served": int(served),
        **mine,
        "references": refs,
        "applied": None if scheduled is None else int(served) == int(scheduled),
    }
    out["note"] = _note(out)
    return out


def _note(s: dict[str, Any]) -> str:
    said = f"served K={s['served']} (scheduled K={'-' if s['scheduled'] is None else s['scheduled']})"
    if s["drafts"] == 0:
        return f"{said}: no decode step drafted"
    return (
        f"{said}: {s['per_step']:.3g} draft tokens per decode step ({s['drafting_share']:.0%} of the steps drafted, "
        f"{s['while_drafting']:.3g} each), nearest K={s['served']}'s "
        f"{s['references'][str(s['served'])]['per_step']:.3g}"
    )


def mismatch_text(levels: list[tuple[float, dict[str, Any]]], engine: str | None, symbol: str = "C") -> str:
    """The proof's first words where the engine served another K than the schedule's: each level's K scheduled and
    served, and the engine's known causes."""
    where = ", ".join(f"{symbol}={c:g} (scheduled K={s['scheduled']}, served K={s['served']})" for c, s in levels)
    return (
        f"THE ENGINE DID NOT APPLY THE SCHEDULE at {where}: {schedule_not_applied_causes(engine)}; the throughput "
        "there measures what it served, not the schedule, and is not judged"
    )


def served_k_text(levels: list[tuple[float, dict[str, Any]]], symbol: str = "C") -> str:
    """'C=2 3/3, C=100 0/0' (served / scheduled) and, where the engine reports none, 'served K not reported'."""
    out = ", ".join(
        f"{symbol}={c:g} {s['served']}/{'-' if s['scheduled'] is None else s['scheduled']}"
        + (" NOT APPLIED" if s.get("applied") is False else "")
        for c, s in levels
        if s.get("served") is not None
    )
    missing = [(c, s) for c, s in levels if s.get("served") is None]
    if missing:
        said = f"{symbol}={levels_text([c for c, _ in missing])}: {missing[0][1]['note']}"
        out = f"{out}; {said}" if out else said
    return out
