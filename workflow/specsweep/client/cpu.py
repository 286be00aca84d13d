"""CPU sets for the client and the servers, and what the client's CPU did while it measured.

Why: on a machine with few cores an engine's threads (vLLM's CPU build spins a scheduler process beside its
compute threads) take the core the client needs, and the client then stamps and sends late. Giving the client a
core of its own removes that; reading its own CPU accounting tells the two ways a client goes wrong apart from a
jittery host:

- *saturated*: its own work fills its core (CPU time / wall time near 1);
- *starved*: it was ready to run but another task held the CPU (`/proc/self/schedstat` run-queue delay).

Neither moves when a virtual machine's host delays the whole guest, which shows up as loop lag only. A third
figure watches the machine rather than the client: CPU time spent on the measurement's CPUs by processes that
are neither the client nor the server tree (another job, a test run), which slows the engine unseen.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsweep.telemetry.process import TreeReading, read_tree, server_state

__all__ = [
    "CpuPlan",
    "CpuUsage",
    "HostSnapshot",
    "format_cpus",
    "host_snapshot",
    "parse_cpus",
    "pin_self",
    "pinned",
    "plan_cpus",
    "usage_now",
]


def parse_cpus(spec: str | int | list[int] | tuple[int, ...] | None) -> tuple[int, ...] | None:
    """'0-2,5' / 3 / [0, 1] -> (0, 1, 2, 5); None -> None. Raises ValueError naming the bad part."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return (spec,)
    if isinstance(spec, list | tuple):
        return tuple(sorted({int(x) for x in spec}))
    out: set[int] = set()
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"bad CPU list {spec!r}: {part!r} is not a number or a range like 2-5") from None
        if b < a:
            raise ValueError(f"bad CPU list {spec!r}: range {part!r} runs backwards")
        out.update(range(a, b + 1))
    if not out:
        raise ValueError(f"bad CPU list {spec!r}: no CPU named")
    return tuple(sorted(out))


def format_cpus(cpus: tuple[int, ...] | None) -> str | None:
    """(0, 1, 2, 5) -> '0-2,5' (the form vLLM's VLLM_CPU_OMP_THREADS_BIND and taskset take)."""
    if not cpus:
        return None
    parts, start, prev = [], cpus[0], cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


