"""Slow a real server for one of its measured blocks, from outside it and without touching the client.

How: a cgroup with a CPU quota (CFS bandwidth: the kernel runs the group's threads for `cores` x its period,
then holds them until the next), the way a container's CPU limit throttles a serving process. The server's
process tree is moved into it at the start of one of its blocks and back out when the interleaved level freezes it
for another arm's block (SIGSTOP: `serving.servers.freeze`), so exactly one block is served by a slower machine.
Needs root and a writable cpu controller (cgroup v1 `cpu` hierarchy, or v2 with `cpu` in the root's
subtree_control); `CpuQuota` says which is missing otherwise.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

CGROUP = Path("/sys/fs/cgroup")


class CpuQuota:
    """A temporary cgroup holding at most `cores` CPUs; `move` puts processes in, `release` back where they were."""

    def __init__(self, cores: float, period_us: int = 100_000) -> None:
        self.cores, self.period_us = cores, period_us
        self.dir: Path | None = None
        self.v2 = False
        self.origin: dict[int, Path] = {}

    def __enter__(self) -> CpuQuota:
        name = f"specsweep-test-{uuid.uuid4().hex[:8]}"
        quota = int(self.cores * self.period_us)
        v1 = CGROUP / "cpu"
        try:
            if (v1 / "cpu.cfs_quota_us").exists():
                self.dir = v1 / name
                self.dir.mkdir()
                (self.dir / "cpu.cfs_period_us").write_text(str(self.period_us))
                (self.dir / "cpu.cfs_quota_us").write_text(str(quota))
            elif "cpu" in (CGROUP / "cgroup.subtree_control").read_text().split():
                self.v2, self.dir = True, CGROUP / name
                self.dir.mkdir()
                (self.dir / "cpu.max").write_text(f"{quota} {self.period_us}")
            else:
                raise OSError("no cgroup v1 cpu hierarchy, and cgroup v2's root does not delegate the cpu controller")
        except OSError as e:
            raise RuntimeError(
                f"cannot create a CPU-quota cgroup under {CGROUP} ({e}): this test slows a real server with one; "
                "run it as root on a machine with a writable cpu controller"
            ) from e
        return self

    def _cgroup_of(self, pid: int) -> Path:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, rel = line.split(":", 2)
            if (self.v2 and controllers == "") or (not self.v2 and "cpu" in controllers.split(",")):
                return (CGROUP if self.v2 else CGROUP / "cpu") / rel.lstrip("/")
        raise RuntimeError(f"process {pid} has no cpu cgroup")

    def move(self, pids: list[int]) -> None:
        assert self.dir is not None
        for pid in pids:
            with contextlib.suppress(OSError, RuntimeError):  # a process that just ended
                self.origin.setdefault(pid, self._cgroup_of(pid))
                (self.dir / "cgroup.procs").write_text(str(pid))

    def release(self) -> None:
        for pid, home in list(self.origin.items()):
            with contextlib.suppress(OSError):
                (home / "cgroup.procs").write_text(str(pid))
            del self.origin[pid]

    def __exit__(self, *exc: object) -> None:
        self.release()
        if self.dir is not None:
            for _ in range(50):  # rmdir fails while a process that just left is still being moved
                try:
                    self.dir.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def api_servers(workdir: Path) -> list[tuple[psutil.Process, str]]:
    """The vLLM API servers started from `workdir`, with their command lines."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if "api_server" in cmd and str(p.info.get("cwd") or "").startswith(str(workdir)):
            out.append((p, cmd))
    return out


def find_server(workdir: Path, marker: str) -> psutil.Process | None:
    """The vLLM API server started from `workdir` whose command line holds `marker`."""
    return next((p for p, cmd in api_servers(workdir) if marker in cmd), None)


def client_streams(server: psutil.Process) -> int:
    """Established TCP connections to the server's listening port(s): the load generator's streams."""
    try:
        conns = server.net_connections(kind="tcp") if hasattr(server, "net_connections") else server.connections()
    except psutil.Error:
        return 0
    ports = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr.port in ports)


class ThrottleOneBlock(threading.Thread):
    """Watch the server whose command line holds `marker`; at the first of its blocks at a level of at least
    `streams` concurrent requests (it runs, another server is frozen, and that many client streams are connected:
    a level's preparation thaws servers too, with one stream or none), hold its tree to `cores` CPUs until it is
    frozen again (at most `max_s`), then stop watching. `log` says when and to what (for the test's messages)."""

    def __init__(self, workdir: Path, marker: str, cores: float = 0.5, streams: int = 8, max_s: float = 8.0) -> None:
        super().__init__(daemon=True)
        self.workdir, self.marker, self.cores, self.streams, self.max_s = workdir, marker, cores, streams, max_s
        self.done = threading.Event()
        self.log: dict[str, Any] = {"marker": marker, "cores": cores, "throttled": False}

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - the test reads what went wrong from the log
            self.log["error"] = repr(e)

    def _stopped(self, p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return False

    def _in_block(self, server: psutil.Process, others: list[psutil.Process]) -> bool:
        """Cheapest first: this loop runs beside the measurement (its CPU counts as another process's)."""
        if self._stopped(server) or not any(self._stopped(p) for p in others):
            return False
        return client_streams(server) >= self.streams

    def _run(self) -> None:
        server = None
        while server is None and not self.done.wait(0.5):
            server = find_server(self.workdir, self.marker)
        if server is None:
            return
        self.log["pid"] = server.pid
        others: list[psutil.Process] = []
        listed = 0.0
        while not self.done.wait(0.05):
            if time.monotonic() - listed > 2.0:  # servers start one after another
                others = [p for p, _ in api_servers(self.workdir) if p.pid != server.pid]
                listed = time.monotonic()
            if self._in_block(server, others):
                break
        else:
            return
        with CpuQuota(self.cores) as quota:
            tree = [server, *server.children(recursive=True)]
            quota.move([p.pid for p in tree])
            self.log.update(throttled=True, start_unix=time.time(), pids=[p.pid for p in tree])
            t0 = time.monotonic()
            while time.monotonic() - t0 < self.max_s and not self._stopped(server) and not self.done.wait(0.01):
                pass
            quota.release()
            self.log.update(end_unix=time.time(), held_s=time.monotonic() - t0)
