"""Paired measurement: the block order, the paired estimate, the drift gate, A/A arms and the served arm."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from specsweep.analysis.bootstrap import CellBootstrap
from specsweep.analysis.cells import Cell
from specsweep.analysis.paired import paired_estimate, rounds_of
from specsweep.client.loadgen import LevelResult, RepeatResult
from specsweep.client.prompts import LevelPrompts
from specsweep.config import (
    AA_INSTANCE_ENV,
    ConfigError,
    aa_arms,
    cell_spec,
    fixed_arms,
    pairing_mode,
    policy_level_specs,
    policy_reference,
    speculative_arms,
    validate,
)
from specsweep.measure import interleave
from specsweep.measure.cell import LevelInputs
from specsweep.measure.gates import block_drift, block_drift_gate
from specsweep.measure.heal import transient_only
from specsweep.measure.interleave import Rounds, block_order, centred, check_specs, out_dirs, round_instances, slot_of

pytestmark = pytest.mark.unit


def test_block_order_is_counterbalanced() -> None:
    assert block_order(["a", "b"], 4) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert block_order(["a", "b", "c"], 2) == [["a", "b", "c"], ["c", "b", "a"]]


def test_every_arm_is_measured_next_to_the_reference() -> None:
    """The reference (listed first) sits in the middle: each other arm's block is its neighbour in every round
    (with 4 arms, all but one), and the order still reverses round by round."""
    assert centred(["base", "spec"]) == ["base", "spec"]
    assert centred(["base", "k1", "k3"]) == ["k1", "base", "k3"]
    assert centred(["base", "k1", "k2", "k3"]) == ["k1", "base", "k2", "k3"]
    for r, order in enumerate(block_order(centred(["base", "k1", "k3"]), 4)):
        for arm in ("k1", "k3"):
            assert abs(order.index(arm) - order.index("base")) == 1, (r, order)


def test_rounds_go_through_the_instances_counterbalanced() -> None:
    """1 .. N, N .. 1: with the arms' order reversed each round, 2N rounds give every instance both orders."""
    assert round_instances(4, 2) == [1, 2, 2, 1]
    assert round_instances(5, 2) == [1, 2, 2, 1, 1]
    assert round_instances(6, 3) == [1, 2, 3, 3, 2, 1]
    assert round_instances(3, 1) == [1, 1, 1]
    orders = block_order(["a", "b"], 4)
    seen = {(k, tuple(o)) for k, o in zip(round_instances(4, 2), orders, strict=True)}
    assert seen == {(1, ("a", "b")), (2, ("b", "a")), (2, ("a", "b")), (1, ("b", "a"))}
    assert slot_of("base", 1, 1) == "base"  # one instance: the slot the servers always had (reused)
    assert slot_of("base", 2, 2) == "base.i2"


def test_a_level_takes_one_instance_count() -> None:
    spec = {"concurrency": 4, "repeats": 4, "pairing": {"mode": "interleaved", "instances": 2}}
    assert check_specs({"a": spec, "b": spec}) == (4, 4, 2)
    with pytest.raises(Exception, match="server instances"):
        check_specs({"a": spec, "b": {**spec, "pairing": {"mode": "interleaved"}}})


def blocks(order: list[list[str]], instances: int = 1) -> list[dict[str, Any]]:
    out, t = [], 0.0
    on = round_instances(len(order), instances)
    for r, arms in enumerate(order):
        for arm in arms:
            out.append({"arm": arm, "repeat": r, "start_unix": t, "end_unix": t + 1})
            if instances > 1:
                out[-1]["instance"] = on[r]
            t += 1
    return out


def test_rounds_pair_the_blocks_of_both_arms() -> None:
    order = block_order(["base", "k1", "spec"], 3)  # base k1 spec | spec k1 base | base k1 spec
    assert rounds_of(blocks(order), "base", "spec") == [0, 1, 2]
    partial = [b for b in blocks(order) if not (b["arm"] == "spec" and b["repeat"] == 1)]
    assert rounds_of(partial, "base", "spec") == [0, 2]  # a round without both arms pairs nothing


