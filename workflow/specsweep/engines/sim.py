"""The built-in simulated engine as a server the pipeline starts like any other."""

from __future__ import annotations

import sys
from typing import Any

from specsweep.engines.base import ServerSpec
from specsweep.engines.http import get_json, get_text
from specsweep.engines.prometheus import spec_decode_counters


class SimEngine:
    name = "sim"

    def server_spec(
        self, variant: dict[str, Any], arm_name: str, arm: dict[str, Any], host: str, port: int, python: str
    ) -> ServerSpec:
        argv = [
            python or sys.executable, "-m", "specsweep.sim.server",
            "--host", host, "--port", str(port), "--profile", variant.get("profile") or "demo",
        ]
        if arm["speculative"]:
            argv.append("--speculative")
        argv += list(variant.get("sim_args", []))
        argv += list(variant.get("server_args", []))
        argv += list(arm.get("server_args", []))
        argv += list(variant.get("arm_server_args", {}).get(arm_name, []))
        return ServerSpec(
            engine=self.name,
            argv=argv,
            host=host,
            port=port,
            resource=f"gpus:{variant['gpus']}" if variant.get("gpus") else "host",
            env={**variant.get("env_vars", {}), **arm.get("env_vars", {})},
            readiness_paths=("/health",),
            startup_timeout_s=float(variant.get("startup_timeout_s", 900)),
            client_backend=variant.get("client_backend") or "sglang",
            source="simulated",
        )

    async def server_info(self, session: Any, base_url: str) -> dict[str, Any]:
        return await get_json(session, base_url + "/server_info") or {}

    async def spec_counters(self, session: Any, base_url: str) -> dict[str, float] | None:
        """The sim reports spec_verify_ct per request on /generate; counters serve the OpenAI path."""
        text = await get_text(session, base_url + "/metrics")
        return spec_decode_counters(text) if text else None

ENGINE = SimEngine()
