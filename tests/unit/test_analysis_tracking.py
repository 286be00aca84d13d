"""Readers of crossover.json outside the analysis: the MLflow numbers and the workflow's final print cope with
an inconclusive verdict (threshold null) and with older layouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specsweep.final import final_text
from specsweep.stack.stack_facts import stack_facts
from specsweep.tracking.notes import crossover_note
from specsweep.tracking.payloads import (
    cell_metrics,
    cell_run_name,
    crossover_numbers,
    curves,
    headline_metrics,
    sweep_params,
    verdict_tags,
)
from specsweep.tracking.view import VIEW_KEY, VIEW_NAME, view_tag

pytestmark = pytest.mark.unit


def _arm(threshold: int | None, kind: str) -> dict[str, Any]:
    x = {
        "estimate": 7.5,
        "lo": 3.0,
        "hi": 12.0,
        "states": {"estimate": "within", "lo": "within", "hi": "within"},
        "min_level": 1.0,
        "max_level": 30.0,
        "interpolation": {"estimate_min": 7.2, "estimate_max": 8.1, "estimates": {}, "widened": True},
    }
    metric = {
        "orientation": "spec/baseline",
        "speedup_lo": [1.1, 0.9],
        "crossover": x,
        "crossings": [{"concurrency": 7.5, "direction": "down", "lo": 3.0, "hi": 12.0}],
    }
    return {
        "baseline_arm": "baseline",
        "spec_arm": "eagle3",
        "source": "simulated",
        "primary_metric": "aggregate_tok_s",
        "levels": [1.0, 30.0],
        "configured_levels": [1.0, 30.0],
        "notes": [],
        "per_level": [],
        "invalid_cells": [],
        "missing_cells": [],
        "crossover": x,
        "interpolation": x["interpolation"],
        "crossings": metric["crossings"],
        "monotone": True,
        "crossover_concurrency": 7.5,
        "crossover_ci_low": 3.0,
        "crossover_ci_high": 12.0,
        "threshold": threshold,
        "verdict": {
            "kind": kind,
            "reason": "crossover interval [3, 12] spans 4.00x > analysis.max_crossover_ratio 2",
            "add_levels": [2, 4, 8],
            "remeasure_levels": [],
            "notes": [],
        },
        "metrics": {"aggregate_tok_s": metric},
    }


def test_no_threshold_metric_when_inconclusive() -> None:
    nums = crossover_numbers(_arm(None, "inconclusive"))
    assert "threshold" not in nums and nums["conclusive"] == 0.0
    assert nums["crossover_concurrency"] == 7.5 and nums["interpolation_max"] == 8.1
    nums = crossover_numbers(_arm(3, "crossover"))
    assert nums["threshold"] == 3.0 and nums["conclusive"] == 1.0
    # an older layout without verdict or interpolation
    old = {"crossover_concurrency": 21.9, "crossover_ci_low": None, "threshold": 19}
    assert crossover_numbers(old) == {"crossover_concurrency": 21.9, "threshold": 19.0}
    assert verdict_tags({"arms": {"eagle3": _arm(None, "inconclusive")}}) == {
        "specsweep.verdict.eagle3": "inconclusive"
    }


def test_final_print_with_an_inconclusive_crossover(tmp_path: Path) -> None:
    res = tmp_path / "exp"
    (res / "v").mkdir(parents=True)
    doc = {
        "schema_version": 1,
        "experiment": "exp",
        "variant": "v",
        "engine": "sim",
        "load": "closed",
        "source": "simulated",
        "baseline_arm": "baseline",
        "bootstrap": {"confidence": 0.95},
        "policy_rule": "crossover_lower",
        "policy": {"eagle3": {"threshold": None, "rule": "crossover_lower", "verdict": "inconclusive"}},
        "arms": {"eagle3": _arm(None, "inconclusive")},
    }
    (res / "v" / "crossover.json").write_text(json.dumps(doc))
    (res / "w").mkdir()
    (res / "w" / "crossover.json").write_text(json.dumps({"arms": {"eagle3": {"levels": []}}}))
    config = {"results_dir": str(tmp_path), "experiment": "exp", "variants": ["v", "w"], "mlflow": {"enabled": False}}
    text = final_text(config)
    assert "eagle3: policy: INCONCLUSIVE, no threshold" in text and "add levels: 2, 4, 8" in text
    assert "cannot show the table" in text  # a malformed file is named, not fatal


def _summary(c: int, valid: bool, n_requests: int, repeats: int = 1) -> dict[str, Any]:
    return {
        "cell": {"variant": "sim", "arm": "eagle3", "concurrency": c, "speculative": True},
        "engine": "sim",
        "source": "simulated",
        "workload": {"n_requests": n_requests, "output_tokens": 64, "prompt_set_sha256": f"p{c}"},
        "server": {"identity": "abc", "argv": ["serve-sim"], "env": {}, "resource": "cpu", "info": {}},
        "stack": {"fingerprint": "", "recipe": None},
        "metrics": {
            "n_repeats": repeats,
            "output_tok_s_steady": 100.0 * c,
            "repeat_spread": {"output_tok_s_steady": {"sd": 1.0}},
            "tokens_per_chunk": {"mean": 2.5, "histogram": {"1": 3, "2": 4}},
        },
        "repeats": [
            {
                "repeat": r,
                "server_state": {
                    "cpu": {"granted_share": 0.9 - 0.1 * r, "cpu_cores": 0.5, "rss_mb": 10.0 * (r + 1)},
                    "gpus": None,
                },
            }
            for r in range(repeats)
        ],
        "validity": {"valid": valid, "reasons": [] if valid else ["machine busy"]},
    }


def test_cell_metrics_carry_something() -> None:
    """No spread over one repeat, no histogram buckets (they stay in summary.json)."""
    one = cell_metrics(_summary(4, True, 16))
    assert "repeat_spread.output_tok_s_steady.sd" not in one and not [k for k in one if "histogram" in k]
    assert one["tokens_per_chunk.mean"] == 2.5 and one["valid"] == 1.0
    three = cell_metrics(_summary(4, True, 16, repeats=3))
    assert "repeat_spread.output_tok_s_steady.sd" in three
    # the serving side's worst block; a figure no block has (throttling, GPUs) is left out, not zeroed
    assert three["server.granted_share_min"] == pytest.approx(0.7) and three["server.rss_mb_max"] == 30.0
    assert three["server.cpu_cores_mean"] == 0.5
    assert "server.cgroup_throttled_share_max" not in three and not [k for k in three if k.startswith("gpu.")]


def test_sweep_params_are_true_for_the_whole_sweep() -> None:
    params = sweep_params([_summary(1, True, 8), _summary(4, False, 16)])
    assert "workload.n_requests" not in params and "workload.prompt_set_sha256" not in params  # differ per cell
    assert params["workload.output_tokens"] == 64 and params["server.identity"] == "abc"
    assert params["levels"] == "1,4" and params["n_requests_by_level"] == "1:8,4:16"
    assert params["invalid_levels"] == "4"


def test_crossover_curves_are_step_logged_by_concurrency() -> None:
    data = {
        "arms": {
            "eagle3": {
                "per_level": [
                    {
                        "concurrency": 1.0,
                        "used": True,
                        "speedup": 1.5,
                        "speedup_lo": 1.4,
                        "speedup_hi": 1.6,
                        # same output, only faster: 96% equal, 3% differing at near-ties, one clear difference
                        "output_match": {"share": 0.96, "tie_share": 0.03, "referral": {"clear": 1}},
                    },
                    {"concurrency": 30.0, "used": False, "speedup": 0.9, "speedup_lo": None, "speedup_hi": None},
                ]
            }
        },
        "policy_proof": {
            "eagle3": {
                "policy_arm": "eagle3-policy",
                "per_level": [{"concurrency": 1.0, "ratio": 1.01, "ratio_lo": 0.95, "ratio_hi": 1.07}],
            }
        },
    }
    got = {(m.key, m.step): m.value for m in curves(data)}
    assert got == {
        ("eagle3.speedup", 1): 1.5,
        ("eagle3.speedup_lo", 1): 1.4,
        ("eagle3.speedup_hi", 1): 1.6,  # C=30 was left out of the analysis (invalid): not on the curve
        ("eagle3.same_output", 1): 0.96,
        ("eagle3.near_tie_output", 1): 0.03,
        ("eagle3.clear_output_differences", 1): 1.0,
        ("eagle3-policy.policy_over_best", 1): 1.01,
        ("eagle3-policy.policy_over_best_lo", 1): 0.95,
        ("eagle3-policy.policy_over_best_hi", 1): 1.07,
    }


def test_headline_metrics_carry_the_analysis_names() -> None:
    """The sweep's curves are named as the final table, crossover.json and policy.yaml name them."""
    summary = _summary(4, True, 16)
    summary["metrics"]["tpot_ms"] = {"p50": 20.0, "p99": 40.0}
    got = headline_metrics(summary)
    assert got == {"aggregate_tok_s": 400.0, "tpot_p50_s": 0.02, "tpot_p99_s": 0.04}


