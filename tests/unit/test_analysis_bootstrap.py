"""Bootstrap intervals and the variant analysis on synthetic cells with a known truth."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from specsweep.analysis.analyze import AnalysisSettings, analyze_variant, slo_seconds
from specsweep.analysis.bootstrap import bootstrap_cell, percentile_interval
from specsweep.analysis.cells import Cell, find_cells, load_cell, request_arrays
from specsweep.analysis.synthetic import synthetic_requests, write_synthetic_variant

pytestmark = pytest.mark.unit

LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]


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
        seed=11,
    )
    res = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())
    x = res["arms"]["eagle3"]["crossover"]
    assert x["states"] == {"estimate": "within", "lo": "within", "hi": "within"}
    assert x["lo"] <= math.exp(2) <= x["hi"]
    assert x["lo"] <= x["estimate"] <= x["hi"]
    ar = res["arms"]["eagle3"]
    assert ar["monotone"] and len(ar["crossings"]) == 1 and ar["crossings"][0]["direction"] == "down"
    assert ar["winner"] is None


def test_interval_coverage_about_95_percent() -> None:
    """Over many synthetic cell pairs the 95% interval of the throughput speedup covers the truth ~95%."""
    rng = np.random.default_rng(2024)
    truth = 1.25  # mean e2e 1.0 s vs 0.8 s at equal tokens and C
    hits, n_sets = 0, 200
    for k in range(n_sets):
        cells = []
        for mean in (1.0, 0.8):
            df = synthetic_requests(4, 60, 32, mean, 0.35, rng)
            cells.append(Cell("a", 4.0, Path("."), {"cell": {"key": f"{k}-{mean}"}}, request_arrays(df)))
        b, s = (bootstrap_cell(c, 400, k) for c in cells)
        lo, hi = percentile_interval(s.replicates["aggregate_tok_s"] / b.replicates["aggregate_tok_s"])
        hits += bool(lo <= truth <= hi)
    assert 0.88 <= hits / n_sets <= 0.99


def test_seeded_and_repeats_resampled() -> None:
    rng = np.random.default_rng(0)
    df = synthetic_requests(4, 30, 16, 1.0, 0.3, rng, repeats=3)
    cell = Cell("a", 4.0, Path("."), {"cell": {"key": "x"}}, request_arrays(df))
    a, b = bootstrap_cell(cell, 200, 5), bootstrap_cell(cell, 200, 5)
    np.testing.assert_array_equal(a.replicates["aggregate_tok_s"], b.replicates["aggregate_tok_s"])
    c = bootstrap_cell(cell, 200, 6)
    assert not np.array_equal(a.replicates["aggregate_tok_s"], c.replicates["aggregate_tok_s"])
    assert a.has_interval["aggregate_tok_s"] and np.all(np.isfinite(a.replicates["tpot_p99_s"]))
    # no SLO configured: goodput has no interval
    assert not a.has_interval["goodput_rps"]


def test_goodput_with_slo() -> None:
    rng = np.random.default_rng(1)
    df = synthetic_requests(4, 50, 16, 1.0, 0.3, rng)
    cell = Cell("a", 4.0, Path("."), {"cell": {"key": "g"}}, request_arrays(df))
    slo = slo_seconds({"e2e_ms": 1000.0, "ttft_ms": None})
    assert slo == {"e2e_s": 1.0}
    b = bootstrap_cell(cell, 200, 0, slo)
    assert b.has_interval["goodput_rps"]
    req = cell.requests
    expect = 4.0 * np.sum(req.e2e_s <= 1.0) / req.busy_s.sum()
    assert b.point["goodput_rps"] == pytest.approx(expect)


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


def test_latency_orientation_and_both_summary_layouts(tmp_path: Path) -> None:
    for layout in ("metrics", "seconds"):
        root = tmp_path / layout
        write_synthetic_variant(root, [1, 2], lambda c: 1.5, requests_per_level=lambda c: 100, seed=6, layout=layout)
        ar = analyze_variant(_load(root), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
        m = ar["metrics"]
        # speculation is faster: throughput ratio > 1 and latency ratio (baseline/spec) > 1 alike
        assert m["tpot_p50_s"]["orientation"] == "baseline/spec"
        assert all(v > 1.2 for v in m["aggregate_tok_s"]["speedup"])
        assert all(v > 1.2 for v in m["tpot_p50_s"]["speedup"])
        assert all(v > 1.2 for v in m["e2e_p50_s"]["speedup"])
        assert m["tpot_p50_s"]["baseline"][0] < 1.0  # seconds, whatever the summary's unit


def test_missing_parquet_gives_points_without_interval(tmp_path: Path) -> None:
    write_synthetic_variant(tmp_path, [1, 2], lambda c: 1.5, seed=7)
    (tmp_path / "eagle3" / "c2" / "requests.parquet").unlink()
    ar = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    agg = ar["metrics"]["aggregate_tok_s"]
    assert agg["interval_available"] == [True, False]
    assert agg["speedup_lo"][1] is None and agg["speedup"][1] is not None
    assert any("requests.parquet missing" in n for n in ar["notes"])


def test_summary_from_metrics_module(tmp_path: Path) -> None:
    """The analysis reads what specsweep.metrics writes (names and units), point values included."""
    metrics = pytest.importorskip("specsweep.metrics")
    rng = np.random.default_rng(8)
    for arm, mean in (("baseline", 1.0), ("eagle3", 0.8)):
        df = synthetic_requests(4, 40, 32, mean, 0.3, rng)
        s = metrics.jsonable(metrics.summarize(df, 4, 32))
        s.update(cell={"arm": arm, "concurrency": 4, "key": f"v/{arm}/c4"}, source="simulated", engine="sim")
        d = tmp_path / arm / "c4"
        d.mkdir(parents=True)
        df.to_parquet(d / "requests.parquet")
        (d / "summary.json").write_text(json.dumps(s))
    ar = analyze_variant(_load(tmp_path), "baseline", ["eagle3"], _settings())["arms"]["eagle3"]
    agg = ar["metrics"]["aggregate_tok_s"]
    assert agg["baseline"][0] is not None and agg["speedup"][0] is not None
    assert agg["speedup_lo"][0] <= agg["speedup"][0] <= agg["speedup_hi"][0]
    assert ar["metrics"]["tpot_p50_s"]["baseline"][0] < 1.0
