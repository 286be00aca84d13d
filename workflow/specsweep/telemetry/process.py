"""The server process tree's share of its CPUs during a block, from /proc and its cgroup.

Why: pairing cancels a slowdown that scales both arms alike, but a server that got less of its CPUs for part of a
level (a CPU quota throttling its container, a co-tenant's burst) is another operating point and moves the paired
ratio itself. The scheduler says so directly: each thread's time on a CPU and its time ready but waiting for one
(`/proc/<pid>/task/<tid>/schedstat`, nanoseconds). Their ratio, `granted_share`, is the share of the CPU time the
server's threads were ready for that they got: 0.36-0.44 for vLLM's CPU build on its own core (its API server and
engine core take turns), within 3% across a level's blocks; 0.05 in a block its cgroup's quota held to half a core
(a CFS-throttled thread counts as waiting). Unlike CPU time per wall second it does not move with how much work a
block had (the simulated engine uses 0.05-0.4 of a core, by load and chance).

Figures (docs/metrics.md, "Serving side"): the tree's CPU cores used and waited for, the CPUs its processes may run
on (affinity) and its cgroup's quota, its share of them, the cgroup's throttled time, its resident memory.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = ["CgroupCpu", "TreeReading", "cgroup_cpu", "read_tree", "server_state", "tree_cpu"]

_TICK = os.sysconf("SC_CLK_TCK")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _processes(pid: int) -> list[psutil.Process] | None:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return None


def tree_cpu(pid: int | None) -> tuple[float, int] | None:
    """(CPU seconds used so far, number of processes) of process `pid` and its live descendants (None when it
    is gone). The count sizes the accounting's quantisation: each process's user and system times are whole
    clock ticks."""
    procs = None if pid is None else _processes(pid)
    if procs is None:
        return None
    total, n = 0.0, 0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # a worker that just ended
            continue
        total += t.user + t.system
        n += 1
    return total, n


@dataclass(frozen=True)
class CgroupCpu:
    """A cgroup's CPU quota (cores; None: unlimited) and its cumulative throttling (None: not exposed)."""

    path: str
    quota_cores: float | None
    throttled_s: float | None
    throttled_periods: int | None


def _cpu_stat(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.strip())}
    except (OSError, ValueError):
        return {}


def cgroup_cpu(pid: int, root: Path = CGROUP_ROOT, membership: str | None = None) -> CgroupCpu | None:
    """The CPU controller's view of `pid`'s cgroup (v2 `cpu.max`/`cpu.stat`, v1 `cpu.cfs_quota_us`/`cpu.stat`);
    None where neither is readable (no cgroup file system, another namespace's path). `membership`: the text of
    /proc/<pid>/cgroup (read when None)."""
    try:
        lines = (membership if membership is not None else Path(f"/proc/{pid}/cgroup").read_text()).splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        names = controllers.split(",")
        if controllers == "" and (root / rel.lstrip("/") / "cpu.max").exists():  # v2, the unified hierarchy
            d = root / rel.lstrip("/")
            quota, _, period = (d / "cpu.max").read_text().partition(" ")
            stat = _cpu_stat(d / "cpu.stat")
            return CgroupCpu(
                str(d),
                None if quota == "max" else int(quota) / int(period),
                stat["throttled_usec"] / 1e6 if "throttled_usec" in stat else None,
                stat.get("nr_throttled"),
            )
        if "cpu" in names:  # v1: the cpu controller's own hierarchy
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                d = mount / rel.lstrip("/")
                if (d / "cpu.cfs_quota_us").exists():
                    quota = int((d / "cpu.cfs_quota_us").read_text())
                    period = int((d / "cpu.cfs_period_us").read_text())
                    stat = _cpu_stat(d / "cpu.stat")
                    return CgroupCpu(
                        str(d),
                        None if quota < 0 else quota / period,
                        stat["throttled_time"] / 1e9 if "throttled_time" in stat else None,
                        stat.get("nr_throttled"),
                    )
    return None


