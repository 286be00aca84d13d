"""Open-loop and trace sweeps through the DAG on the simulated engine: valid cells, running requests measured
two ways, the crossover in running requests and the policy that uses it; an open sweep agrees with a closed
sweep of the same arm when both are expressed in running requests; a bad trace stops before any server."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from specsweep.config import defaults
from specsweep.measure.summary import read_judged
from tests.pipeline.conftest import snakemake

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]

WORKLOAD = {"input_tokens": 64, "output_tokens": 32, "warmup_requests": 1, "seed": 3}
BASE = {
    "repeats": 1,
    "workload": WORKLOAD,
    "analysis": {"bootstrap_samples": 200, "primary_metric": "tpot_p50_s"},
    "policy": {"measure": False},
    "mlflow": {"enabled": False},  # nothing here reads MLflow: its tracking jobs are other tests' (test_mlflow_layout)
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {"sim": {"engine": "sim", "profile": "demo"}},
}
RATES = (15, 60, 180)  # demo profile: speculation lowers TPOT at 15 and 60 requests/s, raises it at 180
CLOSED = (1, 4, 30)  # brackets the running requests the open levels reach


def run(workdir: Path, config: dict) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(workdir, "crossover", timeout=600)
    (workdir / "run.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("openloop")
    run(root / "open", {**BASE, "experiment": "open", "load": {"mode": "open", "rates": list(RATES), "duration_s": 6}})
    run(
        root / "closed",
        {**BASE, "experiment": "closed", "concurrency": list(CLOSED), "analysis": {"bootstrap_samples": 200}},
    )
    return {
        "open": root / "open" / "results" / "open" / "sim",
        "closed": root / "closed" / "results" / "closed" / "sim",
    }


def cell(variant_dir: Path, arm: str, level: str) -> dict:
    return read_judged(variant_dir / arm / level, defaults("gates"))[0]


def test_open_cells_are_valid_and_measure_running_requests_two_ways(sweeps: dict[str, Path]) -> None:
    for arm in ("baseline", "eagle3"):
        for rate in RATES:
            s = cell(sweeps["open"], arm, f"r{rate}")
            assert s["validity"]["valid"], (arm, rate, s["validity"])
            assert s["cell"]["load"] == "open" and s["cell"]["level"] == rate
            assert s["cell"]["key"] == f"open/sim/{arm}/r{rate}"
            m = s["metrics"]
            assert m["load"] == "open" and m["held_share"] == 0.0
            assert m["achieved_rate_rps"] == pytest.approx(rate, rel=0.35)  # Poisson: 6 s of arrivals
            rr = m["running_requests"]
            assert rr["littles_law"] == pytest.approx(rr["mean"], rel=0.2), rr  # two measures of one quantity
            assert s["workload"]["arrivals"]["mode"] == "open" and s["workload"]["arrivals"]["level"] == rate


def test_open_sweep_crossover_is_given_in_running_requests_and_sets_the_policy(sweeps: dict[str, Path]) -> None:
    result = json.loads((sweeps["open"] / "crossover.json").read_text())
    assert result["load"] == "open"
    ar = result["arms"]["eagle3"]
    speedups = [r["speedup"] for r in ar["per_level"]]
    assert speedups[0] > 1 > speedups[-1], speedups  # faster at low rates, slower at 180/s
    running = ar["running_requests"]
    assert [r["level"] for r in running["per_level"]] == list(RATES)
    x, rx = ar["crossover"], running["crossover"]
    assert x["states"]["estimate"] == "within"
    lo_run = min(min(r["baseline"], r["spec"]) for r in running["per_level"])
    hi_run = max(max(r["baseline"], r["spec"]) for r in running["per_level"])
    assert lo_run <= rx["estimate"] <= hi_run  # a running-request count inside the measured curve
    policy = yaml.safe_load((sweeps["open"] / "policy.yaml").read_text())["arms"]["eagle3"]
    if policy["threshold"] is not None:  # the policy counts running requests, not requests/s
        assert policy["threshold"] == math.floor(rx["lo"]) if rx["states"]["lo"] == "within" else True
    table = (sweeps["open"].parents[2] / "run.log").read_text()
    assert "req/s |" in table and "crossover in running requests" in table


def log_interp(x: float, xs: list[float], ys: list[float]) -> float:
    return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))))


def test_open_and_closed_sweeps_agree_in_running_requests(sweeps: dict[str, Path]) -> None:
    """The same arm's TPOT at the batch an open level ran with (its running requests while busy) equals the
    closed sweep's TPOT at that concurrency (interpolated between its levels): the two kinds of sweep measure
    one server."""
    for arm in ("baseline", "eagle3"):
        closed = [cell(sweeps["closed"], arm, f"c{c}")["metrics"] for c in CLOSED]
        xs = [m["running_requests"]["busy_mean"] for m in closed]
        ys = [m["tpot_ms"]["p50"] for m in closed]
        for rate in RATES[:2]:  # the levels whose running requests the closed grid brackets
            m = cell(sweeps["open"], arm, f"r{rate}")["metrics"]
            running = max(m["running_requests"]["busy_mean"], xs[0])  # the batch a decode step ran with
            expect = log_interp(running, xs, ys)
            assert m["tpot_ms"]["p50"] == pytest.approx(expect, rel=0.2), (
                arm,
                rate,
                running,
                m["tpot_ms"]["p50"],
                expect,
            )


def write_trace(path: Path, n: int = 60, rate: float = 10.0) -> Path:
    rng = random.Random(3)
    t, rows = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate) * 1000
        blocks = [1, 2] if i % 3 else [7]
        rows.append(
            {
                "timestamp": round(t),
                "input_length": rng.randint(40, 90),
                "output_length": rng.randint(16, 40),
                "hash_ids": [*blocks, 100 + i],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trace_replay_runs_per_arm_with_its_own_prefix_reuse(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl")
    config = {
        **BASE,
        "experiment": "trace",
        "load": {"mode": "trace", "trace": {"path": str(trace), "time_scales": [1, 3], "block_tokens": 16}},
    }
    run(tmp_path, config)
    for arm in ("baseline", "eagle3"):
        for scale in (1, 3):
            s = cell(tmp_path / "results" / "trace" / "sim", arm, f"t{scale}")
            assert s["validity"]["valid"], (arm, scale, s["validity"])
            assert s["workload"]["arrivals"]["offered_rate_rps"] == pytest.approx(10.0 * scale, rel=0.3)
            assert s["metrics"]["n_requests"] == 60
            share, hit = s["workload"]["expected_prefix_share"], s["metrics"]["prefix_cache"]["hit_rate"]
            assert share > 0.2 and hit == pytest.approx(share, abs=0.05)  # the trace's own reuse, no other cell's
    result = json.loads((tmp_path / "results" / "trace" / "sim" / "crossover.json").read_text())
    assert result["load"] == "trace" and result["arms"]["eagle3"]["running_requests"]["per_level"]


def test_a_bad_trace_stops_before_any_server_starts(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", n=5)
    lines = trace.read_text().splitlines()
    lines[3] = lines[3].replace('"output_length"', '"out_len"')
    trace.write_text("\n".join(lines) + "\n")
    config = {**BASE, "experiment": "bad", "load": {"mode": "trace", "trace": {"path": str(trace)}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "crossover", timeout=120)
    assert proc.returncode != 0
    assert f"{trace}:4: missing field 'output_length'" in proc.stdout + proc.stderr
    assert not (tmp_path / "results" / "bad" / ".servers" / "servers.log").exists()  # no server was started
