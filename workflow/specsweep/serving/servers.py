"""Server lifecycle: one server per resource (GPU set), reused by identity, never outliving its workflow.

A cell asks for its server with `acquire()`. A healthy server with the same identity is reused; anything else
holding the same resource is stopped first. Each server runs under a supervisor process in its own session that
ends the whole server process tree when the owner (the Snakemake process, or the cell itself when run alone)
goes away, however it goes away: normal end, failure, Ctrl-C, SIGTERM or SIGKILL.

In a SLURM job the resource is the job's allocation on its node (the same GPU indices on two nodes, or in two jobs
on one node, are different GPUs), the owner is the job's first Snakemake process, and the supervisor is started
by the job's server host (specsweep.serving.serverhost), so the server serves every cell of the job and ends with it.
The state folder is on shared storage; a process only ever signals servers of its own node.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from specsweep.engines.base import ServerSpec
from specsweep.io import atomic_write_json, file_lock, tail_lines
from specsweep.redact import redact_argv, redact_text, unredact_argv
from specsweep.serving.liveness import owner_alive, process_started
from specsweep.serving.serverhost import HOST_ENV, inbox, request

OWNER_ENV = "SPECSWEEP_OWNER_PID"
OWNER_JOB_ENV = "SPECSWEEP_OWNER_JOB"  # in a SLURM job: the job whose first Snakemake process is the owner
POLL_S = 0.25


class ServerError(RuntimeError):
    """The server could not be started or became unusable; the message carries the command and log tail."""


@dataclass
class ServerRecord:
    identity: str
    resource: str
    engine: str
    label: str
    host: str
    port: int
    supervisor_pid: int
    server_pid: int
    owner_pid: int
    owner_started: float
    started_at: float
    log_path: str
    command: list[str]  # redacted
    node: str = ""  # the machine the server runs on (records are on shared storage)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


# ---------------------------------------------------------------- state files


def this_node() -> str:
    return socket.gethostname()


def scoped_resource(resource: str) -> str:
    """What a server holds exclusively here: the resource as named, or in a SLURM job, its allocation of it."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"{resource}@{this_node()}.job{job}" if job else resource


def _local(rec: ServerRecord) -> bool:
    return rec.node in ("", this_node())


def _slug(resource: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in resource)


def _record_path(state_dir: Path, resource: str) -> Path:
    return state_dir / f"{_slug(resource)}.json"