def cell(arm: str, pid: str, order: list[list[str]], instances: int = 1) -> Cell:
    pairing = {"mode": "interleaved", "id": pid, "blocks": blocks(order, instances)}
    summary = {"pairing": pairing, "cell": {"key": f"x/{arm}"}}
    return Cell(arm=arm, concurrency=1.0, path=Path("/nonexistent"), summary=summary)


def boot(values: dict[int, float], log_var: float = 1e-4, df: int = 9) -> CellBootstrap:
    name = "aggregate_tok_s"
    b = CellBootstrap(point={name: float(np.mean(list(values.values())))}, replicates={})
    b.repeat_values[name] = values
    b.repeat_log_var[name] = {r: (log_var, df) for r in values}
    return b


def test_a_drift_linear_over_the_level_cancels_and_widens_the_interval() -> None:
    order = block_order(["base", "spec"], 4)  # base0 spec0 | spec1 base1 | base2 spec2 | spec3 base3
    delta = 0.1  # the host slows by 10% per block, blocks at t = 0..7
    t = {(b["arm"], b["repeat"]): i for i, b in enumerate(blocks(order))}
    base = boot({r: 100.0 * math.exp(-delta * t[("base", r)]) for r in range(4)})
    spec = boot({r: 150.0 * math.exp(-delta * t[("spec", r)]) for r in range(4)})
    rng = np.random.default_rng(0)
    pe = paired_estimate(
        cell("base", "p", order), cell("spec", "p", order), base, spec, "aggregate_tok_s", True, 2000, rng
    )
    assert pe is not None
    assert pe.speedup == pytest.approx(1.5, rel=1e-12)  # the rounds' +0.1 and -0.1 cancel in the mean
    # the drift is not taken out of the rounds' spread: it widens the interval (3 degrees of freedom)
    assert pe.spread_dominates and pe.df == 3
    lo, hi = np.percentile(pe.replicates, [5, 95])
    assert lo < 1.5 * math.exp(-0.1) and hi > 1.5 * math.exp(0.1)


def test_three_rounds_decide_what_they_agree_on() -> None:
    """The vLLM CPU run that showed the old estimate's cost: C=1 with 3 repeats of three arms, K=3 over plain
    decoding read 1.64, 1.92, 1.33 in the rounds; 2 degrees of freedom give about 1.18-2.18, above 1."""
    order = block_order(["base", "k1", "spec"], 3)
    base = boot({0: 107.0, 1: 104.0, 2: 121.0})
    spec = boot({0: 175.0, 1: 200.0, 2: 161.0})
    pe = paired_estimate(
        cell("base", "p", order),
        cell("spec", "p", order),
        base,
        spec,
        "aggregate_tok_s",
        True,
        20000,
        np.random.default_rng(2),
    )
    assert pe is not None and pe.spread_dominates and pe.df == 2 and pe.pairs == 3
    lo, hi = np.percentile(pe.replicates, [5, 95])
    assert 1.1 < lo < 1.3 and 2.0 < hi < 2.3, (lo, hi)


def test_groups_that_disagree_set_the_interval() -> None:
    """Two A B | B A groups reading 1.4 and 1.6 (a step between them, or two server instances): the spread of
    the rounds, with three degrees of freedom, not the blocks' small noise, sets the interval."""
    order = block_order(["base", "spec"], 4)
    base = boot({0: 100.0, 1: 100.0, 2: 100.0, 3: 100.0})
    spec = boot({0: 140.0, 1: 140.0, 2: 160.0, 3: 160.0})
    pe = paired_estimate(
        cell("base", "p", order),
        cell("spec", "p", order),
        base,
        spec,
        "aggregate_tok_s",
        True,
        4000,
        np.random.default_rng(0),
    )
    assert pe is not None and pe.spread_dominates and pe.df == 3
    assert pe.speedup == pytest.approx(math.sqrt(1.4 * 1.6))
    lo, hi = np.percentile(pe.replicates, [2.5, 97.5])
    assert lo < 1.4 and hi > 1.6


