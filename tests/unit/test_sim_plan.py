"""`specsweep plan`: the fixed and adaptive sweeps of a config in virtual time, with their cost and answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specsweep.analysis.adaptive import AdaptiveSettings
from specsweep.analysis.precision import units_for
from specsweep.cli import main
from specsweep.config import load, load_yaml, requests_for
from specsweep.records.crossover import Crossover
from specsweep.sim.profile import load_profile
from specsweep.virtual.plan import MOST_UNITS, level_needs, plan_sweep

pytestmark = pytest.mark.unit

CONFIG = {
    "experiment": "plan",
    "concurrency": [4, 64],
    "workload": {"input_tokens": 16, "output_tokens": 64, "requests": {"per_concurrency": 3, "floor": 8}},
    "analysis": {"bootstrap_samples": 200},
    "adaptive": {"enabled": True, "max_rounds": 2, "added_per_concurrency": 6},
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {"sim": {"engine": "sim", "profile": "demo"}},
}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def test_fixed_and_adaptive_plans(config_file: Path) -> None:
    config, profile = load(config_file), load_profile("demo")
    fixed = plan_sweep(profile, config, "sim", None, seed=0, server_start_s=60.0)
    assert fixed.levels == [4, 64]
    assert fixed.server_starts == {"baseline": 1, "eagle3": 1, "eagle3-policy": 1}  # a crossing: a schedule to serve
    assert fixed.requests == {4: 12, 64: 192}  # the grid's own counts: adaptive settings off
    assert all(s > 60.0 for s in fixed.measure_s.values())  # a start plus the levels
    adaptive = plan_sweep(profile, config, "sim", AdaptiveSettings.from_config(config), seed=0, server_start_s=60.0)
    added = sorted(set(adaptive.levels) - {4, 64})
    assert added and all(4 < c < 64 for c in added)
    assert all(adaptive.requests[c] == requests_for(config, c) == 6 * c for c in added)
    assert adaptive.server_starts["eagle3"] == 1 + len(adaptive.rounds) - (adaptive.rounds[-1]["stop"] is not None)
    assert adaptive.total_s > fixed.total_s
    # the added levels narrow the interval: closed where the grid left it open or wider
    w_fixed, w_adaptive = fixed.width("eagle3"), adaptive.width("eagle3")
    assert w_adaptive is not None and (w_fixed is None or w_adaptive < w_fixed)


def test_plan_command_prints_json(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(config_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (pair,) = out["runs"]
    assert [p["mode"] for p in pair] == ["fixed", "adaptive"]
    assert pair[1]["crossover"]["eagle3"]["width"] is not None
    # the demo profile has no plausible profiles; no server start given: none counted, and said so
    assert out["plausible"] == [] and out["server_start_s"] == 0.0 and "not given" in out["server_start_from"]


def test_a_calibrated_profile_is_planned_over_its_plausible_profiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Kimi fusion profile's plausible profiles (its calibration's ensemble) disagree on the C=1 speedup:
    the plan runs the grid on the two ends and one between, and prints each one's crossover and the range of the
    measuring time, with the server start the config gives the variant (expected_start_s)."""
    cfg = {
        **CONFIG,
        "concurrency": [1, 64],
        "workload": {"input_tokens": 16, "output_tokens": 32, "requests": {"per_concurrency": 2, "floor": 4}},
        "adaptive": {"enabled": False},
        "policy": {"measure": False},
        "variants": {"gpu": {"engine": "sglang", "model": "/models/m", "expected_start_s": 600}},
    }
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    args = ["plan", "--config", str(path), "--profile", "kimi-k25-cu130-fusion", "--plausible", "3"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["server_start_s"] == 600 and out["server_start_from"] == "variants.gpu.expected_start_s"
    assert len(out["plausible"]) == 3 and out["ensemble_size"] >= 3
    starts = [sum(p["server_starts"].values()) for p in out["plausible"]]
    assert all(p["total_s"] >= 600 * n for p, n in zip(out["plausible"], starts, strict=True))
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "server start 600 s (variants.gpu.expected_start_s)" in text
    assert f"over 3 of the profile's {out['ensemble_size']} plausible profiles" in text and "eagle3: crossover" in text


def test_plan_needs_a_profile_for_a_real_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {**CONFIG, "variants": {"gpu": {"engine": "vllm", "model": "/models/m"}}}
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["plan", "--config", str(path)]) == 2
    assert "pass --profile" in capsys.readouterr().err


