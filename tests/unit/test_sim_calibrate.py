"""Calibration: fitting to the seed table, and extending a partial sweep with a few baseline cells."""

from __future__ import annotations

import argparse
import json

import pytest

from specsweep.cli import calibrate as cal
from specsweep.sim.profile import dump_profile, load_profile
from specsweep.virtual import fit
from specsweep.virtual.bounds import check_profile
from specsweep.virtual.predict import DEFAULT_LEVELS, requests_for_level, simulate_level

pytestmark = pytest.mark.unit

PERTURB = {
    "step.fixed_s": 0.006,
    "step.per_seq_s": 0.0002,
    "step.per_token_s": 0.0002,
    "step.per_context_token_s": 0.000001,
    "step.expert_read_s": 0.035,
    "speculative.accept_prob": 0.65,
    "speculative.draft_step_s": 0.003,
    "speculative.draft_per_seq_s": 0.0001,
}


def test_calibrate_cli_to_seed_table_within_6_percent_inside_physical_bounds(tmp_path, capsys):
    base = load_profile("kimi-k25-cu130-fusion").with_params(PERTURB)
    base_path = tmp_path / "base.yaml"
    dump_profile(base, base_path)
    out = tmp_path / "fitted.yaml"
    parser = argparse.ArgumentParser()
    cal.add_arguments(parser)
    args = parser.parse_args(
        [
            "--measured",
            str(fit.seed_csv_path()),
            "--profile",
            str(base_path),
            "--out",
            str(out),
            "--arm",
            "eagle3",
            "--name",
            "fitted",
        ]
    )
    assert cal.run(args) == 0
    printed = capsys.readouterr().out
    assert "spec closed_loop C=250" in printed and "max |error|" in printed
    assert "identifiability" in printed and "outside physical bounds" not in printed
    fitted = load_profile(out)
    assert check_profile(fitted, list(fitted.reference["uncertainty"]["params"])) == []
    assert fitted.name == "fitted" and fitted.illustrative is False
    targets = fit.load_targets(fit.seed_csv_path(), "eagle3", fit.workload_of(fitted))
    assert len(targets) == 9  # the cuda13-fusion stack: 8 levels + its single-stream figure
    for t in targets:
        # the bounds cost fit quality: the KV-read cost may not absorb the C=1 gap (rms 2.8%, worst 5.2%)
        assert abs(fit.simulated_tok_s(fitted, t) / t.tok_s - 1) <= 0.06, t.label


def _write_cell(root, variant, arm, c, tok_s, w, n_requests, key="output_tok_s_steady", stagger=True):
    """A cell summary as the pipeline writes it (workload.n_requests measured, workload.stagger, metrics)."""
    d = root / variant / arm / f"c{c}"
    d.mkdir(parents=True)
    workload = {"input_tokens_mean": float(w["input_tokens"]), "output_tokens": w["output_tokens"]}
    workload["n_requests"] = n_requests
    if stagger is not None:  # None: a cell written before the client staggered its slots (no such key)
        workload["stagger"] = stagger
    (d / "summary.json").write_text(
        json.dumps(
            {
                "cell": {"variant": variant, "arm": arm, "concurrency": c},
                "workload": workload,
                "metrics": {key: tok_s} if isinstance(key, str) else dict(zip(key, tok_s, strict=True)),
                "validity": {"valid": True},
            }
        )
    )


def test_few_baseline_cells_give_the_baseline_curve(tmp_path):
    """Truth: a profile; measured (as the pipeline measures: staggered slots, steady window): its speculative
    sweep + 3 baseline cells; fit from a perturbed base."""
    truth = load_profile("kimi-k25-cu130-fusion").with_params({"step.per_context_token_s": 0.0000002})
    w = fit.workload_of(truth)
    n = {c: requests_for_level(c, w["requests_per_concurrency"], w["requests_floor"]) for c in DEFAULT_LEVELS}

    def true_tok_s(spec: bool, c: int) -> float:
        return simulate_level(truth, spec, c, n[c], w["input_tokens"], w["output_tokens"], stagger=True).aggregate_tok_s

    for c in DEFAULT_LEVELS:
        _write_cell(tmp_path, "sim", "eagle3", c, true_tok_s(True, c), w, n[c], key="aggregate_tok_s")
    for c in (1, 10, 100):
        _write_cell(tmp_path, "sim", "baseline", c, true_tok_s(False, c), w, n[c])
    base = truth.with_params(PERTURB)
    targets = fit.load_targets(tmp_path, "eagle3", w, variant="sim")
    assert len(targets) == 11
    assert all(t.stagger and t.throughput == "steady" for t in targets)
    fitted, pairs = fit.fit_profile(base, targets)
    assert max(abs(s / t.tok_s - 1) for t, s in pairs) <= 0.05
    for c in DEFAULT_LEVELS:
        got = simulate_level(fitted, False, c, n[c], w["input_tokens"], w["output_tokens"]).aggregate_tok_s
        assert abs(got / true_tok_s(False, c) - 1) <= 0.08, c


def test_cells_are_simulated_the_way_they_were_measured(tmp_path):
    """New cells: ramp (if workload.stagger) and the steady window; cells from before the stagger (no key):
    no ramp and the whole-level figure, whose definition did not change; CSV rows: the reference workload."""
    p = load_profile("demo")
    w = fit.workload_of(p)
    _write_cell(tmp_path, "v", "baseline", 10, 1000.0, w, 40, stagger=True)
    _write_cell(tmp_path, "v", "eagle3", 10, 1100.0, w, 40, stagger=False)
    _write_cell(
        tmp_path,
        "v",
        "baseline",
        5,
        (800.0, 700.0),
        w,
        10,
        key=("output_tok_s_steady", "output_tok_s_total"),
        stagger=None,
    )
    got = {(t.speculative, t.concurrency): t for t in fit.load_targets(tmp_path, "eagle3", w)}
    assert got[(False, 10)].stagger is True and got[(False, 10)].throughput == "steady"
    assert got[(True, 10)].stagger is False and got[(True, 10)].throughput == "steady"
    old = got[(False, 5)]
    assert (old.stagger, old.throughput, old.tok_s, old.n_requests) == (False, "total", 700.0, 10)
    assert old.input_tokens == w["input_tokens"]
    lp = simulate_level(p, False, 5, 10, w["input_tokens"], w["output_tokens"], stagger=False)
    assert fit.simulated_tok_s(p, old) == lp.aggregate_total_tok_s
    new = got[(False, 10)]
    lp = simulate_level(p, False, 10, 40, w["input_tokens"], w["output_tokens"], stagger=True)
    assert lp.ramp_requests == 10 and fit.simulated_tok_s(p, new) == lp.aggregate_tok_s
    # The seed table was taken without a ramp and holds whole-level figures (the Kimi reference workload).
    kimi = fit.workload_of(load_profile("kimi-k25-cu130-fusion"))
    assert (kimi["stagger"], kimi["throughput"]) == (False, "total")
    seed = fit.load_targets(fit.seed_csv_path(), "eagle3", kimi)
    assert all(not t.stagger and t.throughput == "total" for t in seed)
