"""Fault-suite helpers: cells measured directly (no Snakemake) against a simulated engine with faults."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from specsweep import config as ssconfig
from specsweep.serving import servers


def tiny_config(**variant_extra: Any) -> dict[str, Any]:
    raw = {
        "experiment": "faults",
        "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
        "concurrency": [4],
        "workload": {
            "input_tokens": 8,
            "output_tokens": 24,
            "requests": {"floor": 12},
            "warmup_requests": 0,
            "request_timeout_s": 10,
        },
        "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
        "variants": {"sim": {"engine": "sim", "profile": "demo", **variant_extra}},
    }
    return ssconfig.validate(raw)


class CellRunner:
    """Runs one cell of a config in a temporary experiment folder; stops its servers afterwards."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.log_dir = root / "server-logs"
        self.env_json = root / "env.json"
        self.env_json.write_text(json.dumps({"python_executable": sys.executable}))

    def out_dir(self, name: str) -> Path:
        return self.root / "cells" / name

    def run(
        self, cfg: dict[str, Any], arm: str = "baseline", concurrency: int = 4, name: str = "cell", variant: str = "sim"
    ) -> dict:
        from specsweep.measure.cell import run_cell

        cfg = {**cfg, "results_dir": str(self.root / "results")}
        from specsweep.measure.summary import judged

        spec = ssconfig.cell_spec(cfg, variant, arm, concurrency)
        timeout = ssconfig.startup_timeout_s(cfg, variant)  # a resource of the cell rule, not part of the spec
        records, summary = run_cell(spec, self.env_json, self.out_dir(name), self.state_dir, self.log_dir, timeout)
        return judged(summary, records, cfg["gates"], cfg["slo"])  # as the analysis judges it

    def all_text(self) -> str:
        """Everything this runner wrote, as text (binary files decoded leniently)."""
        return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in self.root.rglob("*") if p.is_file())


@pytest.fixture
def cells(tmp_path: Path):
    runner = CellRunner(tmp_path)
    yield runner
    servers.stop_all(runner.state_dir, reason="test end")
