"""An arm's draft length and per-load schedule, written in each engine's own flags.

One home for "K draft tokens" and "K per number of running requests" in every engine: the servers the sweep
starts (sub-arms `<arm>-k<K>`, policy arms `<arm>-policy`) and the text policy.yaml tells the user to paste
both come from here, so what was measured is what is recommended.

- vLLM: `--speculative-config` JSON; `num_speculative_tokens` = K, and for a schedule
  `num_speculative_tokens_per_batch_size` = [[start, end, K], ...] (inclusive running-request ranges, K=0
  turns drafting off) with `num_speculative_tokens` = the schedule's largest K.
- SGLang (EAGLE/EAGLE3, topk 1): `--speculative-num-steps K --speculative-num-draft-tokens K+1`; a schedule
  becomes adaptive speculation (`--speculative-adaptive --speculative-adaptive-config FILE`, batch-size-aware
  since SGLang 0.5.13): one slot per range, keyed by its lower bound, with one candidate step count; 0 steps
  (drafting off) since 0.5.14, the recipes pin 0.5.19 (docs/engines.md). SGLang pads a batch up to its captured
  CUDA-graph size before it picks the slot, so a range's first batch size is exact only after a graph size.
- The simulator: `--draft-tokens K`, `--spec-schedule JSON` (it switches per step as vLLM does).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from specsweep.engines.base import without_flag

Schedule = list[list[int]]

# SGLang: the smallest step count adaptive speculation takes in the pinned release (envs/sglang-*.txt, 0.5.19:
# 0 = drafting off; releases 0.5.13 and older take 1, and a K=0 range would then be approximate).
SGLANG_MIN_STEPS = 0


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` (`--flag V` or `--flag=V`; the last one wins, as argparse does)."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def set_flag(argv: list[str], flag: str, value: str | None) -> list[str]:
    """`argv` with every `flag` removed and `flag value` appended (a bare switch when value is None)."""
    out = without_flag(argv, flag, takes_value=value is not None)
    return [*out, flag] if value is None else [*out, flag, str(value)]


def threshold_schedule(n: int, k: int, upper: int) -> Schedule:
    """'Speculate with K while running requests <= n' as vLLM's inclusive [[start, end, K], ...] ranges."""
    if n <= 0 or k <= 0:
        return [[1, upper, 0]]
    if n >= upper:
        return [[1, upper, k]]
    return [[1, n, k], [n + 1, upper, 0]]


def max_k(schedule: Schedule) -> int:
    return max(int(k) for _, _, k in schedule)


def schedule_not_applied_causes(engine: str | None) -> str:
    """The engine's known reasons for serving another K than a per-load schedule asks (the proof names them where
    the served K, from the engine's counters, differs from the scheduled one)."""
    return {
        "vllm": (
            "vLLM's model runner V2 ignores per-batch-size schedules (num_speculative_tokens_per_batch_size; vLLM "
            "issue 51510), and vLLM disables speculation with data parallel > 1; check the server log and its "
            "--speculative-config"
        ),
        "sglang": (
            "SGLang turns adaptive speculation off with only a warning (topk > 1, DP attention, two-batch overlap); "
            "check speculative_adaptive in /server_info and the server log"
        ),
        "sim": "the simulator applies --spec-schedule each step: a difference is a bug in it or in the arm's flags",
    }.get(engine or "", f"engine {engine or 'unknown'}: no known cause; check its log and flags")


def static_k(schedule: Schedule) -> int | None:
    """The one K a schedule serves over its whole range, or None when it switches. A schedule of one K is what
    a fixed arm serves with the static flag (K=0: the baseline server itself): no per-batch-size path, and no
    policy server to measure, its proof being that arm's own cells."""
    ks = {int(k) for _, _, k in schedule}
    return ks.pop() if len(ks) == 1 else None


# ---- vLLM --------------------------------------------------------------------------------------------------


def vllm_speculative_config(base: dict[str, Any], draft_length: int | None, schedule: Schedule | None) -> dict:
    cfg = dict(base)
    if draft_length is not None:
        cfg["num_speculative_tokens"] = int(draft_length)
    if schedule:
        cfg["num_speculative_tokens"] = max(max_k(schedule), 1)
        cfg["num_speculative_tokens_per_batch_size"] = [list(map(int, e)) for e in schedule]
    return cfg


