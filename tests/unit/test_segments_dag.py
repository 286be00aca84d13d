"""The Kimi example's DAG (a Snakemake dry run): each fixed arm on two server instances, in counterbalanced
segments (baseline i1, eagle3 i1, eagle3 i2, baseline i2), each segment's levels from the highest down, and each
level's cells merged from the segments. Golden: tests/golden/kimi-k25-8gpu.segments.json (regenerate with
SPECSWEEP_UPDATE_GOLDEN=1 and review the diff)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, SNAKEMAKE

pytestmark = pytest.mark.unit
GOLDEN = REPO / "tests" / "golden" / "kimi-k25-8gpu.segments.json"


def dry_run_jobs(tmp_path: Path) -> list[dict[str, str]]:
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-n", "--cores", "1", "crossover"]
    cmd += ["--configfile", str(REPO / "config" / "examples" / "kimi-k25-8gpu.yaml")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule )", proc.stdout):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        wc = re.search(r"wildcards: (.*)", block)
        pr = re.search(r"priority: (-?\d+)", block)
        job = {"rule": m.group(1), "priority": int(pr.group(1)) if pr else 0}
        job.update(dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {})
        jobs.append(job)
    return jobs


def test_kimi_segments_are_counterbalanced(tmp_path: Path) -> None:
    jobs = dry_run_jobs(tmp_path)
    cells = sorted((j for j in jobs if j["rule"] == "instance_cell"), key=lambda j: -j["priority"])
    order: dict[str, list[str]] = {}
    for j in cells:  # the order Snakemake runs them in: segments one after another, highest level first
        seg = f"{j['arm']} i{j['instance']}"
        segs = order.setdefault(j["variant"], [])
        if not segs or segs[-1].split(" @ ")[0] != seg:
            segs.append(f"{seg} @ {j['level']}")
        else:
            segs[-1] += f",{j['level']}"
    merges = sorted({(j["variant"], j["level"]) for j in jobs if j["rule"] == "merge_segments"})
    got = {"segments": order, "merged_levels": [f"{v}/{lv}" for v, lv in merges]}
    if os.environ.get("SPECSWEEP_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text()), f"the segment order changed; if intended, regenerate {GOLDEN}"
    for segs in order.values():
        arms = [s.split(" @ ")[0] for s in segs]
        assert arms == ["baseline i1", "eagle3 i1", "eagle3 i2", "baseline i2"]
        assert all(s.endswith("c250,c100,c70,c30,c10,c5,c2,c1") for s in segs)