def test_an_instance_effect_is_inside_the_interval_with_two_instances() -> None:
    """An A/A pair whose compared arm's instance 1 runs 12% faster than every other instance (what a vLLM CPU A/A
    pair showed on one instance each): on instance 1 alone the rounds agree and the interval excludes 1, a false
    verdict; with the rounds spread over two instances each, the rounds show the instance effect, the interval is
    a t over the two instances' means, and 1 is inside."""
    order = block_order(["base", "aa"], 6)
    on = round_instances(6, 2)
    wobble, aa_wobble = [1.0, 1.02, 0.98, 1.0, 1.02, 0.98], [0.98, 1.0, 1.02, 1.02, 0.98, 1.0]  # blocks' noise
    base = boot({r: 100.0 * wobble[r] for r in range(6)})
    one = boot({r: 112.0 * aa_wobble[r] for r in range(6)})  # one instance each: the offset in every round
    two = boot({r: (112.0 if on[r] == 1 else 100.0) * aa_wobble[r] for r in range(6)})
    name, rng = "aggregate_tok_s", np.random.default_rng(0)
    pe1 = paired_estimate(cell("base", "p", order), cell("aa", "p", order), base, one, name, True, 4000, rng)
    assert pe1 is not None and pe1.unit == "round"
    lo, hi = np.percentile(pe1.replicates, [2.5, 97.5])
    assert lo > 1.05, (lo, hi)
    b2, a2 = cell("base", "p", order, instances=2), cell("aa", "p", order, instances=2)
    pe2 = paired_estimate(b2, a2, base, two, name, True, 4000, rng)
    assert pe2 is not None and pe2.unit == "instance" and pe2.pairs == 2 and pe2.df == 1 and pe2.instance_effect
    d = [math.log((112.0 if on[r] == 1 else 100.0) * aa_wobble[r] / (100.0 * wobble[r])) for r in range(6)]
    means = [np.mean([x for x, k in zip(d, on, strict=True) if k == inst]) for inst in (1, 2)]
    assert pe2.speedup == pytest.approx(math.exp(np.mean(means)), rel=1e-9)  # instances weighted equally
    lo, hi = np.percentile(pe2.replicates, [2.5, 97.5])
    assert lo < 1.0 < hi and hi > 1.1, (lo, hi)


def test_instances_that_agree_pool_their_rounds() -> None:
    """No instance effect: the rounds go through both instances and are pooled (rounds - 1 degrees of freedom),
    so a second instance costs no width where the instances agree."""
    order = block_order(["base", "spec"], 6)
    base = boot({r: 100.0 * w for r, w in enumerate([1.0, 1.02, 0.98, 1.0, 1.02, 0.98])})
    # each round's log ratio 0.02, -0.02, 0.02, -0.02, 0, 0: instance 1 (rounds 0, 3, 4) and instance 2 (1, 2, 5)
    # alike in mean and spread
    d = [0.02, -0.02, 0.02, -0.02, 0.0, 0.0]
    weights = [1.0, 1.02, 0.98, 1.0, 1.02, 0.98]
    spec = boot({r: 150.0 * w * math.exp(x) for r, (w, x) in enumerate(zip(weights, d, strict=True))})
    args = (base, spec, "aggregate_tok_s", True, 4000, np.random.default_rng(1))
    pe = paired_estimate(cell("base", "p", order, 2), cell("spec", "p", order, 2), *args)
    assert pe is not None and pe.unit == "instance" and pe.instance_effect is False and pe.df == 5
    lo, hi = np.percentile(pe.replicates, [2.5, 97.5])
    assert 1.44 < lo < 1.5 < hi < 1.56, (lo, hi)


