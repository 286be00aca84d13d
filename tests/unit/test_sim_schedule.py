"""A per-load speculation schedule in the simulated engine (vLLM's num_speculative_tokens_per_batch_size):
K switched per step by the number of running requests, K=0 turning drafting off, and what switching costs."""

from __future__ import annotations

import pytest

from specsweep.sim.engine import Engine, parse_schedule, scheduled_k, step_time
from specsweep.sim.profile import load_profile
from specsweep.virtual.predict import predict_sweep

pytestmark = pytest.mark.unit


def test_parse_schedule_names_the_bad_entry() -> None:
    assert parse_schedule("[[1, 15, 3], [16, 1024, 0]]") == [(1, 15, 3), (16, 1024, 0)]
    for bad, why in (
        ("[]", "non-empty"),
        ("[[1, 15]]", "[1, 15]"),
        ("[[0, 15, 3]]", "1 <= start"),
        ("[[1, 15, -1]]", "K >= 0"),
        ("[[1, 15, 3], [10, 20, 0]]", "overlaps"),
    ):
        with pytest.raises(ValueError, match=__import__("re").escape(why)):
            parse_schedule(bad)
    assert scheduled_k([(1, 15, 3), (16, 1024, 0)], 16, 3) == 0
    assert scheduled_k([(1, 15, 3)], 40, 2) == 2  # uncovered: the arm's own K


def _steps(engine: Engine, n: int, now: float = 0.0) -> list:
    out = []
    for _ in range(n):
        r = engine.step(now)
        now += r.duration
        out.append(r)
    return out


def test_drafting_off_costs_a_plain_step_and_on_a_speculative_one() -> None:
    p = load_profile("demo")
    off = Engine(p, True, schedule=[(1, 2, 3), (3, 1024, 0)])
    for _ in range(4):
        off.new_request(8, 50)
    steps = _steps(off, 6)
    decode = steps[-1]  # 4 running, K=0: a baseline step of 4 decoding sequences
    ctx = sum(r.prompt_tokens + r.generated - 1 for r in off.running)
    assert decode.duration == pytest.approx(step_time(p, False, 4, 4, 0, 4, ctx))
    assert all(n == 1 for _, n in decode.emissions) and off.verify_steps == 0
    on = Engine(p, True, schedule=[(1, 4, 3), (5, 1024, 0)])
    for _ in range(4):
        on.new_request(8, 50)
    _steps(on, 6)
    assert on.verify_steps > 0 and on.switches == 0


def test_resuming_drafting_pays_the_draft_models_catch_up() -> None:
    p = load_profile("demo")
    e = Engine(p, True, schedule=[(1, 2, 3), (3, 1024, 0)])
    short = [e.new_request(4, 6) for _ in range(2)]
    for _ in range(2):
        e.new_request(4, 60)
    now = 0.0
    while any(not r.done for r in short):  # 4 running: drafting off, the long requests' draft KV falls behind
        now += e.step(now).duration
    assert e.catchup_tokens == 0
    lag = sum(r.draft_lag for r in e.running)
    assert lag > 0
    res = e.step(now)  # 2 running: drafting resumes, first re-prefilling what the draft model missed
    assert e.switches == 1 and e.catchup_tokens == lag
    assert res.duration > step_time(p, True, 2, 2 * 4, 0, 2, sum(r.prompt_tokens + r.generated for r in e.running))


def test_predicted_schedule_takes_the_better_arm_away_from_its_threshold() -> None:
    p = load_profile("demo")
    fixed = predict_sweep(p, [5, 100], seed=1)
    sched = predict_sweep(p, [5, 100], seed=1, schedule=[(1, 20, 3), (21, 1024, 0)])
    # below the threshold the schedule is the speculative arm, far above it the baseline
    assert sched.speculative[0].aggregate_tok_s == pytest.approx(fixed.speculative[0].aggregate_tok_s, rel=0.02)
    assert sched.speculative[1].aggregate_tok_s == pytest.approx(fixed.baseline[1].aggregate_tok_s, rel=0.02)
    assert fixed.speculative[1].aggregate_tok_s < 0.95 * fixed.baseline[1].aggregate_tok_s
    near = predict_sweep(p, [21], seed=1, schedule=[(1, 20, 3), (21, 1024, 0)])
    assert near.speculative[0].switches > 10  # a level on the threshold oscillates, and the test shows it