def vllm_args(argv: list[str], arm: dict[str, Any]) -> list[str]:
    """The arm's vLLM arguments with its draft length or schedule written into `--speculative-config`."""
    draft_length, schedule = arm.get("draft_length"), arm.get("schedule")
    if draft_length is None and not schedule:
        return argv
    raw = flag_value(argv, "--speculative-config")
    if raw is None:
        raise ValueError("vLLM arm: draft_length / schedule need a --speculative-config JSON in server_args")
    cfg = vllm_speculative_config(json.loads(raw), draft_length, schedule)
    return set_flag(argv, "--speculative-config", compact_json(cfg))


# ---- SGLang ------------------------------------------------------------------------------------------------


def sglang_adaptive_config(schedule: Schedule, min_steps: int = SGLANG_MIN_STEPS) -> tuple[dict[str, Any], list]:
    """SGLang's batch-size-aware adaptive config for a schedule, and the ranges it cannot reach.

    Each range becomes a slot keyed by its start (SGLang picks the slot with the largest key <= the batch size,
    after padding the batch to its captured CUDA-graph size) with one candidate, so the step count is fixed
    per slot instead of moving with the acceptance average."""
    cfg: dict[str, Any] = {}
    unreachable = []
    for start, end, k in schedule:
        steps = max(int(k), min_steps)
        if steps != k:
            unreachable.append([start, end, k])
        cfg[str(int(start))] = {"candidate_steps": [steps]}
    return cfg, unreachable


def sglang_args(argv: list[str], arm: dict[str, Any]) -> list[str]:
    """The arm's SGLang arguments with its draft length (steps, topk 1) or its schedule (adaptive) written in."""
    draft_length, schedule = arm.get("draft_length"), arm.get("schedule")
    if schedule and max_k(schedule) == 0:
        raise ValueError(
            "SGLang policy arm: the schedule drafts at no load; it is served by the baseline's command "
            "(config.cell_spec), not by --speculative-num-steps 0"
        )
    if schedule:
        top = max(max_k(schedule), SGLANG_MIN_STEPS)
        argv = _sglang_steps(argv, top)
        argv = set_flag(argv, "--speculative-adaptive", None)
        if not arm.get("schedule_file"):
            raise ValueError("SGLang policy arm: the adaptive config file (schedule_file) is missing")
        return set_flag(argv, "--speculative-adaptive-config", str(arm["schedule_file"]))
    if draft_length is not None:
        return _sglang_steps(argv, int(draft_length))
    return argv


