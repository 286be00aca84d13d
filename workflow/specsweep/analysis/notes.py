"""What the analysis says beside a verdict: the outputs' check, drift and slowed servers, invalid cells kept,
how the intervals were made, and each level's precision. Notes explain; they never change an answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specsweep.analysis.bootstrap import CellBootstrap
from specsweep.analysis.cells import Cell
from specsweep.analysis.hoststate import host_state_notes
from specsweep.analysis.outputs import output_verdict
from specsweep.analysis.paired import pairing_of
from specsweep.analysis.precision import precision_notes
from specsweep.analysis.settings import LEVEL_SYMBOL, AnalysisSettings
from specsweep.analysis.verdict import levels_text
from specsweep.measure.heal import is_drift, is_server_slowed

__all__ = [
    "INTERVAL_NOTE_ONE_REPEAT",
    "INTERVAL_NOTE_TWO_REPEATS",
    "ArmNotes",
    "arm_notes",
    "differ_note",
    "repeats_note",
    "ties_note",
    "unresolved_note",
]

INTERVAL_NOTE_ONE_REPEAT = "1 repeat: intervals hold within-run noise only; use repeats >= 3 for run-to-run variation"
INTERVAL_NOTE_TWO_REPEATS = (
    "2 repeats: the t interval over repeats has 1 degree of freedom and is very wide; use repeats >= 3"
)


def differ_note(
    rows: list[dict[str, Any]], spec_arm: str, baseline_arm: str, settings: AnalysisSettings, sym: str
) -> str:
    """OUTPUTS DIFFER: where, how much, and the first clear difference by prompt and position (or, unreferred,
    the first differing character); the referred differences not resolved are counted apart, with why."""
    worst = min(rows, key=lambda r: r["output_match"]["share"])
    m = worst["output_match"]
    head = (
        f"OUTPUTS DIFFER at {sym}={levels_text([r['concurrency'] for r in rows])}: only {m['share']:.0%} of "
        f"{spec_arm}'s outputs equal {baseline_arm}'s at {sym}={worst['concurrency']:g}"
    )
    refs = [r["output_match"]["referral"] for r in rows if (r["output_match"]["referral"] or {}).get("clear")]
    ex = refs[0]["clear_examples"][0] if refs else None
    if ex is None:
        fd = m["first_difference"] or {}
        return (
            f"{head} (first difference at character {fd.get('char')}; not referred to the baseline server: "
            f"analysis.min_output_match {settings.min_output_match:g}): a faster arm that generates other text is "
            "not the same service; check the draft and verify path"
        )
    ref = refs[0]
    told = (
        f"{baseline_arm} {ex['reference_token']!r} over {spec_arm} {ex['other_token']!r} "
        f"by {ex['margin_nats']:.3g} nats"
        if ex["other_token"] is not None
        else f"{spec_arm}'s {ex['other_head']!r} not among the baseline's top candidates, at least "
        f"{ex['margin_at_least_nats']:.3g} nats below its own token {ex['reference_token']!r}"
    )
    left = (
        f"; {ref['unresolved']} more not resolved ({ref['unresolved_examples'][0]['why']})"
        if ref.get("unresolved")
        else ""
    )
    return (
        f"{head}; {ref['clear']} of {ref['referred']} referred differences are clear (more than "
        f"{settings.output_tie_nats:g} nats between the two tokens, analysis.output_tie_nats), e.g. prompt "
        f"{ex['prompt_index']} of round {ex['repeat']} at character {ex['char']}: {told}{left}. A faster arm that "
        "generates other text is not the same service; check the draft and verify path"
    )


def ties_note(rows: list[dict[str, Any]], spec_arm: str, baseline_arm: str, tie_nats: float, sym: str) -> str:
    """Differences that are near-ties: batch numerics, with their share; not the speculative path."""
    parts = []
    for r in rows:
        m, ref = r["output_match"], r["output_match"]["referral"]
        left = f", {ref['unreferred']} not referred" if ref["unreferred"] else ""
        parts.append(f"{sym}={r['concurrency']:g} {m['differ']} of {m['compared']} ({ref['near_ties']} referred{left})")
    worst = max(r["output_match"]["referral"]["max_tie_margin_nats"] or 0.0 for r in rows)
    return (
        f"outputs differ at near-ties: {'; '.join(parts)}: at each referred first difference the {baseline_arm} "
        f"server scores its own token and {spec_arm}'s within {worst:.2g} nats (analysis.output_tie_nats "
        f"{tie_nats:g}): numerics of another batch shape (the verify pass scores K+1 tokens at once), not the "
        "speculative path"
    )


def unresolved_note(rows: list[dict[str, Any]], spec_arm: str, baseline_arm: str, tie_nats: float, sym: str) -> str:
    """Differences none clear and some not resolved: the server's candidates could not tell a near-tie from a
    clear margin there (an unmatched token, the likeliest it could be within the tie margin), so they are neither
    numerics nor a clear difference; counted with the near-ties beside them, the first named with why. The note
    never holds the words that flag a clear difference (`differ_note`): readers and tests look for them."""
    parts = []
    for r in rows:
        m, ref = r["output_match"], r["output_match"]["referral"]
        left = f", {ref['unreferred']} not referred" if ref["unreferred"] else ""
        parts.append(
            f"{sym}={r['concurrency']:g} {m['differ']} of {m['compared']} ({ref['near_ties']} near-ties, "
            f"{ref['unresolved']} not resolved{left})"
        )
    ex = next(r["output_match"]["referral"]["unresolved_examples"][0] for r in rows)
    return (
        f"outputs differ, not resolved: {'; '.join(parts)}: no referred difference is clear, but the {baseline_arm} "
        f"server's candidates cannot tell near-tie from clear margin where {spec_arm}'s token is not matched, e.g. "
        f"prompt {ex['prompt_index']} of round {ex['repeat']} at character {ex['char']} ({spec_arm}'s "
        f"{ex['other_head']!r}): {ex['why']} (analysis.output_tie_nats {tie_nats:g}). Counted neither as near-ties "
        "nor as clear differences"
    )


def slowed_attempts(cell: Cell) -> bool:
    """Whether an attempt of the cell's level found a block served by a slowed server (`gates.server_state_gate`)."""
    log = (cell.summary.get("attempts") or {}).get("log") or []
    return any(is_server_slowed(r) for entry in log for r in entry["reasons"])