def test_the_blocks_own_noise_is_the_floor_on_the_rounds_degrees_of_freedom() -> None:
    order = block_order(["base", "spec"], 2)
    base, spec = boot({0: 100.0, 1: 100.0}, 0.01**2), boot({0: 150.0, 1: 150.0}, 0.01**2)
    pe = paired_estimate(
        cell("base", "p", order),
        cell("spec", "p", order),
        base,
        spec,
        "aggregate_tok_s",
        True,
        4000,
        np.random.default_rng(1),
    )
    # the rounds agree exactly, so the blocks' noise sets the variance; its degrees of freedom stay the rounds'
    # (a spread that came out below the floor by chance must not buy the blocks' 36: benchmarks/precision_coverage)
    assert pe is not None and not pe.spread_dominates and pe.df == 1
    # D = ((spec0 - base0) + (spec1 - base1)) / 2: variance 4 x 0.01^2 / 2^2 = 0.01^2 in log
    assert pe.log_se == pytest.approx(0.01, rel=0.1)


def test_cells_of_different_level_jobs_do_not_pair() -> None:
    order = block_order(["base", "spec"], 2)
    base, spec = boot({0: 100.0, 1: 100.0}), boot({0: 150.0, 1: 150.0})
    rng = np.random.default_rng(0)
    assert (
        paired_estimate(
            cell("base", "a", order), cell("spec", "b", order), base, spec, "aggregate_tok_s", True, 10, rng
        )
        is None
    )
    missing = boot({0: 150.0})  # a block without its figure: no paired estimate, the unpaired one stands
    assert (
        paired_estimate(
            cell("base", "a", order), cell("spec", "a", order), base, missing, "aggregate_tok_s", True, 10, rng
        )
        is None
    )


def test_lower_is_better_metrics_are_oriented() -> None:
    order = block_order(["base", "spec"], 2)
    base, spec = boot({0: 0.02, 1: 0.02}), boot({0: 0.01, 1: 0.01})  # TPOT halves
    pe = paired_estimate(
        cell("base", "p", order),
        cell("spec", "p", order),
        base,
        spec,
        "aggregate_tok_s",
        False,
        10,
        np.random.default_rng(0),
    )
    assert pe is not None and pe.speedup == pytest.approx(2.0)


def drift_summary(first: float | None, last: float, mode: str = "interleaved") -> dict[str, Any]:
    return {
        "pairing": {"mode": mode},
        "repeats": [
            {"repeat": 0, "metrics": {"output_tok_s_steady": first}},
            {"repeat": 1, "metrics": {"output_tok_s_steady": last}},
        ],
    }


def test_drift_gate_judges_or_says_why_not() -> None:
    gates = {"max_block_drift": 0.2}
    reason, flag = block_drift_gate(drift_summary(100.0, 70.0), gates)
    # a flag, never a reason: the level's rounds are kept, the change in their spread (no attempt thrown away)
    assert reason is None and flag is not None and flag.startswith("drift: steady throughput -30%")
    assert "rounds are kept" in flag
    assert block_drift_gate(drift_summary(100.0, 90.0), gates) == (None, None)
    reason, flag = block_drift_gate(drift_summary(None, 90.0), gates)
    assert reason is None and flag is not None and "not judged" in flag
    assert block_drift_gate(drift_summary(100.0, 50.0, "sequential"), gates) == (None, None)
    # an interleaved level's reasons name their arm; a busy machine is the host's doing, measured again
    assert transient_only(["[eagle3] repeat 1: machine busy: ...", "[baseline] repeat 1: machine busy: ..."])
    assert not transient_only(["[eagle3] repeat 0: 2 of 8 requests failed"]) and not transient_only([])


