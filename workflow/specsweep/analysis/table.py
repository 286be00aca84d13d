"""The crossover table as text and CSV: what `specsweep crossover` prints, what the workflow prints at its end,
and crossover_table.csv. A library module (the CLI and `final` both use it)."""

from __future__ import annotations

import csv
import io
from typing import Any

from specsweep.analysis.bootstrap import METRICS
from specsweep.analysis.policy import choose_threshold
from specsweep.analysis.served import served_k_text
from specsweep.analysis.settings import LEVEL_SYMBOL
from specsweep.analysis.verdict import crossover_text, levels_text

__all__ = ["CONTENT_COLUMN", "content_line", "format_table", "table_csv", "table_rows"]


def _fmt(v: float | None, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}g}"


def _crossover_line(name: str, ar: dict[str, Any], load: str = "closed") -> str:
    sym = LEVEL_SYMBOL[load]
    x = ar.get("crossover")
    m = ar["metrics"][ar["primary_metric"]]
    if x is None:
        return f"{name}: no usable levels"
    if not ar["crossings"]:
        sm = ar["smallest_margin"]
        inconclusive = (ar.get("verdict") or {}).get("kind") == "inconclusive"
        where = f"level measured validly ({sym}={levels_text(ar['levels'])})" if inconclusive else "level"
        line = (
            f"{name}: no crossing: {ar['winner']} wins at every {where}; smallest margin "
            f"{_fmt(sm['speedup'])} [{_fmt(sm['lo'])}, {_fmt(sm['hi'])}] at {sym}={_fmt(sm['concurrency'])}"
        )
        if x["states"]["lo"] == "within":  # the point estimates do not cross, but the interval may
            interval = crossover_text(x, sym)
            line += (
                f"; its crossover interval {interval} reaches into the levels "
                "(the crossover_lower policy rule stops at its lower end)"
            )
        return line
    parts = [
        f"{sym}={_fmt(c['concurrency'])} ({c['direction']}) [{_fmt(c['lo'])}, {_fmt(c['hi'])}]" for c in ar["crossings"]
    ]
    mono = "" if ar["monotone"] else " NON-MONOTONE"
    return (
        f"{name}: crossover ({m['orientation']} {ar['primary_metric']}) {crossover_text(x, sym)}{mono}; "
        "crossings: " + "; ".join(parts) + _interpolation_text(x)
    )


LEVEL_LABEL = {"closed": "C", "open": "req/s", "trace": "scale"}  # the levels' unit, by load mode


def _running_line(name: str, ar: dict[str, Any], load: str) -> str:
    """An open or trace sweep's crossover in running requests (analysis/running.py), which the policy uses."""
    x = (ar.get("running_requests") or {}).get("crossover")
    unit = LEVEL_LABEL.get(load, load)
    if not x:
        return f"{name}: in running requests: no usable levels"
    states = x["states"]
    if states["estimate"] != "within":
        where = "below" if states["estimate"] == "below_range" else "above"
        return (
            f"{name}: in running requests: no crossover inside the measured {_fmt(x['min_level'])}.."
            f"{_fmt(x['max_level'])} running requests (it lies {where} the levels, in {unit})"
        )

    def end(field: str) -> str:
        if states[field] == "above_range":
            return f">{_fmt(x['max_level'])}"
        return f"<{_fmt(x['min_level'])}" if states[field] == "below_range" else _fmt(x[field])

    return (
        f"{name}: crossover in running requests {_fmt(x['estimate'])} [{end('lo')}, {end('hi')}] "
        f"(the {unit} crossover mapped through the arms' measured in-flight curves)"
    )


def _interpolation_text(x: dict[str, Any]) -> str:
    """' (interpolants: loglinear 22, linear 24.4, ...; interval widened)' when they disagree, else ''."""
    ip = x.get("interpolation") or {}
    est = ip.get("estimates") or {}
    if not ip.get("widened") and ip.get("estimate_min") == ip.get("estimate_max"):
        return ""
    shown = ", ".join(f"{k} {_fmt(v)}" for k, v in est.items())
    return f" (interpolants: {shown}{'; interval widened to their envelope' if ip.get('widened') else ''})"