def read_record(path: Path) -> ServerRecord | None:
    try:
        return ServerRecord(**json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def records(state_dir: Path) -> list[ServerRecord]:
    if not state_dir.is_dir():
        return []
    out = [read_record(p) for p in sorted(state_dir.glob("*.json"))]
    return [r for r in out if r is not None]


def log_event(state_dir: Path, event: str, **fields: Any) -> None:
    """One line per lifecycle event in servers.log: how often each server started is read from here."""
    state_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    with open(state_dir / "servers.log", "a") as fh:
        fh.write(f"{stamp} {event} {text}\n")


# ---------------------------------------------------------------- processes


def kill_tree(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process, its process group and all descendants; SIGKILL what is left after grace_s."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
            p.send_signal(signal.SIGCONT)  # a frozen server (interleaved arms) acts on SIGTERM only once resumed
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, configured: int | None, where: str) -> int:
    """The configured port if it is free (else a clear error), or a free one."""
    if configured:
        if not port_free(host, configured):
            raise ServerError(
                f"port {configured} on {host} is already in use ({where}); stop what holds it, "
                "choose another port, or set it to null so a free port is picked"
            )
        return configured
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_status(url: str, timeout: float = 5.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


def is_ready(base_url: str, paths: tuple[str, ...], timeout: float = 5.0) -> bool:
    """Ready when the first readiness path the server knows (not 404) answers 200."""
    for path in paths:
        status = http_status(base_url + path, timeout=timeout)
        if status == 404:
            continue
        return status == 200
    return False


# ---------------------------------------------------------------- stop / start


def stop_record(state_dir: Path, rec: ServerRecord, reason: str, grace_s: float = 10.0) -> None:
    if not _local(rec):
        raise ServerError(f"{rec.label} runs on {rec.node}, not on {this_node()}: stop it there")
    if process_started(rec.supervisor_pid) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.supervisor_pid, signal.SIGTERM)
    if process_started(rec.server_pid) is not None:
        kill_tree(rec.server_pid, grace_s=grace_s)
    # The supervisor removes the record on its way out; make sure it is gone in any case.
    path = _record_path(state_dir, rec.resource)
    current = read_record(path)
    if current is not None and current.server_pid == rec.server_pid:
        path.unlink(missing_ok=True)
    log_event(state_dir, "stop", label=rec.label, identity=rec.identity, pid=rec.server_pid, reason=reason)


def stop_all(state_dir: str | Path, reason: str = "workflow end") -> int:
    """Stop every server of an experiment on this node. Returns how many were stopped."""
    state_dir = Path(state_dir)
    n = 0
    with file_lock(state_dir / "state.lock"):
        for rec in records(state_dir):
            if not _local(rec):  # another node's pids mean nothing here
                continue
            stop_record(state_dir, rec, reason)
            n += 1
    return n


def stop_on_sigterm(state_dir: str | Path) -> None:
    """Make SIGTERM mean "stop now" for servers too.

    Snakemake answers SIGTERM by waiting for its running jobs; a cell mid-sweep can run for many minutes while
    its server holds the GPUs. Stopping the servers first makes the running cell fail at once (nothing is
    written for it), then Snakemake's own handler finishes the shutdown.
    """
    import threading

    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        threading.Thread(target=stop_all, args=(state_dir, "SIGTERM"), daemon=False).start()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def _owner() -> tuple[int, float]:
    pid = int(os.environ.get(OWNER_ENV) or os.getpid())
    started = process_started(pid)
    if started is None:  # the named owner is gone already: the caller owns the server
        pid = os.getpid()
        started = process_started(pid) or time.time()
    return pid, started


INSTANCE_LOG_BYTES = 32 * 1024 * 1024  # what is read of a server log's end for facts the server only logs


def instance_log(log_path: str | Path) -> list[str]:
    """The lines the running server instance wrote: those after the last `=== ... starting` line `_start`
    writes (the log is appended to across restarts), from at most its last INSTANCE_LOG_BYTES."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - INSTANCE_LOG_BYTES))
            text = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("=== ") and " starting " in line]
    return lines[starts[-1] + 1 :] if starts else lines


def _start(state_dir: Path, spec: ServerSpec, label: str, log_path: Path, owner: tuple[int, float]) -> ServerRecord:
    """Start the server's supervisor: from this job's server host where there is one, else from here."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    spec_file = state_dir / f"{_slug(spec.resource)}.spec"
    # The spec file holds the redacted command; the supervisor puts secrets back from its environment.
    public = {**asdict(spec), "argv": redact_argv(spec.argv)}
    atomic_write_json(spec_file, {"spec": public, "label": label, "log_path": str(log_path)})
    record_path = _record_path(state_dir, spec.resource)
    record_path.unlink(missing_ok=True)
    with open(log_path, "a") as log:
        log.write(
            f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {label}: {' '.join(spec.public_dict()['argv'])}\n"
        )
    argv = [
        sys.executable,
        "-m",
        "specsweep",
        "servers",
        "supervise",
        "--spec-file",
        str(spec_file),
        "--record",
        str(record_path),
        "--owner-pid",
        str(owner[0]),
        "--owner-started",
        repr(owner[1]),
    ]
    box = inbox()
    if box is not None:
        request(box, argv, log_path)
    else:
        with open(log_path, "a") as log:
            subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
            )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rec = read_record(record_path)
        if rec is not None:
            log_event(
                state_dir,
                "start",
                label=label,
                identity=spec.identity,
                pid=rec.server_pid,
                port=spec.port,
            )
            return rec
        time.sleep(0.05)
    raise ServerError(f"the server supervisor for {label} did not come up; see {log_path}")