def _schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of `pid`: (ns on a CPU, ns ready and waiting for one); {} where schedstat is not exposed."""
    out = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            run, wait, *_ = (task / "schedstat").read_text().split()
            out[int(task.name)] = (int(run), int(wait))
        except (OSError, ValueError):  # a thread that just ended
            continue
    return out


@dataclass(frozen=True)
class TreeReading:
    """The server tree's accounting at one instant (`read_tree`); `server_state(a, b)` gives the block's figures."""

    pid: int
    wall: float = field(default_factory=time.monotonic)
    cpu_s: float | None = None  # None: the server is gone
    procs: int = 0
    rss_bytes: int | None = None
    cpus: tuple[int, ...] = ()
    cgroup: CgroupCpu | None = None
    pids: tuple[int, ...] = ()
    threads: dict[int, tuple[int, int]] = field(default_factory=dict)  # tid -> (ns on CPU, ns waiting)


def read_tree(pid: int) -> TreeReading:
    """CPU time, resident memory and allowed CPUs of `pid` and its descendants, and its cgroup's CPU state."""
    wall = time.monotonic()
    procs = _processes(pid)
    if procs is None:
        return TreeReading(pid, wall)
    cpu, n, rss, cpus, pids, threads = 0.0, 0, 0, set(), [], {}
    for p in procs:
        try:
            with p.oneshot():
                t = p.cpu_times()
                rss += p.memory_info().rss
                cpus.update(p.cpu_affinity())
        except psutil.Error:  # a worker that just ended
            continue
        cpu += t.user + t.system
        n += 1
        pids.append(p.pid)
        threads.update(_schedstat(p.pid))
    return TreeReading(pid, wall, cpu, n, rss, tuple(sorted(cpus)), cgroup_cpu(pid), tuple(pids), threads)


def server_state(start: TreeReading, end: TreeReading) -> dict[str, Any] | None:
    """The block's serving-side CPU figures (the `ServerCpu` record's fields), None when the server was not
    readable at both ends.

    `granted_share`: the CPU time its threads got over the time they were ready to run (got + waited), None
    where schedstat is not exposed or no thread ran. `cpu_share`: CPU seconds per wall second over the cores it
    was allowed (its CPU set, or its cgroup's quota where lower); `cpu_share_resolution`: what clock-tick
    accounting can tell apart over this block (each process's user and system times are whole ticks)."""
    if start.cpu_s is None or end.cpu_s is None:
        return None
    wall = max(end.wall - start.wall, 1e-9)
    both = start.threads.keys() & end.threads.keys()  # a thread started or ended inside the block is left out
    ran = sum(end.threads[t][0] - start.threads[t][0] for t in both) / 1e9
    waited = sum(end.threads[t][1] - start.threads[t][1] for t in both) / 1e9
    cpus = len(end.cpus) or (os.cpu_count() or 1)
    quota = end.cgroup.quota_cores if end.cgroup is not None else None
    allowed = min(float(cpus), quota) if quota else float(cpus)
    cores = (end.cpu_s - start.cpu_s) / wall
    throttled = None
    if start.cgroup is not None and end.cgroup is not None:
        if start.cgroup.throttled_s is not None and end.cgroup.throttled_s is not None:
            throttled = max(0.0, end.cgroup.throttled_s - start.cgroup.throttled_s) / wall
    return {
        "granted_share": ran / (ran + waited) if both and ran + waited > 0 else None,
        "wait_cores": waited / wall if both else None,
        "cpu_cores": cores,
        "allowed_cores": allowed,
        "cpu_share": cores / allowed,
        "cpu_share_resolution": 2 * max(start.procs, end.procs) / _TICK / (wall * allowed),
        "cpus": list(end.cpus),
        "cgroup_quota_cores": quota,
        "cgroup_throttled_share": throttled,
        "rss_mb": None if end.rss_bytes is None else end.rss_bytes / 2**20,
        "procs": end.procs,
    }