def _policy_line(name: str, ar: dict[str, Any], rule: str) -> str:
    """'policy: speculate while running requests <= N (...)', or INCONCLUSIVE with what to measure."""
    t = choose_threshold(ar, rule)
    if t["threshold"] is not None:
        return f"{name}: policy: speculate while running requests <= {t['threshold']} ({t['reason']})"
    v = ar.get("verdict") or {}
    todo = []
    if v.get("add_levels"):
        todo.append(f"add levels: {levels_text(v['add_levels'])}")
    if v.get("remeasure_levels"):
        todo.append(f"re-measure: {levels_text(v['remeasure_levels'])}")
    what = "INCONCLUSIVE, no threshold" if t["verdict"] == "inconclusive" else "no threshold"
    return f"{name}: policy: {what} ({t['reason']})" + ("; " + "; ".join(todo) if todo else "")


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (speculative arm, level), for the printed table and crossover_table.csv."""
    rows = []
    for name, ar in result["arms"].items():
        invalid = {(e["arm"], e["concurrency"]): e for e in ar["invalid_cells"]}
        for r in ar["per_level"]:
            why = [
                f"{a}: {','.join(invalid[(a, r['concurrency'])]['reasons']) or 'invalid'}"
                for a in (ar["baseline_arm"], name)
                if (a, r["concurrency"]) in invalid
            ]
            missing = [m["arm"] for m in ar["missing_cells"] if m["concurrency"] == r["concurrency"]]
            valid = (
                "yes" if not why and not missing else "no (" + "; ".join(why + [f"{a}: missing" for a in missing]) + ")"
            )
            rows.append(
                {
                    "arm": name,
                    "concurrency": r["concurrency"],
                    "baseline_tok_s": r.get("baseline_value"),
                    "spec_tok_s": r.get("spec_value"),
                    "speedup": r.get("speedup"),
                    "speedup_lo": r.get("speedup_lo"),
                    "speedup_hi": r.get("speedup_hi"),
                    "used": r["used"],
                    "same_output": (r.get("output_match") or {}).get("share"),
                    "near_tie_output": (r.get("output_match") or {}).get("tie_share"),
                    "clear_differences": ((r.get("output_match") or {}).get("referral") or {}).get("clear"),
                    "valid": valid,
                    "precision": r.get("precision"),
                    "accept_length": (r.get("content") or {}).get("accept_length"),
                    "answer_p50": (r.get("content") or {}).get("spec_output_p50"),
                    "answer_cap_share": (r.get("content") or {}).get("spec_cap_share"),
                }
            )
    return rows


PRECISION_COLUMN = f" | {'rounds  +-':>13}"  # the table's column of each level's rounds and half-width
# the speculative arm's accept length and its answers' median length and share at their cap (docs/metrics.md)
CONTENT_COLUMN = f" | {'accept':>6} | {'answer p50 cap':>14}"


def _content_cell(r: dict[str, Any]) -> str:
    """A level's accept length and the speculative arm's answers: median tokens, share that reached the cap."""
    cap = "-" if r["answer_cap_share"] is None else f"{100 * r['answer_cap_share']:.0f}%"
    return f" | {_fmt(r['accept_length']):>6} | {_fmt(r['answer_p50'], 4):>9} {cap:>4}"


def content_line(name: str, result: dict[str, Any]) -> str | None:
    """What the arm's requests held (prompts, stop, engine), or None where the config says nothing of it."""
    facts = result.get("content")
    if not facts:
        return None
    stop = (
        "natural stop (answers end at the model's end of text; output_tokens a cap)"
        if facts["stop"] == "natural"
        else "fixed stop (ignore_eos: every answer its full length)"
    )
    return f"{name}: content: {facts['prompts']}; {stop}; {result.get('source')} engine"


def _precision_cell(p: dict[str, Any] | None) -> str:
    """A level's rounds and the half-width it reached; `!` where it stopped short of its target."""
    if not p:
        return "-"
    hw = f"{100 * p['half_width']:.1f}%" if p["half_width"] is not None else "-"
    short = "!" if p["target"] is not None and not p["met"] else " "
    return f"{p['rounds']:>3}  {hw:>6}{short}"


def table_header(conf: int, unit: str, level: str = "C", extra: str = "") -> str:
    """The speedup table's header line (also what the README's generated sample is checked against)."""
    return (
        f"{level:>6} | {f'baseline {unit}':>14} | {f'spec {unit}':>10} | {f'speedup [{conf}% CI]':<24}{extra} | "
        "same output | valid"
    )


