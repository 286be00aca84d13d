"""Each metric definition of docs/metrics.md, checked on hand-built records."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from specsweep.config import defaults
from specsweep.measure.gates import summarize
from specsweep.measure.metrics import (
    accept_length_from_counters,
    itl,
    jsonable,
    per_request,
    repeat_metrics,
    steady_window,
    tokens_between,
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


def test_a_boundary_step_counts_by_its_chunks_intervals_not_by_which_side_each_landed() -> None:
    """Four streams step together every 0.1 s; the window ends at a step's end (1.0), where their chunks arrive
    within 0.4 ms of each other. Whichever side of the edge each lands on, the closing step counts nearly whole
    (the old count, each chunk in or out, read 1 to 4 tokens for it by that chance)."""
    for late in (0.0, 0.0002, 0.0004):
        streams = [
            rec(0.0, [0.1 * k + (late * i if k == 10 else 0.0) for k in range(1, 11)], [1] * 10, 1.0, idx=i)
            for i in range(4)
        ]
        got = tokens_between(pd.DataFrame(streams), 0.5, 1.0)
        assert got == pytest.approx(20.0, abs=0.03), (late, got)  # steps ending at 0.6-1.0, four tokens each


def test_itl_per_token_and_per_chunk() -> None:
    per_token, per_chunk = itl(cell().iloc[:2])
    # request 0: gap 0.1 carries 2 tokens -> 0.05, 0.05; gap 0.2 carries 1 -> 0.2. request 1: 0.1, 0.2, 0.1
    assert sorted(per_token.tolist()) == pytest.approx(sorted([0.05, 0.05, 0.2, 0.1, 0.2, 0.1]))
    assert sorted(per_chunk.tolist()) == pytest.approx(sorted([0.1, 0.2, 0.1, 0.2, 0.1]))


def test_steady_window_throughput_and_concurrency() -> None:
    df = good_cell()
    # from the C-th end (one full turnover, 0.6) to the first end after the last send (0.8 -> 1.0)
    assert steady_window(df["send_s"], df["end_s"], 2) == pytest.approx((0.6, 1.0))
    m = repeat_metrics(df, 2, lag_samples=LAG_OK)
    assert m["steady_window_s"] == pytest.approx(0.4)
    # two slots, a token each per 0.1 s: (0.6, 1.0] holds the steps ending at 0.7-1.0, not the one ending at 0.6
    assert m["output_tok_s_steady"] == pytest.approx(8 / 0.4)
    assert m["achieved_concurrency"] == pytest.approx(2.0)
    assert m["output_tok_s_total"] == pytest.approx(20 / 1.2)
    assert m["duration_s"] == pytest.approx(1.2)
    assert m["request_throughput_rps"] == pytest.approx(5 / 1.2)  # completed ok requests only


def test_steady_window_works_on_plain_arrays_and_empty_windows() -> None:
    # a staggered level of C=2: ramp requests end at 0.5 and 1.0, then the measured ones follow
    sends = [0.0, 0.0, 0.5, 1.0, 1.5, 2.0]
    ends = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert steady_window(sends, ends, 2) == pytest.approx((1.0, 2.5))
    assert steady_window([0.0, 0.0], [1.0, 1.0], 2) == pytest.approx((1.0, 1.0))  # no turnover: empty
    assert all(math.isnan(x) for x in steady_window([], [], 2))


def test_ramp_requests_are_not_measured() -> None:
    df = good_cell()
    df["ramp"] = [True, True, False, False, False]
    m = repeat_metrics(df, 2, lag_samples=LAG_OK)
    assert m["ttft_ms"]["n"] == 3 and m["n_measured"] == 3
    assert m["ttft_ms"]["p50"] == pytest.approx(100.0)


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


def test_goodput_counts_the_requests_that_end_in_the_steady_window() -> None:
    """Good requests ending inside the steady window [0.5, 0.6], per second of it, as the analysis's bootstrap
    counts them (tests/unit/test_analysis_bootstrap.py): request 1 ends inside it; request 0, the only one with
    TTFT <= 150 ms, ends before it and is not counted."""
    m = repeat_metrics(cell(), 2, slos={"ttft_ms": 500}, lag_samples=LAG_OK)
    assert m["steady_window"] == {"start_s": 0.5, "end_s": 0.6}
    assert m["goodput_rps"] == pytest.approx(1 / 0.1)
    assert repeat_metrics(cell(), 2, slos={"ttft_ms": 150}, lag_samples=LAG_OK)["goodput_rps"] == 0.0
    m = repeat_metrics(cell(), 2, slos={"ttft_ms": 500, "tpot_ms": 120, "e2e_ms": 1000}, lag_samples=LAG_OK)
    assert m["goodput_rps"] == 0.0  # request 1's TPOT is 133 ms
    assert repeat_metrics(cell(), 2, lag_samples=LAG_OK)["goodput_rps"] is None
    with pytest.raises(ValueError, match="unknown SLO 'itl_ms'"):
        repeat_metrics(cell(), 2, slos={"itl_ms": 10}, lag_samples=LAG_OK)


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


GATES = defaults("gates")
QUIET = {"busy_share": 0.05, "wait_share": 0.0, "stamps": {"kernel_share": 1.0}}


def one(lag: list[float] = LAG_OK, idle: list[float] | None = None, client: dict | None = None, counters=None):
    """The per-repeat figures `summarize` takes beside the records (a quiet, kernel-stamping client)."""
    return [{"lag": lag, "idle_lag": idle or [], "client": client or QUIET, "counters": counters}]


def test_errors_and_validity() -> None:
    s = summarize(cell(), 2, GATES, repeats=one())
    err = s["metrics"]["errors"]
    assert err["count"] == 2 and err["rate"] == 0.5
    assert err["by_kind"] == {"http": 1, "short_output": 1}
    assert err["messages"]["http"] == ["http happened"]
    v = s["validity"]
    assert not v["valid"]
    assert any("error rate" in r for r in v["reasons"])
    assert any("fewer output tokens" in r for r in v["reasons"])


def good_cell(repeat: int = 0) -> pd.DataFrame:
    """C=2, five requests of 4 tokens: slot 0 turns over at 0.4 and 0.8, slot 1 at 0.6."""
    return pd.DataFrame(
        [
            rec(0.0, [0.1, 0.2, 0.4], [1, 2, 1], 0.4, repeat=repeat, idx=0),
            rec(0.0, [0.2, 0.3, 0.5, 0.6], [1, 1, 1, 1], 0.6, repeat=repeat, idx=1),
            rec(0.4, [0.5, 0.6, 0.7, 0.8], [1, 1, 1, 1], 0.8, repeat=repeat, idx=2),
            rec(0.6, [0.7, 0.8, 0.9, 1.0], [1, 1, 1, 1], 1.0, repeat=repeat, idx=3),
            rec(0.8, [0.9, 1.0, 1.1, 1.2], [1, 1, 1, 1], 1.2, repeat=repeat, idx=4),
        ]
    )


def valid(df: pd.DataFrame, c: int = 2, **kw) -> dict:
    return summarize(df, c, {**GATES, **kw.pop("gates", {})}, repeats=one(**kw))["validity"]


def test_valid_cell_and_cap_flag() -> None:
    s = summarize(good_cell(), 2, GATES, repeats=one(), server_max_running=1)
    assert s["validity"]["valid"], s["validity"]
    assert any("running-request cap 1" in f for f in s["validity"]["flags"])


def test_short_output_is_judged_per_request_against_its_own_length() -> None:
    # per-prompt output lengths (a prompts file, a uniform range): a 3-token request asked for 3 is complete,
    # although the level's nominal length is 4 (the old gate compared every row with the level's scalar)
    df = good_cell()
    df.at[2, "chunk_s"], df.at[2, "chunk_tokens"] = [0.5, 0.6, 0.8], [1, 1, 1]
    df.loc[2, ["output_tokens", "server_output_tokens", "expected_output_tokens"]] = [3, 3, 3]
    assert valid(df)["valid"], valid(df)
    df.loc[2, "expected_output_tokens"] = 5  # but one asked for 5 that streamed 3 is short
    assert any("fewer output tokens" in r for r in valid(df)["reasons"])


def test_loop_lag_is_judged_against_idle_jitter_and_only_without_kernel_stamps() -> None:
    lag = [0.001] * 90 + [0.02] * 10  # p99 20 ms
    select = {**QUIET, "stamps": {"kernel_share": 0.0}}
    v = valid(good_cell(), lag=lag, idle=[0.0005] * 100, client=select)
    assert not v["valid"] and any("above the host's idle" in r for r in v["reasons"])
    # the same lag on a host whose idle timer is as late (a jittery VM) is no sign of a saturated client
    assert valid(good_cell(), lag=lag, idle=[0.001] * 90 + [0.019] * 10, client=select)["valid"]
    # with kernel stamps a late loop delays parsing, not the chunk times
    assert valid(good_cell(), lag=lag, idle=[0.0005] * 100)["valid"]
    s = summarize(good_cell(), 2, GATES, repeats=one(lag=lag, idle=[0.0005] * 100, client=select))
    c = s["repeats"][0]["metrics"]["client"]
    assert c["loop_lag_ms"]["p99"] == pytest.approx(20.0) and c["idle_lag_ms"]["p99"] == pytest.approx(0.5)
    assert c["loop_lag_excess_p99_ms"] == pytest.approx(19.5)


def test_client_cpu_gates_catch_saturated_and_starved_clients() -> None:
    v = valid(good_cell(), client={**QUIET, "busy_share": 0.93})
    assert not v["valid"] and any("client saturated" in r for r in v["reasons"])
    v = valid(good_cell(), client={**QUIET, "wait_share": 0.4})
    assert not v["valid"] and any("client starved" in r for r in v["reasons"])
    v = valid(good_cell(), client={**QUIET, "wait_share": None})
    assert v["valid"] and any("starvation not checked" in f for f in v["flags"])


def test_shared_cpus_invalidate_unless_allowed() -> None:
    shared = {**QUIET, "shared_cpus": "1"}
    v = valid(good_cell(), client=shared)
    assert not v["valid"] and any("client and server share CPUs 1" in r for r in v["reasons"])
    assert valid(good_cell(), client=shared, gates={"allow_shared_cpus": True})["valid"]


def test_prefix_cache_hits_invalidate_a_cell() -> None:
    df = good_cell()
    df["cached_tokens"] = 0
    assert valid(df)["valid"]
    df["cached_tokens"] = 8  # every prompt token came from the cache
    v = valid(df)
    assert not v["valid"] and any("prefix-cache hit rate 100.0%" in r for r in v["reasons"])
    df["cached_tokens"] = -1  # not reported per request: the engine's counters decide
    before, after = (
        {"prefix_cache_queries": 100.0, "prefix_cache_hits": 0.0},
        {
            "prefix_cache_queries": 140.0,
            "prefix_cache_hits": 1.0,
        },
    )
    s = summarize(df, 2, GATES, repeats=one(counters=(before, after)))
    assert s["validity"]["valid"]
    assert s["metrics"]["prefix_cache"] == {"hit_rate": 1 / 40, "hits": 1.0, "queries": 40.0, "source": "counters"}
    assert any("isolation not checked" in f for f in valid(df)["flags"])


def test_achieved_concurrency_gate() -> None:
    # the client left slots empty between an end and the next send
    df = pd.DataFrame(
        [
            rec(0.0, [0.5, 1.0], [2, 2], 1.0, idx=0),
            rec(0.0, [0.5, 1.0], [2, 2], 1.1, idx=1),
            rec(1.5, [2.0, 2.5], [2, 2], 2.5, idx=2),
            rec(1.6, [2.0, 2.5], [2, 2], 2.6, idx=3),
            rec(3.0, [3.5, 4.0], [2, 2], 4.0, idx=4),
        ]
    )
    df["slot"] = [0, 1, 0, 1, 0]
    s = summarize(df, 2, GATES, repeats=one())
    assert any("achieved concurrency" in r for r in s["validity"]["reasons"])
    assert s["repeats"][0]["metrics"]["client"]["reissue_delay_ms"]["max"] == pytest.approx(500.0)


def test_repeats_pooled_and_per_repeat() -> None:
    df = pd.concat([good_cell(0), good_cell(1)], ignore_index=True)
    s = summarize(df, 2, GATES, repeats=one() * 2)
    assert len(s["repeats"]) == 2 and s["metrics"]["n_repeats"] == 2
    assert s["metrics"]["ttft_ms"]["n"] == 10  # distributions pooled over repeats
    one_rep = s["repeats"][0]["metrics"]["output_tok_s_steady"]
    assert s["metrics"]["output_tok_s_steady"] == pytest.approx(one_rep)  # scalar: mean over repeats
    assert s["metrics"]["repeat_spread"]["output_tok_s_steady"]["std"] == pytest.approx(0.0)
    assert s["validity"]["valid"]
    json.dumps(jsonable(s), allow_nan=False)


def test_reissue_delays_stay_within_a_repeat() -> None:
    df = pd.concat([good_cell(0), good_cell(1)], ignore_index=True)
    df["slot"] = [0, 1, 0, 1, 0] * 2
    s = summarize(df, 2, GATES, repeats=one() * 2)
    per = [r["metrics"]["client"]["reissue_delay_ms"]["max"] for r in s["repeats"]]
    assert per == pytest.approx([0.0, 0.0])  # each end is followed at once by the slot's next send
    assert s["metrics"]["client"]["reissue_delay_ms"]["max"] == pytest.approx(0.0)  # not repeat 1 minus repeat 0


def test_counters_are_summed_over_repeats() -> None:
    df = pd.concat([good_cell(0), good_cell(1)], ignore_index=True)
    c1 = (
        {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0},
        {"num_drafts": 10.0, "num_draft_tokens": 30.0, "num_accepted_tokens": 10.0},
    )
    c2 = (
        {"num_drafts": 10.0, "num_draft_tokens": 30.0, "num_accepted_tokens": 10.0},
        {"num_drafts": 20.0, "num_draft_tokens": 60.0, "num_accepted_tokens": 40.0},
    )
    s = summarize(df, 2, GATES, repeats=[one(counters=c1)[0], one(counters=c2)[0]])
    assert s["metrics"]["spec_counters"]["num_drafts"] == 20.0
    assert s["metrics"]["accept_length"] == pytest.approx(1 + 40 / 20)


def test_summary_is_strict_json_with_failures() -> None:
    s = jsonable(summarize(cell(), 2, GATES, repeats=one(lag=[])))
    text = json.dumps(s, allow_nan=False)
    assert "NaN" not in text
    assert any("no loop-lag samples" in f for f in s["validity"]["flags"])


def test_other_processes_are_judged_above_the_tick_counters_resolution() -> None:
    """10% foreign in a 0.2 s repeat is two clock ticks, within the counters' 15% resolution: a flag, not a
    busy machine (a CI run threw out a sim cell so); 30% in a 4 s repeat at 2% resolution is a busy machine."""
    short = valid(good_cell(), client={**QUIET, "foreign_cpu_share": 0.1001, "foreign_cpu_resolution": 0.15})
    assert short["valid"], short
    assert any("not judged" in f and "±15%" in f for f in short["flags"]), short
    busy = valid(good_cell(), client={**QUIET, "foreign_cpu_share": 0.3, "foreign_cpu_resolution": 0.02})
    assert not busy["valid"] and any("machine busy" in r and "±2%" in r for r in busy["reasons"]), busy
    within = valid(good_cell(), client={**QUIET, "foreign_cpu_share": 0.11, "foreign_cpu_resolution": 0.02})
    assert within["valid"] and not [f for f in within["flags"] if "not judged" in f], within


def test_client_cpu_and_machine_busy_gates_flag_a_missing_figure() -> None:
    """Every gate judges or says it did not: a client without CPU accounting, or a server whose CPU time was not
    read, is flagged "not judged: ... missing" (as the run-queue gate flags a missing schedstat), not passed in
    silence (issue 28)."""
    v = valid(good_cell(), client={**QUIET, "busy_share": None})
    assert v["valid"] and any("client saturation not judged" in f and "missing" in f for f in v["flags"]), v
    v = valid(good_cell(), client={**QUIET, "foreign_cpu_share": None})
    assert v["valid"] and any("machine busy not judged" in f and "missing" in f for f in v["flags"]), v
    known = valid(good_cell(), client={**QUIET, "foreign_cpu_share": 0.01, "foreign_cpu_resolution": 0.01})
    assert not [f for f in known["flags"] if "not judged" in f], known
