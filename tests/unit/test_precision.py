"""The stopping rule's decisions (analysis/precision.py) on rounds whose variance is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specsweep.analysis.paired import Rounds, paired_rounds
from specsweep.analysis.precision import (
    BUDGET_SPENT,
    VERDICT_DECIDED,
    PrecisionSettings,
    RoundCost,
    block_growth,
    components,
    next_step,
    precision_notes,
    proof_decided,
    verdict_decided,
)
from specsweep.measure.interleave import judged_after


def settings(**kw: object) -> PrecisionSettings:
    base = {"target": 0.05, "min_rounds": 3, "max_rounds": 8, "max_level_s": None, "max_block_growth": 4}
    return PrecisionSettings.from_config({**base, **kw})


def rounds(d: list[float], within: float, instance: tuple[int, ...] | None = None) -> Rounds:
    return Rounds(np.array(d), np.full(len(d), within), 18 * len(d), instance or (1,) * len(d))


def cost(n: int, requests: int = 8, overhead_s: float = 0.7, per_request_s: float = 0.1) -> RoundCost:
    return RoundCost([2 * (overhead_s + per_request_s * requests)] * n, [requests] * n, 2 * overhead_s)


def estimate(r: Rounds):  # noqa: ANN201
    pe = paired_rounds(r, 2, np.random.default_rng(0))
    assert pe is not None
    return pe


def test_levels_are_judged_after_complete_cycles_and_at_their_budget() -> None:
    # min_rounds 3, max_rounds 9: the first look after the cycle that completes round 4, none mid-cycle, the last
    # at the budget even where it ends a cycle half-way
    assert [n for n in range(1, 10) if judged_after(n, 3, 9)] == [4, 6, 8, 9]
    assert [n for n in range(1, 7) if judged_after(n, 4, 6)] == [4, 6]
    assert judged_after(3, 3, 3)  # min_rounds = max_rounds: the budget is the one look


def test_no_stop_before_min_rounds_even_when_narrow() -> None:
    r = rounds([0.5, 0.5001], 1e-8)
    assert not next_step(estimate(r), settings(), cost(2), 1, 4).stop


def test_stops_when_the_interval_is_within_the_target() -> None:
    r = rounds([0.50, 0.51, 0.49], 1e-6)
    nxt = next_step(estimate(r), settings(), cost(3), 1, 4)
    assert nxt.stop and nxt.reason.startswith("target met")


def test_a_wide_level_goes_on_then_spends_its_rounds() -> None:
    r = rounds([0.3, 0.6, 0.45], 1e-4)
    assert not next_step(estimate(r), settings(), cost(3), 1, 4).stop
    wide = rounds([0.3, 0.6, 0.45, 0.3, 0.6, 0.45, 0.3, 0.6], 1e-4)
    nxt = next_step(estimate(wide), settings(), cost(8), 1, 4)
    assert nxt.stop and nxt.reason.startswith(BUDGET_SPENT) and "max_rounds" in nxt.reason


def test_no_cycle_starts_that_would_end_past_the_seconds_budget() -> None:
    r = rounds([0.3, 0.6, 0.45, 0.5], 1e-4)
    spent = cost(4)  # 4 rounds of 3 s each: the next cycle's two would end at 18 s
    nxt = next_step(estimate(r), settings(max_level_s=17.0), spent, 1, 4)
    assert nxt.stop and "max_level_s" in nxt.reason
    assert not next_step(estimate(r), settings(max_level_s=19.0), spent, 1, 4).stop
    # one round left before max_rounds: only that one has to fit
    assert not next_step(estimate(r), settings(max_level_s=16.0, max_rounds=5), spent, 1, 4).stop


def test_without_a_target_the_level_measures_its_min_rounds() -> None:
    r = rounds([0.3, 0.6, 0.45], 1e-4)
    assert next_step(estimate(r), settings(target=None), cost(3), 1, 4).stop


def test_blocks_grow_where_their_own_noise_dominates_and_not_where_the_host_does() -> None:
    content = rounds([0.40, 0.55, 0.47], 0.01)  # spread ~ the blocks' noise: the prompts drawn
    comp = components(content)
    assert comp is not None and comp.within > comp.between_round
    assert block_growth(comp, cost(3), 1, 4) > 1
    host = rounds([0.30, 0.60, 0.45], 1e-5)  # the blocks agree with themselves; the rounds do not
    comp = components(host)
    assert comp is not None and comp.between_round > 100 * comp.within
    assert block_growth(comp, cost(3), 1, 4) == 1
    # never past the level's cap (workload.requests.max), never smaller than now
    assert block_growth(components(content), cost(3), 2, 2) == 2


def test_components_split_the_rounds_variance() -> None:
    rng = np.random.default_rng(3)
    between, within = 0.004, 0.001
    d = rng.normal(0, math.sqrt(between + within), size=4000)
    comp = components(rounds(list(d), within))
    assert comp is not None
    assert comp.within == pytest.approx(within)
    assert comp.between_round == pytest.approx(between, rel=0.1)
    assert comp.between_instance is None
    on = tuple(1 + (i % 2) for i in range(4000))
    offset = np.where(np.array(on) == 1, 0.05, -0.05)
    comp = components(rounds(list(d + offset), within, on))
    assert comp is not None and comp.between_instance == pytest.approx(0.005, rel=0.2)


def test_a_round_without_its_blocks_noise_leaves_the_others_theirs() -> None:
    """A block whose bootstrap cannot be put on the log scale (a resample of only empty time blocks in a short,
    bursty window: CI's tiny C=4 blocks with 4,000 replicates) has no noise figure; the level's blocks' noise is
    the other rounds' mean, and with no round's it is unknown (None), never a stand-in."""
    r = Rounds(np.array([0.30, 0.50, 0.40, 0.35]), np.array([0.002, np.nan, 0.004, 0.003]), 54, (1, 1, 1, 1))
    comp = components(r)
    assert comp is not None and comp.within == pytest.approx(0.003)
    assert components(Rounds(np.array([0.3, 0.5]), np.array([np.nan, np.nan]), 0, (1, 1))) is None


def test_the_reference_arms_own_spread_is_split_from_its_noise() -> None:
    """The baseline serves the same work every round: its log values' spread beyond its blocks' noise is time
    (the host, the engine), estimated within server instances (an instance's own speed is not time)."""
    rng = np.random.default_rng(5)
    time_var, noise = 0.006, 0.001
    ref = rng.normal(9.0, math.sqrt(time_var + noise), size=4000)
    d = rng.normal(0.3, 0.05, size=4000)
    r = Rounds(d, np.full(d.size, 2 * noise), 36 * d.size, (1,) * d.size, ref, np.full(d.size, noise))
    comp = components(r)
    assert comp is not None and comp.reference_between == pytest.approx(time_var, rel=0.1)
    on = tuple(1 + (i % 2) for i in range(4000))
    shifted = ref + np.where(np.array(on) == 1, 0.2, -0.2)  # two instances 40% apart: not time
    r = Rounds(d, np.full(d.size, 2 * noise), 36 * d.size, on, shifted, np.full(d.size, noise))
    comp = components(r)
    assert comp is not None and comp.reference_between == pytest.approx(time_var, rel=0.1)
    assert components(rounds([0.3, 0.5, 0.4], 1e-4)).reference_between is None  # not known: None, not 0


def test_notes_never_show_a_short_level_as_met() -> None:
    def row(c: float, hw: float, met: bool, spent: bool) -> dict:
        p = {"target": 0.05, "half_width": hw, "met": met, "budget_spent": spent, "rounds": 3}
        return {"concurrency": c, "precision": {**p, "rounds_for_target": 9 if not met else None}}

    notes = precision_notes([row(1, 0.03, True, False), row(4, 0.08, False, True)], "C")
    assert len(notes) == 1 and "C=4 short of the target +-5% (95%); the widest C=4: +-8.0% after 3 rounds" in notes[0]
    assert "(its budget spent)" in notes[0]
    assert "9 rounds" in notes[0] and "varied" not in notes[0]  # the components unknown: nothing said of them
    short = row(4, 0.08, False, True)
    short["precision"].update(within_round_var=0.05**2, between_round_var=0.12**2, reference_between_round_var=0.1**2)
    (note,) = precision_notes([short], "C")
    assert "the rounds' ratio varied 12% (SD), the baseline alone 10% (the same work" in note, note
    short["precision"].update(within_round_var=0.15**2)  # the blocks' noise dominates: the prompts, not time
    (note,) = precision_notes([short], "C")
    assert "mostly within their blocks" in note and "the baseline alone 10%" in note, note
    assert precision_notes([row(1, 0.03, True, False)], "C") == ["precision: every level within its target (+-5%, 95%)"]
    assert (
        precision_notes(
            [{"concurrency": 1, "precision": {**row(1, 0.03, True, False)["precision"], "target": None}}], "C"
        )
        == []
    )


def test_short_levels_collapse_to_one_line_with_the_widest() -> None:
    """Seven levels short of the target read as one line per arm: the levels, and the widest figure (before: one
    long line per level, ~7 per variant)."""

    def row(c: float, hw: float | None, spent: bool = True) -> dict:
        p = {"target": 0.05, "half_width": hw, "met": False, "budget_spent": spent, "rounds": 3}
        return {"concurrency": c, "precision": {**p, "rounds_for_target": 9}}

    widths = {1: 0.079, 2: 0.052, 5: 0.085, 10: 0.174, 30: 0.06, 70: 0.065, 100: 0.051}
    rows = [row(c, hw, spent=c != 2) for c, hw in widths.items()] + [
        {
            "concurrency": 250,
            "precision": {
                "target": 0.05,
                "half_width": 0.04,
                "met": True,
                "budget_spent": False,
                "rounds": 3,
                "rounds_for_target": None,
            },
        }
    ]
    (note,) = precision_notes(rows, "C")
    assert note.startswith("precision: C=1, 2, 5, 10, 30, 70, 100 short of the target +-5% (95%); the widest C=10: ")
    assert "+-17.4% after 3 rounds (its budget spent); its variance implies 9 rounds" in note
    assert note.endswith("the rule's own estimate stopped C=2") and "250" not in note
    # a level without any interval is the widest of all
    (note,) = precision_notes([row(1, 0.3), row(4, None)], "C")
    assert "the widest C=4: no interval" in note


def test_rounds_that_agree_by_chance_do_not_stop_a_level_whose_blocks_are_noisy() -> None:
    """The interval rests on the rounds' spread; the stop also asks the blocks' own noise, which a lucky spread
    does not move (benchmarks/precision_coverage.py: stops on the spread alone under-covered)."""
    lucky = rounds([0.500, 0.501, 0.499], 0.01)  # blocks +-10% each, rounds within 0.1%
    pe = estimate(lucky)
    assert pe.half_width() < 0.01  # the interval itself is narrow
    assert not next_step(pe, settings(), cost(3), 1, 4).stop


def test_rounds_for_target_is_the_fewest_that_reach_it() -> None:
    from specsweep.analysis.precision import rounds_for

    pe = estimate(rounds([0.3, 0.6, 0.45], 1e-6))  # s = 0.15 per round
    n = rounds_for(pe, 0.05)
    assert n is not None

    def hw(k: int) -> float:
        from scipy import stats

        return float(stats.t.ppf(0.975, k - 1)) * 0.15 / math.sqrt(k)

    assert hw(n) <= math.log1p(0.05) < hw(n - 1)


def test_under_a_seconds_budget_the_block_size_is_the_one_whose_rounds_that_fit_give_the_narrowest_interval() -> None:
    """Content-dominated rounds (m* says grow 4x) of 40 s each, three spent: with 120 s left a 4x round (145 s)
    does not fit and a 2x one leaves one round, where three more of the same size give the narrower interval; with
    a budget that holds several grown rounds, the blocks grow."""
    content = rounds([0.40, 0.55, 0.47], 0.01)
    spent = RoundCost([40.0] * 3, [512] * 3, 5.0)
    assert block_growth(components(content), spent, 1, 4) > 1
    tight = next_step(estimate(content), settings(max_rounds=10, max_level_s=240.0), spent, 1, 4)
    assert not tight.stop and tight.growth == 1
    roomy = next_step(estimate(content), settings(max_rounds=10, max_level_s=2000.0), spent, 1, 4)
    assert not roomy.stop and roomy.growth > 1


def test_a_level_far_from_one_stops_when_its_verdict_is_known_short_of_its_target() -> None:
    # the default run's C=250: ~0.72, its rounds spread +-12% (95%), wider than +-5% but wholly below 1 - 2%
    st = settings(decide_margin=0.02)
    pe = estimate(rounds([-0.25, -0.40, -0.30, -0.38], 4e-4))
    decided = verdict_decided({"eagle3": pe}, st.decide_margin, st.confidence, st.looks)
    assert decided is not None and "below 1 - 2%" in decided and "95% over 3 looks" in decided, decided
    nxt = next_step(pe, st, cost(4), 1, 4, decided)
    assert nxt.stop and nxt.reason.startswith(VERDICT_DECIDED), nxt


def test_a_level_near_one_or_off_or_with_an_undecided_k_choice_goes_on() -> None:
    st = settings(decide_margin=0.02)
    near = estimate(rounds([0.02, 0.05, -0.01, 0.04], 4e-4))  # ~1.025, reaching below 1 + 2%
    assert verdict_decided({"eagle3": near}, st.decide_margin, st.confidence, st.looks) is None
    far = estimate(rounds([0.30, 0.36, 0.33, 0.34], 4e-4))
    assert verdict_decided({"eagle3": far}, None, st.confidence, st.looks) is None  # the stop off
    # two K arms both winning, their intervals overlapping: the K choice is not known yet
    k2 = estimate(rounds([0.31, 0.35, 0.32, 0.35], 4e-4))
    assert verdict_decided({"k3": far, "k2": k2}, st.decide_margin, st.confidence, st.looks) is None
    k1 = estimate(rounds([0.10, 0.11, 0.10, 0.11], 1e-5))
    assert verdict_decided({"k3": far, "k1": k1}, st.decide_margin, st.confidence, st.looks) is not None
    # the stop spends 5% over the looks, at most four of them (98.75% intervals), however many max_rounds allows
    assert settings(decide_margin=0.02, max_rounds=40).looks == 4  # at most VERDICT_LOOKS


def test_a_policy_level_measures_until_its_proof_is_decided_not_until_its_width_is_met() -> None:
    # an A/A pair (the policy serving the fixed arm's own K): +-1.4% after four rounds, well within the +-5%
    # target, but its interval reaches below 1 - 2%: the proof is not decided, so the level goes on
    st = settings(min_rounds=4, max_rounds=8, proof_margin=0.02)
    assert st.looks == 3  # rounds 4, 6, 8: 98.3% intervals
    straddles = estimate(rounds([-0.008, 0.002, -0.024, 0.0], 4e-6))
    assert proof_decided({"policy": straddles}, 0.02, st.confidence, st.looks) is None
    nxt = next_step(straddles, st, cost(4), 1, 4)
    assert not nxt.stop and nxt.reason.startswith("proof not decided") and nxt.growth == 1, nxt
    # the same level without the proof stop: its width alone stops it at four rounds, undecided
    assert next_step(straddles, settings(min_rounds=4, max_rounds=8), cost(4), 1, 4).reason.startswith("target met")
    holds = estimate(rounds([-0.002, 0.003, -0.004, 0.001, 0.0, -0.001], 4e-6))
    decided = proof_decided({"policy": holds}, 0.02, st.confidence, st.looks)
    assert decided is not None and "above 1 - 2%" in decided and "95% over 3 looks" in decided, decided
    nxt = next_step(holds, st, cost(6), 1, 4, decided)
    assert nxt.stop and nxt.reason.startswith(VERDICT_DECIDED), nxt
    fails = estimate(rounds([-0.08, -0.07, -0.09, -0.08], 4e-6))  # ~0.92: wholly below 0.98
    assert "below 1 - 2%" in (proof_decided({"policy": fails}, 0.02, st.confidence, st.looks) or "")
    # undecided at the budget: the level says so
    spent = next_step(straddles, st, cost(8), 1, 4)
    assert spent.stop and spent.reason.startswith(BUDGET_SPENT), spent


def test_decided_levels_are_named_apart_from_short_ones() -> None:
    def p(hw: float, met: bool, decided: bool) -> dict:
        return {"target": 0.05, "half_width": hw, "met": met, "budget_spent": False, "decided": decided, "rounds": 4}

    notes = precision_notes(
        [
            {"concurrency": 1, "precision": p(0.03, True, False)},
            {"concurrency": 250, "precision": p(0.07, False, True)},
        ],
        "C",
    )
    assert notes == [
        "precision: C=1 within the target (+-5%, 95%); C=250 stopped short of it with their verdict known "
        "(outside 1 +- the decide margin)"
    ]  # never "every level within its target" where the table's +- says one is not
    only = precision_notes([{"concurrency": 250, "precision": p(0.07, False, True)}], "C")
    assert only == [
        "precision: no level within the target (+-5%, 95%); C=250 stopped short of it with their verdict known "
        "(outside 1 +- the decide margin)"
    ]
