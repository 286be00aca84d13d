"""Content classes and a traffic mix through the DAG on the simulated engine, with natural stops: each class is a
unit of its own (`<variant>@<class>`), the mix draws its requests from the classes, and contents.json puts their
answers side by side. The demo profile's classes accept drafts at different rates and end their answers at
different lengths (sim/profiles/demo.yaml `contents`), so the figures must tell the classes apart."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specsweep.config import defaults
from specsweep.measure.metrics import aborted
from specsweep.measure.summary import read_judged
from tests.pipeline.conftest import EXP, snakemake

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(300)]

CAP = 96  # output_tokens: a cap the demo profile's answers (24-48 tokens on average) rarely reach
N = 120  # entries per category: disjoint warm-up and measured sets at every level


def speed_bench(path: Path) -> None:
    """A SPEED-Bench-shaped file (question_id, category, turns) of two categories the demo profile knows."""
    rows = [
        {"question_id": f"{cat}-{i}", "category": cat, "turns": [" ".join([cat, f"q{i}", *(["w"] * (12 + i % 5))])]}
        for cat in ("coding", "writing")
        for i in range(N)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("contents")
    speed_bench(workdir / "speed.jsonl")
    config = {
        "experiment": EXP,
        "concurrency": [1, 8],
        "repeats": 2,
        "workload": {
            "input_tokens": 16,
            "output_tokens": CAP,
            "stop": "natural",
            "dataset": {"path": "speed.jsonl", "format": "speed-bench"},
            "classes_by": "category",
            "mix": {"coding": 0.3, "writing": 0.7},
            "requests": {"per_concurrency": 4, "floor": 12},
            "warmup_requests": 1,
            "seed": 1,
        },
        "precision": {"target": None},
        "analysis": {"bootstrap_samples": 200},
        "policy": {"measure": False},
        "mlflow": {"enabled": False},
        "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
        "variants": {"sim": {"engine": "sim", "profile": "demo"}},
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(workdir, "crossover", timeout=280)
    (workdir / "run.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir


def test_each_class_and_the_mix_is_a_unit_with_its_own_answer(run: Path) -> None:
    res = run / "results" / EXP
    for unit in ("sim@coding", "sim@writing", "sim@mix"):
        cx = json.loads((res / unit / "crossover.json").read_text())
        assert cx["content"]["unit"] == unit and cx["content"]["stop"] == "natural"
        assert cx["content_warning"] is None  # the simulated engine: acceptance is its profile's
        assert (res / unit / "policy.yaml").read_text().startswith("# measured on: ")
    contents = json.loads((res / "sim" / "contents.json").read_text())
    assert [a["content"] for a in contents["classes"]] == ["coding", "writing"]
    assert [a["content"] for a in contents["mix"]] == ["mix"]
    assert contents["mix_shares"] == {"coding": 0.3, "writing": 0.7}


def test_acceptance_differs_by_class_and_the_mix_lies_between(run: Path) -> None:
    """coding accepts 0.82 per draft token, writing 0.5 (K=3: 3.04 vs 1.88 tokens per pass): every level's
    accept length says which class it measured; the mix's, drawn 30/70, lies between."""
    contents = json.loads((Path(run) / "results" / EXP / "sim" / "contents.json").read_text())
    accept = {a["content"]: a["accept_length_levels"] for a in [*contents["classes"], *contents["mix"]]}
    for c in range(2):
        coding, writing, mix = accept["coding"][c], accept["writing"][c], accept["mix"][c]
        assert coding == pytest.approx(3.04, abs=0.25) and writing == pytest.approx(1.88, abs=0.2)
        assert writing < mix < coding


def test_natural_stops_end_answers_short_of_the_cap_and_the_same_in_both_arms(run: Path) -> None:
    res = run / "results" / EXP
    for unit in ("sim@coding", "sim@writing", "sim@mix"):
        for arm in ("baseline", "eagle3"):
            for level in ("c1", "c8"):
                summary, records = read_judged(res / unit / arm / level, defaults("gates"))
                assert summary["validity"]["valid"], summary["validity"]["reasons"]
                assert summary["workload"]["stop"] == "natural"
                lengths = summary["metrics"]["output_lengths"]
                assert lengths["p50"] < CAP / 2 and lengths["cap_share"] < 0.1
                answered = records[~aborted(records)]  # fillers stopped mid-answer at the last measured end
                assert set(answered["finish_reason"]) <= {"stop", "length"}
                assert (records["content"] != "").all()
        cx = json.loads((res / unit / "crossover.json").read_text())
        for row in cx["arms"]["eagle3"]["per_level"]:
            assert row["output_match"]["share"] == 1.0  # greedy arms: the same answers, ending at the same token
            assert row["content"]["baseline_output_p50"] == row["content"]["spec_output_p50"]
    mix = pd.read_parquet(res / "sim@mix" / "baseline" / "c8" / "requests.parquet")
    share = (mix["content"] == "coding").mean()
    assert 0.15 < share < 0.45  # drawn 30/70


def test_the_final_text_shows_the_classes_first(run: Path) -> None:
    log = (run / "run.log").read_text()
    assert "the answer per content class" in log
    assert log.index("the answer per content class") < log.index("sim@coding: eagle3 vs baseline")
