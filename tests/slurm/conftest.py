"""A real single-node SLURM cluster (tests/services/slurm.sh) for the tier, and Snakemake runs through it.

The SLURM executor plugin is installed for this tier alone, into a folder of its own put on the tier's
PYTHONPATH, not into the test environment: Snakemake imports every installed executor plugin at start-up, and
this one asks `scontrol show config` for the cluster's settings while it is imported, which on a machine with
SLURM's commands and no running cluster waits ~9-10 s (its timeout). Every Snakemake run of every other tier
paid it: `snakemake --version` took 12.3 s here with the plugin installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, SNAKEMAKE, missing

SCRIPT = REPO / "tests" / "services" / "slurm.sh"
PACKAGES = "slurmctld slurmd slurmdbd slurm-client munge mariadb-server"
DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "munged", "mariadbd")
EXP = "slurm-ci"
ENVS_DIR = Path(os.environ.get("SPECSWEEP_ENVS_DIR") or REPO / "results" / "_envs").absolute()
# the releases this tier was run with; the `slurm` extra (pyproject.toml) is what a cluster user installs
PLUGIN = ("snakemake-executor-plugin-slurm==2.8.0", "snakemake-executor-plugin-slurm-jobstep==0.6.1")
PLUGIN_DIR = ENVS_DIR / ("snakemake-slurm-plugin-" + "-".join(p.split("==")[1] for p in PLUGIN))


def missing_reason() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"SLURM packages not installed ({', '.join(missing)} missing): apt-get install {PACKAGES}"
    if os.geteuid() != 0:
        return "the test cluster's daemons need root"
    return None


def plugin_path() -> Path:
    """The executor plugin's folder (installed once with pip --target; the rest of what it needs comes with
    Snakemake), for the tier's PYTHONPATH."""
    done = PLUGIN_DIR / ".complete"
    if not done.exists():
        shutil.rmtree(PLUGIN_DIR, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(PLUGIN_DIR), *PLUGIN]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            missing(f"SLURM tier: could not install {' '.join(PLUGIN)}:\n{proc.stderr[-2000:]}")
        done.write_text("\n".join(PLUGIN) + "\n")
    return PLUGIN_DIR


@pytest.fixture(scope="package")  # down after its tier: later tiers measure on an idle host
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The cluster's client environment (SLURM_CONF); the cluster is stopped after the tier, whatever happened."""
    reason = missing_reason()
    if reason:
        missing(f"SLURM tier: {reason}")
    plugin = plugin_path()
    state = tmp_path_factory.mktemp("slurm")
    up = subprocess.run(["bash", str(SCRIPT), "up", str(state)], capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, f"the test cluster did not come up:\n{up.stdout}\n{up.stderr}"
        pythonpath = os.pathsep.join(filter(None, [str(plugin), os.environ.get("PYTHONPATH")]))
        yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf"), "PYTHONPATH": pythonpath}
    finally:
        subprocess.run(["bash", str(SCRIPT), "down", str(state)], capture_output=True, text=True, timeout=120)


def snakemake_cmd(workdir: Path, *targets: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The default experiment laid over with tests/slurm/cluster.yaml, through the SLURM profile."""
    return [
        *SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "--workflow-profile",
        str(REPO / "workflow" / "profiles" / "slurm"),
        "--configfile",
        str(REPO / "config" / "config.yaml"),
        str(REPO / "tests" / "slurm" / "cluster.yaml"),
        "--config",
        f"mlflow={{tracking_uri: 'sqlite:///{workdir}/results/mlflow.db'}}",
        # The test cluster's one node is also the submitting host: one job at a time, so that no analysis or
        # tracking job on the submitting host shares the node's 2 CPUs with a measurement (the cells' gate
        # catches it: "machine busy"). On a real cluster the submitting host is not a compute node.
        "--jobs",
        "1",
        # The test cluster answers at once: poll it every few seconds rather than the plugin's 40 s. The plugin
        # adds 10 s to the wait after each check that finds its job still running (2.8.0), so checks come at
        # I, 2I + 10, 3I + 30 s after a submission: with I = 2 the tier's group jobs (16-19 s in sacct) were seen
        # done at ~36 s, preflight and env at ~14 s; with I = 8 the group jobs at 26 s, preflight at 8 and env
        # (~10 s on the node) at 26: the DAG fixture 155 -> 106 s.
        "--slurm-init-seconds-before-status-checks",
        "8",
        "--seconds-between-status-checks",
        "8",
        *extra,
        *targets,
    ]


def sacct(env: dict[str, str], *job_ids: str) -> list[dict[str, str]]:
    """One row per job (no steps): id, state, node, elapsed, time limit, resources, and the group it ran."""
    fields = ["JobIDRaw", "State", "NodeList", "Elapsed", "Timelimit", "AllocTRES", "Comment"]
    cmd = ["sacct", "-X", "--parsable2", "--noheader", f"--format={','.join(fields)}"]
    if job_ids:
        cmd += ["-j", ",".join(job_ids)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30, check=True).stdout
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line]
