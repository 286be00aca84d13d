"""Paired measurement against host drift: the same slow-down biases arms measured one after the other, and leaves
arms measured in interleaved blocks where an undisturbed run puts them.

The drift fault (specsweep.sim.faults.HostDrift) slows every simulated server on the machine by 30% from a moment
on. In the sequential design that moment is when the speculative arm's server starts, so the slow-down covers
exactly one arm's measurement, as a slow host period would. In the interleaved design it starts as long after the
first server as it did there: levels before it are undisturbed, levels after it are slowed in every arm alike, and
the level it falls into sees its reference arm drift between its first and last block: flagged
(`gates.max_block_drift`), its rounds kept, the round whose blocks straddle the change in their spread.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
import yaml

from specsweep.config import validate
from specsweep.measure.summary import read_judged
from specsweep.sim.faults import DRIFT_ENV
from tests.conftest import sim_server_processes
from tests.pipeline.conftest import snakemake

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(600)]

LEVELS = [1, 4, 16]
DRIFT = 1.3
CONFIG: dict[str, Any] = {
    "experiment": "drift",
    "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
    "concurrency": LEVELS,
    # three blocks per arm and level (A B | B A | A B): the clean run's interval is the yardstick of both designs'
    # tests, and with two rounds (a t of 1 degree of freedom, 12.7) it spanned 1.01-2.51 at C=1 around 1.56
    "repeats": 3,
    # at least 32 requests a block: at C=1 with 12, the speculative arm's blocks differed by 7% (328 vs 354 tok/s)
    # from the simulated acceptance's draws alone, the baseline's by 0.4%
    "workload": {
        "input_tokens": 16,
        "output_tokens": 24,
        "requests": {"per_concurrency": 4, "floor": 32},
        "warmup_requests": 0,  # the simulated engine has nothing to warm
    },
    "client": {"idle_probe_s": 0.0},  # kernel-stamped chunks: the host's idle lag is a flag's baseline, no gate's
    "gates": {"max_block_drift": 0.1},
    "analysis": {"bootstrap_samples": 400},
    "policy": {"measure": False},
    "mlflow": {"enabled": False},
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {"sim": {"engine": "sim", "profile": "demo"}},
}


def run(workdir: Path, mode: str, drift_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump({**CONFIG, "pairing": {"mode": mode}}))
    return snakemake(workdir, "crossover", env={DRIFT_ENV: str(drift_file)} if drift_file else None)


def per_level(workdir: Path) -> dict[float, dict[str, Any]]:
    x = json.loads((workdir / "results" / "drift" / "sim" / "crossover.json").read_text())
    return {r["concurrency"]: r for r in x["arms"]["eagle3"]["per_level"]}


def events(workdir: Path) -> list[str]:
    log = workdir / "results" / "drift" / ".servers" / "servers.log"
    return log.read_text().splitlines() if log.exists() else []


class DriftAt(threading.Thread):
    """Writes the drift file (DRIFT from then on) once `when(events, t_first_start)` says so."""

    def __init__(self, workdir: Path, path: Path, when: Any) -> None:
        super().__init__(daemon=True)
        self.workdir, self.path, self.when = workdir, path, when
        self.fired_at: float | None = None
        self.first_start: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            ev = events(self.workdir)
            if self.first_start is None and any(" start " in e for e in ev):
                self.first_start = time.time()
            if self.first_start is not None and self.when(ev, self.first_start):
                self.fired_at = time.time()
                self.path.write_text(json.dumps({"factor": DRIFT, "start_unix": self.fired_at, "end_unix": 4e9}))
                return
            time.sleep(0.02)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairing")
    out = {"clean": root / "clean", "sequential": root / "sequential", "interleaved": root / "interleaved"}
    proc = run(out["clean"], "interleaved")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    seq_file = root / "drift-sequential.json"
    seq = DriftAt(out["sequential"], seq_file, lambda ev, t0: any(" start label=sim/eagle3" in e for e in ev))
    seq.start()
    proc = run(out["sequential"], "sequential", seq_file)
    seq.stop.set()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert seq.fired_at is not None and seq.first_start is not None
    offset = seq.fired_at - seq.first_start  # the baseline arm's whole sweep

    int_file = root / "drift-interleaved.json"
    inter = DriftAt(out["interleaved"], int_file, lambda ev, t0: time.time() - t0 >= offset)
    inter.start()
    proc = run(out["interleaved"], "interleaved", int_file)
    inter.stop.set()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert inter.fired_at is not None, "the drift never started: the interleaved run ended before the offset"
    assert not sim_server_processes(root)
    return out


Z_APART = 4.0  # standard errors of two runs' difference: by chance once in ~16,000 levels


def log_se(row: dict[str, Any]) -> float:
    """The standard error of log(speedup), from its 95% interval."""
    return (math.log(row["speedup_hi"]) - math.log(row["speedup_lo"])) / (2 * NormalDist().inv_cdf(0.975))


def z_apart(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How many standard errors of their difference two runs' speedups at one level lie apart."""
    return abs(math.log(a["speedup"]) - math.log(b["speedup"])) / math.hypot(log_se(a), log_se(b))


def test_sequential_design_is_biased_by_drift(runs: dict[str, Path]) -> None:
    clean, drifted = per_level(runs["clean"]), per_level(runs["sequential"])
    for c in LEVELS:
        assert clean[c]["used"] and drifted[c]["used"], (clean[c], drifted[c])
        # the speculative arm ran 30% slower: its speedup reads ~1/1.3 of the truth, below the clean interval
        assert drifted[c]["speedup"] < clean[c]["speedup_lo"], (c, drifted[c]["speedup"], clean[c])
        assert drifted[c]["speedup"] == pytest.approx(clean[c]["speedup"] / DRIFT, rel=0.12)