def _referred_mark(row: dict[str, Any]) -> str:
    """After the same-output share: " ties" where every referred difference is a near-tie (batch numerics),
    " DIFF" where one is clear (analysis/outputs.py); nothing where none differ or none were referred."""
    if row.get("clear_differences"):
        return " DIFF"
    return " ties" if row.get("near_tie_output") else ""


def proof_header(conf: int) -> str:
    """The policy proof table's header line."""
    return (
        f"{'C':>6} | {'best fixed arm':>14} | {'best':>8} | {'policy':>8} | {f'policy/best [{conf}% CI]':<24} | "
        "status     | same output"
    )


def format_table(result: dict[str, Any]) -> str:
    """The compact table (C | baseline tok/s | spec tok/s | speedup [95% CI] | same output | valid) and the
    crossover line; "same output" is the share of the speculative cell's outputs equal to the baseline's, marked
    "ties" where the rest differ at near-ties and "DIFF" where a difference is clear (`_referred_mark`)."""
    lines = []
    conf = int(round(100 * result["bootstrap"]["confidence"]))
    for name, ar in result["arms"].items():
        lines.append(
            f"{result.get('experiment')}/{result.get('variant')}: {name} vs {ar['baseline_arm']} "
            f"({result.get('source')}; metric {ar['primary_metric']})"
        )
        if result.get("content_warning"):
            lines.append(f"{name}: {result['content_warning']}")
        unit = next(m.unit for m in METRICS if m.name == ar["primary_metric"])
        running = {r["level"]: r for r in (ar.get("running_requests") or {}).get("per_level") or []}
        extra = f" | {'running b / s':>13}" if running else ""
        mine = [r for r in table_rows(result) if r["arm"] == name]
        precise = any(r["precision"] for r in mine)
        extra += PRECISION_COLUMN if precise else ""
        described = any(r["accept_length"] is not None or r["answer_p50"] is not None for r in mine)
        extra += CONTENT_COLUMN if described else ""
        lines.append(table_header(conf, unit, LEVEL_LABEL.get(result.get("load", "closed"), "C"), extra))
        for r in mine:
            ci = f"{_fmt(r['speedup'])} [{_fmt(r['speedup_lo'])}, {_fmt(r['speedup_hi'])}]"
            same = "-" if r["same_output"] is None else f"{100 * r['same_output']:.1f}%" + _referred_mark(r)
            rr = running.get(r["concurrency"])
            shown = f" | {_fmt(rr['baseline'])} / {_fmt(rr['spec'])}".ljust(16) if rr else ""
            if precise:
                shown += f" | {_precision_cell(r['precision']):>13}"
            if described:
                shown += _content_cell(r)
            lines.append(
                f"{_fmt(r['concurrency'], 6):>6} | {_fmt(r['baseline_tok_s'], 5):>14} | "
                f"{_fmt(r['spec_tok_s'], 5):>10} | {ci:<24}{shown} | {same:>11} | {r['valid']}"
            )
        lines.append(_crossover_line(name, ar, result.get("load", "closed")))
        if said := content_line(name, result):
            lines.append(said)
        if running:
            lines.append(_running_line(name, ar, result.get("load", "open")))
        if ar.get("interval_note"):
            lines.append(f"{name}: note: {ar['interval_note']}")
        for note in (ar.get("verdict") or {}).get("notes") or []:
            lines.append(f"{name}: note: {note}")
        lines.append(_policy_line(name, ar, result.get("policy_rule", "crossover_lower")))
    lines += _noise_lines(result, conf)
    lines += _proof_lines(result, conf)
    return "\n".join(lines)


def _noise_lines(result: dict[str, Any], conf: int) -> list[str]:
    """The A/A comparisons (an arm against a copy of itself on another server instance) and their band."""
    noise = result.get("noise_floor")
    if not noise:
        return []
    lines = []
    for aa, comp in noise["comparisons"].items():
        cells = ", ".join(
            f"{_fmt(r['concurrency'])}: {_fmt(r['ratio'])} [{_fmt(r['lo'])}, {_fmt(r['hi'])}]"
            for r in comp["per_level"]
        )
        lines.append(f"A/A {aa} vs {comp['of']} ({conf}% CI) at C = {cells}")
    share, bands = noise["false_verdict_share"], noise.get("bands") or []
    per_level = ", ".join(f"{_fmt(b['concurrency'])}: [{_fmt(b['lo'])}, {_fmt(b['hi'])}]" for b in bands)
    lines.append(
        f"A/A: {noise['levels_excluding_one']} of {noise['levels_judged']} level intervals exclude 1"
        + (f" (false-verdict share {share:.0%})" if share is not None else "")
        + (f"; noise bands, each level's indifference zone: {per_level}" if bands else "")
    )
    return lines