def repeats_note(methods: list[str], n_repeats: list[int]) -> tuple[bool, str | None]:
    """Whether the intervals hold within-run noise only (a cell with one repeat), and the note that says so."""
    if "blocks" in methods:
        return True, INTERVAL_NOTE_ONE_REPEAT
    if n_repeats and min(n_repeats) == 2:
        return False, INTERVAL_NOTE_TWO_REPEATS
    return False, None


@dataclass(frozen=True)
class ArmNotes:
    """What `arm_notes` says of one arm's comparison: the notes, and how its intervals were made."""

    notes: list[str]
    within_only: bool  # the intervals hold within-run noise only (one repeat, one round)
    interval_note: str | None
    output_match_min: float | None  # the lowest share of equal outputs over the compared levels


def arm_notes(
    per_level: list[dict[str, Any]],
    used: list[float],
    base_cells: dict[float, Cell],
    spec_cells: dict[float, Cell],
    boots: list[CellBootstrap],
    invalid: list[dict[str, Any]],
    spec_arm: str,
    baseline_arm: str,
    settings: AnalysisSettings,
) -> ArmNotes:
    """The notes beside one arm's verdict, from its levels (`per_level` rows), its used levels' cells and their
    bootstraps: the outputs' check, drift, slowed servers, invalid cells kept, the intervals' making, precision."""
    out: list[str] = []
    sym = LEVEL_SYMBOL[settings.load]
    pname = settings.primary_metric
    # None: the two cells' outputs were never compared (one recorded none: virtual-time or older cells); said
    # so below, never counted as equal
    compared = [r for r in per_level if r.get("output_match") is not None]
    judged = {r["concurrency"]: output_verdict(r["output_match"], settings.min_output_match) for r in compared}
    differ = [r for r in compared if judged[r["concurrency"]] == "differ"]
    if differ:
        out.append(differ_note(differ, spec_arm, baseline_arm, settings, sym))
    ties = [r for r in compared if judged[r["concurrency"]] == "numerics"]
    if ties:
        out.append(ties_note(ties, spec_arm, baseline_arm, settings.output_tie_nats, sym))
    unresolved = [r for r in compared if judged[r["concurrency"]] == "unresolved"]
    if unresolved:
        out.append(unresolved_note(unresolved, spec_arm, baseline_arm, settings.output_tie_nats, sym))
    not_compared = [r["concurrency"] for r in per_level if "output_match" in r and r["output_match"] is None]
    if not_compared:
        out.append(
            f"outputs not compared at {sym}={levels_text(not_compared)}: a cell there recorded no outputs "
            '(virtual-time or older cells), so "same output, only faster" is not checked there'
        )
    shares = [r["output_match"]["share"] for r in compared]
    drifted = [c for c in used if any(is_drift(f) for x in (base_cells[c], spec_cells[c]) for f in x.flags)]
    if drifted:
        out.append(
            f"the host changed speed inside the level at {sym}={levels_text(drifted)}, in two attempts in a row "
            "(the cells' drift flags): kept, the rounds' spread carries it into the interval; more rounds "
            "(repeats) or fewer arms per level narrow it"
        )
    slowed = [c for c in used if any(slowed_attempts(x) for x in (base_cells[c], spec_cells[c]))]
    if slowed:
        out.append(
            f"a server slowed in a block at {sym}={levels_text(slowed)} (it got less of its CPUs or GPUs than in "
            "its other blocks, gates.max_server_slowdown): that attempt is kept under the cell's attempts/ and the "
            "level was measured again; the answer uses the attempt that counts"
        )
    included_invalid = sorted({e["concurrency"] for e in invalid if e["included"]})
    if included_invalid:
        out.append(f"{sym}={levels_text(included_invalid)} invalid but included (include_invalid)")
    cells_b = boots
    methods = [b.method.get(pname, "none") for b in cells_b]
    n_reps = [b.n_repeats.get(pname, 0) for b in cells_b if b.has_interval.get(pname)]
    within_only, interval_note = repeats_note(methods, n_reps)
    pairs = [r["paired"] for r in per_level if r.get("paired")]
    interleaved = all(pairing_of(x) is None or pairing_of(x)["mode"] == "interleaved" for x in base_cells.values())
    if pairs and len(pairs) == len(used) and {p["unit"] for p in pairs} == {"instance"}:
        counts = sorted({p["blocks"] for p in pairs})
        within_only = counts == [1]
        interval_note = (
            f"interleaved arms on {'/'.join(map(str, counts))} server instances per arm: the speedup the mean "
            "of the instances' paired rounds; where the rounds show an instance effect (F test, 50%), the interval "
            "is a t over the instances"
            + (
                f" (at {sym}={levels_text(effect)}: more instances narrow it)"
                if (effect := [r["concurrency"] for r in per_level if (r.get("paired") or {}).get("instance_effect")])
                else " (none showed one)"
            )
            if interleaved
            else f"replicated arms: {'/'.join(map(str, counts))} server instance(s) per arm in counterbalanced "
            "segments, the speedup from the arms' instance means (the instances' spread in the interval)"
        )
    elif pairs and len(pairs) == len(used):  # every level measured in interleaved blocks: the paired interval
        blocks = sorted({p["blocks"] for p in pairs})
        within_only = blocks == [1]
        shown = f"{blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else str(blocks[0])
        interval_note = (
            f"interleaved arms: {shown} round(s) of blocks per level, the speedup a paired t over the rounds "
            "(each round's blocks of both arms)"
            + (
                "; 1 round: intervals hold within-block noise only, use precision.min_rounds >= 3"
                if within_only
                else ""
            )
        )
    out.extend(precision_notes(per_level, sym))
    out.extend(host_state_notes(per_level, sym))
    return ArmNotes(out, within_only, interval_note, min(shares) if shares else None)
