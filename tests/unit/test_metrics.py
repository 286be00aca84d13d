"""Each metric definition of docs/metrics.md, checked on hand-built records."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from specsweep.metrics import (
    accept_length_from_counters,
    itl,
    jsonable,
    per_request,
    repeat_metrics,
    steady_window,
    summarize,
)

pytestmark = pytest.mark.unit
NAN = float("nan")


def rec(
    send: float,
    chunks: list[float],
    toks: list[int],
    end: float,
    ok: bool = True,
    kind: str = "",
    expected: int = 4,
    svc: int = -1,
    repeat: int = 0,
    idx: int = 0,
) -> dict:
    out = sum(toks)
    return {
        "repeat": repeat,
        "request_index": idx,
        "prompt_index": idx,
        "send_s": send,
        "first_token_s": chunks[0] if chunks else NAN,
        "end_s": end,
        "chunk_s": chunks,
        "chunk_tokens": toks,
        "server_chunk_s": [],
        "input_tokens": 8,
        "output_tokens": out,
        "server_output_tokens": out if ok else -1,
        "expected_output_tokens": expected,
        "spec_verify_ct": svc,
        "ok": ok,
        "error_kind": kind,
        "error": "" if ok else f"{kind} happened",
    }


def cell(repeat: int = 0) -> pd.DataFrame:
    """C=2, four requests: two good (one 2-token chunk), one HTTP failure, one zero-output."""
    return pd.DataFrame(
        [
            rec(0.0, [0.1, 0.2, 0.4], [1, 2, 1], 0.45, svc=2, repeat=repeat, idx=0),
            rec(0.0, [0.2, 0.3, 0.5, 0.6], [1, 1, 1, 1], 0.6, svc=4, repeat=repeat, idx=1),
            rec(0.45, [], [], 0.5, ok=False, kind="http", repeat=repeat, idx=2),
            rec(0.5, [], [], 0.7, ok=False, kind="short_output", repeat=repeat, idx=3),
        ]
    )


LAG_OK = [0.001] * 100


def test_ttft_e2e_tpot_tok_s() -> None:
    pr = per_request(cell())
    assert pr["ttft"].tolist()[:2] == pytest.approx([0.1, 0.2])
    assert pr["e2e"].tolist()[:2] == pytest.approx([0.4, 0.6])  # last token chunk, not stream end
    assert pr["tpot"].tolist()[:2] == pytest.approx([0.3 / 3, 0.4 / 3])
    assert pr["tok_s"].tolist()[:2] == pytest.approx([10.0, 4 / 0.6])
    assert math.isnan(pr["ttft"][2]) and math.isnan(pr["tpot"][3])  # failed / zero-output: undefined


def test_tpot_undefined_for_one_token() -> None:
    pr = per_request(pd.DataFrame([rec(0.0, [0.3], [1], 0.3, expected=1)]))
    assert math.isnan(pr["tpot"][0])
    m = repeat_metrics(pd.DataFrame([rec(0.0, [0.3], [1], 0.3, expected=1)]), 1, lag_samples=LAG_OK)
    assert m["tpot_ms"]["n"] == 0 and m["tpot_ms"]["mean"] is None
    assert m["ttft_ms"]["p50"] == pytest.approx(300.0)


def test_itl_per_token_and_per_chunk() -> None:
    per_token, per_chunk = itl(cell().iloc[:2])
    # request 0: gap 0.1 carries 2 tokens -> 0.05, 0.05; gap 0.2 carries 1 -> 0.2. request 1: 0.1, 0.2, 0.1
    assert sorted(per_token.tolist()) == pytest.approx(sorted([0.05, 0.05, 0.2, 0.1, 0.2, 0.1]))
    assert sorted(per_chunk.tolist()) == pytest.approx(sorted([0.1, 0.2, 0.1, 0.2, 0.1]))


def test_steady_window_throughput_and_concurrency() -> None:
    df = cell()
    assert steady_window(df, 2) == pytest.approx((0.0, 0.6))  # C-th send .. first end after the last send
    m = repeat_metrics(df, 2, lag_samples=LAG_OK)
    assert m["achieved_concurrency"] == pytest.approx((0.45 + 0.6 + 0.05 + 0.2 - 0.1) / 0.6)
    assert m["output_tok_s_steady"] == pytest.approx(8 / 0.6)
    assert m["output_tok_s_total"] == pytest.approx(8 / 0.7)
    assert m["duration_s"] == pytest.approx(0.7)
    assert m["request_throughput_rps"] == pytest.approx(2 / 0.7)  # completed ok requests only


def test_stats_fields() -> None:
    m = repeat_metrics(cell(), 2, lag_samples=LAG_OK)
    t = m["ttft_ms"]
    assert t["n"] == 2  # failed and zero-output requests have no latency
    assert (t["mean"], t["min"], t["max"], t["p50"]) == pytest.approx((150.0, 100.0, 200.0, 150.0))
    assert t["std"] == pytest.approx(50.0)
    assert t["p99"] == pytest.approx(199.0)
    assert set(m["request_tok_s"]) >= {"mean", "std", "min", "max", "p50", "p90", "p95", "p99"}
    assert m["itl_token_ms"]["n"] == 6 and m["itl_chunk_ms"]["n"] == 5


def test_tokens_per_chunk_distribution() -> None:
    m = repeat_metrics(cell(), 2, lag_samples=LAG_OK)
    tpc = m["tokens_per_chunk"]
    assert tpc["histogram"] == {"1": 6, "2": 1}
    assert tpc["mean"] == pytest.approx(8 / 7) and tpc["max"] == 2


def test_goodput() -> None:
    m = repeat_metrics(cell(), 2, slos={"ttft_ms": 150}, lag_samples=LAG_OK)
    assert m["goodput_rps"] == pytest.approx(1 / 0.7)  # only request 0 has TTFT <= 150 ms
    m = repeat_metrics(cell(), 2, slos={"ttft_ms": 500, "tpot_ms": 120, "e2e_ms": 1000}, lag_samples=LAG_OK)
    assert m["goodput_rps"] == pytest.approx(1 / 0.7)  # request 1's TPOT is 133 ms
    assert repeat_metrics(cell(), 2, lag_samples=LAG_OK)["goodput_rps"] is None


def test_accept_length_from_records() -> None:
    m = repeat_metrics(cell(), 2, lag_samples=LAG_OK)
    assert m["accept_length"] == pytest.approx(8 / 6)


def test_accept_length_from_counters() -> None:
    before = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 15}
    after = {"num_drafts": 20, "num_draft_tokens": 60, "num_accepted_tokens": 35}
    c = accept_length_from_counters(before, after)
    assert c["accept_length"] == pytest.approx(3.0)  # 1 + 20 accepted / 10 drafts
    assert c["acceptance_rate"] == pytest.approx(20 / 30)
    assert accept_length_from_counters(before, before)["accept_length"] is None
    with pytest.raises(ValueError):
        accept_length_from_counters(after, before)


def test_errors_and_validity() -> None:
    s = summarize(cell(), 2, expected_output_tokens=4, lag_samples=[LAG_OK])
    err = s["metrics"]["errors"]
    assert err["count"] == 2 and err["rate"] == 0.5
    assert err["by_kind"] == {"http": 1, "short_output": 1}
    assert err["messages"]["http"] == ["http happened"]
    v = s["validity"]
    assert not v["valid"]
    assert any("error rate" in r for r in v["reasons"])
    assert any("fewer output tokens" in r for r in v["reasons"])


def good_cell(repeat: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        [
            rec(0.0, [0.1, 0.2, 0.4], [1, 2, 1], 0.4, repeat=repeat, idx=0),
            rec(0.0, [0.2, 0.3, 0.5, 0.6], [1, 1, 1, 1], 0.6, repeat=repeat, idx=1),
            rec(0.4, [0.5, 0.6, 0.7, 0.8], [1, 1, 1, 1], 0.8, repeat=repeat, idx=2),
        ]
    )


def test_valid_cell_and_cap_flag() -> None:
    s = summarize(good_cell(), 2, expected_output_tokens=4, lag_samples=[LAG_OK], server_max_running=1)
    assert s["validity"]["valid"], s["validity"]
    assert any("running-request cap 1" in f for f in s["validity"]["flags"])


def test_loop_lag_gate() -> None:
    lag = [0.001] * 90 + [0.02] * 10
    s = summarize(good_cell(), 2, lag_samples=[lag])
    assert not s["validity"]["valid"]
    assert any("lag p99" in r for r in s["validity"]["reasons"])
    assert s["metrics"]["loop_lag_ms"]["max"] == pytest.approx(20.0)
    s = summarize(good_cell(), 2, lag_samples=[lag], gates={"loop_lag_p99_ms": 50})
    assert s["validity"]["valid"]


def test_achieved_concurrency_gate() -> None:
    # the client left slots empty between an end and the next send
    df = pd.DataFrame(
        [
            rec(0.0, [0.5, 1.0], [2, 2], 1.0, idx=0),
            rec(0.0, [0.5, 1.0], [2, 2], 1.0, idx=1),
            rec(1.5, [2.0, 2.5], [2, 2], 2.5, idx=2),
            rec(1.5, [2.0, 2.5], [2, 2], 2.5, idx=3),
        ]
    )
    s = summarize(df, 2, lag_samples=[LAG_OK])
    assert s["metrics"]["achieved_concurrency"] == pytest.approx(4 / 2.5)
    assert any("achieved concurrency" in r for r in s["validity"]["reasons"])


def test_repeats_pooled_and_per_repeat() -> None:
    df = pd.concat([good_cell(0), good_cell(1)], ignore_index=True)
    s = summarize(df, 2, lag_samples=[LAG_OK, LAG_OK])
    assert len(s["repeats"]) == 2 and s["metrics"]["n_repeats"] == 2
    assert s["metrics"]["ttft_ms"]["n"] == 6  # distributions pooled over repeats
    one = s["repeats"][0]["metrics"]["output_tok_s_steady"]
    assert s["metrics"]["output_tok_s_steady"] == pytest.approx(one)  # scalar: mean over repeats
    assert s["metrics"]["repeat_spread"]["output_tok_s_steady"]["std"] == pytest.approx(0.0)
    assert s["validity"]["valid"]
    json.dumps(jsonable(s), allow_nan=False)


def test_summary_is_strict_json_with_failures() -> None:
    s = jsonable(summarize(cell(), 2, lag_samples=[[]]))
    text = json.dumps(s, allow_nan=False)
    assert "NaN" not in text
    assert any("no loop-lag samples" in f for f in s["validity"]["flags"])