def _proof_lines(result: dict[str, Any], conf: int) -> list[str]:
    """Per family: its schedule and the policy arm against the best fixed arm, level by level."""
    lines = []
    for family, sched in (result.get("schedules") or {}).items():
        proof = (result.get("policy_proof") or {}).get(family) or {}
        choices = sched.get("per_level") or []
        if len(sched.get("members") or {}) > 1 and choices:
            lines.append(
                f"{family}: best draft length per level (smallest within the noise): "
                + ", ".join(f"C={c['concurrency']:g} K={c['k']}" for c in choices)
            )
        lines.append(f"{family}: schedule {sched.get('schedule')} ({sched.get('rule')})")
        if u := sched.get("unmeasured"):
            lines.append(f"{family}: NOT MEASURED: {u['note']}; to measure: {u['command']}")
        if not proof.get("per_level"):
            if proof:
                lines.append(f"{proof['policy_arm']}: {proof['verdict']}")
            continue
        arm = proof["policy_arm"]
        lines.append(
            f"{result.get('experiment')}/{result.get('variant')}: {arm} vs the best fixed arm per level "
            f"({proof['source']}; metric {proof['metric']})"
        )
        lines.append(proof_header(conf))
        for r in proof["per_level"]:
            ci = f"{_fmt(r['ratio'])} [{_fmt(r['ratio_lo'])}, {_fmt(r['ratio_hi'])}]"
            m = r.get("output_match") or {}
            same = "-" if m.get("share") is None else f"{100 * m['share']:.1f}%"
            lines.append(
                f"{_fmt(r['concurrency'], 6):>6} | {r['best_fixed_arm'] or '-':>14} | {_fmt(r['best_value'], 5):>8} | "
                f"{_fmt(r['policy_value'], 5):>8} | {ci:<24} | {r['status']:<10} | {same:>11}"
            )
        approx = " (SGLang approximation: K=0 ranges draft 1 step)" if proof.get("approximate") else ""
        lines.append(f"{arm}: policy {proof['verdict']}{approx}")
        served = [(r["concurrency"], r["served_k"]) for r in proof["per_level"] if r.get("served_k")]
        if served:  # the K the engine served beside the K scheduled, from its counters ("not reported": none)
            lines.append(f"{arm}: K served / scheduled: " + served_k_text(served))
        for kind, m in (proof.get("mechanism") or {}).items():
            lines.append(
                f"{arm}: {kind}: {_fmt(m['ratio'])} [{_fmt(m['ratio_lo'])}, {_fmt(m['ratio_hi'])}] over "
                f"C={', '.join(f'{c:g}' for c in m['levels'])} (the mechanism's own cost: same K, other path)"
            )
        switched = [r["concurrency"] for r in proof["per_level"] if r.get("compares") == "schedule"]
        if switched:
            lines.append(
                f"{arm}: at C={', '.join(f'{c:g}' for c in switched)} the schedule serves another K than the best "
                "fixed arm: those rows measure the schedule's choice too"
            )
    return lines


def table_csv(result: dict[str, Any]) -> str:
    buf = io.StringIO()
    rows = table_rows(result)
    fields = [
        "arm",
        "concurrency",
        "baseline_tok_s",
        "spec_tok_s",
        "speedup",
        "speedup_lo",
        "speedup_hi",
        "used",
        "same_output",
        "near_tie_output",
        "clear_differences",
        "valid",
        "rounds",
        "half_width",
        "target",
        "accept_length",
        "answer_p50",
        "answer_cap_share",
    ]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in rows:
        p = r.pop("precision") or {}
        w.writerow({**r, "rounds": p.get("rounds"), "half_width": p.get("half_width"), "target": p.get("target")})
    return buf.getvalue()