def _wait_ready(state_dir: Path, rec: ServerRecord, spec: ServerSpec) -> None:
    deadline = time.monotonic() + spec.startup_timeout_s
    while True:
        if process_started(rec.server_pid) is None:
            _fail(state_dir, rec, spec, "the server process exited during start-up")
        if is_ready(rec.base_url, spec.readiness_paths, timeout=2.0):
            return
        if time.monotonic() > deadline:
            _fail(state_dir, rec, spec, f"the server was not ready within {spec.startup_timeout_s:g} s")
        time.sleep(0.2)


def _fail(state_dir: Path, rec: ServerRecord, spec: ServerSpec, why: str) -> None:
    stop_record(state_dir, rec, reason="start-up failed", grace_s=3.0)
    tail = redact_text("\n".join(tail_lines(Path(rec.log_path), 50)))
    raise ServerError(
        f"{why} ({rec.label}).\ncommand: {' '.join(spec.public_dict()['argv'])}\n"
        f"log: {rec.log_path}\n--- last 50 lines of the server log ---\n{tail}"
    )


def _reusable(rec: ServerRecord | None, probe: ServerSpec, owner: tuple[int, float]) -> bool:
    """A recorded server this process may use for `probe`: same identity and owner, alive and ready."""
    return (
        rec is not None
        and rec.identity == probe.identity
        and rec.owner_pid == owner[0]
        and process_started(rec.server_pid) is not None
        and is_ready(rec.base_url, probe.readiness_paths)
    )


def _check_served(state_dir: Path, rec: ServerRecord, probe: ServerSpec, label: str, during: str) -> None:
    """A server being stopped (its owner went away) may linger while it shuts down: what was measured against
    it holds failures, not the engine. Its record is gone, or it no longer answers its readiness path."""
    current = read_record(_record_path(state_dir, probe.resource))
    if (
        process_started(rec.server_pid) is None
        or current is None
        or current.server_pid != rec.server_pid
        or not is_ready(rec.base_url, probe.readiness_paths)
    ):
        raise ServerError(f"the server of {label} stopped during {during}; see {rec.log_path}")


@contextlib.contextmanager
def acquire(
    state_dir: str | Path,
    make_spec: Callable[[int], ServerSpec],
    host: str,
    configured_port: int | None,
    label: str,
    log_path: str | Path,
) -> Iterator[ServerRecord]:
    """Hold the server for `make_spec(port)` for the duration of the block (one cell's measurement).

    The resource lock is held throughout, so no other cell can stop this server mid-measurement.
    """
    state_dir = Path(state_dir)
    resource = scoped_resource(make_spec(configured_port or 0).resource)

    def make_scoped(port: int) -> ServerSpec:
        return replace(make_spec(port), resource=resource)

    probe = make_scoped(configured_port or 0)
    with file_lock(state_dir / f"{_slug(probe.resource)}.lock"):
        with file_lock(state_dir / "state.lock"):
            owner = _owner()
            rec = read_record(_record_path(state_dir, probe.resource))
            reusable = _reusable(rec, probe, owner)
            if rec is not None and not reusable:
                stop_record(state_dir, rec, reason=f"resource {probe.resource} needed by {label}")
            for member in group_records(state_dir, probe.resource):
                stop_record(state_dir, member, reason=f"resource {probe.resource} needed by {label}")
            if reusable:
                assert rec is not None
                log_event(state_dir, "reuse", label=label, identity=rec.identity, pid=rec.server_pid)
                spec = make_scoped(rec.port)
            else:
                port = pick_port(host, configured_port, label)
                spec = make_scoped(port)
                rec = _start(state_dir, spec, label, Path(log_path), owner)
        if not reusable:
            _wait_ready(state_dir, rec, spec)
            log_event(state_dir, "ready", label=label, identity=rec.identity, pid=rec.server_pid)
        yield rec
        _check_served(state_dir, rec, probe, label, "the cell")


