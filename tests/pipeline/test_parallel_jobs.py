"""`snakemake --cores 2` on two variants, as a user types it by habit: a measuring job asks for every core
(MEASURE_THREADS), so it runs alone; every cell is valid and each server starts once, while builds, analysis and
MLflow jobs run beside one another. The two variants' tracking jobs open the new MLflow store together
(tracking.store.schema_lock) and both log."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from specsweep.config import defaults
from specsweep.measure.summary import read_judged
from tests.conftest import REPO
from tests.pipeline.conftest import EXP, mlflow_runs, server_events, snakemake, starts

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(600)]

VARIANTS = ("sim", "sim-fused")


def test_two_cores_measure_alone(tmp_path: Path, no_leftover_servers: None) -> None:
    config = yaml.safe_load((REPO / "tests" / "pipeline" / "tiny.yaml").read_text())
    config["variants"]["sim-fused"] = {"engine": "sim", "profile": "demo-fused"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "crossover", cores=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    spans: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for summary in sorted((tmp_path / "results" / EXP).glob("*/*/c*/summary.json")):
        judged = read_judged(summary.parent, defaults("gates"))[0]
        assert judged["validity"]["valid"], (summary, judged["validity"])
        cell = json.loads(summary.read_text())
        spans[summary.relative_to(tmp_path / "results" / EXP).parts[0]].append(
            (cell["t0_unix"], cell["t0_unix"] + cell["level_s"])
        )
    assert all(len(spans[v]) == 4 for v in VARIANTS), spans  # 2 arms x C = 1, 4
    # no moment at which both variants were measuring
    for (a0, a1), (b0, b1) in itertools.product(spans["sim"], spans["sim-fused"]):
        assert a1 <= b0 or b1 <= a0, ((a0, a1), (b0, b1))

    # and each server started once: two variants' levels taking turns on the host's CPUs would stop one
    # variant's servers for the other's at every level (seen without the limit: 8 starts for 4 servers)
    events = server_events(tmp_path)
    assert len(starts(events)) == 4, events

    runs = mlflow_runs(tmp_path)
    crossovers = runs[runs["tags.specsweep.kind"] == "crossover"]
    assert sorted(crossovers["tags.specsweep.variant"]) == sorted(VARIANTS), crossovers.to_dict()
