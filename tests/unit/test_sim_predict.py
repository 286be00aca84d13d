"""Virtual-time prediction: speed, the demo profile's promises, fidelity of the Kimi profiles to the seed."""

from __future__ import annotations

import json
import time

import pytest

from specsweep.sim import predict as predict_mod
from specsweep.sim.calibrate import Target, load_targets, seed_csv_path, simulated_tok_s, workload_of
from specsweep.sim.predict import DEFAULT_LEVELS, predict_sweep, simulate_level
from specsweep.sim.profile import load_profile

pytestmark = pytest.mark.unit


def test_full_default_sweep_predicts_under_one_second():
    t = time.perf_counter()
    sweep = predict_sweep(load_profile("demo"), DEFAULT_LEVELS)
    assert time.perf_counter() - t < 1.0
    assert len(sweep.baseline) == len(sweep.speculative) == 8


def test_demo_profile_promises():
    """Crossover clearly inside; <= ~90 s of serving for the 16 cells; <= ~3000 chunks/s."""
    p = load_profile("demo")
    sweep = predict_sweep(p, DEFAULT_LEVELS)
    cx = sweep.crossovers()
    assert len(cx) == 1 and 5 < cx[0] < 70
    sp = sweep.speedup()
    assert sp[0] > 1.3 and sp[-1] < 0.9
    warmup = sum(simulate_level(p, s, 1, 2, 128, 64).duration_s for s in (False, True)) * 8
    serving = sum(x.duration_s for x in sweep.baseline + sweep.speculative) + warmup
    assert serving <= 85
    assert max(x.peak_chunks_per_s for x in sweep.baseline + sweep.speculative) <= 3000


def test_level_prediction_fields_are_consistent():
    p = load_profile("demo")
    lp = simulate_level(p, True, 10, 20, 128, 64, seed=1)
    assert lp.n_requests == 20 and lp.chunks < 20 * 64
    assert lp.ttft_s < lp.e2e_s and lp.tpot_s > 0
    assert lp.accept_length > 1.5
    assert lp.aggregate_tok_s == pytest.approx(lp.aggregate_total_tok_s, rel=0.2)
    assert simulate_level(p, True, 10, 20, 128, 64, seed=1) == lp


def test_kimi_fusion_profile_reproduces_seed_sweep_within_5_percent():
    p = load_profile("kimi-k25-cu130-fusion")
    targets = load_targets(seed_csv_path(), "eagle3", workload_of(p), stack="cuda13-fusion")
    closed = [t for t in targets if t.mode == "closed_loop"]
    assert [t.concurrency for t in closed] == DEFAULT_LEVELS
    for t in targets:
        got = simulated_tok_s(p, t)
        assert abs(got / t.tok_s - 1) <= 0.05, (t.label, got, t.tok_s)


@pytest.mark.parametrize(
    ("profile", "speculative", "measured"),
    [
        ("kimi-k25-cu128", False, 89.5),
        ("kimi-k25-cu128", True, 54.1),
        ("kimi-k25-cu130", False, 92.6),
        ("kimi-k25-cu130-fusion", True, 96.1),
    ],
)
def test_single_stream_numbers_within_5_percent(profile, speculative, measured):
    p = load_profile(profile)
    w = workload_of(p)
    t = Target(speculative, "single_stream", 1, measured, w["single_stream_input_tokens"], w["output_tokens"], 1)
    assert abs(simulated_tok_s(p, t) / measured - 1) <= 0.05


def test_predict_cli_json(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    predict_mod.add_arguments(parser)
    assert predict_mod.run(parser.parse_args(["--concurrency", "1,10,100", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert [b["concurrency"] for b in out["baseline"]] == [1, 10, 100]
    assert len(out["crossovers"]) == 1 and out["illustrative"] is True
    assert (
        predict_mod.run(
            parser.parse_args(
                ["--profile", "kimi-k25-cu130-fusion", "--output-tokens", "512", "--concurrency", "1,250"]
            )
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "calibrated" in text and "crossover" in text