GROUP_SEP = "#"  # a group member's resource: <resource>#<slot>


def group_records(state_dir: Path, resource: str) -> list[ServerRecord]:
    """The servers of a group on `resource` (interleaved arms: one per slot, all holding the one resource)."""
    return [r for r in records(state_dir) if r.resource.startswith(resource + GROUP_SEP) and _local(r)]


def server_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def freeze(rec: ServerRecord) -> None:
    """Stop the server's whole process tree (SIGSTOP), so an idle arm takes no CPU from the measured one."""
    for p in server_tree(rec.server_pid):
        with contextlib.suppress(psutil.Error):
            p.suspend()


def thaw(rec: ServerRecord) -> None:
    """Resume a frozen server's process tree (SIGCONT); harmless on a running one."""
    for p in server_tree(rec.server_pid):
        with contextlib.suppress(psutil.Error):
            p.resume()


@contextlib.contextmanager
def acquire_group(
    state_dir: str | Path,
    make_specs: dict[str, Callable[[int], ServerSpec]],
    host: str,
    configured_port: int | None,
    labels: dict[str, str],
    log_paths: dict[str, str | Path],
) -> Iterator[dict[str, ServerRecord]]:
    """Hold one server per slot, all up at once on one resource, for the block (an interleaved level).

    The resource's lock is held throughout, as `acquire` holds it for one server; each slot's server is reused
    by identity across levels, and the group's servers of other slots stay up, frozen for the block. Every
    server is resumed on the way out, whatever happened inside (the caller freezes the idle slots while another
    is measured)."""
    state_dir = Path(state_dir)
    slots = list(make_specs)
    first = make_specs[slots[0]](configured_port or 0)
    base = scoped_resource(first.resource)

    def make_scoped(slot: str, port: int) -> ServerSpec:
        return replace(make_specs[slot](port), resource=f"{base}{GROUP_SEP}{slot}")

    recs: dict[str, ServerRecord] = {}
    started: list[tuple[str, int]] = []
    with file_lock(state_dir / f"{_slug(base)}.lock"):
        with file_lock(state_dir / "state.lock"):
            owner = _owner()
            plain = read_record(_record_path(state_dir, base))
            if plain is not None:
                stop_record(state_dir, plain, reason=f"resource {base} needed by the group {', '.join(slots)}")
            # the group's other members (another level job's arms) stay up, frozen while this block runs: a
            # policy arm's level job reuses the fixed arm it is measured with instead of starting it again
            idle = [m for m in group_records(state_dir, base) if m.resource.split(GROUP_SEP, 1)[1] not in slots]
            taken: set[int] = set()
            for i, slot in enumerate(slots):
                probe = make_scoped(slot, 0)
                rec = read_record(_record_path(state_dir, probe.resource))
                if rec is not None:
                    thaw(rec)
                reusable = _reusable(rec, probe, owner)
                if rec is not None and not reusable:
                    stop_record(state_dir, rec, reason=f"{labels[slot]} changed")
                if reusable:
                    assert rec is not None
                    log_event(state_dir, "reuse", label=labels[slot], identity=rec.identity, pid=rec.server_pid)
                    recs[slot] = rec
                    taken.add(rec.port)
                    continue
                port = pick_port(host, configured_port + i if configured_port else None, labels[slot])
                while port in taken:
                    port = pick_port(host, None, labels[slot])
                taken.add(port)
                started.append((slot, port))
        # One after another, each ready before the next starts: started together, servers that load on the CPU
        # (vLLM's CPU build: ~60 s alone on 2 cores) took over 300 s each; and a ready server is frozen while the
        # next one loads, so it takes no CPU from it.
        try:
            for slot, port in started:
                with file_lock(state_dir / "state.lock"):
                    recs[slot] = _start(state_dir, make_scoped(slot, port), labels[slot], Path(log_paths[slot]), owner)
                rec = recs[slot]
                _wait_ready(state_dir, rec, make_scoped(slot, port))
                log_event(state_dir, "ready", label=labels[slot], identity=rec.identity, pid=rec.server_pid)
                freeze(rec)
        finally:
            for rec in recs.values():
                thaw(rec)
        for rec in idle:
            freeze(rec)
        try:
            yield recs
        finally:
            for rec in [*recs.values(), *idle]:
                thaw(rec)
        for slot, rec in recs.items():
            _check_served(state_dir, rec, make_scoped(slot, rec.port), labels[slot], "the level")


