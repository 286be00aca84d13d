"""Bootstrap intervals and the variant analysis on synthetic cells with a known truth."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specsweep.analysis.analyze import analyze_variant
from specsweep.analysis.bootstrap import (
    METRICS,
    block_replicates,
    bootstrap_cell,
    cell_rng,
    few_blocks_factor,
    percentile_interval,
)
from specsweep.analysis.cells import (
    MIN_BLOCKS,
    N_BLOCKS,
    Cell,
    find_cells,
    infer_concurrency,
    load_cell,
    request_arrays,
)
from specsweep.analysis.notes import INTERVAL_NOTE_ONE_REPEAT
from specsweep.analysis.settings import AnalysisSettings
from specsweep.measure.metrics import goodput_rps, slo_seconds
from tests.support.synthetic import (
    correlated_cell,
    correlated_requests,
    simulate_correlated,
    summary_metrics,
    synthetic_requests,
    true_throughput,
    write_synthetic_cell,
    write_synthetic_variant,
)

pytestmark = pytest.mark.unit

LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]
# permissive validity gates (the config schema's keys): these tests are about the analysis, not validity
GATES = {
    "min_achieved_concurrency_ratio": 0.0,
    "max_client_cpu_share": 1.0,
    "max_client_wait_share": 1.0,
    "max_loop_lag_excess_ms": 1e9,
    "max_error_rate": 1.0,
    "max_prefix_cache_hit_rate": 1.0,
}


def _load(root: Path) -> dict[str, dict[float, Cell]]:
    return {a: {c: load_cell(d) for c, d in by.items()} for a, by in find_cells(root).items()}


def _settings(**kw: object) -> AnalysisSettings:
    s = AnalysisSettings(replicates=400, seed=3)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def test_known_crossover_inside_interval(tmp_path: Path) -> None:
    # true speedup 1.5 - 0.25 ln C crosses 1 at C = e^2 ~ 7.39; linear in log C, so interpolation is unbiased
    write_synthetic_variant(
        tmp_path,
        [1, 2, 5, 10, 30],
        lambda c: 1.5 - 0.25 * math.log(c),
        requests_per_level=lambda c: 200,
        sigma=0.3,
        seed=13,
    )
    res = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())
    x = res["arms"]["eagle3"]["crossover"]
    assert x["states"] == {"estimate": "within", "lo": "within", "hi": "within"}
    assert x["lo"] <= math.exp(2) <= x["hi"]
    assert x["lo"] <= x["estimate"] <= x["hi"]
    ar = res["arms"]["eagle3"]
    assert ar["monotone"] and len(ar["crossings"]) == 1 and ar["crossings"][0]["direction"] == "down"
    assert ar["winner"] is None


def test_seeded_and_repeats_use_t_across_repeats() -> None:
    rng = np.random.default_rng(0)
    df = correlated_requests(4, 40, 16, 1.0, rng, repeats=3)
    cell = Cell("a", 4.0, Path("."), {"cell": {"key": "x"}, "repeats": []}, request_arrays(df))
    a, b = bootstrap_cell(cell, 200, 5), bootstrap_cell(cell, 200, 5)
    np.testing.assert_array_equal(a.replicates["aggregate_tok_s"], b.replicates["aggregate_tok_s"])
    c = bootstrap_cell(cell, 200, 6)
    assert not np.array_equal(a.replicates["aggregate_tok_s"], c.replicates["aggregate_tok_s"])
    assert a.has_interval["aggregate_tok_s"] and np.all(np.isfinite(a.replicates["tpot_p99_s"]))
    assert a.method["aggregate_tok_s"] == "repeats_t" and a.n_repeats["aggregate_tok_s"] == 3
    # centred on the reported value
    assert np.median(a.replicates["aggregate_tok_s"]) == pytest.approx(a.point["aggregate_tok_s"], rel=0.02)
    # no SLO configured: goodput has no interval
    assert not a.has_interval["goodput_rps"] and a.method["goodput_rps"] == "none"


def test_one_repeat_uses_blocks_widened_for_few_blocks() -> None:
    rng = np.random.default_rng(3)
    df = correlated_requests(4, 80, 16, 1.0, rng, speed_sd=0.2)
    cell = Cell("a", 4.0, Path("."), {"cell": {"key": "one"}, "repeats": []}, request_arrays(df))
    b = bootstrap_cell(cell, 300, 0)
    assert b.method["aggregate_tok_s"] == "blocks" and b.n_repeats["aggregate_tok_s"] == 1
    k = cell.requests.blocks.n_blocks(0)
    raw = block_replicates(cell.requests, 0, 300, cell_rng(0, "one"))
    assert raw is not None and raw.n_blocks == k
    kt = raw.k("aggregate_tok_s")  # throughput has its own blocks, sized from the token series
    assert kt == int((cell.requests.blocks.tp_block_repeat == 0).sum()) >= 3
    ratio = np.log(raw.replicates["aggregate_tok_s"] / raw.full["aggregate_tok_s"])
    got = np.log(b.replicates["aggregate_tok_s"] / b.point["aggregate_tok_s"])
    np.testing.assert_allclose(got, few_blocks_factor(kt) * ratio)
    assert few_blocks_factor(10) == pytest.approx(math.sqrt(10 / 9) * 2.2622 / 1.95996, rel=1e-4)


def test_floor_when_repeats_agree_exactly() -> None:
    """Three identical repeats have s = 0; the interval is still the within-repeat noise, not a point."""
    rng = np.random.default_rng(4)
    one = correlated_requests(4, 40, 16, 1.0, rng, speed_sd=0.2)
    df = pd.concat([one.assign(repeat=r) for r in range(3)], ignore_index=True)
    cell = Cell("a", 4.0, Path("."), {"cell": {"key": "same"}, "repeats": []}, request_arrays(df))
    b = bootstrap_cell(cell, 400, 0, metrics=(METRICS[0],))
    lo, hi = percentile_interval(b.replicates["aggregate_tok_s"])
    assert b.method["aggregate_tok_s"] == "repeats_t" and hi / lo > 1.02


def test_repeat_too_short_for_blocks_still_counts_across_repeats() -> None:
    """A repeat whose window holds too few requests for blocks still gives its summary value to the t step."""
    rng = np.random.default_rng(10)
    df = correlated_requests(4, 40, 16, 1.0, rng, repeats=3, speed_sd=0.1)
    summary = {"cell": {"key": "short"}, **summary_metrics(df, 4)}
    short = df[(df["repeat"] != 2) | (df["request_index"] < 8)]  # repeat 2: its ramp and 4 requests only
    cell = Cell("a", 4.0, Path("."), summary, request_arrays(short, 4))
    assert cell.requests.blocks.n_blocks(2) == 0 and cell.requests.blocks.n_blocks(0) >= MIN_BLOCKS
    b = bootstrap_cell(cell, 200, 0, metrics=(METRICS[0],))
    assert b.method["aggregate_tok_s"] == "repeats_t" and b.n_repeats["aggregate_tok_s"] == 3


def test_goodput_with_slo() -> None:
    rng = np.random.default_rng(1)
    df = synthetic_requests(4, 50, 16, 1.0, 0.3, rng)
    cell = Cell("a", 4.0, Path("."), {"cell": {"key": "g"}, "repeats": []}, request_arrays(df))
    slo = slo_seconds({"e2e_ms": 1000.0, "ttft_ms": None})
    assert slo == {"e2e_s": 1.0}
    b = bootstrap_cell(cell, 200, 0, slo)
    assert b.has_interval["goodput_rps"]
    # no summary value: requests ending in the steady window that meet the SLO, per second of the window
    req = cell.requests
    (start, end) = req.blocks.windows[0]
    inside = (req.end_s >= start) & (req.end_s <= end)
    expect = np.sum((req.e2e_s <= 1.0) & inside) / (end - start)
    assert b.point["goodput_rps"] == pytest.approx(expect)
    # one goodput: the summary's figure of the same records is the same count over the same window
    assert goodput_rps(df, {"e2e_ms": 1000.0}, start, end) == pytest.approx(expect)


def test_request_arrays_use_metrics_definitions_and_leave_out_ramp_rows() -> None:
    metrics = pytest.importorskip("specsweep.measure.metrics")
    rng = np.random.default_rng(5)
    df = correlated_requests(4, 24, 8, 1.0, rng, repeats=2)
    assert df["ramp"].sum() == 8
    req = request_arrays(df)
    meas = ~df["ramp"].to_numpy()
    pr = metrics.per_request(df)[meas]
    assert len(req) == 48
    np.testing.assert_allclose(req.tpot_s, pr["tpot"].to_numpy())
    np.testing.assert_allclose(req.e2e_s, pr["e2e"].to_numpy())
    np.testing.assert_allclose(req.busy_s, pr["busy"].to_numpy())
    # older records without ramp/slot columns: every row counts, C inferred from the overlap
    old = df.drop(columns=["ramp", "slot"])
    assert len(request_arrays(old)) == len(df) and infer_concurrency(old) == 4


def test_blocks_partition_the_steady_window() -> None:
    metrics = pytest.importorskip("specsweep.measure.metrics")
    rng = np.random.default_rng(6)
    df = correlated_requests(5, 200, 8, 1.0, rng)
    req = request_arrays(df, 5)
    lay = req.blocks
    start, end = metrics.steady_window(df["send_s"], df["end_s"], 5)
    assert lay.windows[0] == pytest.approx((start, end))
    k = lay.n_blocks(0)
    assert MIN_BLOCKS <= k <= N_BLOCKS
    assert lay.block_len_s.sum() == pytest.approx(end - start)
    assert lay.block_tokens.sum() == pytest.approx(metrics.tokens_between(df, start, end), rel=1e-9)
    inside = (req.end_s >= start) & (req.end_s <= end)
    assert np.all((lay.block >= 0) == inside)
    # a request's block holds its end time
    edges = start + (end - start) * np.arange(k + 1) / k
    b = lay.block[inside]
    assert np.all((req.end_s[inside] >= edges[b] - 1e-12) & (req.end_s[inside] <= edges[b + 1] + 1e-12))
    # a window given by summary.json wins over the recomputed one
    lay2 = request_arrays(df, 5, {0: (start + 1.0, end)}).blocks
    assert lay2.windows[0][0] == pytest.approx(start + 1.0)


def test_array_path_matches_dataframe_path() -> None:
    """correlated_cell (used by the coverage tests) builds what load_cell would build from the records."""
    run = simulate_correlated(4, 60, 12, 1.0, np.random.default_rng(7), repeats=2, speed_sd=0.2)
    fast = correlated_cell("k", run)
    df = correlated_requests(4, 60, 12, 1.0, np.random.default_rng(7), repeats=2, speed_sd=0.2)
    slow = request_arrays(df, 4)
    np.testing.assert_array_equal(fast.requests.blocks.block, slow.blocks.block)
    np.testing.assert_allclose(fast.requests.blocks.block_tokens, slow.blocks.block_tokens)
    np.testing.assert_allclose(fast.requests.tpot_s, slow.tpot_s)
    s = summary_metrics(df, 4)
    assert fast.summary["metrics"]["output_tok_s_steady"] == pytest.approx(s["metrics"]["output_tok_s_steady"])
    assert [r["metrics"]["output_tok_s_steady"] for r in fast.summary["repeats"]] == pytest.approx(
        [r["metrics"]["output_tok_s_steady"] for r in s["repeats"]]
    )


def test_correlated_generator_truth() -> None:
    """The stated truth holds: the shared speed averages to 1 over time, the run factor over repeats."""
    rng = np.random.default_rng(8)
    long = [correlated_cell("t", simulate_correlated(4, 2000, 8, 0.5, rng, speed_sd=0.2)) for _ in range(4)]
    vals = [c.summary["metrics"]["output_tok_s_steady"] for c in long]
    assert np.mean(vals) == pytest.approx(true_throughput(4, 8, 0.5), rel=0.015)
    runs = correlated_cell("r", simulate_correlated(4, 40, 8, 0.5, rng, repeats=100, speed_sd=0.0, run_sd=0.1))
    per = np.array([r["metrics"]["output_tok_s_steady"] for r in runs.summary["repeats"]])
    assert per.mean() == pytest.approx(true_throughput(4, 8, 0.5), rel=0.03)
    assert np.std(np.log(per)) == pytest.approx(0.1, rel=0.25)


def test_default_size_is_fast(tmp_path: Path) -> None:
    write_synthetic_variant(
        tmp_path, LEVELS, lambda c: 1.3 - 0.1 * math.log(c), requests_per_level=lambda c: 500, seed=1
    )
    cells = _load(tmp_path)
    t = time.perf_counter()
    res = analyze_variant(cells, "baseline", ["eagle3"], AnalysisSettings(replicates=1000))
    assert time.perf_counter() - t < 10.0
    assert len(res["arms"]["eagle3"]["levels"]) == len(LEVELS)


def test_invalid_cells_left_out_and_listed(tmp_path: Path) -> None:
    write_synthetic_variant(
        tmp_path,
        LEVELS,
        lambda c: 1.5 - 0.25 * math.log(c),
        invalid=(("eagle3", 100), ("baseline", 5)),
        seed=2,
    )
    cells = _load(tmp_path)
    ar = analyze_variant(cells, "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    assert 100.0 not in ar["levels"] and 5.0 not in ar["levels"]
    listed = {(e["arm"], e["concurrency"]) for e in ar["invalid_cells"]}
    assert listed == {("eagle3", 100.0), ("baseline", 5.0)}
    assert all(not e["included"] and e["reasons"] == ["client_lag"] for e in ar["invalid_cells"])
    row = next(r for r in ar["per_level"] if r["concurrency"] == 100.0)
    assert row["used"] is False and row["spec_valid"] is False and row["speedup"] is not None
    ar2 = analyze_variant(cells, "baseline", ["eagle3"], _settings(include_invalid=True))["arms"]["eagle3"]
    assert 100.0 in ar2["levels"] and all(e["included"] for e in ar2["invalid_cells"])


def test_levels_kept_with_drift_are_named_in_the_verdict(tmp_path: Path) -> None:
    """A level the host moved is kept (its drift a flag, `gates.block_drift_gate`): the verdict names it, since its
    interval is wide for the host's doing, not the engine's."""
    write_synthetic_variant(tmp_path, [1, 2, 5], lambda c: 1.2, seed=3)
    cells = _load(tmp_path)
    flag = "drift: steady throughput +40% from the first interleaved block to the last (> ±20%): ..., and in ..."
    cells["baseline"][2.0].summary["validity"]["flags"].append(flag)
    notes = analyze_variant(cells, "baseline", ["eagle3"], _settings())["arms"]["eagle3"]["verdict"]["notes"]
    assert [n for n in notes if n.startswith("the host changed speed inside the level at C=2,")], notes
    cells["baseline"][2.0].summary["validity"]["flags"].remove(flag)
    notes = analyze_variant(cells, "baseline", ["eagle3"], _settings())["arms"]["eagle3"]["verdict"]["notes"]
    assert not [n for n in notes if "changed speed" in n], notes


def test_missing_cell_listed(tmp_path: Path) -> None:
    write_synthetic_variant(tmp_path, [1, 2, 5], lambda c: 1.2, seed=3)
    cells = _load(tmp_path)
    del cells["eagle3"][5.0]
    ar = analyze_variant(cells, "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    assert ar["levels"] == [1.0, 2.0]
    assert ar["missing_cells"] == [{"arm": "eagle3", "concurrency": 5.0}]


def test_no_crossing_reports_winner_and_margin(tmp_path: Path) -> None:
    write_synthetic_variant(
        tmp_path, [1, 2, 5, 10], lambda c: 3.0 - 0.5 * math.log(c), requests_per_level=lambda c: 100, seed=4
    )
    ar = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    assert ar["crossings"] == [] and ar["winner"] == "eagle3"
    assert ar["smallest_margin"]["concurrency"] == 10.0
    assert ar["crossover"]["states"]["estimate"] == "above_range"
    assert ar["crossover"]["estimate"] is None


def test_several_crossings_flagged_non_monotone(tmp_path: Path) -> None:
    table = {1: 1.6, 2: 0.6, 5: 1.6, 10: 0.6}
    write_synthetic_variant(tmp_path, list(table), lambda c: table[int(c)], requests_per_level=lambda c: 100, seed=5)
    ar = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    assert len(ar["crossings"]) == 3 and ar["monotone"] is False
    assert [c["direction"] for c in ar["crossings"]] == ["down", "up", "down"]


def test_latency_orientation(tmp_path: Path) -> None:
    for root in (tmp_path,):
        write_synthetic_variant(root, [1, 2], lambda c: 1.5, requests_per_level=lambda c: 100, seed=6)
        ar = analyze_variant(_load(root), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
        m = ar["metrics"]
        # speculation is faster: throughput ratio > 1 and latency ratio (baseline/spec) > 1 alike
        assert m["tpot_p50_s"]["orientation"] == "baseline/spec"
        assert all(v > 1.2 for v in m["aggregate_tok_s"]["speedup"])
        assert all(v > 1.2 for v in m["tpot_p50_s"]["speedup"])
        assert all(v > 1.2 for v in m["e2e_p50_s"]["speedup"])
        assert m["tpot_p50_s"]["baseline"][0] < 1.0  # seconds, whatever the summary's unit


def test_missing_parquet_makes_the_cell_unjudgeable(tmp_path: Path) -> None:
    """Validity is judged from the records: a cell without them is invalid (point values kept, flagged)."""
    write_synthetic_variant(tmp_path, [1, 2], lambda c: 1.5, seed=7)
    (tmp_path / "eagle3" / "c2" / "requests.parquet").unlink()
    ar = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    assert ar["levels"] == [1]
    row = next(r for r in ar["per_level"] if r["concurrency"] == 2)
    assert row["spec_valid"] is False and row["speedup"] is not None and row["speedup_lo"] is None
    assert any("requests.parquet missing" in n for n in ar["notes"])
    assert ar["verdict"]["kind"] == "inconclusive" and ar["verdict"]["remeasure_levels"] == [2]


def test_summary_from_metrics_module(tmp_path: Path) -> None:
    """The analysis reads what specsweep.measure.metrics writes (names and units), point values included."""
    rng = np.random.default_rng(8)
    for arm, mean in (("baseline", 1.0), ("eagle3", 0.8)):
        df = correlated_requests(4, 40, 32, mean, rng, repeats=2)
        write_synthetic_cell(tmp_path, arm, 4, df)  # through summary.summary_body and write_cell
    ar = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    agg = ar["metrics"]["aggregate_tok_s"]
    assert agg["baseline"][0] is not None and agg["speedup"][0] is not None
    assert agg["speedup_lo"][0] <= agg["speedup"][0] <= agg["speedup_hi"][0]
    assert ar["metrics"]["tpot_p50_s"]["baseline"][0] < 1.0
    # two repeats with their own metrics and steady windows in summary.json: t across repeats, no R=1 note
    assert ar["n_repeats"] == {"baseline": [2], "spec": [2]}
    assert ar["within_run_only"] is False and ar["interval_note"].startswith("2 repeats")


def test_one_repeat_note(tmp_path: Path) -> None:
    write_synthetic_variant(tmp_path, [1, 2], lambda c: 1.5, requests_per_level=lambda c: 40, seed=9)
    ar = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    assert ar["within_run_only"] is True and ar["interval_note"] == INTERVAL_NOTE_ONE_REPEAT
    assert INTERVAL_NOTE_ONE_REPEAT in ar["notes"] and ar["n_repeats"]["spec"] == [1, 1]
    write_synthetic_variant(tmp_path / "r3", [1, 2], lambda c: 1.5, repeats=3, run_sd=0.05, seed=9)
    ar3 = analyze_variant(_load(tmp_path / "r3"), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    assert ar3["within_run_only"] is False and ar3["interval_note"] is None
    assert ar3["per_level"][0]["spec_n_repeats"] == 3