def test_interleaved_design_agrees_with_the_undisturbed_run(runs: dict[str, Path]) -> None:
    """Within both runs' noise, not inside the clean run's interval: that asks a point that has noise of its own to
    fall inside the other run's 95% interval, which two runs of equal noise miss 16% of the time per level
    (1.4528 against [1.4530, 1.546] at C=1 in one CI run, 2.8% and 1.3 standard errors from the clean point;
    the sequential design's speedups lay 10, 7.7 and 5.3 standard errors from it at C = 1, 4, 16)."""
    clean, drifted = per_level(runs["clean"]), per_level(runs["interleaved"])
    res = runs["interleaved"] / "results" / "drift" / "sim"
    gates = validate({**CONFIG, "pairing": {"mode": "interleaved"}})["gates"]
    for c in LEVELS:
        assert clean[c]["used"] and drifted[c]["used"], (clean[c], drifted[c])
        assert drifted[c]["paired"] is not None
        assert z_apart(drifted[c], clean[c]) < Z_APART, (c, drifted[c], clean[c])
        flags = [
            f for arm in ("baseline", "eagle3") for f in read_judged(res / arm / f"c{c}", gates)[0]["validity"]["flags"]
        ]
        if any(f.startswith("drift:") for f in flags):
            # the level the change fell into: kept, its rounds' spread holding the round that straddled it (up
            # to a third of log 1.3 in its point, which its interval covers: the z above)
            continue
        assert drifted[c]["speedup"] == pytest.approx(clean[c]["speedup"], rel=0.1), (c, drifted[c], clean[c])


def test_interleaved_level_records_its_blocks_and_attempts(runs: dict[str, Path]) -> None:
    res = runs["interleaved"] / "results" / "drift" / "sim"
    for c in LEVELS:
        base = json.loads((res / "baseline" / f"c{c}" / "summary.json").read_text())
        spec = json.loads((res / "eagle3" / f"c{c}" / "summary.json").read_text())
        assert base["pairing"]["id"] == spec["pairing"]["id"]
        order = [["baseline", "eagle3"], ["eagle3", "baseline"], ["baseline", "eagle3"]]
        assert base["pairing"]["order"] == order
        starts = [b["start_unix"] for b in base["pairing"]["blocks"]]
        assert starts == sorted(starts)
        assert [b["arm"] for b in base["pairing"]["blocks"]] == [arm for round_ in order for arm in round_]
        log = (base.get("attempts") or {}).get("log") or []  # present where the level was measured again
        assert spec.get("attempts") == base.get("attempts")  # the level heals as one: every arm's cell says so
        for a in log[:-1]:  # an attempt that did not count is kept beside each cell
            for arm in ("baseline", "eagle3"):
                assert (res / arm / f"c{c}" / a["kept_at"] / "summary.json").is_file(), (arm, c, a)


def test_replicated_instances_run_in_counterbalanced_segments(tmp_path: Path) -> None:
    """pairing.mode sequential with two instances per arm (the GPU box's design, on the simulator): four server
    starts in the order baseline, eagle3, eagle3, baseline, each level's cell merged from both instances, and
    the speedup paired across the segments. With precision.max_instances 3 and a target no two or three instances
    reach (+-0.5%: two instances' t has about one degree of freedom, 12.7), the segment rule adds a third pair at
    every level, in the order continued (baseline i3, eagle3 i3: two more starts, not one per level), and each
    level then says it spent its budget, with the instances its spread implies."""
    config = {**CONFIG, "concurrency": [1, 4], "repeats": 1, "pairing": {"mode": "sequential", "instances": 2}}
    # the width alone stops it here (no verdict stop): the budget's path is what this test runs
    config["precision"] = {"target": 0.005, "max_instances": 3, "decide_margin": None}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    starts = [e.split(" label=")[1].split()[0] for e in events(tmp_path) if " start " in e]
    assert starts == ["sim/baseline", "sim/eagle3", "sim/eagle3", "sim/baseline", "sim/baseline", "sim/eagle3"], starts
    res = tmp_path / "results" / "drift" / "sim"
    levels = per_level(tmp_path)
    for c in (1, 4):
        base = json.loads((res / "baseline" / f"c{c}" / "summary.json").read_text())
        assert base["pairing"]["mode"] == "segments" and len(base["server"]["instances"]) == 3
        assert [(b["arm"], b["instance"]) for b in base["pairing"]["blocks"]] == [
            ("baseline", 1),
            ("eagle3", 1),
            ("eagle3", 2),
            ("baseline", 2),
            ("baseline", 3),
            ("eagle3", 3),
        ]
        ids = {i["identity"] for i in base["server"]["instances"]}
        assert len(ids) == 3  # three server instances, not one reused
        log = base["pairing"]["instance_log"]
        assert (log["instances"], log["max_instances"]) == (3, 3), log
        assert log["decisions"][0].startswith("i2: +-") and log["decisions"][0].endswith("> +-0.5%"), log
        assert log["decisions"][-1] == "i3: budget spent: max_instances 3", log
        assert levels[c]["used"] and levels[c]["paired"]["unit"] == "instance", levels[c]
        precision = levels[c]["precision"]
        assert precision["unit"] == "instance" and precision["rounds"] == 3, precision
        assert precision["budget_spent"] and not precision["met"], precision
        assert precision["rounds_for_target"] is None or precision["rounds_for_target"] > 3, precision
    notes = json.loads((res / "crossover.json").read_text())["arms"]["eagle3"]["verdict"]["notes"]
    assert any("after 3 server instances per arm (its budget spent)" in n for n in notes), notes
    assert not sim_server_processes(tmp_path)