def test_the_derived_policy_holds_and_a_wrong_one_fails_in_virtual_time(config_file: Path) -> None:
    """The whole policy loop in virtual time: the fixed arms, the derived schedule, the policy arm measured at
    every level and its regret. A schedule that speculates everywhere fails where speculation loses (C=40 and 64 on
    the demo profile, where the baseline is the best fixed arm) and holds where it wins."""
    dense = {**CONFIG, "concurrency": [4, 16, 40, 64]}
    dense["workload"] = {**CONFIG["workload"], "requests": {"per_concurrency": 8, "floor": 8}}
    config_file.write_text(yaml.safe_dump(dense))
    config, profile = load(config_file), load_profile("demo")
    plan = plan_sweep(profile, config, "sim", None, seed=0)
    sched = plan.schedules["eagle3"]
    assert sched[0][0] == 1 and sched[0][2] == 3 and sched[-1][2] == 0  # speculate low, plain decoding high
    # never a failure; holds, or not decided where its interval straddles 1 - margin (policy.margin)
    proof = plan.proof["eagle3"]
    assert not proof["failing_levels"] and proof["holds"] is not False, proof["verdict"]
    assert all(r["status"] in ("holds", "better", "not decided") for r in proof["per_level"]), proof["per_level"]
    wrong = load_yaml(config_file)
    # speculating with K=3 where the baseline wins and with K=1 below: a schedule that switches (one K everywhere
    # would be the fixed arm itself, served by its static flag, with no policy arm to measure)
    wrong["policy"] = {"schedules": {"eagle3": [[1, 8, 1], [9, 1024, 3]]}}
    path = config_file.parent / "wrong.yaml"
    path.write_text(yaml.safe_dump(wrong))
    bad = plan_sweep(profile, load(path), "sim", None, seed=0)
    proof = bad.proof["eagle3"]
    assert bad.schedules["eagle3"] == [[1, 8, 1], [9, 1024, 3]]
    assert {40, 64} <= set(proof["failing_levels"]) and not proof["holds"]  # the baseline wins beyond the margin
    best = {r["concurrency"]: r["best_fixed_arm"] for r in proof["per_level"]}
    assert best[40] == best[64] == "baseline" and best[4] == "eagle3"
    static = {**wrong, "policy": {"schedules": {"eagle3": [[1, 1024, 3]]}}}
    path.write_text(yaml.safe_dump(static))
    one_k = plan_sweep(profile, load(path), "sim", None, seed=0).proof["eagle3"]
    assert one_k["served_by"] == "eagle3" and one_k["holds"] is None and "static" in one_k["verdict"]


def measured_crossover(levels: dict[float, float], speedups: dict[float, float] | None = None) -> dict:
    """A sequential run's crossover.json as the analysis writes it, cut to what plan reads: per level the paired
    interval's basis (two instance pairs, one degree of freedom, the given standard error of the log ratio)."""
    row = {
        "baseline_key": "b",
        "spec_key": "s",
        "baseline_valid": True,
        "spec_valid": True,
        "used": True,
    }
    per_level = [
        {
            **row,
            "concurrency": c,
            "paired": {"blocks": 2, "unit": "instance", "df": 1, "spread_dominates": True, "log_se": se},
            **({"speedup": speedups[c]} if speedups else {}),
        }
        for c, se in levels.items()
    ]
    arm = {
        "baseline_arm": "baseline",
        "spec_arm": "eagle3",
        "source": "real",
        "levels": list(levels),
        "configured_levels": list(levels),
        "per_level": per_level,
        "invalid_cells": [],
        "missing_cells": [],
        "primary_metric": "aggregate_tok_s",
        "crossover_concurrency": None,
        "crossover_ci_low": None,
        "crossover_ci_high": None,
        "crossover": None,
        "verdict": {"kind": "inconclusive", "reason": "test"},
        "threshold": None,
        "notes": [],
    }
    return {
        "schema_version": 1,
        "experiment": "plan",
        "variant": "gpu",
        "engine": "sglang",
        "load": "closed",
        "source": "real",
        "baseline_arm": "baseline",
        "bootstrap": {},
        "arms": {"eagle3": arm},
        "policy": {},
        "policy_rule": "crossover_lower",
    }


def gpu_config(levels: list[int]) -> dict:
    """A sequential GPU variant (SGLang, two instances per arm, 600-s starts) at `levels`, no adaptive or policy."""
    return {
        **CONFIG,
        "concurrency": levels,
        "workload": {"input_tokens": 16, "output_tokens": 32, "requests": {"per_concurrency": 2, "floor": 4}},
        "adaptive": {"enabled": False},
        "policy": {"measure": False},
        "pairing": {"mode": "sequential", "instances": 2},
        "variants": {"gpu": {"engine": "sglang", "model": "/models/m", "expected_start_s": 600}},
    }