# ---------------------------------------------------------------- supervisor


def supervise(spec_file: Path, record_path: Path, owner_pid: int, owner_started: float) -> int:
    """Run the server and end its whole tree when the owner goes away or a stop is asked (SIGTERM)."""
    data = json.loads(spec_file.read_text())
    secret_env = tuple(data["spec"]["secret_env"])
    spec = ServerSpec(
        **{
            **data["spec"],
            "readiness_paths": tuple(data["spec"]["readiness_paths"]),
            "secret_env": secret_env,
            "argv": unredact_argv(data["spec"]["argv"], secret_env),
            "cpus": tuple(data["spec"]["cpus"]) if data["spec"].get("cpus") else None,
        }
    )
    env = {**os.environ, **spec.env}
    for name in (OWNER_ENV, OWNER_JOB_ENV, HOST_ENV):  # the engine owns nothing
        env.pop(name, None)
    log = open(data["log_path"], "a")  # noqa: SIM115 - lives as long as the server
    cpus = spec.cpus
    server = subprocess.Popen(
        spec.argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # the whole tree inherits the CPU set (the supervisor is single-threaded, so preexec_fn is safe):
        # engines spawn workers that must stay off the client's core
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    rec = ServerRecord(
        identity=spec.identity,
        resource=spec.resource,
        engine=spec.engine,
        label=data["label"],
        host=spec.host,
        port=spec.port,
        supervisor_pid=os.getpid(),
        server_pid=server.pid,
        owner_pid=owner_pid,
        owner_started=owner_started,
        started_at=time.time(),
        log_path=data["log_path"],
        command=spec.public_dict()["argv"],
        node=this_node(),
    )
    atomic_write_json(record_path, asdict(rec))
    stop = {"asked": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["asked"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    reason = "stop asked"
    while not stop["asked"]:
        if server.poll() is not None:
            reason = f"server exited with code {server.returncode}"
            break
        if not owner_alive(owner_pid, owner_started):
            reason = f"owner process {owner_pid} is gone"
            break
        time.sleep(POLL_S)
    print(f"supervisor: {reason}; stopping the server tree", file=log, flush=True)
    if server.poll() is None:
        kill_tree(server.pid, grace_s=10.0)
    else:
        kill_tree(server.pid, grace_s=1.0)  # children may outlive a crashed parent
    current = read_record(record_path)
    if current is not None and current.server_pid == server.pid:
        record_path.unlink(missing_ok=True)
    if reason != "stop asked":  # a requested stop is logged by whoever asked
        log_event(
            record_path.parent,
            "stop",
            label=rec.label,
            identity=rec.identity,
            pid=server.pid,
            reason=reason.replace(" ", "_"),
        )
    return 0


def listing(state_dir: Path) -> list[str]:
    """One tab-separated line per recorded server of an experiment: label, node, URL, pid, state (alive, gone,
    or elsewhere: on another node, not checked from here) and identity."""
    lines = []
    for rec in records(state_dir):
        state = ("alive" if process_started(rec.server_pid) is not None else "gone") if _local(rec) else "elsewhere"
        node = rec.node or this_node()
        lines.append(f"{rec.label}\t{node}\t{rec.base_url}\tpid={rec.server_pid}\t{state}\t{rec.identity}")
    return lines
