"""The built-in simulated engine as a server the pipeline starts like any other."""

from __future__ import annotations

import sys
from typing import Any

import aiohttp

from specsweep.engines.base import ServerSpec
from specsweep.engines.common import (
    api_key_args,
    auth_headers,
    engine_counters,
    get_json,
    post_flush_cache,
    resource_of,
    server_cpus,
)
from specsweep.engines.sglang import summarize_server_info
from specsweep.engines.speculation import sim_args


class SimEngine:
    name = "sim"

    def __init__(self, api_key_env: str | None = None) -> None:
        self.api_key_env = api_key_env

    def server_spec(
        self, variant: dict[str, Any], arm_name: str, arm: dict[str, Any], host: str, port: int, python: str
    ) -> ServerSpec:
        argv = [
            python or sys.executable,
            "-m",
            "specsweep",
            "serve-sim",
            "--host",
            host,
            "--port",
            str(port),
            "--profile",
            variant.get("profile") or "demo",
        ]
        if arm["speculative"]:
            argv.append("--speculative")
        argv += list(variant.get("sim_args", []))
        argv += list(variant.get("server_args", []))
        argv += list(arm.get("server_args", []))
        argv += list(variant.get("arm_server_args", {}).get(arm_name, []))
        if arm["speculative"]:
            argv += sim_args(arm)
        key_args, secret = api_key_args(variant)
        return ServerSpec(
            engine=self.name,
            argv=argv + key_args,
            host=host,
            port=port,
            resource=resource_of(variant),
            env={**variant.get("env_vars", {}), **arm.get("env_vars", {})},
            readiness_paths=("/health",),
            startup_timeout_s=float(variant.get("startup_timeout_s", 900)),
            client_backend=variant.get("client_backend") or "sglang",
            source="simulated",
            secret_env=secret,
            cpus=server_cpus(variant),
        )

    async def server_info(self, session: Any, base_url: str) -> dict[str, Any]:
        """SGLang-shaped facts (the sim mirrors SGLang's /server_info)."""
        status, raw = await get_json(session, base_url + "/server_info", auth_headers(self.api_key_env))
        return summarize_server_info(raw, "/server_info") if isinstance(raw, dict) else {}

    async def counters(self, session: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
        """vLLM-named spec-decode and prefix-cache counters on /metrics (the sim mirrors both engines)."""
        return await engine_counters(session, base_url, auth_headers(self.api_key_env))

    async def reset_cache(self, session: aiohttp.ClientSession, base_url: str) -> str:
        """`POST /flush_cache`, as SGLang (the sim's prefix cache also answers vLLM's /reset_prefix_cache)."""
        return await post_flush_cache(session, base_url, auth_headers(self.api_key_env))


ENGINE = SimEngine()
