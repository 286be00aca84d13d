"""Virtual-time prediction: speed, the demo profile's promises, fidelity of the Kimi profiles to the seed."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytest

from specsweep.analysis import crossover
from specsweep.cli import predict as predict_cli
from specsweep.client.loadgen import ramp_length
from specsweep.config import defaults
from specsweep.measure import metrics
from specsweep.sim.profile import load_profile
from specsweep.virtual import predict as predict_mod
from specsweep.virtual.fit import Target, load_targets, seed_csv_path, simulated_tok_s, workload_of
from specsweep.virtual.forecast import resolve_workload
from specsweep.virtual.predict import (
    DEFAULT_LEVELS,
    WORKLOAD_DEFAULTS,
    level_records,
    predict_sweep,
    run_level,
    simulate_level,
    summarize_level,
)

pytestmark = pytest.mark.unit


def test_full_default_sweep_predicts_under_one_second():
    t = time.perf_counter()
    sweep = predict_sweep(load_profile("demo"), DEFAULT_LEVELS)
    assert time.perf_counter() - t < 1.0
    assert len(sweep.baseline) == len(sweep.speculative) == 8


def test_demo_profile_promises():
    """Crossover clearly inside; under a minute of serving for the 16 cells of the default workload (4 turnovers
    per slot after the ramp); <= ~7500 chunks/s (the server uses about a fifth of a core there: docs/sim.md)."""
    p = load_profile("demo")
    sweep = predict_sweep(p, DEFAULT_LEVELS)
    cx = sweep.crossovers()
    assert len(cx) == 1 and 5 < cx[0] < 70
    sp = sweep.speedup()
    assert sp[0] > 1.3 and sp[-1] < 0.9
    warmup = sum(simulate_level(p, s, 1, 2, 128, 64, stagger=False).duration_s for s in (False, True)) * 8
    serving = sum(x.duration_s for x in sweep.baseline + sweep.speculative) + warmup
    assert serving <= 55
    assert max(x.peak_chunks_per_s for x in sweep.baseline + sweep.speculative) <= 7500


def test_workload_defaults_are_the_pipelines():
    w, r = defaults("workload"), defaults("workload", "requests")
    assert WORKLOAD_DEFAULTS == {
        "input_tokens": w["input_tokens"],
        "output_tokens": w["output_tokens"],
        "requests_per_concurrency": r["per_concurrency"],
        "requests_floor": r["floor"],
        "stagger": w["stagger"],
    }
    assert predict_mod.crossings_log_c is crossover.crossings_log_c  # no private copy


@pytest.mark.parametrize("stagger", [True, False])
def test_virtual_client_sends_what_the_real_client_sends(stagger):
    """With stagger: C ramp requests of loadgen.ramp_length tokens at t0, then n measured full-length ones, each
    slot sending its next when its previous ends; without: n requests over min(C, n) slots."""
    p = load_profile("demo")
    c, n = 8, 20
    lv = run_level(p, True, c, n, 128, 64, stagger=stagger)
    kinds = list(zip(lv.requests, lv.ramp, lv.filler, strict=True))
    ramps = [r for r, is_ramp, _ in kinds if is_ramp]
    fillers = [r for r, _, is_filler in kinds if is_filler]
    meas = [r for r, is_ramp, is_filler in kinds if not (is_ramp or is_filler)]
    assert len(meas) == n and all(r.max_new_tokens == 64 for r in meas)
    # fillers (stagger only): after the last measured send, at most two per slot, those still running aborted
    # at the last measured end, where the level ends
    last_end = max(r.finished_at for r in meas)
    assert len(fillers) <= 2 * c and (fillers != []) == stagger
    assert all(r.arrival > max(q.arrival for q in meas) for r in fillers)
    assert all(r.finished_at <= last_end or (r.aborted and r.finished_at == last_end) for r in fillers)
    assert max(r.finished_at for r in lv.requests) == last_end
    if stagger:
        assert [r.max_new_tokens for r in ramps] == [ramp_length(64, k, c) for k in range(c)]
        assert [r.tag for r in ramps] == list(range(c)) and all(r.arrival == lv.t0 for r in ramps)
    else:
        assert ramps == [] and sum(r.arrival == lv.t0 for r in meas) == c
    # Every later send follows an end of the same slot by the client's turnaround.
    for r in lv.requests:
        if r.arrival > lv.t0:
            prev = [q for q in lv.requests if q.tag == r.tag and q.finished_at <= r.arrival]
            assert max(q.finished_at for q in prev) + predict_mod.CLIENT_TURNAROUND_S == pytest.approx(r.arrival)
    lp = summarize_level(lv, True, 128, 64, stagger)
    assert (lp.n_requests, lp.ramp_requests, lp.stagger) == (n, c if stagger else 0, stagger)


@pytest.mark.parametrize(("speculative", "concurrency", "n"), [(False, 1, 8), (True, 10, 40), (False, 70, 280)])
def test_prediction_is_the_metrics_of_its_own_records(speculative, concurrency, n):
    """The prediction uses the metrics module's definitions: run `specsweep.measure.metrics` on the virtual level's
    records and get the same window, latencies (measured requests only) and whole-level throughput."""
    p = load_profile("demo")
    lv = run_level(p, speculative, concurrency, n, 128, 64, trace=True)
    lp = summarize_level(lv, speculative, 128, 64, True)
    df = level_records(lv)
    m = metrics.repeat_metrics(df, concurrency)
    assert m["n_measured"] == lp.n_requests == n and m["n_requests"] == n + concurrency + sum(lv.filler)
    assert m["errors"]["count"] == 0 and m["n_ok"] == m["n_requests"] - sum(r.aborted for r in lv.requests)
    assert m["steady_window_s"] == pytest.approx(lp.steady_window_s, abs=1e-9)
    assert m["output_tok_s_total"] == pytest.approx(lp.aggregate_total_tok_s, rel=1e-12)
    assert m["duration_s"] == pytest.approx(lp.duration_s, abs=1e-9)
    for key, got in (("ttft_ms", lp.ttft_s), ("tpot_ms", lp.tpot_s), ("e2e_ms", lp.e2e_s)):
        assert m[key]["mean"] == pytest.approx(got * 1e3, rel=1e-9), key
    assert m["request_tok_s"]["mean"] == pytest.approx(lp.per_request_tok_s, rel=1e-9)
    assert m["achieved_concurrency"] >= 0.95 * concurrency
    # Window tokens: a step's chunks all arrive at its end; the step ending at the window's start counts
    # outside, the closing one inside, in virtual time as in the metrics (each chunk over its interval; only a
    # first token whose prefill spans the start counts in part). Was 2% apart when chunks counted whole.
    assert m["output_tok_s_steady"] == pytest.approx(lp.aggregate_tok_s, rel=1e-4)
    # Ramp requests are excluded from the latencies: their (shorter) E2E would pull the mean down.
    e2e_all = (df["end_s"] - df["send_s"]).to_numpy()
    if concurrency > 1:
        assert np.mean(e2e_all) < lp.e2e_s


def test_level_prediction_fields_are_consistent():
    p = load_profile("demo")
    lp = simulate_level(p, True, 10, 20, 128, 64, seed=1)
    assert lp.n_requests == 20 and lp.ramp_requests == 10
    assert lp.chunks < (20 * 64 + sum(ramp_length(64, k, 10) for k in range(10))) / 1.5
    assert lp.ttft_s < lp.e2e_s and lp.tpot_s > 0
    assert lp.accept_length > 1.5
    assert lp.aggregate_tok_s == pytest.approx(lp.aggregate_total_tok_s, rel=0.2)
    assert simulate_level(p, True, 10, 20, 128, 64, seed=1) == lp


def test_kimi_fusion_profile_reproduces_seed_sweep_within_6_percent():
    """Fitted inside the physical bounds (docs/sim.md, "Bounds"): rms 2.8%, worst 5.1% (C=1)."""
    p = load_profile("kimi-k25-cu130-fusion")
    targets = load_targets(seed_csv_path(), "eagle3", workload_of(p), stack="cuda13-fusion")
    closed = [t for t in targets if t.mode == "closed_loop"]
    assert [t.concurrency for t in closed] == DEFAULT_LEVELS
    for t in targets:
        got = simulated_tok_s(p, t)
        assert abs(got / t.tok_s - 1) <= 0.06, (t.label, got, t.tok_s)


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
    parser = argparse.ArgumentParser()
    predict_cli.add_arguments(parser)
    assert predict_cli.run(parser.parse_args(["--concurrency", "1,10,100", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert [b["concurrency"] for b in out["baseline"]] == [1, 10, 100]
    assert len(out["crossovers"]) == 1 and out["illustrative"] is True
    assert out["workload"] == WORKLOAD_DEFAULTS  # demo has no reference workload: the pipeline's defaults
    assert [b["n_requests"] for b in out["baseline"]] == [8, 40, 400]
    assert [b["ramp_requests"] for b in out["speculative"]] == [1, 10, 100]
    assert predict_cli.run(parser.parse_args(["--concurrency", "10", "--no-stagger", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["stagger"] is False and out["baseline"][0]["ramp_requests"] == 0
    # A profile's reference workload sets the sizes and request counts, not the stagger (that of its seed).
    args = parser.parse_args(["--profile", "kimi-k25-cu130-fusion", "--concurrency", "1", "--json"])
    w = resolve_workload({k: getattr(args, k) for k in WORKLOAD_DEFAULTS}, load_profile("kimi-k25-cu130-fusion"))
    assert (w["input_tokens"], w["requests_per_concurrency"], w["requests_floor"], w["stagger"]) == (2048, 2, 30, True)
    assert (
        predict_cli.run(
            parser.parse_args(
                ["--profile", "kimi-k25-cu130-fusion", "--output-tokens", "512", "--concurrency", "1,250"]
            )
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "calibrated" in text and "crossover" in text
