"""Each interleaved level is measured until its answer is known (`precision:`, analysis/precision.py): at least
min_rounds rounds, then rounds until the paired speedup's 95% half-width is within the target (judged after
complete A B | B A cycles) or the budget is spent; blocks grow where their own noise dominates. The analysis
reports what each level reached, and never a level short of its target as if it met it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specsweep.config import defaults
from specsweep.measure.metrics import measured as measured_rows
from specsweep.measure.summary import read_judged
from tests.conftest import REPO
from tests.pipeline.conftest import EXP, mlflow_runs, snakemake

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(600)]

TARGET = 0.05
MAX_ROUNDS = 6
RUN_S = 900


def test_levels_measured_until_their_answer_is_known(tmp_path: Path, no_leftover_servers: None) -> None:
    config = yaml.safe_load((REPO / "tests" / "pipeline" / "tiny.yaml").read_text())
    config["precision"] = {"target": TARGET, "min_rounds": 3, "max_rounds": MAX_ROUNDS, "max_block_growth": 4}
    config["workload"]["requests"] = {"per_concurrency": 2, "floor": 8, "max": 64}
    # the printed interval is the replicates' percentiles: enough of them that it reads the half-width it rests on
    config["analysis"]["bootstrap_samples"] = 4000
    # a run budget roomy enough to leave the levels their own (max_rounds): its clock, ledger and account are run
    config["budget"] = {"run_s": RUN_S}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    variant = tmp_path / "results" / EXP / "sim"
    for level in ("c1", "c4"):
        cells = {arm: variant / arm / level for arm in ("baseline", "eagle3")}
        for arm, cell in cells.items():
            judged = read_judged(cell, defaults("gates"))[0]
            assert judged["validity"]["valid"], (arm, level, judged["validity"])
        summary = json.loads((cells["eagle3"] / "summary.json").read_text())
        log = summary["pairing"]["precision"]
        n = log["rounds"]
        assert 3 <= n <= MAX_ROUNDS, log
        assert len(summary["pairing"]["blocks"]) == 2 * n  # both arms, every round
        sizes = log["block_requests"]
        assert len(sizes) == n and sizes == sorted(sizes), sizes  # blocks only grow
        # judged after complete A B | B A cycles: both rounds of a cycle have one block size, and a level stops on
        # its target after an even number of rounds only
        assert all(sizes[i] == sizes[i + 1] for i in range(0, n - 1, 2)), sizes
        assert not log["decisions"][-1].startswith("target met") or n % 2 == 0, log
        assert all(x.endswith("judged after complete cycles (A B | B A)") for x in log["decisions"][2:-1:2]), log
        assert max(sizes) <= 64  # never past workload.requests.max
        stops = ("target met", "budget spent", "verdict decided")
        assert len(log["decisions"]) == n and log["decisions"][-1].split(":")[0] in stops, log
        # each round sent the requests its block size says (the ramp's rows are not measured)
        records = pd.read_parquet(cells["eagle3"] / "requests.parquet")
        measured = records[measured_rows(records)]
        per_round = measured.groupby("repeat").size().to_dict()
        assert [per_round[r] for r in range(n)] == sizes, (per_round, sizes)

    crossover = json.loads((variant / "crossover.json").read_text())
    arm = crossover["arms"]["eagle3"]
    notes = arm["verdict"]["notes"]
    for row in arm["per_level"]:
        p = row["precision"]
        summary = json.loads((variant / "eagle3" / f"c{int(row['concurrency'])}" / "summary.json").read_text())
        log = summary["pairing"]["precision"]
        assert p["target"] == TARGET and p["rounds"] == log["rounds"] and p["requests"] == sum(log["block_requests"])
        assert p["met"] == (p["half_width"] <= TARGET), p
        # the reported interval is the one the half-width describes
        lo, hi, sp = row["speedup_lo"], row["speedup_hi"], row["speedup"]
        assert max(hi / sp, sp / lo) - 1 == pytest.approx(p["half_width"], rel=0.05)
        # a level the rule stopped on its target reads within it here too (the bootstrap's own sampling aside)
        if log["decisions"][-1].startswith("target met"):
            assert p["half_width"] <= TARGET * 1.1, p
        if p["decided"]:  # stopped short of the target on its verdict: named as such, its interval outside 1 +- 2%
            assert log["decisions"][-1].startswith("verdict decided") and not p["met"], log
            assert lo > 1.0 or hi < 1.0, row
            assert any("stopped short of it with their verdict known" in x for x in notes), notes
        elif not p["met"]:  # said, never shown as met
            short = [x for x in notes if x.startswith("precision: C=") and " short of the target " in x]
            assert len(short) == 1, notes  # one line per arm, listing the levels and the widest
            levels = short[0].removeprefix("precision: C=").split(" short of")[0].split(", ")
            assert f"{row['concurrency']:g}" in levels, notes
        assert p["within_round_var"] is not None and p["between_round_var"] is not None
        assert p["reference_between_round_var"] is not None and p["reference_between_round_var"] >= 0, p
    if all(r["precision"]["met"] for r in arm["per_level"]):
        assert any("every level within its target" in x for x in notes), notes
    # the printed table has each level's rounds and half-width
    assert "rounds  +-" in proc.stdout

    # the run's budget: every level job asked the run's clock and wrote its line; the run says how it spent it
    ledgers = list((tmp_path / "results" / EXP / "budget").glob("run-*.jsonl"))
    assert len(ledgers) == 1, ledgers
    done = [json.loads(x) for x in ledgers[0].read_text().splitlines()]
    assert {d["level"] for d in done} >= {"sim/fixed/c1", "sim/fixed/c4"} and all(d["seconds"] > 0 for d in done), done
    logs = tmp_path / "results" / EXP / "logs" / "cells"
    assert "run budget: " in (logs / "sim.paired.c1.log").read_text()
    assert f"run budget {RUN_S} s: the run took " in proc.stdout, proc.stdout[-2000:]

    runs = mlflow_runs(tmp_path)
    crossover_run = runs[runs["tags.specsweep.kind"] == "crossover"].iloc[0]
    assert crossover_run["metrics.eagle3.speedup_half_width"] > 0
    assert crossover_run["metrics.eagle3.speedup_rounds"] >= 3