def test_drift_is_the_trend_over_the_level_not_its_two_end_blocks() -> None:
    """Over many rounds the gate fits the arm's log throughput against the round: a last block 40% above a
    first one in a level that otherwise held its speed is one block's regime (the rounds' spread carries it),
    while a level that slid 40% from start to end drifted, whichever its end blocks."""
    gates = {"max_block_drift": 0.35}

    def level(tok_s: list[float]) -> dict[str, Any]:
        reps = [{"repeat": r, "metrics": {"output_tok_s_steady": v}} for r, v in enumerate(tok_s)]
        return {"pairing": {"mode": "interleaved"}, "repeats": reps}

    flat_ends_apart = [100.0, 110.0, 95.0, 105.0, 98.0, 102.0, 107.0, 93.0, 101.0, 140.0]
    assert block_drift(level(flat_ends_apart)) == pytest.approx(0.14, abs=0.02)
    assert block_drift_gate(level(flat_ends_apart), gates) == (None, None)
    slid = [100.0 * 1.06**r for r in range(10)]
    slid[-1] = 118.0  # its last block alone no further than the first's spread
    reason, flag = block_drift_gate(level(slid), gates)
    assert reason is None and flag is not None and "over the level" in flag
    assert block_drift(level([100.0, 140.0])) == pytest.approx(0.40)  # two blocks: the last over the first


def test_drift_is_judged_on_one_server_instance() -> None:
    """With two instances (rounds on 1, 2, 2, 1) the arm's first and last blocks on instance 1 are compared: the
    slower instance 2 is an instance effect (the paired interval's business), not drift."""
    gates = {"max_block_drift": 0.2}
    on = round_instances(4, 2)
    summary = {
        "pairing": {"mode": "interleaved", "blocks": [{"arm": "a", "repeat": r, "instance": on[r]} for r in range(4)]},
        "repeats": [{"repeat": r, "metrics": {"output_tok_s_steady": 100.0 if on[r] == 1 else 60.0}} for r in range(4)],
    }
    assert block_drift_gate(summary, gates) == (None, None)
    summary["repeats"][3]["metrics"]["output_tok_s_steady"] = 70.0  # instance 1 itself slowed
    _, flag = block_drift_gate(summary, gates)
    assert flag is not None and "-30%" in flag
    two = {**summary, "repeats": summary["repeats"][:2]}  # one block per instance: nothing to judge drift by
    reason, flag = block_drift_gate(two, gates)
    assert reason is None and flag is not None and "no two blocks on one server instance" in flag


BASE_CONFIG: dict[str, Any] = {
    "experiment": "x",
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {"sim": {"engine": "sim"}},
}


def test_aa_arm_repeats_its_twin_on_an_instance_of_its_own() -> None:
    cfg = validate({**BASE_CONFIG, "arms": {**BASE_CONFIG["arms"], "baseline-aa": {"same_as": "baseline"}}})
    assert aa_arms(cfg) == {"baseline-aa": "baseline"}
    aa = cfg["arms"]["baseline-aa"]
    assert aa["speculative"] is False and aa["env_vars"] == {AA_INSTANCE_ENV: "baseline-aa"}
    assert speculative_arms(cfg) == ["eagle3"] and "baseline-aa" in fixed_arms(cfg)
    assert validate(cfg)["arms"] == cfg["arms"]  # idempotent
    spec_aa = validate({**BASE_CONFIG, "arms": {**BASE_CONFIG["arms"], "eagle3-aa": {"same_as": "eagle3"}}})
    assert "eagle3-aa" not in speculative_arms(spec_aa) and spec_aa["arms"]["eagle3-aa"]["speculative"]
    assert "eagle3-aa-policy" not in spec_aa["arms"]  # an A/A arm has no family and no policy arm
    with pytest.raises(ConfigError, match="arms/x/same_as.*'nope' is not defined"):
        validate({**BASE_CONFIG, "arms": {**BASE_CONFIG["arms"], "x": {"same_as": "nope"}}})


