"""The server tree's CPU figures (specsweep.telemetry.process): the cgroup's quota and throttling in both cgroup
versions, the granted share from the scheduler's per-thread accounting, and a real process read through /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specsweep.telemetry.process import CgroupCpu, TreeReading, cgroup_cpu, read_tree, server_state

pytestmark = pytest.mark.unit


def test_cgroup_v1_quota_and_throttled_time(tmp_path: Path) -> None:
    d = tmp_path / "cpu" / "serving"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("50000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    (d / "cpu.stat").write_text("nr_periods 20\nnr_throttled 19\nthrottled_time 967242892\n")
    got = cgroup_cpu(1, tmp_path, "4:memory:/x\n1:cpu:/serving\n0::/\n")
    assert got == CgroupCpu(str(d), 0.5, pytest.approx(0.967242892), 19)
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu(1, tmp_path, "1:cpu,cpuacct:/serving\n").quota_cores is None  # type: ignore[union-attr]


def test_cgroup_v2_quota_and_throttled_time(tmp_path: Path) -> None:
    d = tmp_path / "system.slice" / "serving"
    d.mkdir(parents=True)
    (d / "cpu.max").write_text("150000 100000\n")
    (d / "cpu.stat").write_text("usage_usec 5\nnr_periods 4\nnr_throttled 2\nthrottled_usec 250000\n")
    assert cgroup_cpu(1, tmp_path, "0::/system.slice/serving\n") == CgroupCpu(str(d), 1.5, 0.25, 2)
    (d / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu(1, tmp_path, "0::/system.slice/serving\n").quota_cores is None  # type: ignore[union-attr]
    assert cgroup_cpu(1, tmp_path, "0::/elsewhere\n") is None  # another namespace's path: not read


def reading(wall: float, cpu_s: float, threads: dict[int, tuple[int, int]], **kw: object) -> TreeReading:
    return TreeReading(1, wall, cpu_s, procs=2, rss_bytes=2**30, cpus=(0,), threads=threads, **kw)  # type: ignore[arg-type]


def test_granted_share_is_what_the_ready_threads_got() -> None:
    """Half a second on a CPU and half a second waiting over one wall second: 50% granted. A thread that started
    inside the block (no start reading) is left out rather than counted from zero."""
    a = reading(0.0, 10.0, {1: (0, 0), 2: (5_000_000_000, 0)})
    b = reading(1.0, 10.5, {1: (400_000_000, 500_000_000), 2: (5_100_000_000, 0), 3: (9_000_000_000, 0)})
    st = server_state(a, b)
    assert st is not None
    assert st["granted_share"] == pytest.approx(0.5)
    assert st["wait_cores"] == pytest.approx(0.5)
    assert st["cpu_cores"] == pytest.approx(0.5) and st["allowed_cores"] == 1.0 and st["cpu_share"] == 0.5
    assert st["rss_mb"] == 1024.0 and st["cpus"] == [0]


def test_a_quota_below_the_cpu_set_is_what_the_server_is_allowed() -> None:
    cg = CgroupCpu("/q", 0.5, 1.0, 3)
    a = reading(0.0, 0.0, {}, cgroup=cg)
    b = reading(2.0, 1.0, {}, cgroup=CgroupCpu("/q", 0.5, 2.0, 23))
    st = server_state(a, b)
    assert st is not None
    assert st["allowed_cores"] == 0.5 and st["cpu_share"] == 1.0
    assert st["cgroup_throttled_share"] == 0.5  # 1 s of throttling in 2 s
    assert st["granted_share"] is None  # no thread accounting: not judged, never a default


def test_a_server_gone_has_no_state() -> None:
    assert server_state(TreeReading(1, 0.0), reading(1.0, 1.0, {})) is None


def test_a_real_process_tree_is_read() -> None:
    """A child spinning on one CPU: its tree's threads, CPU time and granted share come from /proc."""
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        time.sleep(0.3)
        a = read_tree(child.pid)
        time.sleep(0.5)
        b = read_tree(child.pid)
    finally:
        child.kill()
        child.wait()
    assert a.threads and a.pids == (child.pid,) and b.cpus == (cpu,)
    st = server_state(a, b)
    assert st is not None and st["granted_share"] is not None
    assert 0.0 < st["granted_share"] <= 1.0 and st["cpu_cores"] > 0.05 and st["rss_mb"] > 1
    assert read_tree(child.pid).cpu_s is None  # gone
