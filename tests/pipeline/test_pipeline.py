"""The Snakemake DAG end to end on the simulated engine: files, MLflow runs, server reuse, --forcerun of one cell."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specsweep.config import defaults
from specsweep.measure.metrics import aborted, measured
from specsweep.measure.summary import read_judged
from tests.conftest import REPO, sim_server_processes
from tests.pipeline.conftest import EXP, mlflow_runs, server_events, snakemake, starts
from tests.support.contract import missing

pytestmark = pytest.mark.pipeline

LEVELS = (1, 4)
ARMS = ("baseline", "eagle3")


def test_cells_written(run_dir: Path) -> None:
    for arm in ARMS:
        for c in LEVELS:
            cell = run_dir / "results" / EXP / "sim" / arm / f"c{c}"
            df = pd.read_parquet(cell / "requests.parquet")
            summary = read_judged(cell, defaults("gates"))[0]  # tiny.yaml keeps the default gates
            n = max(8, 4 * c)  # measured requests after C ramp requests (tiny.yaml: per_concurrency 4, floor 8)
            assert int(measured(df).sum()) == 2 * n, (arm, c)  # two repeats, each its own record
            assert int(df["ramp"].sum()) == 2 * c
            # fillers (at most two per slot) keep the slots busy to the last measured end; those still running
            # then were aborted, and nothing else was
            stopped = aborted(df)
            assert int(df["filler"].sum()) <= 2 * 2 * c and df["filler"][stopped].all()
            df = df[~stopped]
            assert sorted(df["repeat"].unique()) == [0, 1]
            assert [r["repeat"] for r in summary["repeats"]] == [0, 1]
            assert summary["metrics"]["n_repeats"] == 2
            assert df["ok"].all()
            assert (df["output_tokens"] == df["expected_output_tokens"]).all()
            assert (df["server_output_tokens"] == df["expected_output_tokens"]).all()
            assert (df[~df["ramp"]]["output_tokens"] == 12).all()  # ramp requests ask (k+1)/C of it
            assert summary["cell"] == {
                "experiment": EXP,
                "variant": "sim",
                "arm": arm,
                "concurrency": c,
                "key": f"{EXP}/sim/{arm}/c{c}",
                "speculative": arm == "eagle3",
            }
            assert summary["source"] == "simulated"
            m = summary["metrics"]
            assert m["output_tok_s_steady"] > 0
            for key in ("ttft_ms", "tpot_ms", "itl_token_ms", "e2e_ms"):
                assert {"mean", "p50", "p90", "p99"} <= set(m[key])
            if arm == "eagle3":
                assert m["accept_length"] > 1.0
            assert summary["validity"]["valid"], summary["validity"]
            assert summary["server"]["identity"]
            for rep in summary["repeats"]:  # isolated: a cache reset and a prompt set of its own per repeat
                assert rep["cache_reset"] == "flushed"
                assert rep["metrics"]["prefix_cache"]["hit_rate"] == 0.0
            assert len({rep["prompt_set_sha256"] for rep in summary["repeats"]}) == 2
            # the host's idle loop lag, probed before the arm's first block of the level, stands for its later blocks
            idle = [rep["metrics"]["client"]["idle_lag_ms"] for rep in summary["repeats"]]
            assert idle[0]["n"] and idle == [idle[0]] * len(idle), idle
            client = summary["metrics"]["client"]
            assert client["busy_share"] is not None and client["wait_share"] is not None
            assert summary["cpus"]["client"] and summary["cpus"]["server"]


@pytest.mark.parametrize("name", ["summary", "crossover"])
def test_outputs_keep_their_recorded_contract(run_dir: Path, name: str) -> None:
    """summary.json and crossover.json have every key path they had before the package moved into folders by
    concern (tests/golden/pipeline.<name>.keys.json, recorded from this run at commit 4e8446c): a reader of
    either file finds what it read before. A key removed on purpose leaves the recorded list by hand, in the
    commit that changes its readers."""
    results = run_dir / "results" / EXP / "sim"
    files = (
        sorted(p for p in results.glob("*/c*/summary.json") if "attempts" not in p.parts)
        if name == "summary"
        else [results / "crossover.json"]
    )
    assert files
    gone = missing(REPO / "tests" / "golden" / f"pipeline.{name}.keys.json", files)
    assert not gone, f"{name}.json lost key paths its readers use: {gone}"


def test_fingerprint_written(run_dir: Path) -> None:
    fp = json.loads((run_dir / "results" / EXP / "envs" / "sim.json").read_text())
    assert fp["engine"] == "sim"
    assert fp["python"]


def test_crossover_and_final_print(run_dir: Path) -> None:
    out = json.loads((run_dir / "results" / EXP / "sim" / "crossover.json").read_text())
    assert out["arms"]["eagle3"]["levels"] == list(LEVELS)
    for row in out["arms"]["eagle3"]["per_level"]:  # speculation is lossless on the simulated engine
        match = row["output_match"]
        assert match["share"] == 1.0 and match["compared"] >= row["spec_n_requests"], row
    assert (run_dir / "results" / EXP / "sim" / "plots" / "speedup.png").stat().st_size > 0
    assert (run_dir / "results" / EXP / "sim" / "policy.yaml").exists()
    text = (run_dir / "first_run.log").read_text()
    assert "speedup [95% CI]" in text
    assert f"results: {(run_dir / 'results' / EXP).resolve()}" in text
    assert f"mlflow ui --backend-store-uri sqlite:///{(run_dir / 'results' / 'mlflow.db').resolve()}" in text


def test_each_server_started_once_and_stopped(run_dir: Path) -> None:
    events = server_events(run_dir)
    assert len(starts(events)) == 2, events
    assert {e.split("label=")[1].split()[0] for e in starts(events)} == {"sim/baseline", "sim/eagle3"}
    # each level job acquires both servers once per attempt (a level measured again after a busy spell acquires
    # them again): every acquisition but the first of each server is a reuse
    res = run_dir / "results" / EXP / "sim" / "baseline"
    made = [
        (json.loads((res / f"c{c}" / "summary.json").read_text()).get("attempts") or {}).get("made", 1) for c in LEVELS
    ]
    assert sum(" reuse " in e for e in events) == 2 * sum(made) - 2, (made, events)
    deadline = time.monotonic() + 30
    while sim_server_processes(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not sim_server_processes(run_dir)
    assert not list((run_dir / "results" / EXP / ".servers").glob("*.json"))


def test_each_server_measures_its_levels_from_the_highest_down(run_dir: Path) -> None:
    """One order for every arm (config.cell_priority): the arms meet a server's first minute at the same level."""
    res = run_dir / "results" / EXP / "sim"
    for arm in ("baseline", "eagle3"):
        t0 = {c: json.loads((res / arm / f"c{c}" / "summary.json").read_text())["t0_unix"] for c in (1, 4)}
        assert t0[4] < t0[1], (arm, t0)