def test_pairing_mode_auto() -> None:
    cfg = validate(BASE_CONFIG)
    assert pairing_mode(cfg, "sim") == "interleaved"
    gpu = validate({**BASE_CONFIG, "variants": {"g": {"engine": "sim", "gpus": "0-7"}}})
    assert pairing_mode(gpu, "g") == "sequential"  # one server holds the GPUs
    forced = validate({**BASE_CONFIG, "pairing": {"mode": "sequential"}})
    assert pairing_mode(forced, "sim") == "sequential"
    open_loop = {"load": {"mode": "open"}, "policy": {"measure": False}, "analysis": {"primary_metric": "tpot_p50_s"}}
    opened = validate({**BASE_CONFIG, **open_loop})
    assert pairing_mode(opened, "sim") == "sequential"  # auto: open levels are measured one arm at a time
    with pytest.raises(ConfigError, match="pairing/mode.*load.mode is open"):
        validate({**BASE_CONFIG, **open_loop, "pairing": {"mode": "interleaved"}})


def test_the_policy_is_paired_with_the_best_fixed_arm() -> None:
    served = {"schedule": [[1, 16, 3], [17, 1024, 0]], "best_fixed": {"4": "eagle3-k3", "30": "baseline"}}
    assert policy_reference(served, 4) == "eagle3-k3"
    assert policy_reference(served, 30.0) == "baseline"
    assert policy_reference(served, 8) is None  # no valid fixed cell there: the policy is measured alone


def test_a_policy_level_measured_until_its_proof_is_decided_shares_its_precision() -> None:
    served = {"schedule": [[1, 16, 3], [17, 1024, 0]], "best_fixed": {"4": "eagle3"}}
    plain = validate(BASE_CONFIG)
    specs = policy_level_specs(plain, "sim", "eagle3-policy", 4, served)
    assert list(specs) == ["eagle3", "eagle3-policy"]  # the reference first: interleave.run_level's order
    assert specs["eagle3-policy"] == cell_spec(plain, "sim", "eagle3-policy", 4, served)  # no key: identity kept
    assert "proof_margin" not in specs["eagle3"]["precision"]
    asked = validate({**BASE_CONFIG, "policy": {"max_rounds": 8}})
    specs = policy_level_specs(asked, "sim", "eagle3-policy", 4, served)
    assert specs["eagle3"]["precision"] == specs["eagle3-policy"]["precision"]  # check_specs asks one block
    assert specs["eagle3-policy"]["precision"]["max_rounds"] == 8
    assert specs["eagle3-policy"]["precision"]["proof_margin"] == 0.02
    assert cell_spec(asked, "sim", "eagle3", 4) == cell_spec(plain, "sim", "eagle3", 4)  # fixed cells: as before
    assert interleave.check_specs(specs)[0] == 4
    # it adds rounds, never grows its blocks: prompts are made for the rounds it may measure at their own size
    rounds = interleave.level_rounds(specs["eagle3-policy"], 1, rule=lambda progress: None)  # type: ignore[arg-type]
    assert (rounds.max_rounds, rounds.max_growth) == (8, 1)
    grid = interleave.level_rounds(cell_spec(asked, "sim", "eagle3", 4), 1, rule=lambda progress: None)  # type: ignore[arg-type]
    assert grid.max_growth > 1
    alone = policy_level_specs(asked, "sim", "eagle3-policy", 8, served)  # no valid fixed cell: no pair to decide
    assert list(alone) == ["eagle3-policy"] and alone["eagle3-policy"] == cell_spec(
        plain, "sim", "eagle3-policy", 8, served
    )
    with pytest.raises(ConfigError, match="policy/max_rounds.*set precision.target"):
        validate({**BASE_CONFIG, "policy": {"max_rounds": 8}, "precision": {"target": None}})


