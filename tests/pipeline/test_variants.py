"""Two variants through the `all` target: each variant's crossover, and the variants compared arm by arm."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from specsweep.config import defaults
from specsweep.summary import read_judged
from tests.conftest import sim_server_processes
from tests.pipeline.conftest import snakemake

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(300)]

CONFIG = {
    "experiment": "two",
    "concurrency": [1, 4],
    "workload": {"input_tokens": 16, "output_tokens": 12, "requests": {"floor": 4}, "warmup_requests": 1},
    "analysis": {"bootstrap_samples": 200},
    "mlflow": {"enabled": False},
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {
        "stack-a": {"engine": "sim", "profile": "demo"},
        # a stack whose server runs at most 2 requests at once: slower at C=4, and flagged as capped there
        "stack-b": {"engine": "sim", "profile": "demo", "sim_args": ["--max-running-requests", "2"]},
    },
}


def test_two_variants_compared(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    proc = snakemake(tmp_path, "all")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = tmp_path / "results" / "two"
    for v in ("stack-a", "stack-b"):
        assert json.loads((res / v / "crossover.json").read_text())["variant"] == v
    rows = list(csv.DictReader((res / "comparison" / "comparison_table.csv").open()))
    assert {(r["arm"], float(r["concurrency"])) for r in rows} == {
        (a, c) for a in ("baseline", "eagle3") for c in (1.0, 4.0)
    }
    at4 = {r["arm"]: float(r["tok_s_ratio"]) for r in rows if float(r["concurrency"]) == 4.0}
    assert all(ratio < 0.9 for ratio in at4.values()), at4  # the capped stack is slower at C=4
    summary = read_judged(res / "stack-b" / "baseline" / "c4", defaults("gates"))[0]
    assert any("running-request cap 2" in f for f in summary["validity"]["flags"])
    assert (res / "comparison" / "comparison_throughput.png").stat().st_size > 0
    assert "variants compared arm by arm" in proc.stdout + proc.stderr
    assert not sim_server_processes(tmp_path)
