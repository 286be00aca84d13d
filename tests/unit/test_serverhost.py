"""Servers in cluster jobs: the job's server host, ownership by the job, resources scoped to node and job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from specsweep.serving import servers
from specsweep.serving.serverhost import request, start_host
from tests.conftest import REPO

pytestmark = pytest.mark.unit


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_resources_are_scoped_to_node_and_job_in_a_slurm_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert servers.scoped_resource("gpus:0-7") == "gpus:0-7"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert servers.scoped_resource("gpus:0-7") == f"gpus:0-7@{servers.this_node()}.job42"


def test_the_host_starts_what_it_is_asked_and_leaves_with_its_owner(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        box = start_host(owner.pid, servers.process_started(owner.pid), "7")
        assert wait_for(lambda: any("-m specsweep server-host" in " ".join(p.cmdline()) for p in _children()))
        host = next(p for p in _children() if "-m specsweep server-host" in " ".join(p.cmdline()))
        marker = tmp_path / "parent"
        code = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getppid())); time.sleep(60)"
        request(box, [sys.executable, "-c", code], tmp_path / "child.log")
        assert wait_for(lambda: marker.exists() and marker.read_text() != "")
        assert int(marker.read_text()) == host.pid, "the host, not the asking process, is the parent"
        child = next(p for p in host.children() if p.pid != host.pid)
        assert os.getsid(child.pid) == child.pid, "started in a session of its own"
        owner.kill()
        owner.wait()
        assert wait_for(lambda: not host.is_running() or host.status() == psutil.STATUS_ZOMBIE)
        assert not box.exists(), "the host removes its inbox on the way out"
        child.kill()
    finally:
        owner.kill()


def _children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def test_the_first_snakemake_process_of_a_job_owns_its_servers(tmp_path: Path) -> None:
    """A job inherits the submitting process's owner; its first process takes over, nested ones keep it."""
    code = textwrap.dedent(
        f"""
        import json, os, sys
        sys.path.insert(0, {str(REPO / "workflow")!r})
        from specsweep.serving.jobenv import prepare
        prepare({str(REPO / "workflow")!r})
        first = {{k: os.environ[k] for k in ("SPECSWEEP_OWNER_PID", "SPECSWEEP_OWNER_JOB", "SPECSWEEP_SERVER_HOST")}}
        prepare({str(REPO / "workflow")!r})
        again = {{k: os.environ[k] for k in first}}
        print(json.dumps({{"pid": os.getpid(), "first": first, "again": again}}))
        """
    )
    env = {**os.environ, "SLURM_JOB_ID": "99", "SPECSWEEP_OWNER_PID": "1", "SPECSWEEP_OWNER_JOB": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(out.stdout)
    assert got["first"]["SPECSWEEP_OWNER_PID"] == str(got["pid"])  # not the submitting host's pid 1
    assert got["first"]["SPECSWEEP_OWNER_JOB"] == "99"
    assert "job99" in got["first"]["SPECSWEEP_SERVER_HOST"]
    assert got["again"] == got["first"], "a nested process of the same job keeps the owner and host"
    assert wait_for(lambda: not Path(got["first"]["SPECSWEEP_SERVER_HOST"]).exists()), "host outlived its owner"


def test_stop_all_leaves_other_nodes_servers_alone(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rec = servers.ServerRecord(
            identity="x",
            resource="gpus:0-7@othernode.job1",
            engine="sim",
            label="v/a",
            host="127.0.0.1",
            port=1,
            supervisor_pid=sleeper.pid,  # a pid that exists here means nothing for another node's server
            server_pid=sleeper.pid,
            owner_pid=1,
            owner_started=0.0,
            started_at=0.0,
            log_path=str(tmp_path / "log"),
            command=[],
            node="othernode",
        )
        path = tmp_path / "gpus_0-7_othernode.job1.json"
        path.write_text(json.dumps(rec.__dict__))
        assert servers.stop_all(tmp_path) == 0
        assert sleeper.poll() is None and path.exists()
        with pytest.raises(servers.ServerError, match="runs on othernode"):
            servers.stop_record(tmp_path, rec, reason="test")
    finally:
        sleeper.kill()
