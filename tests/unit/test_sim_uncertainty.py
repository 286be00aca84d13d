"""Physical bounds, identifiability and prediction intervals (docs/sim.md, "Bounds" and "Uncertainty")."""

from __future__ import annotations

import dataclasses

import pytest

from specsweep.sim.profile import Hardware, load_profile
from specsweep.virtual.bounds import check_profile, read_floors
from specsweep.virtual.fit import Target, load_targets, seed_csv_path, simulated_tok_s, workload_of
from specsweep.virtual.predict import predict_sweep
from specsweep.virtual.uncertainty import format_intervals, identify, sweep_intervals

pytestmark = pytest.mark.unit

KIMI = ("kimi-k25-cu128", "kimi-k25-cu130", "kimi-k25-cu130-fusion")


def test_read_floors_follow_bandwidth_and_kv_memory_caps_running_requests() -> None:
    p = load_profile("kimi-k25-cu130-fusion")
    floors = read_floors(p)
    assert floors["step.per_context_token_s"][0] == pytest.approx(70272 / 1.79e12)  # ~39 ns, MLA KV per token
    assert floors["step.expert_read_s"][0] == pytest.approx(507e9 / 8 / 1.79e12)  # ~35 ms, every routed expert
    # (96 - 600/8 - 6) GB free per card over 70 KB x 2560 tokens per request
    assert p.kv_capacity(2560) == int(15e9 // (70272 * 2560)) == 83
    assert p.running_cap(False, 2560) == 83 and p.running_cap(True, 2560) == 48  # SGLang's EAGLE cap is lower
    assert p.running_cap(False) == 256  # no context given: the scheduler's cap alone
    assert load_profile("demo").kv_capacity(2560) is None and read_floors(load_profile("demo")) == {}
    sharded = dataclasses.replace(p, hardware=dataclasses.replace(p.hardware, kv_replicated=False))
    assert sharded.kv_capacity(2560) == int(15e9 // (70272 / 8 * 2560)) == 667  # each rank holds 1/8 of the KV


@pytest.mark.parametrize("name", KIMI)
def test_kimi_profiles_respect_the_physical_bounds(name: str) -> None:
    p = load_profile(name)
    params = list(p.reference["uncertainty"]["params"])
    assert check_profile(p, params) == []
    for member in p.reference["uncertainty"]["ensemble"]:
        assert check_profile(p.with_params(member), params) == [], member


def test_the_old_unbounded_kv_cost_is_refused() -> None:
    """The unbounded fit charged 1.85 us per context token: ~47x the KV read at the card's bandwidth."""
    p = load_profile("kimi-k25-cu130-fusion").with_params({"step.per_context_token_s": 1.85e-6})
    problems = check_profile(p, ["step.per_context_token_s"])
    assert len(problems) == 1 and "per_context_token_s" in problems[0]


def test_rich_data_pins_a_parameter_that_thin_data_leaves_free() -> None:
    """Cells of a known profile at every level pin its fixed and per-sequence costs; one level cannot tell them
    apart. Baseline cells never tell per-sequence from per-token costs (a decode step has one token per
    sequence): that pair stays free however many levels are measured."""
    truth = load_profile("demo")
    hw = Hardware(gpus=2, gpu_memory_gb=80, memory_bandwidth_gbs=2000, weight_gb=4, dense_weight_gb=2)
    base = dataclasses.replace(truth, hardware=hw)
    params = ["step.fixed_s", "step.per_seq_s"]

    def targets(levels: list[int]) -> list[Target]:
        out = []
        for c in levels:
            t = Target(False, "closed_loop", c, 0.0, 128, 64, 4 * c, stagger=True)
            out.append(dataclasses.replace(t, tok_s=simulated_tok_s(truth, t)))
        return out

    rich = {r.name: r for r in identify(base, targets([1, 2, 5, 10, 30, 70, 100, 250]), params).ranges}
    thin = {r.name: r for r in identify(base, targets([30]), params).ranges}
    for name, value in (("step.fixed_s", truth.step.fixed_s), ("step.per_seq_s", truth.step.per_seq_s)):
        assert rich[name].pinned and value == pytest.approx(rich[name].best, rel=1e-3), rich[name]
        assert rich[name].lo * (1 - 1e-9) <= value <= rich[name].hi * (1 + 1e-9), rich[name]
        assert not thin[name].pinned, thin[name]
    assert rich["step.fixed_s"].bound.physical and rich["step.fixed_s"].bound.lo == pytest.approx(1e9 / 2e12)
    collinear = identify(base, targets([1, 5, 30, 250]), [*params, "step.per_token_s"]).ranges
    assert not {r.name: r for r in collinear}["step.per_token_s"].pinned


def test_eagle_sweep_alone_predicts_the_baseline_with_a_wide_interval() -> None:
    """The done-when case: calibrated on the EAGLE-3 sweep (and its single-stream figure) alone, the baseline
    is an extrapolation; its interval says so (wide), the speculative arm's stays narrow, the crossover is given
    as an interval, and the cells to measure are baseline ones."""
    base = load_profile("kimi-k25-cu130-fusion")
    targets = load_targets(seed_csv_path(), "eagle3", workload_of(base), stack="cuda13-fusion")
    assert {t.speculative for t in targets} == {True}
    ident = identify(base, targets)
    assert check_profile(ident.profile, [r.name for r in ident.ranges]) == []
    assert any(not r.pinned for r in ident.ranges)  # the data leaves some costs free
    levels = [1, 2, 5, 10, 30, 70, 100, 250]
    sweep = predict_sweep(ident.profile, levels, 2048, 512, 2, 30, stagger=False)
    result = sweep_intervals(
        ident.profile,
        ident.as_dict(),
        levels,
        [p.aggregate_tok_s for p in sweep.baseline],
        [p.aggregate_tok_s for p in sweep.speculative],
        2048,
        512,
    )
    base_width = [lv.baseline[2] / lv.baseline[1] for lv in result.levels]
    spec_width = [lv.speculative[2] / lv.speculative[1] for lv in result.levels]
    assert min(base_width) > 2.0 and max(spec_width) < 1.3  # the unmeasured arm is the uncertain one
    assert all(lv.baseline[1] <= lv.baseline[0] <= lv.baseline[2] for lv in result.levels)
    assert {arm for arm, _, _ in result.suggestions} == {"baseline"}
    text = format_intervals(result)
    assert "measure next: baseline at C=" in text
    assert "crossover C in [" in text or "no crossover in range" in text
    if result.crossover_interval() is None:
        assert "every plausible profile" in result.verdict()  # "none" only when the whole ensemble agrees


@pytest.mark.parametrize("name", KIMI)
def test_predict_prints_the_crossover_interval_or_why_none(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from specsweep.cli import main

    assert main(["predict", "--profile", name]) == 0
    out = capsys.readouterr().out
    assert "90% prediction intervals over" in out
    assert "crossover C in [" in out or "no crossover in range" in out
    assert "measure next:" in out
