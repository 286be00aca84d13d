"""The default experiment through snakemake-executor-plugin-slurm on a real slurmctld/slurmd (tests/services/slurm.sh).

What must hold on a cluster: one SLURM job per server (variant x arm), whose server starts once and serves every
level of its arm; the answer itself (valid cells, the crossover; the tier runs variant sim); a cancelled job leaves
no server behind, and a rerun measures only the cells it had not finished.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

from specsweep.config import defaults
from specsweep.measure.summary import read_judged
from tests.conftest import sim_server_processes
from tests.slurm.conftest import EXP, sacct, snakemake_cmd

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

LEVELS = ("c1", "c10", "c70")  # tests/slurm/cluster.yaml
# One variant of the two: what the tier asserts holds per server group, and the second variant's groups repeated the
# first's (the same rules and resources, another config value) for about half of the tier's DAG time.
VARIANTS = ("sim",)


def summaries(workdir: Path) -> dict[tuple[str, str], list[dict]]:
    """Cells by server group (variant, arm)."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted((workdir / "results" / EXP).glob("*/*/c*/summary.json")):
        variant, arm = path.parts[-4], path.parts[-3]
        out[(variant, arm)].append(json.loads(path.read_text()))
    return out


@pytest.fixture(scope="module")
def experiment(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("slurm-run")
    targets = [f"results/{EXP}/{v}/{f}" for v in VARIANTS for f in ("crossover.json", "mlflow_crossover.json")]
    t0 = time.monotonic()
    proc = subprocess.run(
        snakemake_cmd(workdir, *targets), cwd=workdir, env=cluster, capture_output=True, text=True, timeout=840
    )
    (workdir / "run.log").write_text(proc.stdout + proc.stderr)
    (workdir / "wall_s.txt").write_text(f"{time.monotonic() - t0:.0f}\n")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return workdir


def test_each_server_group_ran_as_one_slurm_job(experiment: Path, cluster: dict[str, str]) -> None:
    groups = summaries(experiment)
    assert {v for v, _ in groups} == set(VARIANTS)
    jobs = {}
    for (variant, arm), cells in groups.items():
        assert len(cells) == len(LEVELS), f"{variant}/{arm}: {len(cells)} cells"
        job_ids = {c["server"]["slurm_job"] for c in cells}
        assert len(job_ids) == 1 and None not in job_ids, f"{variant}/{arm} ran in jobs {job_ids}"
        servers = {(c["server"]["pid"], c["server"]["started_at"]) for c in cells}
        assert len(servers) == 1, f"{variant}/{arm}: its server started {len(servers)} times"
        jobs[job_ids.pop()] = (variant, arm)
    assert len(jobs) == len(groups), "two server groups shared a job"
    rows = sacct(cluster, *jobs)
    (experiment / "sacct.txt").write_text("\n".join("|".join(r.values()) for r in rows) + "\n")
    assert {r["JobIDRaw"] for r in rows} == set(jobs)
    for row in rows:
        variant, arm = jobs[row["JobIDRaw"]]
        assert row["State"] == "COMPLETED", row
        assert row["Comment"] == f"rule_server.{variant}.{arm}_cell", row
        assert "gres/gpu=4" in row["AllocTRES"] and "cpu=2" in row["AllocTRES"], row  # variants.<name>.slurm
        assert row["Timelimit"] == f"00:{5 * len(LEVELS):02d}:00", row  # 5 min per cell, summed over the job


def test_the_answer_holds_on_the_cluster(experiment: Path) -> None:
    gates = defaults("gates")
    invalid = []
    for path in sorted((experiment / "results" / EXP).glob("*/*/c*/")):
        summary, _ = read_judged(path, gates)
        if not summary["validity"]["valid"]:
            invalid.append(f"{path.relative_to(experiment)}: {summary['validity']['reasons']}")
    assert not invalid, "\n".join(invalid)
    for variant in VARIANTS:
        crossover = json.loads((experiment / "results" / EXP / variant / "crossover.json").read_text())
        arm = crossover["arms"]["eagle3"]
        assert [lvl["baseline_valid"] and lvl["spec_valid"] for lvl in arm["per_level"]] == [True] * len(LEVELS)
        assert (experiment / "results" / EXP / variant / "policy.yaml").is_file()
        assert (experiment / "results" / EXP / variant / "mlflow_crossover.json").is_file()
    assert not sim_server_processes(experiment), "a server outlived its job"


def test_scancel_leaves_no_server_and_a_rerun_measures_only_the_missing_cells(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    cells = [f"results/{EXP}/sim/baseline/{lvl}/summary.json" for lvl in LEVELS]
    # No hooks: the workflow's own clean-up (onerror) must not be what stops the server here.
    log = tmp_path / "first.log"
    first = subprocess.Popen(
        snakemake_cmd(tmp_path, *cells, extra=("--no-hooks",)),
        cwd=tmp_path,
        env={**cluster, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack (below)
        # Ctrl-C at a terminal: SIGINT handled. A test run started in the background (`... &` in a script) hands
        # its children SIGINT ignored, and Python keeps it so: Snakemake then ignored all six Ctrl-C here.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        # Snakemake orders a group's cells as it likes (c1 first here, c70 first in a CI run): wait for any.
        deadline = time.monotonic() + 300
        while (
            not (done := [tmp_path / c for c in cells if (tmp_path / c).exists()])
            and first.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert done, "no cell finished"
        job = json.loads(done[0].read_text())["server"]["slurm_job"]
        assert sim_server_processes(tmp_path), "the server should be up, serving the next level"
        subprocess.run(["scancel", job], env=cluster, check=True, timeout=30)
        deadline = time.monotonic() + 30  # KillWait=5 s on the test cluster, then SIGKILL
        while sim_server_processes(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not sim_server_processes(tmp_path), "a server outlived its cancelled job"
        # snakemake-executor-plugin-slurm 2.8.0 keeps a cancelled job as running: sacct says "CANCELLED by <uid>",
        # which is not among the states it compares with. A user stops the workflow (Ctrl-C, again if it keeps
        # waiting for that job) and reruns it.
        for _ in range(6):
            first.send_signal(signal.SIGINT)
            try:
                first.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                continue
        if first.poll() is None:
            # where it waits goes into the log, for the failure below to show
            first.send_signal(signal.SIGABRT)
            first.wait(timeout=20)
            pytest.fail(f"the workflow did not stop on Ctrl-C; its threads' stacks:\n{log.read_text()[-12000:]}")
        assert first.returncode != 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    state = sacct(cluster, job)[0]["State"]
    assert state.startswith("CANCELLED"), state
    finished = {c: (tmp_path / c).stat().st_mtime_ns for c in cells if (tmp_path / c).exists()}
    assert done[0].relative_to(tmp_path).as_posix() in finished and len(finished) < len(cells), finished

    rerun = subprocess.run(
        snakemake_cmd(tmp_path, *cells), cwd=tmp_path, env=cluster, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    for cell, mtime in finished.items():
        assert (tmp_path / cell).stat().st_mtime_ns == mtime, f"{cell} was measured again"
    assert all((tmp_path / c).exists() for c in cells)
    jobs = {json.loads((tmp_path / c).read_text())["server"]["slurm_job"] for c in cells if c not in finished}
    assert len(jobs) == 1 and job not in jobs, jobs  # the missing cells, in one new job
    assert not sim_server_processes(tmp_path)