def without_speculation(argv: list[str]) -> list[str]:
    """SGLang flags without any `--speculative-*` flag and its value (plain decoding)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip and not a.startswith("--"):
            skip = False
            continue
        skip = a.startswith("--speculative-") and "=" not in a
        if not a.startswith("--speculative-"):
            out.append(a)
    return out


def _sglang_steps(argv: list[str], steps: int) -> list[str]:
    topk = flag_value(argv, "--speculative-eagle-topk")
    if topk not in (None, "1"):
        raise ValueError(
            f"SGLang arm: a draft length or schedule needs --speculative-eagle-topk 1 (got {topk}); with topk 1 "
            "the draft tokens are steps + 1"
        )
    argv = set_flag(argv, "--speculative-num-steps", str(steps))
    argv = set_flag(argv, "--speculative-eagle-topk", "1")
    return set_flag(argv, "--speculative-num-draft-tokens", str(steps + 1))


# ---- the simulator -----------------------------------------------------------------------------------------


def sim_args(arm: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if arm.get("draft_length") is not None:
        out += ["--draft-tokens", str(int(arm["draft_length"]))]
    if arm.get("schedule"):
        out += ["--spec-schedule", compact_json([list(map(int, e)) for e in arm["schedule"]])]
    return out


# ---- what to paste ---------------------------------------------------------------------------------------


def static_text(engine: str, argv: list[str], k: int) -> dict[str, Any]:
    """policy.yaml's per-engine block for one K at every load: the fixed arm's own static flag, or for K=0 the
    baseline's command without any speculative configuration (a K=0 range of a speculative server is not the
    baseline server: it still runs the speculative path; vLLM issue 49548 measured it slower)."""
    if k == 0:
        plain = {
            "vllm": lambda: without_flag(argv, "--speculative-config", takes_value=True),
            "sglang": lambda: without_speculation(argv),
        }.get(engine)
        out: dict[str, Any] = {"static": True, "draft_length": 0}
        if plain is not None:
            out["server_args"] = plain()
        out["note"] = (
            "no drafting at any measured load: serve plain decoding, the baseline arm's command (what the sweep "
            "measured), with no speculative configuration at all"
        )
        return out
    arm = {"draft_length": k}
    out = {"static": True, "draft_length": k}
    if engine == "vllm":
        raw = flag_value(argv, "--speculative-config")
        cfg = {key: v for key, v in json.loads(raw or "{}").items() if key != "num_speculative_tokens_per_batch_size"}
        cfg = vllm_speculative_config(cfg, k, None)
        out.update(speculative_config=cfg, cli="--speculative-config " + shlex.quote(compact_json(cfg)))
    elif engine == "sglang":
        out["server_args"] = sglang_args(argv, arm)
    elif engine == "sim":
        out["server_args"] = sim_args(arm)
    out["note"] = (
        f"one draft length (K={k}) over the whole measured range: the static flag, the fixed arm's own setting "
        "(what the sweep measured), no per-batch-size path"
    )
    return out


def apply_text(engine: str, argv: list[str], schedule: Schedule, schedule_file: str) -> dict[str, Any]:
    """policy.yaml's per-engine block: the exact flags (and file) that serve `schedule` on this arm; a schedule
    of one K is served by the static flag (`static_text`)."""
    k = static_k(schedule)
    if k is not None:
        return static_text(engine, argv, k)
    arm = {"schedule": schedule, "schedule_file": schedule_file}
    if engine == "vllm":
        cfg = json.loads(flag_value(vllm_args(argv, arm), "--speculative-config") or "{}")
        return {
            "speculative_config": cfg,
            "cli": "--speculative-config " + shlex.quote(compact_json(cfg)),
            "note": "vLLM switches K each step by the number of running requests; K=0 turns drafting off",
        }
    if engine == "sglang":
        cfg, unreachable = sglang_adaptive_config(schedule)
        out: dict[str, Any] = {
            "server_args": sglang_args(argv, arm),
            "adaptive_config_file": schedule_file,
            "adaptive_config": cfg,
            "approximate": bool(unreachable),
            "note": (
                "SGLang >= 0.5.14 (batch-size-aware adaptive speculation with 0-step slots, EAGLE/EAGLE3, topk "
                "1): write adaptive_config to the file, one slot per range keyed by its first batch size with one "
                "step count (0: drafting off; the draft model's KV cache is still updated). SGLang pads a batch "
                "up to its captured CUDA-graph size before choosing the slot: a boundary is exact after a graph size"
            ),
        }
        if unreachable:
            out["unreachable_ranges"] = unreachable
            out["approximate_why"] = (
                f"K=0 (no drafting) in {unreachable}: this SGLang release's smallest step count is "
                f"{SGLANG_MIN_STEPS}, so those ranges still draft {SGLANG_MIN_STEPS} token(s). Only a second "
                "deployment reaches K=0 there: a plain-decoding server next to the speculative one, with a "
                "router that sends requests above the threshold to it"
            )
        return out
    if engine == "sim":
        return {"server_args": sim_args(arm), "note": "serve-sim switches K each step as vLLM does (docs/sim.md)"}
    return {"note": f"engine {engine or 'unknown'}: schedule only"}


def configured_k(engine: str, arm: dict[str, Any], argv: list[str], profile: str | None = None) -> int | None:
    """The draft length an arm runs with: its `draft_length`, else what its engine flags say (vLLM
    num_speculative_tokens; SGLang steps, topk 1; the simulator's --draft-tokens or its profile's). None when
    unknown (no profile named for the simulator, too): the schedule then says so instead of inventing one."""
    if arm.get("draft_length") is not None:
        return int(arm["draft_length"])
    if engine == "vllm":
        raw = flag_value(argv, "--speculative-config")
        try:
            k = json.loads(raw).get("num_speculative_tokens") if raw else None
        except (ValueError, AttributeError):
            k = None
        return int(k) if k is not None else None
    if engine == "sglang":
        v = flag_value(argv, "--speculative-num-steps")
        return int(v) if v is not None else None
    if engine == "sim":
        v = flag_value(argv, "--draft-tokens")
        if v is not None:
            return int(v)
        if not profile:
            return None
        from specsweep.sim.profile import load_profile

        return load_profile(profile).speculative.draft_tokens
    return None


def batch_upper(engine: str, argv: list[str], max_level: float) -> int:
    """The largest batch a schedule must cover: the engine's running-request cap when the flags set one."""
    flag = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}.get(engine)
    v = flag_value(argv, flag) if flag else None
    return int(v) if v is not None else max(1024, int(max_level))
