"""The files' typed contracts (specsweep.records): a missing field fails where it is read, naming the file, the field
and the fix, instead of becoming a default further on; writers are checked before anything is written; the
documented contract is the checked one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specsweep import config as ssconfig
from specsweep.analysis.cells import load_cell
from specsweep.measure.cell import CellError, prepare_cell
from specsweep.measure.summary import read_summary
from specsweep.records import CellSpec, Crossover, RecordError, check, read
from specsweep.records.doc import DOC_PATH, render
from tests.conftest import REPO
from tests.support.synthetic import correlated_requests, write_synthetic_cell

pytestmark = pytest.mark.unit


def _cell(tmp_path: Path) -> Path:
    df = correlated_requests(2, 12, 16, 0.2, np.random.default_rng(1))
    return write_synthetic_cell(tmp_path / "v", "baseline", 2, df)


def _drop(path: Path, *keys: str) -> None:
    data = json.loads(path.read_text())
    for dotted in keys:
        *parents, last = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        del node[last]
    path.write_text(json.dumps(data))


def test_docs_are_generated_from_the_records() -> None:
    assert DOC_PATH.read_text() == render(), "docs/records.md is stale: run `specsweep records-doc --write`"
    assert "| `source` | `Literal['simulated', 'real']` | yes |" in render()


def test_a_summary_missing_a_field_fails_where_it_is_read(tmp_path: Path) -> None:
    """Before: Cell.source read a summary without `source` as "unknown", and the analysis went on."""
    d = _cell(tmp_path)
    assert load_cell(d).source == "simulated"
    _drop(d / "summary.json", "source", "server.info")
    with pytest.raises(RecordError) as e:
        load_cell(d)
    text = str(e.value)
    assert str(d / "summary.json") in text and "source: missing" in text and "server.info: missing" in text
    assert "snakemake --forcerun" in text


def test_a_mistyped_field_is_named_with_what_it_holds(tmp_path: Path) -> None:
    d = _cell(tmp_path)
    data = json.loads((d / "summary.json").read_text())
    data["metrics"]["n_ok"] = "many"
    (d / "summary.json").write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"metrics\.n_ok: .*'many'"):
        read_summary(d / "summary.json")


def test_a_bench_level_is_its_own_record(tmp_path: Path) -> None:
    """`specsweep bench` writes levels without a cell block: read as such, not as a broken cell."""
    d = _cell(tmp_path)
    _drop(d / "summary.json", "cell", "source", "engine", "client_backend", "server", "stack", "level_s")
    cell = load_cell(d)
    assert cell.arm == "baseline" and cell.concurrency == 2.0 and cell.source == "unknown (specsweep bench)"
    _drop(d / "summary.json", "workload.n_requests")
    with pytest.raises(RecordError, match=r"not a valid MeasuredLevel: workload\.n_requests: missing"):
        load_cell(d)


def test_crossovers_of_real_runs_fit_and_a_lost_field_is_named(tmp_path: Path) -> None:
    doc = {"schema_version": 1, "experiment": "e", "variant": "v", "engine": "sim", "load": "closed"}
    with pytest.raises(RecordError, match="source: missing; baseline_arm: missing"):
        check(Crossover, doc, "a crossover", "rerun")
    path = tmp_path / "crossover.json"
    path.write_text("{not json")
    with pytest.raises(RecordError, match="is not JSON"):
        read(Crossover, path, "rerun")


def test_every_example_configs_cell_spec_fits_its_record() -> None:
    for path in sorted((REPO / "config" / "examples").glob("*.yaml")) + [REPO / "config" / "config.yaml"]:
        cfg = ssconfig.load(path)
        for variant in cfg["variants"]:
            for arm, arm_cfg in cfg["arms"].items():
                served = {"schedule": [[1, 16, 3], [17, 4096, 0]]} if arm_cfg.get("policy") else None
                check(CellSpec, ssconfig.cell_spec(cfg, variant, arm, 4, served=served), f"{path}:{arm}", "-")


def test_a_cell_spec_missing_a_field_is_a_cell_error(tmp_path: Path) -> None:
    cfg = ssconfig.load(REPO / "config" / "config.yaml")
    variant = next(iter(cfg["variants"]))
    spec = ssconfig.cell_spec(cfg, variant, cfg["analysis"]["baseline_arm"], 4)
    del spec["n_requests"]
    with pytest.raises(CellError, match=r"n_requests: missing.*specsweep\.config\.cell_spec"):
        prepare_cell(spec, tmp_path / "env.json")


def test_zero_requests_is_a_whole_trace_and_nothing_else() -> None:
    """A trace level measures its whole trace (n_requests 0); any other level with 0 would measure nothing."""
    cfg = ssconfig.load(REPO / "config" / "config.yaml")
    variant = next(iter(cfg["variants"]))
    spec = ssconfig.cell_spec(cfg, variant, cfg["analysis"]["baseline_arm"], 4)
    with pytest.raises(RecordError, match="only a trace level measures its whole trace"):
        check(CellSpec, {**spec, "n_requests": 0}, "a cell spec", "-")
    trace = {**spec, "n_requests": 0, "level": 1.0, "load": {"mode": "trace", "max_in_flight": 64}}
    assert check(CellSpec, trace, "a trace cell spec", "-").n_requests == 0
