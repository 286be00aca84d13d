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

import json
import math
import shlex
from typing import Any

import yaml

from specsweep.engines.speculation import apply_text, flag_value, sim_args, threshold_schedule, vllm_speculative_config

__all__ = [
    "choose_threshold",
    "dump_yaml",
    "engine_policy",
    "policy_document",
    "schedule_entries",
    "speculative_tokens",
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


def _argv_of(arm: dict[str, Any]) -> list[str]:
    for key in ("server_args", "args", "extra_args", "argv"):
        v = arm.get(key)
        if isinstance(v, list):
            return [str(a) for a in v]
        if isinstance(v, str):
            return shlex.split(v)
    return []


def _speculative_config(arm: dict[str, Any]) -> dict[str, Any]:
    """vLLM's speculative config from the arm: a dict, a JSON string, or --speculative-config in its args."""
    v: Any = arm.get("speculative_config")
    if v is None:
        v = flag_value(_argv_of(arm), "--speculative-config")
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            v = None
    return dict(v) if isinstance(v, dict) else {}


def speculative_tokens(engine: str, arm: dict[str, Any]) -> int | None:
    """Draft tokens per step of the speculative arm (vLLM num_speculative_tokens; SGLang num draft tokens)."""
    for key in ("num_speculative_tokens", "speculative_num_draft_tokens"):
        if arm.get(key) is not None:
            return int(arm[key])
    cfg = _speculative_config(arm)
    if cfg.get("num_speculative_tokens") is not None:
        return int(cfg["num_speculative_tokens"])
    argv = _argv_of(arm)
    for flag in ("--num-speculative-tokens", "--speculative-num-draft-tokens"):
        v = flag_value(argv, flag)
        if v is not None:
            return int(v)
    return None


def _sim(n: int, variant: dict[str, Any], max_level: float) -> dict[str, Any]:
    """The simulated engine applies the same schedule per step as vLLM (`serve-sim --spec-schedule`). K is
    the variant's profile's draft length; a variant without a profile (a validated config always has one, the
    schema's default) gets no schedule, as a vLLM arm without num_speculative_tokens gets none."""
    from specsweep.sim.profile import load_profile

    if not variant.get("profile"):
        return {
            "note": (
                "the variant names no profile, so its draft length is unknown: no schedule written; "
                "set variants.<name>.profile (or pass the validated config)"
            )
        }
    k = load_profile(variant["profile"]).speculative.draft_tokens
    sched = threshold_schedule(n, k, max(1024, int(max_level)))
    return {
        "num_speculative_tokens_per_batch_size": sched,
        "server_args": sim_args({"schedule": sched}),
        "note": (
            "add server_args to a speculative arm to serve the schedule (K per running requests, switched each "
            "step as vLLM does; switching re-prefills the draft model, docs/sim.md); measure it as an arm"
        ),
    }


def _vllm(n: int, arm: dict[str, Any], variant: dict[str, Any], max_level: float) -> dict[str, Any]:
    k = speculative_tokens("vllm", arm)
    max_seqs = arm.get("max_num_seqs") or variant.get("max_num_seqs") or flag_value(_argv_of(arm), "--max-num-seqs")
    upper = int(max_seqs) if max_seqs else max(1024, int(max_level))
    out: dict[str, Any] = {"max_batch_size": upper, "num_speculative_tokens": k}
    if k is None:
        out["note"] = (
            "num_speculative_tokens not found in the arm's server args: no schedule written; "
            "use [[1, N, K], [N+1, max_num_seqs, 0]] with the arm's K"
        )
        return out
    sched = threshold_schedule(n, k, upper)
    cfg = vllm_speculative_config(_speculative_config(arm), None, sched if n > 0 else None)
    cfg["num_speculative_tokens_per_batch_size"] = sched
    out["num_speculative_tokens_per_batch_size"] = sched
    out["speculative_config"] = cfg
    out["cli"] = "--speculative-config " + shlex.quote(json.dumps(cfg, separators=(",", ":")))
    out["note"] = (
        "batch size is the number of running requests in a step; K=0 turns speculation off in that "
        "range. Check the key against your vLLM version's SpeculativeConfig."
    )
    return out


def _sglang(n: int) -> dict[str, Any]:
    if n <= 0:
        return {
            "apply": [
                {
                    "how": "no_speculation",
                    "what": "speculation is not shown to pay off at any measured load: serve the baseline",
                }
            ]
        }
    return {
        "apply": [
            {
                "how": "router",
                "what": (
                    f"run a baseline deployment next to the speculative one; a router/gateway sends a request "
                    f"to the speculative deployment while that keeps it at <= {n} running requests (it has "
                    f"fewer than {n} before the request), otherwise to the baseline (SGLang cannot turn "
                    f"speculation off by load)"
                ),
            },
            {
                "how": "cap_and_overflow",
                "what": (
                    f"start the speculative deployment with --max-running-requests {n} and send the overflow "
                    f"to a baseline deployment, rather than letting requests queue inside the speculative one"
                ),
                "server_args": ["--max-running-requests", str(n)],
            },
        ],
        "note": "some SGLang versions cap running requests at 48 under EAGLE unless --max-running-requests is set",
    }


def engine_policy(
    engine: str,
    threshold: int,
    arm: dict[str, Any] | None = None,
    variant: dict[str, Any] | None = None,
    max_level: float = 0.0,
) -> dict[str, Any]:
    """The engine-specific form of 'speculate while running requests <= threshold'."""
    arm, variant = arm or {}, variant or {}
    if engine == "vllm":
        return _vllm(threshold, arm, variant, max_level)
    if engine == "sglang":
        return _sglang(threshold)
    if engine == "sim":
        return _sim(threshold, variant, max_level)
    return {"note": f"engine {engine or 'unknown'}: threshold only"}


def policy_document(
    result: dict[str, Any],
    engine: str,
    arms_cfg: dict[str, Any] | None = None,
    variant_cfg: dict[str, Any] | None = None,
    rule: str = "crossover_lower",
) -> dict[str, Any]:
    """policy.yaml's content: one entry per speculative arm of crossover.json `result`."""
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
        entry[engine or "engine"] = engine_policy(engine, t["threshold"], arms_cfg.get(name), variant_cfg, max_level)
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
        if sched:
            file = entry.get("file") or f"{family}.sglang-adaptive.json"
            block[engine or "engine"] = apply_text(engine, argvs.get(family, []), sched, file)
        out[family] = block
    return out


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