def test_a_policy_reference_goes_beside_the_policy_cell(tmp_path: Path) -> None:
    dirs = out_dirs({"eagle3": {}, "eagle3-policy": {}}, tmp_path, "c4", "eagle3-policy")
    assert dirs == {
        "eagle3": tmp_path / "eagle3-policy" / "c4" / "reference",
        "eagle3-policy": tmp_path / "eagle3-policy" / "c4",
    }


def _canned_rows(table: dict[str, dict[float, tuple[float, float, float]]]) -> Any:
    """An `analyze_arm` stand-in: per (reference, arm), per level, (ratio, lo, hi)."""

    def fake(cells: Any, ref: str, arm: str, settings: Any, cache: Any = None) -> dict[str, Any]:
        rows = [
            {"concurrency": c, "speedup": r, "speedup_lo": lo, "speedup_hi": hi, "used": True}
            for c, (r, lo, hi) in sorted(table[arm].items())
        ]
        return {"per_level": rows, "verdict": {"kind": "wins_everywhere", "notes": []}, "source": "real"}

    return fake


def test_the_aa_band_is_each_levels_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """One level's wide A/A interval (two instances that disagree: a t with one degree of freedom) widens that
    level's indifference zone only. The figures are a vLLM CPU A/A run's (ratio, 95% interval); with one band for
    all levels every ngram level read "within the noise", C=1 and 4 included."""
    from specsweep.analysis import analyze as an

    table = {
        "baseline-aa": {
            1: (1.26, 0.936, 1.66),
            4: (1.0, 0.688, 1.49),
            16: (1.12, 0.144, 7.52),
            64: (1.12, 0.879, 1.36),
        },
        "ngram": {1: (1.82, 1.29, 2.56), 4: (1.72, 1.22, 2.2), 16: (1.66, 0.0862, 22), 64: (1.32, 1.0, 1.7)},
    }
    monkeypatch.setattr(an, "analyze_arm", _canned_rows(table))
    settings = an.AnalysisSettings()
    out = an.analyze_variant({}, "baseline", ["ngram"], settings, aa_arms={"baseline-aa": "baseline"})
    bands = {b["concurrency"]: (b["lo"], b["hi"]) for b in out["noise_floor"]["bands"]}
    assert bands[16] == pytest.approx((1 / 7.52, 7.52), rel=1e-6)
    assert bands[1] == pytest.approx((1 / 1.66, 1.66), rel=1e-6)  # the farther end from 1, both ways
    assert out["noise_floor"]["band"]["hi"] == pytest.approx(7.52)  # the widest: the set-up's worst level
    within = {r["concurrency"]: r["within_noise"] for r in out["arms"]["ngram"]["per_level"]}
    assert within == {1: False, 4: False, 16: True, 64: True}  # 1.32 at C=64 inside [0.735, 1.36]
    assert settings.noise_band_at(16) == pytest.approx((1 / 7.52, 7.52)) and settings.noise_band_at(2) is None
    notes = out["arms"]["ngram"]["verdict"]["notes"]
    assert any(n.startswith("C=16 [0.133, 7.52], 64 [0.735, 1.36]: within the noise") for n in notes), notes


def test_a_level_without_an_aa_comparison_has_no_band(monkeypatch: pytest.MonkeyPatch) -> None:
    """No other level's band stands in for a level the A/A did not judge: the note says its noise is not known."""
    from specsweep.analysis import analyze as an

    table = {"baseline-aa": {1: (1.0, 0.9, 1.1)}, "ngram": {1: (1.05, 0.95, 1.2), 4: (1.05, 0.97, 1.15)}}
    monkeypatch.setattr(an, "analyze_arm", _canned_rows(table))
    out = an.analyze_variant({}, "baseline", ["ngram"], an.AnalysisSettings(), aa_arms={"baseline-aa": "baseline"})
    within = {r["concurrency"]: r["within_noise"] for r in out["arms"]["ngram"]["per_level"]}
    assert within == {1: True, 4: None}
    assert any(n.startswith("C=4: no A/A band") for n in out["arms"]["ngram"]["verdict"]["notes"])


