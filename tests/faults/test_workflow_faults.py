"""Servers never outlive the workflow, and a failure loses nothing already measured (Snakemake end to end)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SNAKEMAKE, sim_server_processes

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

BASE = {
    "experiment": "wf",
    "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
    "concurrency": [2, 4],
    "workload": {"input_tokens": 8, "output_tokens": 16, "requests": {"floor": 6}, "warmup_requests": 0},
    "analysis": {"bootstrap_samples": 100},
    "mlflow": {"enabled": False},
    # whether a schedule is derived from these few requests is up to the noise: no policy arm, so that the
    # cells a fault leaves are counted exactly (the policy arm: tests/pipeline/test_policy.py)
    "policy": {"measure": False},
    # one server per arm, one cell per job: a fault in one arm's server leaves the other arm's cells measured (an
    # interleaved level is one job for both arms: tests/pipeline/test_pairing.py)
    "pairing": {"mode": "sequential"},
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {"sim": {"engine": "sim", "profile": "demo"}},
}


def write_config(workdir: Path, **overrides: object) -> None:
    cfg = json.loads(json.dumps(BASE))
    for key, value in overrides.items():
        cfg[key] = value
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))


def _default_sigint() -> None:
    """Ctrl-C's default meaning in the child: a runner that starts the suite in the background (a shell's `&`
    without job control) passes SIGINT down ignored, and Snakemake would then never hear it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(workdir: Path, *args: str) -> subprocess.Popen[str]:
    """Snakemake in its own session, so a signal to its group is what Ctrl-C in a terminal would send."""
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "1", *args, "--configfile", "config.yaml"]
    return subprocess.Popen(
        cmd,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = start(workdir, *args)
    out, _ = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def servers_gone_within(workdir: Path, seconds: float) -> None:
    wait_for(lambda: not sim_server_processes(workdir), seconds, "every server process to end")


def summaries(workdir: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in (workdir / "results" / "wf").glob("sim/*/c*/summary.json")}


@pytest.fixture
def workdir(tmp_path: Path):
    yield tmp_path
    for p in sim_server_processes(tmp_path):  # never leave one behind, even when a test fails
        p.kill()


@pytest.mark.parametrize("how", ["sigint-group", "sigterm", "sigkill"])
def test_no_server_outlives_an_interrupted_workflow(workdir: Path, how: str) -> None:
    # A long level, so the workflow is surely mid-cell when it is interrupted.
    write_config(
        workdir, concurrency=[2], workload={**BASE["workload"], "output_tokens": 64, "requests": {"floor": 400}}
    )
    proc = start(workdir, "crossover")
    try:
        wait_for(lambda: bool(sim_server_processes(workdir)), 90, "the first server to start")
        time.sleep(1.0)
        if how == "sigint-group":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.kill()
        proc.communicate(timeout=60)
        servers_gone_within(workdir, 30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Nothing half-written that a later run would take as complete.
    assert not summaries(workdir)
    for tmp in (workdir / "results").rglob("*.tmp"):
        raise AssertionError(f"temporary file left behind: {tmp}")


def test_failing_cell_keeps_the_rest_and_rerun_redoes_only_what_is_missing(workdir: Path) -> None:
    crash = {
        "sim": {"engine": "sim", "profile": "demo", "arm_server_args": {"eagle3": ["--fault-crash-after-tokens", "40"]}}
    }
    write_config(workdir, variants=crash)
    first = run(workdir, "crossover", "--keep-going")
    assert first.returncode != 0
    done = summaries(workdir)
    assert {p.parent.parent.name for p in done} == {"baseline"} and len(done) == 2, first.stdout[-2000:]
    assert "stopped during the cell" in "".join(
        p.read_text() for p in (workdir / "results" / "wf" / "logs" / "cells").glob("sim.eagle3.*.log")
    )
    servers_gone_within(workdir, 30)

    write_config(workdir)  # the fault is gone: the rerun measures only what is missing
    second = run(workdir, "crossover")
    assert second.returncode == 0, second.stdout[-3000:]
    after = summaries(workdir)
    assert {p: after[p] for p in done} == done  # completed cells untouched
    assert len(after) == 4
    log = (workdir / "results" / "wf" / ".servers" / "servers.log").read_text().splitlines()
    starts = [line for line in log if " start " in line]
    assert starts[-1].split("label=")[1].startswith("sim/eagle3")  # the server was restarted for the rerun
    servers_gone_within(workdir, 30)


def test_unknown_variant_in_target_lists_known_ones(workdir: Path) -> None:
    write_config(workdir)
    proc = run(workdir, "results/wf/gpu9/baseline/c2/summary.json")
    assert proc.returncode != 0
    assert "unknown variant 'gpu9'" in proc.stdout and "known variants: sim" in proc.stdout
    proc = run(workdir, "results/wf/sim/medusa/c2/summary.json")
    assert "unknown arm 'medusa'" in proc.stdout and "known arms: baseline, eagle3" in proc.stdout
    assert not sim_server_processes(workdir)


@pytest.mark.parametrize(
    ("concurrency", "message"),
    [([], "should be non-empty"), ([1, "two"], "is not of type 'integer'"), ([0, 4], "less than the minimum of 1")],
)
def test_bad_concurrency_refused_before_anything_starts(workdir: Path, concurrency: list, message: str) -> None:
    write_config(workdir, concurrency=concurrency)
    proc = run(workdir, "crossover")
    assert proc.returncode != 0
    assert "config error at 'concurrency" in proc.stdout and message in proc.stdout
    assert not (workdir / "results").exists()


def test_wrong_key_names_the_key_and_allowed_ones(workdir: Path) -> None:
    write_config(workdir, workload={**BASE["workload"], "output_tokenz": 5})
    proc = run(workdir, "crossover")
    assert proc.returncode != 0
    assert "config error at 'workload'" in proc.stdout and "'output_tokenz' was unexpected" in proc.stdout
    assert "allowed keys here:" in proc.stdout and "output_tokens" in proc.stdout


def test_missing_recipe_or_model_fails_before_any_server(workdir: Path) -> None:
    variants = {"real": {"engine": "vllm", "recipe": "envs/no-such-recipe.txt", "model": "/no/such/model"}}
    write_config(workdir, variants=variants)
    proc = run(workdir, "crossover")
    assert proc.returncode != 0
    assert "envs/no-such-recipe.txt does not exist" in proc.stdout
    assert not (workdir / "results" / "wf" / ".servers").exists()


def test_failing_preflight_stops_the_variant_before_its_environment(workdir: Path) -> None:
    """A missing model is found by the variant's first job, in seconds: no environment is built, no server
    started, and the preflight log names the model and the fix."""
    (workdir / "envs").mkdir()
    (workdir / "envs" / "stack.txt").write_text("# an empty stack: building it would take a second\n")
    variants = {"real": {"engine": "vllm", "recipe": "envs/stack.txt", "model": "/no/such/model"}}
    write_config(workdir, variants=variants)
    proc = run(workdir, "crossover")
    assert proc.returncode != 0
    assert "Error in rule preflight" in proc.stdout, proc.stdout[-3000:]
    log = (workdir / "results" / "wf" / "logs" / "preflight" / "real.log").read_text()
    assert "ERROR   [real] served model: /no/such/model does not exist. Fix:" in log
    assert not (workdir / "results" / "_envs").exists()
    assert not (workdir / "results" / "wf" / "envs" / "real.json").exists()
    servers = workdir / "results" / "wf" / ".servers"  # the stop-on-SIGTERM hook makes it; no server was logged
    assert sorted(p.name for p in servers.iterdir()) == ["state.lock"]


def test_fake_api_key_found_in_no_output(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-specsweep-pipeline-secret-9876"
    monkeypatch.setenv("SPECSWEEP_FAKE_KEY", secret)
    write_config(
        workdir,
        mlflow={"enabled": True},
        variants={"sim": {"engine": "sim", "profile": "demo", "api_key_env": "SPECSWEEP_FAKE_KEY"}},
    )
    proc = run(workdir, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert secret not in proc.stdout
    leaks = [p for p in workdir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks, leaks
    servers_gone_within(workdir, 30)


# Two speculative arms whose outputs part from the baseline's: one replaces a word for 30% of prompts (not among the
# model's top candidates), the other takes the second word at its first near-tie for half the prompts
OUTPUT_FAULTS = {
    "variants": {
        "sim": {
            "engine": "sim",
            "profile": "demo",
            "arm_server_args": {
                "eagle3": ["--fault-corrupt-output-fraction", "0.3"],
                "eagle3-ties": ["--fault-near-tie-output-fraction", "0.5"],
            },
        }
    },
    "arms": {**BASE["arms"], "eagle3-ties": {"speculative": True}},
}


def test_corrupted_outputs_are_caught_and_near_ties_are_numerics(workdir: Path) -> None:
    """Two speculative arms whose outputs differ from the baseline's, interleaved so that each difference is
    referred to the baseline server while it is up: `eagle3` replaces one word for 30% of prompts (a broken
    verify path: the baseline's model does not have that word among its top candidates), `eagle3-ties` takes the
    second word at its first near-tie for half the prompts (other batch numerics: the sim's top two words 0.004
    nats apart there). The first is OUTPUTS DIFFER, named by prompt and position; the second is reported as
    numerics with its share, without OUTPUTS DIFFER."""
    write_config(workdir, **OUTPUT_FAULTS, pairing={"mode": "interleaved"})
    proc = run(workdir, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = json.loads((workdir / "results" / "wf" / "sim" / "crossover.json").read_text())
    corrupt, ties = out["arms"]["eagle3"], out["arms"]["eagle3-ties"]
    for row in corrupt["per_level"]:
        m = row["output_match"]
        assert 0.1 <= 1 - m["share"] <= 0.7 and m["differ"] >= 1, m  # ~30% of the prompts, few per level
        assert "CORRUPTED" in m["example"]["spec"] and "CORRUPTED" not in m["example"]["baseline"]
        ref = m["referral"]
        assert ref["against"] == "baseline" and ref["referred"] == m["differ"] and ref["clear"] == m["differ"], ref
        assert all(x["other_head"].startswith(" CORRUPTED") and x["other_token"] is None for x in ref["clear_examples"])
    notes = " ".join(corrupt["verdict"]["notes"])
    assert "OUTPUTS DIFFER" in notes and "' CORRUPTED" in notes and "of round" in notes, notes
    tied = 0
    for row in ties["per_level"]:
        m = row["output_match"]
        ref = m["referral"]
        assert ref["clear"] == 0 and ref["referred"] == m["differ"] and ref["unreferred"] == 0, ref
        assert m["tie_share"] == pytest.approx(1 - m["share"])
        tied += m["differ"]
    assert tied >= 2, ties["per_level"]
    notes = " ".join(ties["verdict"]["notes"])
    assert "OUTPUTS DIFFER" not in notes and "outputs differ at near-ties" in notes, notes
    assert "OUTPUTS DIFFER" in proc.stdout and " DIFF |" in proc.stdout and " ties |" in proc.stdout
    summary = json.loads((workdir / "results" / "wf" / "sim" / "eagle3-ties" / "c2" / "summary.json").read_text())
    assert summary["output_referral"]["check"]["agrees"], summary["output_referral"]["check"]
    assert summary["output_referral"]["replayed_by"] == "reference"
    for x in summary["output_referral"]["referred"]:
        assert x["margin_nats"] == pytest.approx(0.004) and x["error"] is None, x


def test_sequential_cells_refer_their_differences_on_their_own_server(workdir: Path) -> None:
    """One server at a time (as on a GPU box): each speculative cell, measured after the baseline's, compares its
    outputs with the baseline cell's recorded ones and replays the differing prompts on its own server; the
    verdicts are those of the interleaved design (the replay's candidates are the target model's)."""
    write_config(workdir, **OUTPUT_FAULTS)  # BASE: pairing sequential
    proc = run(workdir, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = json.loads((workdir / "results" / "wf" / "sim" / "crossover.json").read_text())
    for row in out["arms"]["eagle3"]["per_level"]:
        ref = row["output_match"]["referral"]
        assert ref["referred"] == row["output_match"]["differ"] >= 1 and ref["clear"] == ref["referred"], ref
    assert any("OUTPUTS DIFFER" in n for n in out["arms"]["eagle3"]["verdict"]["notes"])
    tied = 0
    for row in out["arms"]["eagle3-ties"]["per_level"]:
        ref = row["output_match"]["referral"]
        assert ref["clear"] == 0 and ref["referred"] == row["output_match"]["differ"], ref
        tied += ref["near_ties"]
    assert tied >= 2
    notes = " ".join(out["arms"]["eagle3-ties"]["verdict"]["notes"])
    assert "OUTPUTS DIFFER" not in notes and "outputs differ at near-ties" in notes, notes
    for arm in ("eagle3", "eagle3-ties"):
        summary = json.loads((workdir / "results" / "wf" / "sim" / arm / "c4" / "summary.json").read_text())
        assert summary["output_referral"]["replayed_by"] == "own" and summary["output_referral"]["check"]["agrees"]
    baseline = json.loads((workdir / "results" / "wf" / "sim" / "baseline" / "c4" / "summary.json").read_text())
    assert baseline.get("output_referral") is None  # the baseline refers nothing