def test_the_gpu_time_to_a_target_is_planned_at_a_measured_runs_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sequential variant on two instances per arm: each instance pair's log ratio varies by the measured
    standard error squared times its two pairs. At +-3.8% a level with se 0.01 needs 3 pairs (t(2) 4.30 x
    sqrt(0.0002 / 3) = 0.0351 <= log 1.038 = 0.0373) and one with se 0.03 needs 8 (t(7) 2.36 x sqrt(0.0018 / 8)
    = 0.0354): the widest decides the GPU time, pairs x one pair's starts and sweeps; one degree of freedom puts
    the upper end of its range past what can be planned. Without a measured run, no GPU time is printed."""
    cfg = gpu_config([1, 64])
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    measured = tmp_path / "crossover.json"
    measured.write_text(json.dumps(measured_crossover({1.0: 0.01, 64.0: 0.03})))
    base = ["plan", "--config", str(path), "--profile", "kimi-k25-cu130-fusion", "--plausible", "0"]
    assert main([*base, "--noise-from", str(measured), "--effect", "0.038", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["precision"]
    assert out["target"] == 0.038 and out["measured_variant"] == "gpu"
    assert [(n["concurrency"], n["need"]) for n in out["levels"]] == [(1.0, 3), (64.0, 8)]
    # one degree of freedom: the spread's own 95% interval reaches ~560 pairs at se 0.01, past 1,000 at 0.03
    assert out["levels"][0]["need_hi"] > 500 and out["levels"][1]["need_hi"] is None
    (pair_s,) = out["pair_s"]
    assert pair_s > 2 * 600  # a pair: both fixed arms' server starts and sweeps
    assert main([*base, "--noise-from", str(measured), "--effect", "0.038"]) == 0
    text = capsys.readouterr().out
    assert "eagle3 (instance pairs, measured 2): 1: 3 [" in text
    gpu = f"GPU time: 8 instance pairs (C=64 decides) x {pair_s / 60:.1f} min a pair = {8 * pair_s / 3600:.1f} h"
    assert gpu in text
    assert (
        "the segment rule's budget (precision.max_instances 2) stops short of it: levels then say so; 8 reach" in text
    )
    cfg["precision"] = {"max_instances": 8}  # the segment rule may add pairs: its budget holds the 8
    path.write_text(yaml.safe_dump(cfg))
    assert main([*base, "--noise-from", str(measured), "--effect", "0.038"]) == 0
    text = capsys.readouterr().out
    assert "within the segment rule's budget (precision.max_instances 8)" in text
    assert "up to 8 per arm (precision.max_instances): at most" in text
    # interleaved instances pooled (no instance effect): the interval rests on its 8 rounds, not on 2 instances
    pooled = measured_crossover({4.0: 0.01})
    pooled["arms"]["eagle3"]["per_level"][0]["paired"].update(df=7, instance_effect=False)
    (need,) = level_needs(Crossover.model_validate(pooled), 0.038)
    assert (need.unit, need.measured, need.need) == ("round", 8, units_for(0.01**2 * 8, 0.038, most=MOST_UNITS))
    assert main(base) == 0
    assert "the GPU time to reach it is not planned here" in capsys.readouterr().out
    assert main([*base, "--noise-from", str(tmp_path / "missing.json")]) == 2
    assert "--noise-from" in capsys.readouterr().err


def test_a_gpu_budget_says_what_it_buys_and_what_a_decided_answer_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--budget-min` on a sequential variant: the instance pairs the budget buys past the fixed grid, and at a
    measured run's spread which levels' verdicts they decide (the interval outside 1 +- 2%). C=1 at 1.30 (se 0.01)
    needs 2 pairs, C=16 at 0.80 (se 0.03: t(2) 4.30 x sqrt(0.0018 / 3) = 0.105 <= log(0.98 / 0.80) = 0.203) 3;
    C=64 at 0.99 lies within the margin: only the precision target decides it, so no budget decides every level.
    A budget short of the grid says by how much."""
    cfg = gpu_config([1, 16, 64])
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    measured = tmp_path / "crossover.json"
    measured.write_text(
        json.dumps(measured_crossover({1.0: 0.01, 16.0: 0.03, 64.0: 0.03}, {1.0: 1.30, 16.0: 0.80, 64.0: 0.99}))
    )
    base = ["plan", "--config", str(path), "--profile", "kimi-k25-cu130-fusion", "--plausible", "0"]
    assert main([*base, "--noise-from", str(measured), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    grid_s, pair_s = plain["runs"][0][0]["total_s"], plain["precision"]["pair_s"][0]
    budget_min = (grid_s + 1.5 * pair_s) / 60  # the grid's two pairs and one more
    assert main([*base, "--noise-from", str(measured), "--budget-min", str(budget_min), "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["budget"]
    assert b["pairs"] == [3]
    by_level = {x["concurrency"]: x for x in b["levels"]}
    assert (by_level[1.0]["pairs_to_decide"], by_level[16.0]["pairs_to_decide"]) == (2, 3)
    assert by_level[1.0]["decided"] and by_level[16.0]["decided"] and not by_level[64.0]["decided"]
    assert by_level[64.0]["pairs_to_decide"] is None and b["pairs_for_every_verdict"] is None
    assert main([*base, "--noise-from", str(measured), "--budget-min", str(budget_min)]) == 0
    text = capsys.readouterr().out
    assert "buys 3 instance pairs per level (1 past the grid's)" in text
    assert "verdicts decided at 2 of 3 levels; not decided: eagle3 C=64" in text
    assert "a decided answer at every level: not within reach" in text
    assert main([*base, "--budget-min", str(grid_s / 120)]) == 0  # half the grid
    assert "it falls short of the fixed grid by" in capsys.readouterr().out
