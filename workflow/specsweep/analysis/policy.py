"""From a crossover to a setting: "speculate while running requests <= N", in each engine's own form.

N is chosen conservatively from the bootstrap, not from the point estimate: a policy built on a lucky
measurement would turn speculation on where it costs throughput. Two rules (config `analysis.policy_rule`):

- `crossover_lower` (default): the lower end of the crossover's interval, rounded down to an integer. It uses
  the interpolation between levels, so N can fall between measured levels.
- `level_lower_bound`: the largest measured level such that it and every level below it have a speedup
  interval whose lower bound is >= 1. It never interpolates, so it is at most the crossover_lower value's
  bracketing level and is the choice when the sweep's levels are dense.

Both give 0 (never speculate) when speculation is not shown to win even at the lowest level, and the largest
measured level when it wins everywhere (no extrapolation beyond what was measured).

An arm whose verdict (crossover.json `verdict`) is inconclusive gets no threshold at all: `threshold: null`,
the reason and the levels to add or re-measure, and no engine schedule. A number there would be acted on.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from specsweep.analysis.unmeasured import unmeasured_range
from specsweep.engines.speculation import apply_text, batch_upper, configured_k, threshold_schedule

__all__ = [
    "choose_threshold",
    "dump_yaml",
    "engine_policy",
    "policy_document",
    "schedule_entries",
]


class _NoAliasDumper(yaml.SafeDumper):
    """A SafeDumper that writes a list shared by two entries twice instead of as an anchor and alias.

    Why: policy.yaml is read and copied by people; `&id001` / `*id001` in it is noise at best.
    """

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(doc: Any) -> str:
    """YAML text of `doc` without anchors or aliases, keys in insertion order."""
    return yaml.dump(doc, Dumper=_NoAliasDumper, sort_keys=False, width=110)


def _inconclusive(arm_result: dict[str, Any]) -> dict[str, Any] | None:
    """The arm's verdict when it is inconclusive (older crossover.json files have no verdict: None)."""
    v = arm_result.get("verdict")
    return v if isinstance(v, dict) and v.get("kind") == "inconclusive" else None


def choose_threshold(
    arm_result: dict[str, Any], rule: str = "crossover_lower", metric: str | None = None
) -> dict[str, Any]:
    """Threshold N and the evidence for it, from one arm's entry of crossover.json.

    Inconclusive verdict: threshold None, the verdict's reason, no candidates.
    """
    metric = metric or arm_result["primary_metric"]
    m = arm_result["metrics"][metric]
    verdict = arm_result.get("verdict") or {}
    inc = _inconclusive(arm_result)
    if inc is not None and metric == arm_result["primary_metric"]:
        return {
            "threshold": None,
            "rule": rule,
            "metric": metric,
            "reason": str(inc.get("reason", "inconclusive")),
            "candidates": {},
            "crossover": m.get("crossover"),
            "upward_crossing": any(c["direction"] == "up" for c in m.get("crossings", [])),
            "verdict": "inconclusive",
        }
    levels = arm_result["levels"]
    x = m.get("crossover")
    running = arm_result.get("running_requests")
    if running and metric == arm_result["primary_metric"]:  # open/trace sweep: N counts running requests
        levels = [v if v is not None else math.nan for v in running["levels"]]
        x = running["crossover"]
    # None: no evidence to choose N from (never 0, which a policy would serve as "do not speculate")
    cand: dict[str, int | None] = {}
    reasons: dict[str, str] = {}
    # level rule: contiguous from the bottom, lower bound >= 1
    lows = list(zip(levels, m["speedup_lo"], strict=True))
    if not lows or lows[0][1] is None or not math.isfinite(lows[0][0]):
        cand["level_lower_bound"] = None
        reasons["level_lower_bound"] = (
            "no usable levels: no threshold" if not lows else "no speedup interval at the lowest level: no threshold"
        )
    else:
        n_level = 0
        for c, lo in lows:
            if lo is None or lo < 1.0 or not math.isfinite(c):
                break
            n_level = int(math.floor(c))
        cand["level_lower_bound"] = n_level
        reasons["level_lower_bound"] = (
            f"largest measured level with every level up to it having speedup lower bound >= 1: {n_level}"
            if n_level
            else "speedup lower bound < 1 already at the lowest level"
        )
    if not x:
        cand["crossover_lower"] = None
        reasons["crossover_lower"] = "no usable levels (no level with a speedup): no threshold"
    else:
        state = x["states"]["lo"]
        if state == "below_range":
            cand["crossover_lower"] = 0
            reasons["crossover_lower"] = "crossover interval reaches below the lowest level: not shown to pay off"
        elif state == "above_range" or x.get("lo") is None:
            cand["crossover_lower"] = int(math.floor(x["max_level"] or 0))
            reasons["crossover_lower"] = (
                "speculation wins at every measured level (interval above the range); "
                "N is the largest measured level, not extrapolated"
            )
        else:
            cand["crossover_lower"] = int(math.floor(x["lo"]))
            reasons["crossover_lower"] = f"lower end of the crossover interval {x['lo']:.3g}, rounded down"
    return {
        "threshold": cand[rule],
        "rule": rule,
        "metric": metric,
        "reason": reasons[rule],
        "candidates": cand,
        "crossover": x,
        "upward_crossing": any(c["direction"] == "up" for c in m.get("crossings", [])),
        "verdict": verdict.get("kind"),
    }


