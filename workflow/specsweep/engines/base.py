"""What defines a server, independent of engine: the lifecycle code and the cell runner work on this."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from specsweep.redact import redact_argv


@dataclass(frozen=True)
class ServerSpec:
    """A server to start. `identity` names it: same identity, same server (reused across cells)."""

    engine: str  # "sim" | "sglang" | "vllm"
    argv: list[str]  # full command line, port included
    host: str
    port: int
    resource: str  # what the server holds exclusively (a GPU set); at most one server per resource
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables (secrets come from os.environ)
    readiness_paths: tuple[str, ...] = ("/health",)
    startup_timeout_s: float = 900.0
    client_backend: str = "sglang"  # which client API the cells use: "sglang" (native /generate) or "openai"
    source: str = "real"  # "simulated" or "real": printed with every number
    secret_env: tuple[str, ...] = ()  # names of env vars that hold secrets (values never stored)
    cpus: tuple[int, ...] | None = None  # CPU affinity of the whole server process tree (None: not pinned)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def identity(self) -> str:
        """Hash of what defines the server; the port is left out so a reused server keeps its identity."""
        argv = [a for a in self.argv]
        payload = {
            "engine": self.engine,
            "argv": _without_port(argv),
            "env": {k: v for k, v in sorted(self.env.items())},
            "resource": self.resource,
            "cpus": list(self.cpus) if self.cpus else None,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def public_dict(self) -> dict[str, Any]:
        """A JSON-able description with secrets redacted, for summaries, logs and MLflow."""
        d = asdict(self)
        d["argv"] = redact_argv(self.argv)
        d["env"] = {k: ("***" if k in self.secret_env else v) for k, v in self.env.items()}
        d["identity"] = self.identity
        d["readiness_paths"] = list(self.readiness_paths)
        d["secret_env"] = list(self.secret_env)
        d["cpus"] = list(self.cpus) if self.cpus else None
        return d


def without_flag(argv: list[str], flag: str, takes_value: bool = True) -> list[str]:
    """`argv` without `flag` (`--flag V` or `--flag=V`; a bare switch when not `takes_value`)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def _without_port(argv: list[str]) -> list[str]:
    return without_flag(argv, "--port")


class Engine(Protocol):
    """Per-engine knowledge. Implementations: engines/sim.py, engines/sglang.py, engines/vllm.py."""

    name: str

    def server_spec(
        self, variant: dict[str, Any], arm_name: str, arm: dict[str, Any], host: str, port: int, python: str
    ) -> ServerSpec:
        """The server for one variant x arm. `variant`/`arm` are validated config dicts (schema defaults filled)."""
        ...

    async def server_info(self, session: Any, base_url: str) -> dict[str, Any]:
        """The server's own facts (version, speculative settings, running-request cap); {} when unavailable."""
        ...

    async def counters(self, session: Any, base_url: str) -> dict[str, float] | None:
        """Cumulative spec-decode and prefix-cache counters (for per-repeat deltas); None when the engine
        reports these per request instead (SGLang: spec_verify_ct, cached_tokens) or they cannot be read."""
        ...

    async def reset_cache(self, session: Any, base_url: str) -> str:
        """Empty the server's prefix cache before a repeat; returns the outcome for the summary."""
        ...
