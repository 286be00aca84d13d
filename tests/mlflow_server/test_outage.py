"""A team on one server: two checkouts, each measuring its own variant of experiment `team` (with different
speculative arms), through a server that goes down in the middle of their runs and comes back.

While it is down every cell still completes, and the tracking jobs fail within seconds with a line that names
the server and the fix. Then both checkouts rerun the same command at the same time: their tracking jobs race
each other (creating the experiment, writing its saved view), and a run the outage cut short must be replaced,
not reused. In the end every cell, sweep and crossover has exactly one complete run.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from specsweep.tracking.view import VIEW_KEY, view_arms
from tests.conftest import sim_server_processes
from tests.mlflow_server.conftest import (
    FaultyProxy,
    MlflowServer,
    active_runs,
    by_kind,
    snakemake_cmd,
    summaries,
    track_sweep,
    write_config,
)

pytestmark = [pytest.mark.mlflow_server, pytest.mark.timeout(420)]

EXP = "team"
# checkout: (its variant, its speculative arm, the teammate running it)
CHECKOUTS = {"a": ("sim-a", "eagle3", "alice"), "b": ("sim-b", "mtp", "bob")}


def _both(workdirs: dict[str, Path], server: MlflowServer, timeout: float = 300) -> dict[str, Any]:
    """The same snakemake command in both checkouts, started together, each as its teammate."""
    procs = {}
    for k, w in workdirs.items():
        env = server.env(CHECKOUTS[k][2])
        procs[k] = subprocess.Popen(
            snakemake_cmd(), cwd=w, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    out = {}
    for k, p in procs.items():
        text, _ = p.communicate(timeout=timeout)
        (workdirs[k].parent / f"{k}-{time.monotonic_ns()}.log").write_text(text)
        out[k] = (p.returncode, text)
    return out


def test_outage_then_two_checkouts_rerun_at_once(mlflow_server: MlflowServer, client: Any, tmp_path: Path) -> None:
    proxy = FaultyProxy(mlflow_server.url)
    proxy.up()
    # the server goes away at the second artifact upload: one cell run is logged whole, the next one is cut
    # short after its metrics (left RUNNING), and everything after that finds the server down
    proxy.cut_at("/mlflow-artifacts/artifacts/", 2)
    workdirs = {}
    for k, (variant, arm, _) in CHECKOUTS.items():
        workdirs[k] = tmp_path / k
        write_config(
            workdirs[k],
            proxy.url,
            experiment=EXP,
            repeats=1,
            arms={"baseline": {"speculative": False}, arm: {"speculative": True}},
            variants={variant: {"engine": "sim", "profile": "demo"}},
        )
    try:
        first = _both(workdirs, mlflow_server)
    finally:
        proxy.down()
    assert proxy.cut_done, "the outage never happened: no tracking job reached its second artifact upload"

    # down: every cell measured, every tracking job failed, saying which server and what to do
    for k, (rc, text) in first.items():
        variant, arm, _ = CHECKOUTS[k]
        assert rc != 0, text[-3000:]
        cells = summaries(workdirs[k])
        assert sorted(cells) == sorted(f"{EXP}/{variant}/{a}/c{c}" for a in ("baseline", arm) for c in (1, 4))
        assert (workdirs[k] / "results" / EXP / variant / "crossover.json").is_file()
        assert not list(workdirs[k].glob("results/*/*/*/mlflow_sweep.json")), k  # no job claims to have logged
        said = [line for line in text.splitlines() if line.startswith("specsweep track:")]
        assert said, text[-3000:]
        assert f"the MLflow server at {proxy.url} cannot be reached" in said[0]
        assert "start it" in said[0] and "rerun the same snakemake command" in said[0]
        assert "Nothing measured is lost" in said[0]
    deadline = time.monotonic() + 20  # the failed runs stopped their engine servers too
    while sim_server_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not sim_server_processes(tmp_path)
    cut_short = [r for r in active_runs(client, EXP) if r.info.status == "RUNNING"]
    assert cut_short, "the outage left no run half-logged"

    # fail fast: one tracking job against the server while it is down, as the rule runs it
    proc, elapsed = track_sweep(workdirs["a"], EXP, "sim-a", tmp_path / "down.json", mlflow_server.env("alice"))
    assert proc.returncode == 1 and "cannot be reached" in proc.stderr, proc.stderr[-2000:]
    assert elapsed < 30, f"a tracking job took {elapsed:.0f} s to give up on a server that is down"
    assert "Traceback" not in proc.stderr

    # back: both checkouts rerun the same command at the same time
    proxy.up()
    try:
        second = _both(workdirs, mlflow_server)
    finally:
        proxy.down()
    for rc, text in second.values():
        assert rc == 0, text[-4000:]
        assert "localrule cell" not in text, "a cell was measured again"

    runs = active_runs(client, EXP)
    assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    cells = by_kind(runs, "cell")
    keys = [r.data.tags["specsweep.cell_key"] for r in cells]
    on_disk = {**summaries(workdirs["a"]), **summaries(workdirs["b"])}
    assert sorted(keys) == sorted(on_disk), "not exactly one run per cell"
    sweeps = {r.data.tags["specsweep.sweep_key"]: r for r in by_kind(runs, "sweep")}
    assert len(sweeps) == len(by_kind(runs, "sweep")) == 4, sorted(sweeps)
    crossovers = [r.data.tags["specsweep.crossover_key"] for r in by_kind(runs, "crossover")]
    assert sorted(crossovers) == [f"{EXP}/sim-a", f"{EXP}/sim-b"]
    for run in cells:
        parent = run.data.tags.get("mlflow.parentRunId")
        cell = run.data.tags
        assert parent == sweeps[f"{EXP}/{cell['specsweep.variant']}/{cell['specsweep.arm']}"].info.run_id
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["summary.json"]
    for workdir in workdirs.values():
        for marker in workdir.glob("results/*/*/*/mlflow_sweep.json"):
            data = json.loads(marker.read_text())
            assert data["sweep_run_id"] in {r.info.run_id for r in sweeps.values()}
            assert set(data["cell_run_ids"].values()) <= {r.info.run_id for r in cells}
    # what the outage cut short was replaced, not reused
    for run in cut_short:
        gone = client.get_run(run.info.run_id)
        assert gone.info.lifecycle_stage == "deleted" and "specsweep.superseded_by" in gone.data.tags
    # the saved view charts both checkouts' speculative arms
    exp = client.get_experiment_by_name(EXP)
    speculative, policy = view_arms(exp.tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
    assert sorted(speculative) == ["eagle3", "mtp"] and policy == []


def _open_together(url: str, name: str, n: int) -> tuple[list[Any], list[BaseException]]:
    """n Trackers of experiment `name` opened at the same instant from n threads, each with an arm of its own."""
    from specsweep.tracking.store import Tracker

    barrier = threading.Barrier(n)
    trackers: list[Any] = [None] * n
    errors: list[BaseException] = []

    def job(i: int) -> None:
        spec = {
            "experiment": name,
            "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
            "results_dir": "results",
            "mlflow": {"tracking_uri": url},
            "view_arms": {"speculative": [f"arm{i}"], "policy": []},
        }
        barrier.wait(timeout=30)
        try:
            trackers[i] = Tracker(spec)
        except BaseException as exc:  # reported by the caller, with the others
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return trackers, errors


def test_jobs_starting_together_share_one_experiment_and_view(
    mlflow_server: MlflowServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight tracking jobs opening a new experiment at the same instant (every arm's sweep job of a fresh
    experiment, other checkouts): all get the one experiment, though all but one lose the create, and their
    first writes of the saved view collide (PostgreSQL answers one of them with a unique violation, about one
    round in six here: hence several rounds). Once each job has ended (its second look at the view,
    `tracking.log.track`), the view charts every job's arm."""
    from specsweep.tracking.uri import HTTP_ENV

    for var in HTTP_ENV.values():  # Tracker sets them: restored after the test
        monkeypatch.setenv(var, "0")
    n = 8
    for round_ in range(5):
        name = f"together-{round_}"
        trackers, errors = _open_together(mlflow_server.url, name, n)
        assert not errors, errors
        assert len({t.experiment_id for t in trackers}) == 1
        assert [e.name for e in client.search_experiments(filter_string=f"name = '{name}'")] == [name]
        for t in trackers:  # the jobs end one after another
            t.save_view()
        exp = client.get_experiment_by_name(name)
        speculative, _ = view_arms(exp.tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
        assert sorted(speculative) == [f"arm{i}" for i in range(n)]