def engine_policy(
    engine: str,
    threshold: int,
    arm: dict[str, Any] | None = None,
    variant: dict[str, Any] | None = None,
    max_level: float = 0.0,
    schedule_file: str = "adaptive.json",
) -> dict[str, Any]:
    """The engine's form of 'speculate while running requests <= threshold' for one measured arm: the schedule
    [[1, N, K], [N+1, max, 0]] with the K this arm was measured at (its `draft_length`, else its flags), written
    in the same flags as the servers the sweep starts (engines.speculation.apply_text): the one home that keeps
    what was measured what is recommended. One K over the whole range (N at or above the largest batch: the arm
    itself; N = 0: the baseline) is the static flag. `arm`: the arm's config with its merged `server_args`."""
    arm, variant = arm or {}, variant or {}
    argv = [str(a) for a in arm.get("server_args") or []]
    if engine not in ("vllm", "sglang", "sim"):
        return {"note": f"engine {engine or 'unknown'}: threshold only"}
    k = configured_k(engine, arm, argv, variant.get("profile"))
    if k is None:
        return {
            "note": (
                "the arm's draft length is unknown (no draft_length, and none in its server_args or the variant's "
                "profile): no schedule written; set the arm's draft_length"
            )
        }
    upper = batch_upper(engine, argv, max_level)
    schedule = threshold_schedule(threshold, k, upper)
    return {
        "draft_length_measured": k,
        "schedule": schedule,
        "max_batch_size": upper,
        **apply_text(engine, argv, schedule, schedule_file),
    }


