"""The built-in simulated engine as a server the pipeline starts like any other."""

from __future__ import annotations

import sys
from typing import Any

from specsweep.engines.base import ServerSpec
from specsweep.engines.sglang import api_key_args, auth_headers, get_json, resource_of, summarize_server_info
from specsweep.engines.vllm import counters_from_metrics


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
            "specsweep.sim.server",
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
        )

    async def server_info(self, session: Any, base_url: str) -> dict[str, Any]:
        """SGLang-shaped facts (the sim mirrors SGLang's /server_info)."""
        status, raw = await get_json(session, base_url + "/server_info", auth_headers(self.api_key_env))
        return summarize_server_info(raw, "/server_info") if isinstance(raw, dict) else {}

    async def spec_counters(self, session: Any, base_url: str) -> dict[str, float] | None:
        """vLLM-named counters on /metrics; used when the client talks OpenAI (no spec_verify_ct)."""
        async with session.get(base_url + "/metrics", headers=auth_headers(self.api_key_env)) as resp:
            if resp.status != 200:
                return None
            return counters_from_metrics(await resp.text())


ENGINE = SimEngine()
