"""Draft lengths and schedules in each engine's own flags, and the sub-arms and policy arms a config expands to."""

from __future__ import annotations

import json

import pytest

from specsweep import config as ssconfig
from specsweep.engines.speculation import (
    apply_text,
    configured_k,
    set_flag,
    sglang_adaptive_config,
    sglang_args,
    sim_args,
    threshold_schedule,
    vllm_args,
)
from specsweep.sim.engine import parse_schedule

pytestmark = pytest.mark.unit

NGRAM = ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}']
EAGLE = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]
SCHEDULE = [[1, 16, 3], [17, 64, 0]]


def test_vllm_draft_length_and_schedule_rewrite_the_speculative_config() -> None:
    argv = ["--max-num-seqs", "64", *NGRAM]
    k1 = vllm_args(argv, {"draft_length": 1})
    assert k1[:2] == ["--max-num-seqs", "64"] and k1.count("--speculative-config") == 1
    cfg = json.loads(k1[k1.index("--speculative-config") + 1])
    assert cfg == {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 3}
    sched = vllm_args(argv, {"schedule": SCHEDULE})
    cfg = json.loads(sched[sched.index("--speculative-config") + 1])
    assert cfg["num_speculative_tokens"] == 3 and cfg["num_speculative_tokens_per_batch_size"] == SCHEDULE
    assert vllm_args(argv, {}) == argv
    with pytest.raises(ValueError, match="--speculative-config"):
        vllm_args(["--max-num-seqs", "64"], {"draft_length": 2})


def test_sglang_steps_and_adaptive_flags() -> None:
    k7 = sglang_args([*EAGLE, "--speculative-num-draft-tokens", "4"], {"draft_length": 7})
    assert k7[k7.index("--speculative-num-steps") + 1] == "7"
    assert k7[k7.index("--speculative-num-draft-tokens") + 1] == "8" and k7.count("--speculative-num-steps") == 1
    argv = sglang_args(EAGLE, {"schedule": SCHEDULE, "schedule_file": "results/e/v/policy/eagle3.json"})
    assert "--speculative-adaptive" in argv
    assert argv[argv.index("--speculative-adaptive-config") + 1] == "results/e/v/policy/eagle3.json"
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"  # must be among the slots' candidates
    with pytest.raises(ValueError, match="topk 1"):
        sglang_args(["--speculative-eagle-topk", "4"], {"draft_length": 2})
    with pytest.raises(ValueError, match="schedule_file"):
        sglang_args(EAGLE, {"schedule": SCHEDULE})


def test_sglang_adaptive_config_turns_drafting_off_with_0_steps() -> None:
    cfg, unreachable = sglang_adaptive_config(SCHEDULE)  # the pinned release (0.5.19) takes 0-step slots
    assert cfg == {"1": {"candidate_steps": [3]}, "17": {"candidate_steps": [0]}} and unreachable == []
    assert not apply_text("sglang", EAGLE, SCHEDULE, "f.json")["approximate"]
    # a release without 0-step slots (<= 0.5.13) cannot reach K=0: said so, with the ranges
    cfg, unreachable = sglang_adaptive_config(SCHEDULE, min_steps=1)
    assert cfg["17"] == {"candidate_steps": [1]} and unreachable == [[17, 64, 0]]


def test_sim_flags_are_what_serve_sim_accepts() -> None:
    args = sim_args({"draft_length": 2, "schedule": SCHEDULE})
    assert args[:2] == ["--draft-tokens", "2"]
    assert parse_schedule(args[3]) == [(1, 16, 3), (17, 64, 0)]


def test_configured_k_and_flags() -> None:
    assert configured_k("vllm", {}, NGRAM) == 3
    assert configured_k("sglang", {}, EAGLE) == 3
    assert configured_k("sim", {}, [], "demo") == 3
    # no profile named: the draft length is unknown (None, which the schedule reports), not the demo profile's
    assert configured_k("sim", {}, [], None) is None
    assert configured_k("sim", {}, ["--draft-tokens", "2"], None) == 2
    assert configured_k("vllm", {"draft_length": 5}, NGRAM) == 5
    assert set_flag(["--a", "1", "--b", "--a=2"], "--a", "3") == ["--b", "--a", "3"]
    assert threshold_schedule(0, 3, 64) == [[1, 64, 0]] and threshold_schedule(64, 3, 64) == [[1, 64, 3]]


def _config(**extra: object) -> dict:
    return {
        "experiment": "e",
        "arms": {
            "baseline": {"speculative": False},
            "ngram": {"speculative": True, "server_args": NGRAM, "draft_lengths": [4, 1]},
        },
        "variants": {"v": {"engine": "vllm", "model": "m", "arm_server_args": {"ngram": ["--x"]}}},
        **extra,
    }


def test_draft_lengths_expand_to_sub_arms_and_a_policy_arm() -> None:
    cfg = ssconfig.validate(_config())
    assert list(cfg["arms"]) == ["baseline", "ngram-k1", "ngram-k4", "ngram-policy"]
    assert cfg["arms"]["ngram-k4"]["draft_length"] == 4 and cfg["arms"]["ngram-k4"]["family"] == "ngram"
    assert cfg["arms"]["ngram-policy"]["policy"] and "draft_lengths" not in cfg["arms"]["ngram-k1"]
    # per-variant arguments of the configured arm follow its sub-arms and its policy arm
    assert set(cfg["variants"]["v"]["arm_server_args"]) == {"ngram-k1", "ngram-k4", "ngram-policy"}
    assert ssconfig.validate(cfg) == cfg  # idempotent
    assert ssconfig.families(cfg) == {"ngram": {"ngram-k1": 1, "ngram-k4": 4}}
    assert ssconfig.fixed_arms(cfg) == ["baseline", "ngram-k1", "ngram-k4"]
    assert ssconfig.speculative_arms(cfg) == ["ngram-k1", "ngram-k4"]
    off = ssconfig.validate(_config(policy={"measure": False}))
    assert ssconfig.policy_arms(off) == {}


def test_policy_cell_needs_its_schedule_and_holds_it() -> None:
    cfg = ssconfig.validate(_config())
    with pytest.raises(ssconfig.ConfigError, match="schedule"):
        ssconfig.cell_spec(cfg, "v", "ngram-policy", 4)
    spec = ssconfig.cell_spec(cfg, "v", "ngram-policy", 4, {"schedule": SCHEDULE})
    assert spec["arm"]["schedule"] == SCHEDULE
    # a fixed arm's cell does not change with the policy settings
    other = ssconfig.validate(_config(policy={"schedules": {"ngram": [[1, 64, 1]]}}))
    assert ssconfig.cell_spec(other, "v", "ngram-k1", 4) == ssconfig.cell_spec(cfg, "v", "ngram-k1", 4)


def test_bad_policy_config_is_refused() -> None:
    with pytest.raises(ssconfig.ConfigError, match="policy/schedules"):
        ssconfig.validate(_config(policy={"schedules": {"eagle3": [[1, 64, 1]]}}))
    bad = _config()
    bad["arms"]["ngram-k1"] = {"speculative": True, "server_args": NGRAM}
    with pytest.raises(ssconfig.ConfigError, match="taken"):
        ssconfig.validate(bad)
