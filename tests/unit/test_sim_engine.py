"""The engine core: step-time formula, batching cap and queue, chunked prefill, speculative schedule."""

from __future__ import annotations

import math

import pytest

from specsweep.sim.engine import Engine, step_time
from specsweep.sim.profile import load_profile

pytestmark = pytest.mark.unit


def _run(engine: Engine) -> list[tuple[int, int, int]]:
    """Drive to completion in virtual time; return (step, rid, tokens) for every emission."""
    out, now, k = [], 0.0, 0
    while engine.has_work:
        res = engine.step(now)
        now += res.duration
        out += [(k, r.rid, n) for r, n in res.emissions]
        k += 1
    return out


def test_step_time_formula_demo():
    p = load_profile("demo")
    c = p.step
    ar = p.model.layers * p.model.allreduces_per_layer * c.allreduce_s
    base = step_time(p, False, n_seqs=10, decode_tokens=10, prefill_tokens=100, n_decode=10, context_tokens=0)
    assert base == pytest.approx(c.fixed_s + 10 * c.per_seq_s + 10 * c.per_token_s + 100 * c.prefill_token_s + ar)
    s = p.speculative
    spec = step_time(p, True, n_seqs=10, decode_tokens=40, prefill_tokens=0, n_decode=10)
    draft = s.draft_tokens * (s.draft_step_s + s.draft_per_seq_s * 10)
    assert spec == pytest.approx(c.fixed_s + 10 * c.per_seq_s + 40 * c.per_token_s + ar + draft)
    assert step_time(p, True, 0, 0, 0, 0) == 0.0


def test_step_time_tp1_has_no_allreduce_and_experts_saturate():
    p = load_profile("demo").with_params({"model.tensor_parallel": 1})
    assert step_time(p, False, 1, 1, 0, 1) == pytest.approx(p.step.fixed_s + p.step.per_seq_s + p.step.per_token_s)
    k = load_profile("kimi-k25-cu130-fusion")
    e = k.step.expert_read_s
    one = step_time(k, False, 1, 1, 0, 1) - step_time(k.with_params({"step.expert_read_s": 0.0}), False, 1, 1, 0, 1)
    assert one == pytest.approx(e * 8 / 384)
    many = step_time(k, False, 100, 5000, 0, 100) - step_time(
        k.with_params({"step.expert_read_s": 0.0}), False, 100, 5000, 0, 100
    )
    assert many == pytest.approx(e, rel=1e-6)


def test_running_cap_and_fifo_queue():
    p = load_profile("demo")
    eng = Engine(p, speculative=False, max_running_requests=3)
    reqs = [eng.new_request(4, 5) for _ in range(7)]
    res = eng.step(0.0)
    assert len(eng.running) == 3 and len(eng.waiting) == 4
    assert {r.rid for r, _ in res.emissions} == {0, 1, 2}
    emissions = _run(eng)
    assert all(r.generated == 5 for r in reqs)
    # FIFO: request 3 starts only after one of the first three finished
    first_step = {rid: min(s for s, r, _ in emissions if r == rid) for rid in range(7)}
    assert first_step[3] > first_step[0]


def test_prefill_chunking_spreads_a_long_prompt_over_steps():
    p = load_profile("demo").with_params({"batching.prefill_chunk_tokens": 100})
    eng = Engine(p, speculative=False)
    req = eng.new_request(350, 3)
    steps = 0
    while req.generated == 0:
        eng.step(0.0)
        steps += 1
    assert steps == 4 and req.prefilled == 350


def test_baseline_emits_one_token_per_chunk_and_exact_length():
    eng = Engine(load_profile("demo"), speculative=False)
    reqs = [eng.new_request(16, 33) for _ in range(4)]
    em = _run(eng)
    assert all(n == 1 for _, _, n in em)
    assert [r.generated for r in reqs] == [33] * 4


def test_speculative_chunks_and_determinism_by_seed():
    p = load_profile("demo")
    k = p.speculative.draft_tokens

    def schedule(seed: int) -> list[tuple[int, int, int]]:
        eng = Engine(p, speculative=True, seed=seed)
        for _ in range(6):
            eng.new_request(32, 200)
        return _run(eng)

    a, b, c = schedule(1), schedule(1), schedule(2)
    assert a == b
    assert a != c
    assert all(1 <= n <= k + 1 for _, _, n in a)
    assert any(n > 1 for _, _, n in a)
    per_req = {}
    for _, rid, n in a:
        per_req[rid] = per_req.get(rid, 0) + n
    assert set(per_req.values()) == {200}


def test_accept_length_matches_truncated_geometric():
    p = load_profile("demo")
    eng = Engine(p, speculative=True, seed=3)
    for _ in range(20):
        eng.new_request(8, 2000)
    _run(eng)
    assert eng.avg_accept_length() == pytest.approx(p.expected_accept_length(), rel=0.03)
    assert eng.accepted_draft_tokens / eng.verify_steps == pytest.approx(p.expected_accept_length() - 1, rel=0.05)


def test_abort_frees_the_slot():
    eng = Engine(load_profile("demo"), speculative=False, max_running_requests=1)
    a = eng.new_request(4, 100)
    b = eng.new_request(4, 3)
    eng.step(0.0)
    eng.abort(a)
    _run(eng)
    assert b.generated == 3 and not math.isnan(b.finished_at)
    assert a.generated < 100
