"""The answer per content class: what each level's requests held, the warning where the acceptance measured is
not production's, and a variant's classes and traffic mix side by side (contents.json).

Why: how many draft tokens the target accepts is a property of the content and of where answers stop, and the
speedup at low load scales with it, so the crossover does too (docs/metrics.md "Content classes"). A crossover
measured on synthetic words, or on answers forced past their end of text (a fixed stop: ignore_eos), is precise
about content nobody serves; on a real engine the output says so where a person reads it. On the simulated engine
acceptance is the profile's (per class where it lists classes), so there is nothing to warn about.
"""

from __future__ import annotations

import math
from typing import Any

from specsweep.analysis.cells import Cell
from specsweep.client.contents import content_warning

__all__ = ["content_warning", "contents_summary", "format_contents", "level_content"]

MIX = "mix"


def level_content(base: Cell | None, spec: Cell | None) -> dict[str, Any] | None:
    """records.LevelContent of one level: the speculative arm's acceptance (the cell's mean and, where the
    engine reports passes per request, its median and 90th percentile) and both arms' answer lengths."""
    if base is None and spec is None:
        return None

    def metric(cell: Cell | None, *path: str) -> Any:
        node: Any = cell.summary.get("metrics") if cell is not None else None
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    per_request = metric(spec, "accept_length_per_request") or {}
    has_dist = bool(per_request.get("n"))
    return {
        "accept_length": metric(spec, "accept_length"),
        "accept_length_p50": per_request.get("p50") if has_dist else None,
        "accept_length_p90": per_request.get("p90") if has_dist else None,
        "baseline_output_p50": metric(base, "output_lengths", "p50"),
        "spec_output_p50": metric(spec, "output_lengths", "p50"),
        "baseline_cap_share": metric(base, "output_lengths", "cap_share"),
        "spec_cap_share": metric(spec, "output_lengths", "cap_share"),
    }


def _answer(unit: str, content: str, prompts: str, arm: str, result: dict[str, Any]) -> dict[str, Any]:
    """records.ClassAnswer of one unit's arm."""
    accept = [(r.get("content") or {}).get("accept_length") for r in result["per_level"]]
    cross = result.get("crossover") or {}
    states = cross.get("states") or {}
    return {
        "unit": unit,
        "content": content,
        "prompts": prompts,
        "arm": arm,
        "accept_length": next((a for a in accept if a is not None), None),
        "accept_length_levels": accept,
        "crossover": cross.get("estimate"),
        "crossover_lo": cross.get("lo") if states.get("lo") == "within" else None,  # null: open
        "crossover_hi": cross.get("hi") if states.get("hi") == "within" else None,
        "verdict": result["verdict"]["kind"],
        "threshold": result.get("threshold"),
    }


def _disagree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two classes' crossover intervals are disjoint (an open end reaches as far as it may)."""
    if a["crossover"] is None or b["crossover"] is None:
        return False

    def ends(x: dict[str, Any]) -> tuple[float, float]:
        lo, hi = x["crossover_lo"], x["crossover_hi"]
        return (-math.inf if lo is None else lo), (math.inf if hi is None else hi)

    (a_lo, a_hi), (b_lo, b_hi) = ends(a), ends(b)
    return a_hi < b_lo or b_hi < a_lo


def contents_summary(
    variant: str, crossovers: dict[str, dict[str, Any]], mix_shares: dict[str, float] | None
) -> dict[str, Any]:
    """records.Contents: each unit's crossover.json (`crossovers`, by unit, in the config's order) as one answer
    per class and arm, the mix's beside them, the spread between the classes and their disagreements."""
    classes: list[dict[str, Any]] = []
    mix: list[dict[str, Any]] = []
    warnings: list[str] = []
    engines, sources = set(), set()
    for unit, cx in crossovers.items():
        facts = cx.get("content") or {}
        content = facts.get("content") or unit.partition("@")[2] or unit
        engines.add(cx["engine"])
        sources.add(cx["source"])
        if cx.get("content_warning"):
            warnings.append(f"{unit}: {cx['content_warning']}")
        for arm, result in cx["arms"].items():
            (mix if content == MIX else classes).append(_answer(unit, content, facts.get("prompts", ""), arm, result))
    spread: dict[str, Any] = {}
    disagreements: list[str] = []
    for arm in dict.fromkeys(c["arm"] for c in classes):
        mine = [c for c in classes if c["arm"] == arm]
        crosses = [c["crossover"] for c in mine if c["crossover"] is not None]
        accepts = [c["accept_length"] for c in mine if c["accept_length"] is not None]
        spread[arm] = {
            "crossover_min": min(crosses, default=None),
            "crossover_max": max(crosses, default=None),
            "accept_length_min": min(accepts, default=None),
            "accept_length_max": max(accepts, default=None),
            "classes_without_crossover": [c["content"] for c in mine if c["crossover"] is None],
        }
        for i, a in enumerate(mine):
            for b in mine[i + 1 :]:
                if _disagree(a, b):
                    disagreements.append(
                        f"{arm}: {a['content']} crosses at {_interval(a)}, {b['content']} at {_interval(b)}: the "
                        "intervals do not overlap, so one threshold does not serve both; route them apart or paste "
                        "the mix's policy knowing each class's"
                    )
    return {
        "schema_version": 1,
        "variant": variant,
        "engine": "/".join(sorted(engines)),
        "source": sources.pop() if len(sources) == 1 else "mixed",
        "classes": classes,
        "mix": mix,
        "mix_shares": mix_shares,
        "spread": spread,
        "disagreements": disagreements,
        "warnings": warnings,
    }


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _interval(a: dict[str, Any]) -> str:
    if a["crossover"] is None:
        return "no crossing"
    lo = "open" if a["crossover_lo"] is None else _num(a["crossover_lo"])
    hi = "open" if a["crossover_hi"] is None else _num(a["crossover_hi"])
    return f"{_num(a['crossover'])} [{lo}, {hi}]"


def format_contents(summary: dict[str, Any]) -> str:
    """contents.json as a person reads it: disagreements first, then one line per class and the mix's, then the
    spread and the warnings."""
    lines = [f"{summary['variant']}: the answer per content class ({summary['source']} engine, {summary['engine']})"]
    lines += [f"  DISAGREE  {d}" for d in summary["disagreements"]]
    head = f"  {'class':<18} {'arm':<14} {'accept len':>10}  {'crossover [interval]':<28} {'verdict':<18} threshold"
    lines.append(head)
    shares = summary.get("mix_shares") or {}
    for a in [*summary["classes"], *summary["mix"]]:
        label = a["content"] + (f" ({shares[a['content']]:.0%})" if a["content"] in shares else "")
        lines.append(
            f"  {label:<18} {a['arm']:<14} {_num(a['accept_length']):>10}  {_interval(a):<28} {a['verdict']:<18} "
            f"{_num(a['threshold'])}"
        )
    for arm, s in summary["spread"].items():
        lines.append(
            f"  spread {arm}: crossover {_num(s['crossover_min'])} .. {_num(s['crossover_max'])}, accept length "
            f"{_num(s['accept_length_min'])} .. {_num(s['accept_length_max'])}"
            + (f"; no crossing: {', '.join(s['classes_without_crossover'])}" if s["classes_without_crossover"] else "")
        )
    if summary["mix"]:
        lines.append("  the policy to paste is the mix's (its unit's policy.yaml); each class's is beside it")
    lines += [f"  {w}" for w in summary["warnings"]]
    return "\n".join(lines)