@dataclass
class _Request:
    url: str = ""


@dataclass
class _Set:
    """A prompt set that knows its round: what a block sent is read back from its repeat's `prompts`."""

    round: int
    n: int = 10**6

    def head(self, n: int) -> _Set:
        return _Set(self.round, min(self.n, n))


def test_a_round_measured_again_replaces_that_round_and_keeps_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transient cause in one round of an interleaved level costs that round: measured again, every arm's block
    of it in the round's own order, on its prompt set and block size; the other rounds' blocks are the earlier
    attempt's, and the level still has one block per arm and round."""
    calls: list[tuple[str, int, int]] = []

    async def block(req: _Request, concurrency: int, n: int, prompts: LevelPrompts, *a: Any, **kw: Any) -> Any:
        calls.append((req.url, prompts.repeats[0].round, n))
        rep = RepeatResult(0, [], time.monotonic(), time.time(), [], "reset", client={"wall_s": 0.0})
        rep.prompts = prompts.repeats[0]
        return LevelResult(concurrency, n, [rep])

    async def no_referral(*a: Any) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(interleave, "measure_level", block)
    monkeypatch.setattr(interleave, "refer_level", no_referral)
    monkeypatch.setattr(interleave, "watched_gpus", lambda variant: None)
    monkeypatch.setattr(interleave.servers, "freeze", lambda rec: None)
    monkeypatch.setattr(interleave.servers, "thaw", lambda rec: None)
    spec = {
        "workload": {"stagger": False, "warmup_requests": 0, "output_tokens": 16, "requests": {}},
        "client": {"idle_probe_s": 0.0},
        "variant": {},
    }
    cells = {arm: SimpleNamespace(spec=spec, plan=SimpleNamespace(watched=None), engine=None) for arm in ("a", "b")}
    recs = {arm: SimpleNamespace(base_url=f"http://{arm}", server_pid=0) for arm in cells}
    prompts = LevelPrompts(_Set(-1), [_Set(r) for r in range(4)], True)
    inputs = {arm: LevelInputs(_Request(), prompts, 5) for arm in cells}

    async def level_inputs(*a: Any) -> tuple[dict[str, LevelInputs], dict[str, Any]]:
        return inputs, {arm: {} for arm in cells}

    monkeypatch.setattr(interleave, "_inputs_and_infos", level_inputs)
    rounds = Rounds(4, 4, target=0.05)
    first = asyncio.run(interleave._measure_blocks(cells, recs, rounds, 1, 2, {}))  # type: ignore[arg-type]
    assert len(calls) == 8 and [b["repeat"] for b in first.blocks] == [0, 0, 1, 1, 2, 2, 3, 3]
    calls.clear()
    again = asyncio.run(interleave._measure_blocks(cells, recs, rounds, 1, 2, {}, (first, (1,))))  # type: ignore[arg-type]
    assert calls == [("http://b", 1, 5), ("http://a", 1, 5)]  # round 1's order (B A), set and size
    for arm in cells:
        before, after = first.results[arm].repeats, again.results[arm].repeats
        assert [r.repeat for r in after] == [0, 1, 2, 3]
        assert [after[i] is before[i] for i in range(4)] == [True, False, True, True]
        assert after[1].prompts.round == 1
    assert sorted(b["repeat"] for b in again.blocks) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [b["repeat"] for b in again.blocks[-2:]] == [1, 1]  # measured last
    assert again.sizes == first.sizes and len(again.round_s) == 4
    # the rule's decisions, one per round, the last why the level stopped: the attempts log names the rounds
    assert again.decisions == first.decisions and first.decisions[-1] == "budget spent: max_rounds 4"
    assert again.precision is not None and again.precision["rounds"] == 4