@dataclass(frozen=True)
class CpuPlan:
    """Which CPUs the client and the servers use; None means 'not pinned' (the OS decides)."""

    client: tuple[int, ...] | None
    server: tuple[int, ...] | None
    note: str = ""

    @property
    def shared(self) -> tuple[int, ...]:
        """CPUs the client and the server were both given (none under 'auto' with two or more CPUs)."""
        if self.client is None or self.server is None:
            return ()
        return tuple(sorted(set(self.client) & set(self.server)))

    @property
    def watched(self) -> tuple[int, ...] | None:
        """The CPUs a measurement runs on (client and server), None when either is unpinned (all CPUs)."""
        if self.client is None or self.server is None:
            return None
        return tuple(sorted(set(self.client) | set(self.server)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "client": format_cpus(self.client),
            "server": format_cpus(self.server),
            "shared": format_cpus(self.shared),
            "note": self.note,
        }


def available_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_cpus(client: Any = "auto", server: Any = "auto", available: tuple[int, ...] | None = None) -> CpuPlan:
    """Resolve the config's `client.cpus` and a variant's `cpus` ('auto', null or a CPU list).

    auto: the client gets the last available CPU and the server every other one; with a single CPU nothing is
    pinned (and the plan says so). An explicit client set leaves the server the rest under 'auto'.
    """
    avail = available or available_cpus()
    note = ""
    if client == "auto":
        if len(avail) >= 2:
            c: tuple[int, ...] | None = (avail[-1],)
        else:
            c, note = None, "one CPU: client and server share it (the client-starvation gate will tell)"
    else:
        c = parse_cpus(client)
    if c is not None and not set(c) <= set(avail):
        raise ValueError(f"client CPUs {format_cpus(c)} are not all available here ({format_cpus(avail)})")
    if server == "auto":
        rest = tuple(x for x in avail if c is None or x not in c)
        s: tuple[int, ...] | None = rest if (c is not None and rest) else None
    else:
        s = parse_cpus(server)
        if s is not None and not set(s) <= set(avail):
            raise ValueError(f"server CPUs {format_cpus(s)} are not all available here ({format_cpus(avail)})")
    if c is not None and s is not None and set(c) & set(s):
        note = note or f"client and server share CPUs {format_cpus(tuple(sorted(set(c) & set(s))))}"
    return CpuPlan(c, s, note)


def pin_self(cpus: tuple[int, ...] | None) -> None:
    """Restrict this process (all its threads) to `cpus`; None leaves it alone."""
    if cpus:
        os.sched_setaffinity(0, cpus)


@contextlib.contextmanager
def pinned(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """This process on `cpus` for the block, its former CPU set restored after (a cell run in-process, as the
    fault suite does, must not leave its caller on one core)."""
    before = os.sched_getaffinity(0)
    pin_self(cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _schedstat_ns() -> tuple[int, int]:
    """(time on CPU, time waiting on a run queue) in ns, summed over this process's threads."""
    run = wait = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            a = (task / "schedstat").read_text().split()
        except OSError:  # a thread that just ended
            continue
        run += int(a[0])
        wait += int(a[1])
    return run, wait


@dataclass
class CpuUsage:
    """A snapshot of this process's CPU accounting; `since(earlier)` gives the shares over the interval."""

    wall: float = field(default_factory=time.monotonic)
    cpu: float = field(default_factory=time.process_time)
    waited: float | None = None  # seconds on a run queue (None where /proc/self/schedstat is absent)

    def since(self, start: CpuUsage) -> dict[str, float | None]:
        wall = max(self.wall - start.wall, 1e-9)
        waited = None if self.waited is None or start.waited is None else self.waited - start.waited
        return {
            "wall_s": wall,
            "cpu_s": self.cpu - start.cpu,
            "busy_share": (self.cpu - start.cpu) / wall,  # of one core: the event loop is one thread
            "wait_s": waited,
            "wait_share": None if waited is None else waited / wall,
        }


def usage_now() -> CpuUsage:
    try:
        _, wait = _schedstat_ns()
        waited: float | None = wait / 1e9
    except (OSError, ValueError, IndexError):
        waited = None
    return CpuUsage(waited=waited)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(cpus: tuple[int, ...] | None) -> tuple[float, float]:
    """(busy, steal) seconds since boot over `cpus` (all when None), from /proc/stat's per-CPU lines."""
    busy = steal = 0
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *vals = line.split()
            if cpus is not None and int(name[3:]) not in cpus:
                continue
            v = [int(x) for x in vals]
            # user nice system: time of processes; interrupts (the loopback traffic's softirq work among them)
            # are charged to no process, so they are left out rather than counted as someone else's work
            busy += v[0] + v[1] + v[2]
            steal += v[7] if len(v) > 7 else 0
    return busy / _TICK, steal / _TICK


@dataclass
class HostSnapshot:
    """CPU accounting of the measurement's CPUs, the server tree and this process at one instant."""

    cpus: tuple[int, ...] | None
    server_pid: int | None
    wall: float = field(default_factory=time.monotonic)
    busy: float = 0.0
    steal: float = 0.0
    server: TreeReading | None = None
    own: float = field(default_factory=time.process_time)

    def since(self, start: HostSnapshot) -> dict[str, Any]:
        """Shares of the watched CPUs' capacity over the interval: the server's, other processes', stolen; and
        the server tree's own state (`telemetry.process.server_state`: its share of the CPUs it was allowed).

        `foreign_cpu_resolution` is the smallest foreign share the counters can tell from none over this
        interval: the CPUs' busy time and each server process's user and system times are whole clock ticks
        (10 ms), so a difference of two readings is off by up to a tick each. Over a 0.2 s repeat on one CPU
        that is 15%: such a repeat cannot say whether another process took 10% of its CPU.
        """
        wall = max(self.wall - start.wall, 1e-9)
        n = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
        state = None if self.server is None or start.server is None else server_state(start.server, self.server)
        foreign = resolution = server = None
        if state is not None:
            server = float(state["cpu_cores"]) * wall
            foreign = max(0.0, (self.busy - start.busy) - server - (self.own - start.own))
            assert self.server is not None and start.server is not None
            ticks = n + 2 * max(self.server.procs, start.server.procs)
            resolution = ticks / _TICK / (wall * n)
        return {
            "server_cpu_cores": None if server is None else server / wall,
            "foreign_cpu_share": None if foreign is None else foreign / (wall * n),
            "foreign_cpu_resolution": resolution,
            "steal_share": (self.steal - start.steal) / (wall * n),
            "server_state": state,
        }


def host_snapshot(cpus: tuple[int, ...] | None, server_pid: int | None) -> HostSnapshot:
    busy, steal = _cpu_ticks(cpus)
    tree = None if server_pid is None else read_tree(server_pid)
    return HostSnapshot(cpus, server_pid, busy=busy, steal=steal, server=tree)
