"""Nothing leaves that should not: a user's prompts and the outputs they made stay under results/<experiment>/, and
the MLflow store (its database and its artifacts) holds neither unless the config opts in (`mlflow.log_texts`).

A dataset whose every prompt carries a marker, and a speculative arm whose simulated server corrupts outputs (the
word CORRUPTED in half of them), so that summary.json and crossover.json hold referral examples with output text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specsweep.tracking.private import WHY
from tests.pipeline.conftest import snakemake

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(240)]

EXP = "private"
MARKER = "qzxprivmarker4417"  # in every prompt; in no file name, no config value but the dataset's own lines
OUTPUT_WORD = "CORRUPTED"  # the corrupt fault's word in the speculative arm's outputs (specsweep.sim.server)
N = 40


def config(log_texts: bool) -> dict[str, Any]:
    """One level, one round, few requests (test_datasets.py's shape): an interleaved level refers each difference
    to the baseline server, so the referral's examples hold output text."""
    return {
        "experiment": EXP,
        "concurrency": [2],
        "repeats": 1,
        # measured once: whether a busy host leaves the cell valid is not this test's question (the outputs are
        # compared either way), and a re-measure after a wait for quiet would double its time
        "cell_attempts": 1,
        "precision": {"target": None},
        "workload": {
            "input_tokens": 16,
            "output_tokens": 12,
            "requests": {"per_concurrency": 4, "floor": 8},
            "warmup_requests": 1,
            "seed": 1,
            "dataset": {"path": "prompts.jsonl", "format": "prompts-jsonl", "name": "user-set"},
        },
        "analysis": {"bootstrap_samples": 100},
        "policy": {"measure": False},
        "pairing": {"mode": "interleaved"},
        "mlflow": {"log_texts": log_texts},  # the store: sqlite:///results/mlflow.db, artifacts in results/mlartifacts
        "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
        "variants": {
            "sim": {
                "engine": "sim",
                "profile": "demo",
                "arm_server_args": {"eagle3": ["--fault-corrupt-output-fraction", "0.5"]},
            }
        },
    }


def store_files(workdir: Path) -> list[Path]:
    """Every file of the MLflow store: the database (with its journal, if any) and the artifacts."""
    results = workdir / "results"
    files = [p for p in results.glob("mlflow.db*") if p.is_file()]
    files += [p for p in (results / "mlartifacts").rglob("*") if p.is_file()]
    return files


def holding(files: list[Path], needle: str) -> list[Path]:
    return [p for p in files if needle.encode() in p.read_bytes()]


def test_prompts_and_outputs_stay_local_unless_the_config_opts_in(tmp_path: Path) -> None:
    lines = [{"prompt": f"{MARKER} p{i} " + " ".join(f"w{j}" for j in range(5 + i % 3))} for i in range(N)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config(log_texts=False)))
    proc = snakemake(tmp_path, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # locally, the outputs' text is there: the referral's examples and the notes that quote them
    local = tmp_path / "results" / EXP
    crossover = json.loads((local / "sim" / "crossover.json").read_text())
    match = crossover["arms"]["eagle3"]["per_level"][0]["output_match"]
    assert match["differ"] >= 1 and OUTPUT_WORD in match["example"]["spec"], match
    assert match["referral"]["clear_examples"], match["referral"]
    assert any(OUTPUT_WORD in n for n in crossover["arms"]["eagle3"]["verdict"]["notes"])
    summary = json.loads((local / "sim" / "eagle3" / "c2" / "summary.json").read_text())
    assert any(OUTPUT_WORD in x["other_head"] for x in summary["output_referral"]["referred"])
    local_files = [p for p in local.rglob("*") if p.is_file()]
    assert holding(local_files, OUTPUT_WORD)  # so the scan below can fail
    # the prompts' text is kept nowhere by the workflow (their hashes are), only in the user's own file
    assert MARKER in (tmp_path / "prompts.jsonl").read_text()

    # the store: every byte of the database and the artifacts, none with a prompt's or an output's text
    store = store_files(tmp_path)
    names = {p.name for p in store}
    assert {"mlflow.db", "summary.json", "crossover.json"} <= names, names
    assert not holding(store, MARKER)
    assert not holding(store, OUTPUT_WORD), holding(store, OUTPUT_WORD)
    logged = [p for p in store if p.name == "crossover.json"]
    copy = json.loads(logged[0].read_text())
    kept = copy["arms"]["eagle3"]["per_level"][0]["output_match"]
    assert kept["example"]["spec"] == WHY and kept["share"] == match["share"]  # the figures as they were
    assert kept["referral"]["clear"] == match["referral"]["clear"]

    # opted in: the outputs' text reaches the artifacts (the runs are logged again: their content changed)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config(log_texts=True)))
    proc = snakemake(tmp_path, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    artifacts = [p for p in store_files(tmp_path) if p.name in ("summary.json", "crossover.json")]
    assert any(p.name == "crossover.json" for p in holding(artifacts, OUTPUT_WORD))
    assert any(p.name == "summary.json" for p in holding(artifacts, OUTPUT_WORD))
    assert not holding(store_files(tmp_path), MARKER)  # prompts never: not even opted in
