"""SGLang: command line, readiness, server facts. Accept length comes per request
(`meta_info.spec_verify_ct`).

Command: `<python> -m sglang.launch_server --model-path M --tp-size N --host H --port P [variant server_args]
[arm server_args] [--api-key ***]`. Flag names follow SGLang's server arguments (`--tp-size`, alias `--tp`;
`--max-running-requests`; `--enable-metrics`; `--speculative-algorithm EAGLE3 ...`), checked against
SGLang's docs; see docs/engines.md.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from specsweep.engines.base import ServerSpec
from specsweep.engines.common import auth_headers, get_json, post_flush_cache, real_server_spec, require_model
from specsweep.engines.speculation import sglang_args

# ---- the engine -------------------------------------------------------------------------------------------

SPEC_FIELDS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)


class SGLangEngine:
    name = "sglang"
    readiness_paths = ("/health_generate", "/health")

    def __init__(self, api_key_env: str | None = None) -> None:
        self.api_key_env = api_key_env  # for server_info() against a keyed server

    def server_spec(
        self, variant: dict[str, Any], arm_name: str, arm: dict[str, Any], host: str, port: int, python: str
    ) -> ServerSpec:
        launcher = [
            str(python),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(require_model(self.name, variant)),
            "--tp-size",
            str(int(variant.get("tp", 1))),
        ]
        return real_server_spec(
            self.name,
            launcher,
            "--speculative-",
            variant,
            arm_name,
            arm,
            host,
            port,
            self.readiness_paths,
            "sglang",
            speculation=sglang_args,
        )

    async def server_info(self, session: Any, base_url: str) -> dict[str, Any]:
        headers = auth_headers(self.api_key_env)
        status, raw = await get_json(session, base_url.rstrip("/") + "/server_info", headers)
        endpoint = "/server_info"
        if status == 404:
            status, raw = await get_json(session, base_url.rstrip("/") + "/get_server_info", headers)
            endpoint = "/get_server_info"
        if not isinstance(raw, dict):
            return {}
        return summarize_server_info(raw, endpoint)

    async def counters(self, session: Any, base_url: str) -> dict[str, float] | None:
        return None  # per request instead: meta_info.spec_verify_ct (accept length), meta_info.cached_tokens

    async def reset_cache(self, session: aiohttp.ClientSession, base_url: str) -> str:
        """`POST /flush_cache`: empties the radix (prefix) cache; answers 400 while requests run (retried)."""
        return await post_flush_cache(session, base_url, auth_headers(self.api_key_env))


def summarize_server_info(raw: dict[str, Any], endpoint: str = "/server_info") -> dict[str, Any]:
    """The interesting facts of an SGLang /server_info payload, plus the raw dict."""
    states = raw.get("internal_states")
    state0 = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    effective = state0.get("effective_max_running_requests_per_dp")
    info: dict[str, Any] = {
        "endpoint": endpoint,
        "version": raw.get("version"),
        "model_path": raw.get("model_path"),
        "tp_size": raw.get("tp_size"),
        "max_running_requests": raw.get("max_running_requests"),
        "effective_max_running_requests_per_dp": effective,
        "max_total_num_tokens": raw.get("max_total_num_tokens"),
        "enable_flashinfer_allreduce_fusion": raw.get("enable_flashinfer_allreduce_fusion"),
        "cuda_graph_max_bs": raw.get("cuda_graph_max_bs"),
        # cumulative since start: mixes levels, informational only (cells use per-request spec_verify_ct)
        "avg_spec_accept_length_cumulative": state0.get("avg_spec_accept_length"),
        "raw": raw,
    }
    for f in SPEC_FIELDS:
        info[f] = raw.get(f)
    return info


ENGINE = SGLangEngine()