def test_mlflow_runs(run_dir: Path) -> None:
    runs = mlflow_runs(run_dir)
    kinds = runs["tags.specsweep.kind"].value_counts().to_dict()
    assert kinds == {"cell": 4, "sweep": 2, "crossover": 1}
    cells = runs[runs["tags.specsweep.kind"] == "cell"]
    sweeps = runs[runs["tags.specsweep.kind"] == "sweep"]
    assert set(cells["tags.mlflow.parentRunId"]) == set(sweeps["run_id"])
    assert set(cells["params.concurrency"]) == {"1", "4"}
    assert cells["metrics.output_tok_s_steady"].gt(0).all()
    assert set(cells["tags.specsweep.cell_key"]) == {f"{EXP}/sim/{a}/c{c}" for a in ARMS for c in LEVELS}


def test_forcerun_one_cell(run_dir: Path) -> None:
    """--forcerun of one cell re-measures its level, which is the pair (both arms' cells at C=4: they are
    measured in interleaved blocks), and what aggregates it; the other level's cells stay as they were."""
    root = run_dir / "results" / EXP / "sim"
    untouched = {p: p.stat().st_mtime_ns for p in root.glob("*/c*/summary.json") if "/c4/" not in str(p)}
    pair = {p: p.stat().st_mtime_ns for p in root.glob("*/c4/summary.json")}
    before = len(starts(server_events(run_dir)))
    target = f"results/{EXP}/sim/eagle3/c4/summary.json"
    proc = snakemake(run_dir, "crossover", "--forcerun", target)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in untouched} == untouched
    assert all(p.stat().st_mtime_ns != t for p, t in pair.items()) and len(pair) == 2
    new_starts = starts(server_events(run_dir))[before:]
    assert sorted(e.split("label=")[1].split()[0] for e in new_starts) == ["sim/baseline", "sim/eagle3"]
    jobs = proc.stdout + proc.stderr
    assert "paired_level" in jobs and "crossover_variant" in jobs
    runs = mlflow_runs(run_dir)
    cells = runs[runs["tags.specsweep.kind"] == "cell"]
    assert len(cells) == 4  # the re-measured cells have new runs; the ones they replaced are retired
    assert (cells["tags.specsweep.cell_key"] == f"{EXP}/sim/eagle3/c4").sum() == 1
    assert not sim_server_processes(run_dir)


def test_client_on_the_servers_core_is_thrown_out(tmp_path: Path, no_leftover_servers: None) -> None:
    """Client and server forced onto one core (`client.cpus` and the variant's `cpus` the same CPU): the cell is
    judged invalid by the shared-CPU gate, and its client figures are measured all the same. The gate is the
    engine's business only through the CPUs it is given, so the simulated server stands in for vLLM here (the
    real-engine tier asserts the whole vLLM tree is pinned where `cpus` says: test_every_cell_valid_and_isolated)."""
    core = str(max(os.sched_getaffinity(0)))
    config = yaml.safe_load((REPO / "tests" / "pipeline" / "tiny.yaml").read_text())
    config.update(concurrency=[4], repeats=1, client={"cpus": core}, pairing={"mode": "sequential"})
    config["variants"]["sim"]["cpus"] = core
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    target = f"results/{EXP}/sim/baseline/c4/summary.json"
    proc = snakemake(tmp_path, target)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = read_judged((tmp_path / target).parent, defaults("gates"))[0]
    assert s["cpus"]["client"] == s["cpus"]["server"] == s["cpus"]["shared"] == core
    assert not s["validity"]["valid"]
    assert any(f"client and server share CPUs {core}" in r for r in s["validity"]["reasons"]), s["validity"]
    client = s["metrics"]["client"]
    assert client["wait_share"] is not None and client["busy_share"] is not None  # measured either way