def policy_document(
    result: dict[str, Any],
    engine: str,
    arms_cfg: dict[str, Any] | None = None,
    variant_cfg: dict[str, Any] | None = None,
    rule: str = "crossover_lower",
    file_dir: str = "policy",
) -> dict[str, Any]:
    """policy.yaml's content: one entry per speculative arm of crossover.json `result` (an engine file such as
    SGLang's adaptive config named in `file_dir`, written by the caller)."""
    arms_cfg = arms_cfg or {}
    doc: dict[str, Any] = {
        "experiment": result.get("experiment"),
        "variant": result.get("variant"),
        "engine": engine,
        "source": result.get("source"),
        "meaning": (
            "speculate while running requests <= threshold; plain decoding above "
            "(threshold null: inconclusive, see reason and the levels to measure)"
        ),
        "arms": {},
    }
    for name, ar in result["arms"].items():
        t = choose_threshold(ar, rule)
        max_level = max(ar["levels"]) if ar["levels"] else 0.0
        crossover = {k: t["crossover"][k] for k in ("estimate", "lo", "hi")} if t["crossover"] else None
        inc = _inconclusive(ar)
        if inc is not None:
            doc["arms"][name] = {
                "threshold": None,
                "verdict": "inconclusive",
                "rule": t["rule"],
                "metric": t["metric"],
                "reason": t["reason"],
                "add_levels": list(inc.get("add_levels") or []),
                "remeasure_levels": list(inc.get("remeasure_levels") or []),
                "crossover": crossover,
            }
            continue
        entry: dict[str, Any] = {
            "threshold": t["threshold"],
            "verdict": t["verdict"],
            "rule": t["rule"],
            "metric": t["metric"],
            "reason": t["reason"],
            "candidates": t["candidates"],
            "crossover": crossover,
        }
        if t["threshold"] is None:  # no evidence to choose N from: no engine form either
            doc["arms"][name] = entry
            continue
        if t["upward_crossing"]:
            entry["warning"] = (
                "speculation loses at low load and wins higher up on this stack: a "
                "'speculate <= N' policy cannot express that; see crossover.json"
            )
        form = engine_policy(
            engine,
            t["threshold"],
            arms_cfg.get(name),
            variant_cfg,
            max_level,
            schedule_file=f"{file_dir}/{name}.threshold.sglang-adaptive.json",
        )
        entry[engine or "engine"] = form
        used = [r["concurrency"] for r in ar.get("per_level") or [] if r.get("used")]
        # loads above the highest level, never shown as measured (closed loops: an open sweep's levels are rates)
        if form.get("schedule") and t["crossover"] is not None and not ar.get("running_requests"):
            unmeasured = unmeasured_range(
                form["schedule"], max(used, default=max_level), ar.get("configured_levels") or ar["levels"], _won(ar)
            )
            if unmeasured:
                entry["unmeasured"] = unmeasured
        doc["arms"][name] = entry
    return doc


def schedule_entries(
    schedules: dict[str, Any], proof: dict[str, Any], engine: str, argvs: dict[str, list[str]]
) -> dict[str, Any]:
    """policy.yaml `schedules`: per speculative arm of the config, the schedule (K per running requests), how
    it was chosen, whether its policy arm proved it, and exactly what to paste into the engine's flags.

    `argvs`: each family's server arguments as configured (variant, arm, variant-per-arm)."""
    out: dict[str, Any] = {}
    for family, entry in (schedules.get("families") or {}).items():
        sched = entry.get("schedule")
        p = proof.get(family) or {}
        block: dict[str, Any] = {
            "schedule": sched,
            "meaning": "[[first, last, K], ...]: K draft tokens while first..last requests are running (0: none)",
            "rule": entry.get("rule"),
            "reason": entry.get("reason"),
        }
        if p:
            block["proof"] = {
                "verdict": p.get("verdict"),
                "failing_levels": p.get("failing_levels"),
                "policy_over_best_fixed": {
                    f"C={r['concurrency']:g}": (
                        None
                        if r["ratio"] is None
                        else f"{r['ratio']:.3f} [{_num(r['ratio_lo'])}, {_num(r['ratio_hi'])}] vs {r['best_fixed_arm']}"
                    )
                    for r in p.get("per_level") or []
                },
            }
            served = {
                f"C={r['concurrency']:g}": r["served_k"]["note"] for r in p.get("per_level") or [] if r.get("served_k")
            }
            if served:  # the K the engine served beside the K scheduled (analysis/served.py)
                block["proof"]["k_served"] = served
        if entry.get("unmeasured"):  # loads above the highest level: never presented as measured
            block["unmeasured"] = entry["unmeasured"]
        if sched:
            file = entry.get("file") or f"{family}.sglang-adaptive.json"
            block[engine or "engine"] = apply_text(engine, argvs.get(family, []), sched, file)
        out[family] = block
    return out


def _won(ar: dict[str, Any]) -> str:
    """What the arm measured at its highest used level, in words."""
    used = [r for r in ar.get("per_level") or [] if r.get("used") and r.get("speedup") is not None]
    if not used:
        return ""
    r = used[-1]
    ci = f" [{_num(r['speedup_lo'])}, {_num(r['speedup_hi'])}]" if r.get("speedup_lo") is not None else ""
    return f"speculation measured {r['speedup']:.3g}{ci} over the baseline at C={r['concurrency']:g}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
