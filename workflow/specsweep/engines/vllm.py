"""vLLM: command line, readiness, server facts, and accept-length counters from `/metrics`.

Command: `<python> -m vllm.entrypoints.openai.api_server --model M --host H --port P --tensor-parallel-size N
[variant server_args] [arm server_args] [--api-key ***]`. The module entry point is used rather than the
`vllm` console script (which fails on package metadata in the CPU build, and which a relocated environment
may not have). Speculation is configured by `--speculative-config '<json>'` in the arm's server_args.

Counters (Prometheus text at `/metrics`, summed over label sets; engines/common.py): spec decode
(`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`) and prefix
cache (`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`), read before and after each repeat.
A repeat's accept length is `1 + d(accepted) / d(drafts)` (tokens per verify step), its prefix-cache hit rate
`d(hits) / d(queries)`. The cache is reset before each repeat (`POST /reset_prefix_cache`, dev mode).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp

from specsweep.client.cpu import format_cpus
from specsweep.engines.base import ServerSpec
from specsweep.engines.common import (
    auth_headers,
    engine_counters,
    get_json,
    post_reset_prefix_cache,
    real_server_spec,
    require_model,
)
from specsweep.engines.speculation import vllm_args


def speculative_config_from_argv(argv: list[str]) -> dict[str, Any] | None:
    """The JSON of `--speculative-config` (either `--speculative-config X` or `--speculative-config=X`)."""
    raw: str | None = None
    for i, a in enumerate(argv):
        if a in ("--speculative-config", "--speculative_config", "-sc") and i + 1 < len(argv):
            raw = argv[i + 1]
        elif a.startswith(("--speculative-config=", "--speculative_config=")):
            raw = a.split("=", 1)[1]
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"unparsed": raw}
    return value if isinstance(value, dict) else {"unparsed": raw}


class VLLMEngine:
    name = "vllm"
    readiness_paths = ("/health",)

    def __init__(self, api_key_env: str | None = None) -> None:
        self.api_key_env = api_key_env
        # speculative config by base_url, remembered from server_spec() (server_info has no argv)
        self._spec_config: dict[str, dict[str, Any] | None] = {}

    def server_spec(
        self, variant: dict[str, Any], arm_name: str, arm: dict[str, Any], host: str, port: int, python: str
    ) -> ServerSpec:
        launcher = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(require_model(self.name, variant)),
            "--tensor-parallel-size",
            str(int(variant.get("tp", 1))),
        ]
        spec = real_server_spec(
            self.name,
            launcher,
            "--speculative",
            variant,
            arm_name,
            arm,
            host,
            port,
            self.readiness_paths,
            "openai",
            speculation=vllm_args,
        )
        spec = dataclasses.replace(spec, env=launch_env(spec.env, spec.cpus, bool(variant.get("gpus"))))
        self._spec_config[spec.base_url] = speculative_config_from_argv(spec.argv)
        return spec

    async def server_info(self, session: Any, base_url: str, spec: ServerSpec | None = None) -> dict[str, Any]:
        base = base_url.rstrip("/")
        headers = auth_headers(self.api_key_env)
        status, version = await get_json(session, base + "/version", headers)
        if status == 0:
            return {}
        _, models = await get_json(session, base + "/v1/models", headers)
        model0 = (models or {}).get("data", [{}])[0] if isinstance(models, dict) and models.get("data") else {}
        if spec is not None:
            spec_cfg = speculative_config_from_argv(spec.argv)
        else:
            spec_cfg = self._spec_config.get(base)
        info: dict[str, Any] = {
            "endpoint": "/version",
            "version": (version or {}).get("version") if isinstance(version, dict) else None,
            "served_model": model0.get("id"),
            "max_model_len": model0.get("max_model_len"),
            "speculative_config": spec_cfg,
            "speculative_method": (spec_cfg or {}).get("method"),
            "num_speculative_tokens": (spec_cfg or {}).get("num_speculative_tokens"),
            "raw": {"version": version, "models": models},
        }
        return info

    async def counters(self, session: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
        """Cumulative spec-decode and prefix-cache counters from `/metrics`; None when unreadable."""
        return await engine_counters(session, base_url, auth_headers(self.api_key_env))

    async def reset_cache(self, session: aiohttp.ClientSession, base_url: str) -> str:
        """`POST /reset_prefix_cache`, served because the launcher sets VLLM_SERVER_DEV_MODE=1."""
        return await post_reset_prefix_cache(session, base_url, auth_headers(self.api_key_env))


def launch_env(env: dict[str, str], cpus: tuple[int, ...] | None, gpus: bool) -> dict[str, str]:
    """The server's environment with what specsweep needs of vLLM, unless the config sets it already:

    - VLLM_SERVER_DEV_MODE=1, so `POST /reset_prefix_cache` exists and each repeat starts with a cold cache;
    - on the CPU build with a CPU set, VLLM_CPU_OMP_THREADS_BIND to that set: vLLM's automatic binding picks
      cores by itself and leaves one for its scheduler process, which may be the client's.
    """
    out = {"VLLM_SERVER_DEV_MODE": "1", **env}
    if cpus and not gpus:
        out.setdefault("VLLM_CPU_OMP_THREADS_BIND", format_cpus(cpus) or "auto")
    return out


ENGINE = VLLMEngine()
