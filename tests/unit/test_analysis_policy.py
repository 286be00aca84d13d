"""Threshold choice from the intervals, and its engine-specific forms (vLLM schedule, SGLang adaptive config, sim),
at the K each arm was measured at."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from specsweep.analysis.policy import (
    choose_threshold,
    dump_yaml,
    engine_policy,
    policy_document,
)
from specsweep.sim.engine import parse_schedule
from tests.support.crossovers import crossover_block

pytestmark = pytest.mark.unit


def _arm(lo: list[float | None], crossover: dict[str, Any] | None, crossings: list[dict] | None = None) -> dict:
    levels = [1.0, 2.0, 5.0, 10.0, 30.0][: len(lo)]
    return {
        "levels": levels,
        "primary_metric": "aggregate_tok_s",
        "metrics": {"aggregate_tok_s": {"speedup_lo": lo, "crossover": crossover, "crossings": crossings or []}},
    }


def _x(est: float | None, lo: float | None, hi: float | None, states: tuple[str, str, str]) -> dict[str, Any]:
    return crossover_block(est, lo, hi, states, max_level=30.0)


def test_threshold_from_crossover_lower_end() -> None:
    ar = _arm([1.2, 1.1, 1.02, 0.9, 0.7], _x(12.0, 7.6, 18.0, ("within",) * 3))
    t = choose_threshold(ar)
    assert t["threshold"] == 7 and t["rule"] == "crossover_lower"
    assert t["candidates"]["level_lower_bound"] == 5
    assert choose_threshold(ar, "level_lower_bound")["threshold"] == 5


def test_threshold_edges() -> None:
    below = _arm([0.9, 0.8, 0.7], _x(0.0, 0.0, 1.5, ("below_range", "below_range", "within")))
    assert choose_threshold(below)["threshold"] == 0
    assert choose_threshold(below, "level_lower_bound")["threshold"] == 0
    above = _arm([1.5, 1.4, 1.3, 1.2, 1.1], _x(None, None, None, ("above_range",) * 3))
    assert choose_threshold(above)["threshold"] == 30
    assert choose_threshold(above, "level_lower_bound")["threshold"] == 30
    # a level without an interval stops the level rule: not proven
    assert choose_threshold(_arm([1.5, None, 1.3], None), "level_lower_bound")["threshold"] == 1


EAGLE_VLLM = [
    "--max-num-seqs",
    "256",
    "--speculative-config",
    '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}',
]
EAGLE_SGLANG = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]


def test_vllm_threshold_with_the_arms_k() -> None:
    p = engine_policy("vllm", 12, {"server_args": EAGLE_VLLM})
    assert p["schedule"] == [[1, 12, 3], [13, 256, 0]] and p["draft_length_measured"] == 3
    cfg = p["speculative_config"]
    assert cfg["method"] == "eagle3" and cfg["num_speculative_tokens"] == 3
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 12, 3], [13, 256, 0]]
    flag, payload = p["cli"].split(" ", 1)
    assert flag == "--speculative-config"
    assert json.loads(payload.strip("'"))["num_speculative_tokens_per_batch_size"][1] == [13, 256, 0]


def test_a_sub_arm_is_recommended_at_the_k_it_was_measured_at() -> None:
    """`draft_lengths: [1, 3]` measures sub-arm K=1 with the family's flags (K=3 in its config): its entry
    recommends K=1, in the schedule, the config and the command line (issue 41: it said K=3)."""
    p = engine_policy("vllm", 12, {"draft_length": 1, "server_args": EAGLE_VLLM})
    assert p["draft_length_measured"] == 1 and p["schedule"] == [[1, 12, 1], [13, 256, 0]]
    assert p["speculative_config"]["num_speculative_tokens"] == 1
    assert '"num_speculative_tokens":1' in p["cli"] and '"num_speculative_tokens":3' not in p["cli"]


def test_one_k_everywhere_is_the_static_flag_and_k0_the_baseline() -> None:
    arm = {"server_args": ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']}
    off = engine_policy("vllm", 0, arm, {}, 250)
    assert off["schedule"] == [[1, 1024, 0]] and off["static"] and off["server_args"] == []  # no speculative config
    on = engine_policy("vllm", 5000, arm, {}, 250)
    assert on["schedule"] == [[1, 1024, 4]] and on["static"]
    assert on["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4}  # no per-batch-size path
    assert "note" in engine_policy("vllm", 8, {}, {}, 250)  # K unknown: said so, no schedule invented
    assert "schedule" not in engine_policy("vllm", 8, {}, {}, 250)


def test_sglang_threshold_is_the_adaptive_config() -> None:
    """One answer for SGLang: the pinned release turns drafting off per batch size (0-step slots), so the
    threshold is an adaptive config, not a router (which the release does not need)."""
    p = engine_policy("sglang", 24, {"server_args": EAGLE_SGLANG}, schedule_file="policy/eagle3.json")
    assert p["adaptive_config"] == {"1": {"candidate_steps": [3]}, "25": {"candidate_steps": [0]}}
    assert p["adaptive_config_file"] == "policy/eagle3.json" and not p["approximate"]
    assert "--speculative-adaptive" in p["server_args"] and "router" not in json.dumps(p)
    off = engine_policy("sglang", 0, {"server_args": EAGLE_SGLANG})
    assert off["static"] and not any(a.startswith("--speculative") for a in off["server_args"])


def test_sim_schedule_and_document() -> None:
    ar = _arm([1.2, 1.1, 0.9], _x(3.0, 2.4, 4.0, ("within",) * 3), [{"direction": "down"}])
    result = {"experiment": "e", "variant": "sim", "source": "simulated", "arms": {"eagle3": ar}}
    doc = policy_document(result, "sim", variant_cfg={"profile": "demo"})
    entry = doc["arms"]["eagle3"]
    assert entry["threshold"] == 2 and "sim" in entry
    # the demo profile drafts 3 tokens: speculate with 3 up to 2 running requests, then not at all
    assert entry["sim"]["schedule"] == [[1, 2, 3], [3, 1024, 0]]
    assert entry["sim"]["server_args"] == ["--spec-schedule", "[[1,2,3],[3,1024,0]]"]
    assert parse_schedule(entry["sim"]["server_args"][1]) == [(1, 2, 3), (3, 1024, 0)]  # what serve-sim accepts
    up = _arm([0.8, 1.1, 1.2], _x(0.0, 0.0, 0.0, ("below_range",) * 3), [{"direction": "up"}])
    doc = policy_document({"arms": {"eagle3": up}}, "sglang")
    assert doc["arms"]["eagle3"]["threshold"] == 0 and "warning" in doc["arms"]["eagle3"]


def test_policy_yaml_has_no_aliases() -> None:
    ar = _arm([1.2, 1.1, 0.9], _x(3.0, 2.4, 4.0, ("within",) * 3), [{"direction": "down"}])
    doc = policy_document({"arms": {"eagle3": ar}}, "vllm", {"eagle3": {"server_args": EAGLE_VLLM}})
    form = doc["arms"]["eagle3"]["vllm"]
    form["schedule_again"] = form["schedule"]  # one list object in two places, as a document may hold
    assert "&id" in yaml.safe_dump(doc)
    text = dump_yaml(doc)
    assert "&id" not in text and "*id" not in text
    assert yaml.safe_load(text) == yaml.safe_load(yaml.safe_dump(doc))


def test_inconclusive_verdict_writes_no_threshold() -> None:
    ar = _arm([1.2, 1.1, 0.9], _x(3.0, 1.4, 4.0, ("within",) * 3), [{"direction": "down"}])
    ar["verdict"] = {
        "kind": "inconclusive",
        "reason": "crossover interval [1.4, 4] spans 2.86x > analysis.max_crossover_ratio 2",
        "add_levels": [3],
        "remeasure_levels": [],
        "notes": [],
    }
    t = choose_threshold(ar)
    assert t["threshold"] is None and t["verdict"] == "inconclusive" and "2.86x" in t["reason"]
    entry = policy_document({"arms": {"eagle3": ar}}, "vllm")["arms"]["eagle3"]
    assert entry["threshold"] is None and entry["add_levels"] == [3] and entry["verdict"] == "inconclusive"
    assert "vllm" not in entry and "candidates" not in entry
    # a conclusive verdict keeps its threshold and says which verdict it rests on
    ar["verdict"] = {"kind": "crossover", "reason": "", "add_levels": [], "remeasure_levels": [], "notes": []}
    entry = policy_document({"arms": {"eagle3": ar}}, "vllm")["arms"]["eagle3"]
    assert entry["threshold"] == 1 and entry["verdict"] == "crossover" and "vllm" in entry


def test_no_usable_levels_is_no_threshold_with_its_reason() -> None:
    """No level with a speedup is no evidence: no threshold (None) and why, not N=0 ("never speculate"),
    which a policy would serve as a decision (issue 28)."""
    nothing = _arm([], None)
    t = choose_threshold(nothing)
    assert t["threshold"] is None and "no usable levels" in t["reason"], t
    assert t["candidates"] == {"level_lower_bound": None, "crossover_lower": None}, t
    assert choose_threshold(nothing, "level_lower_bound")["threshold"] is None
    # the lowest level without an interval: the level rule cannot say either
    assert choose_threshold(_arm([None, 1.3], None), "level_lower_bound")["threshold"] is None
    entry = policy_document({"arms": {"eagle3": nothing}}, "vllm")["arms"]["eagle3"]
    assert entry["threshold"] is None and "no usable levels" in entry["reason"] and "vllm" not in entry, entry


def test_sim_policy_without_a_profile_invents_no_draft_length() -> None:
    """A sim variant that names no profile has no known draft length: said so, no schedule, not the demo
    profile's K (issue 28). A validated config always names one (the schema's default)."""
    out = engine_policy("sim", 2, {}, {}, 10)
    assert "schedule" not in out and "server_args" not in out, out
    assert "profile" in out["note"], out
    assert engine_policy("sim", 2, {}, {"profile": "demo"}, 10)["schedule"] == [
        [1, 2, 3],
        [3, 1024, 0],
    ]