def test_cell_run_names_sort_by_variant_arm_and_concurrency() -> None:
    names = [cell_run_name("sim", "eagle3", c) for c in (250, 1, 30, 5)]
    assert sorted(names) == ["sim/eagle3/c0001", "sim/eagle3/c0005", "sim/eagle3/c0030", "sim/eagle3/c0250"]


def test_stack_facts_mask_secrets_and_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server command is the same for every cell a server served (no port) and never holds a secret."""
    monkeypatch.setenv("SPECSWEEP_TEST_API_KEY", "s3cr3t-value")
    argv = ["python", "-m", "sglang.launch_server", "--port", "30001", "--api-key", "s3cr3t-value", "--tp", "8"]
    summary = {
        "engine": "sglang",
        "cell": {"speculative": True},
        "server": {
            "argv": argv,
            "resource": "gpu",
            "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
            "info": {
                "version": "0.5.19",
                "model_path": "moonshotai/Kimi-K2.5",
                "tp_size": 8,
                "speculative_algorithm": "EAGLE3",
                "speculative_draft_model_path": "lightseekorg/kimi-k2.5-eagle3",
            },
        },
        "stack": {"fingerprint": "", "recipe": None},
    }
    facts = stack_facts(summary)
    assert "s3cr3t-value" not in json.dumps(facts) and "30001" not in facts["stack.server_command"]
    assert "--port <port>" in facts["stack.server_command"]
    assert facts["stack.draft_model"] == "lightseekorg/kimi-k2.5-eagle3" and facts["stack.tp"] == 8
    assert facts["stack.gpus"] == "0,1,2,3,4,5,6,7" and facts["stack.engine_version"] == "0.5.19"
    vllm = {
        "engine": "vllm",
        "cell": {"speculative": True},
        "stack": {"fingerprint": "", "recipe": None},
        "server": {
            "argv": ["vllm", "serve", "m", "--port=8000"],
            "env": {},
            "resource": "cpu",
            "info": {"served_model": "m", "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
        },
    }
    facts = stack_facts(vllm)
    assert facts["stack.draft_model"] == "ngram (no draft model)" and facts["stack.tp"] == 1
    assert facts["stack.server_command"].endswith("--port=<port>") and facts["stack.gpus"] == "none (CPU)"
    assert stack_facts({**vllm, "cell": {"speculative": False}})["stack.draft_model"] == "none (no speculation)"


def test_saved_view_charts_every_arm_against_log_concurrency() -> None:
    key, value = view_tag(["eagle3-k1", "eagle3-k3"], ["eagle3-policy"], now_ms=1)
    envelope = json.loads(value)
    assert key == "mlflow.sharedViewState." + VIEW_KEY and envelope["name"] == VIEW_NAME
    state = json.loads(envelope["state"])
    charts = state["compareRunCharts"]
    assert {c["xAxisScaleType"] for c in charts} == {"log"} and {c["xAxisKey"] for c in charts} == {"step"}
    keys = [k for c in charts for k in c["selectedMetricKeys"]]
    assert keys[0] == "aggregate_tok_s" and "cell_valid" in keys
    assert {"eagle3-k1.speedup", "eagle3-k3.speedup_lo", "eagle3-policy.policy_over_best_hi"} <= set(keys)
    assert {c["metricSectionId"] for c in charts} == {s["uuid"] for s in state["compareRunSections"]}
    assert "cell" in state["searchFilter"]  # the view lists sweeps and crossover runs only


def test_crossover_note_says_which_side_speculation_wins() -> None:
    """The description follows the crossing's direction: a rising speedup means speculation wins above it."""
    down = _arm(3, "crossover")
    up = {**_arm(3, "crossover"), "crossings": [{"concurrency": 7.5, "direction": "up", "lo": 3.0, "hi": 12.0}]}
    assert "speculation is below it faster, above it slower" in crossover_note({"arms": {"e": down}}, "v", {}, "1")
    assert "speculation is below it slower, above it faster" in crossover_note({"arms": {"e": up}}, "v", {}, "1")
