"""Adaptive levels through the DAG: checkpoint rounds add levels inside the crossover interval, each added level
is an ordinary cell (measured in every arm, analysed, logged to the same MLflow sweep, `--forcerun`-able)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.pipeline.conftest import snakemake

pytestmark = pytest.mark.pipeline

# The demo profile's crossover lies near C=20 for this workload: between the two grid levels.
CONFIG = {
    "experiment": "ad",
    "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
    "concurrency": [4, 64],
    "workload": {
        "input_tokens": 16,
        "output_tokens": 32,
        "requests": {"per_concurrency": 3, "floor": 8},
        "warmup_requests": 0,
    },
    "client": {"idle_probe_s": 0.0},
    "analysis": {"bootstrap_samples": 200},
    "adaptive": {"enabled": True, "max_rounds": 2, "added_per_concurrency": 6},
    "mlflow": {"tracking_uri": "sqlite:///results/mlflow.db"},
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {"sim": {"engine": "sim", "profile": "demo"}},
}


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("adaptive")
    (workdir / "config.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    proc = snakemake(workdir, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir


def rounds(workdir: Path) -> list[dict]:
    files = sorted((workdir / "results" / "ad" / "sim" / "adaptive").glob("round*.json"))
    return [json.loads(p.read_text()) for p in files]


def test_rounds_add_levels_inside_the_interval(adaptive_run: Path) -> None:
    done = rounds(adaptive_run)
    assert done and done[0]["add"], done
    added = sorted({c for r in done for c in r["add"]})
    assert all(4 < c < 64 for c in added)
    for r in done:  # each added level inside the interval the round saw
        for c in r["add"]:
            arm = r["arms"]["eagle3"]
            assert (arm["lo"] or 4) <= c <= (arm["hi"] or 64), r
    res = adaptive_run / "results" / "ad" / "sim"
    for arm in ("baseline", "eagle3"):
        for c in [4, 64, *added]:
            assert (res / arm / f"c{c}" / "summary.json").is_file()
    out = json.loads((res / "crossover.json").read_text())
    assert out["arms"]["eagle3"]["levels"] == [4, *added, 64]
    n = {
        c: json.loads((res / "eagle3" / f"c{c}" / "summary.json").read_text())["workload"]["n_requests"] for c in added
    }
    assert all(v == 6 * c for c, v in n.items()), n  # added levels: adaptive.added_per_concurrency turnovers


def test_added_levels_are_logged_to_the_same_sweep(adaptive_run: Path) -> None:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{adaptive_run / 'results' / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    runs = mlflow.search_runs(experiment_names=["ad"], filter_string="tags.`specsweep.kind` = 'sweep'")
    added = sorted({c for r in rounds(adaptive_run) for c in r["add"]})
    for run_id in runs["run_id"]:  # `cell_valid` is logged at every level (the curves hold valid cells only)
        steps = sorted(m.step for m in client.get_metric_history(run_id, "cell_valid"))
        assert steps == sorted([4, 64, *added])


def test_nothing_reruns_and_an_added_level_reruns_alone(adaptive_run: Path, tmp_path: Path) -> None:
    work = tmp_path / "exp"
    shutil.copytree(adaptive_run, work, symlinks=True)
    again = snakemake(work, "-n", "crossover")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]
    c = rounds(work)[0]["add"][0]
    target = f"results/ad/sim/eagle3/c{c}/summary.json"
    proc = snakemake(work, "-n", "crossover", "--forcerun", target)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    # the added level is one interleaved job for both arms (its first output: the baseline's records)
    levels = re.findall(r"^rule paired_level:\n(?:    .*\n)*?    output: ([^,\n]+)", text, flags=re.M)
    assert levels == [f"results/ad/sim/baseline/c{c}/requests.parquet"], levels
    assert not re.findall(r"^rule (?:cell|paired_policy):", text, flags=re.M)


def test_re_analysis_keeps_the_rounds_and_measures_nothing(adaptive_run: Path, tmp_path: Path) -> None:
    """A round decided what to measure: editing gates, SLOs or analysis settings re-judges the cells in the
    analysis and MLflow jobs; the rounds' jobs rerun but keep their decisions, and no cell is measured."""
    work = tmp_path / "exp"
    shutil.copytree(adaptive_run, work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["slo"] = {"tpot_ms": 50}
    cfg["gates"] = {"max_client_cpu_share": 0.7}
    cfg["analysis"]["bootstrap_samples"] = 300
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    plan = snakemake(work, "-n", "crossover")
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", text.split("Job stats:")[1].split("Reasons")[0], flags=re.M))
    jobs.pop("job", None)
    expected = {"refine", "schedule", "crossover_variant", "track_variant", "crossover", "total"}
    assert set(jobs) == expected, jobs
    before = {p: p.stat().st_mtime_ns for p in (work / "results" / "ad" / "sim").rglob("*") if p.is_file()}
    proc = snakemake(work, "crossover")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    # the cells' own files (a cell re-measured for a busy host also keeps its earlier attempts under attempts/, and
    # a policy cell its paired re-measurement of the best fixed arm under reference/)
    cells = [
        p
        for p in before
        if p.name in ("summary.json", "requests.parquet") and not {"attempts", "reference"} & set(p.parts)
    ]
    assert cells and all(p.stat().st_mtime_ns == before[p] for p in cells)  # nothing measured
    assert {p.name for p in (work / "results" / "ad" / "sim").glob("*/c*")} == {p.parent.name for p in cells}
    assert [r["add"] for r in rounds(work)] == [r["add"] for r in rounds(adaptive_run)]  # decisions kept
    log = (work / "results" / "ad" / "logs" / "adaptive" / "sim.round1.log").read_text()
    assert "decision kept" in log
    schedule_log = (work / "results" / "ad" / "logs" / "schedule" / "sim.log").read_text()
    assert "schedules kept" in schedule_log  # the policy arm's schedule: decided on the same cells, kept
    out = json.loads((work / "results" / "ad" / "sim" / "crossover.json").read_text())
    assert out["bootstrap"]["replicates"] == 300 and out["slo"] == {"tpot_s": 0.05}
