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
from specsweep.engines.speculation import flag_value, sglang_args
from specsweep.redact import redact_facts, redact_text

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


# What the server resolved, as /server_info reports it (SGLang 0.5.19 returns `ServerArgs.resolved_dict()`:
# the fields after its resolution, sglang/srt/entrypoints/http_server.py). Field names from 0.5.19's ServerArgs
# (sglang/srt/server_args.py): `--enable-flashinfer-allreduce-fusion` is deprecated, rewritten by
# `handle_deprecated_args` (sglang/srt/arg_groups/serving_hook.py) to flashinfer_allreduce_fusion_backend="auto"
# with enable_flashinfer_allreduce_fusion reset to False, so the backend is the field that says fusion is on;
# `--cuda-graph-max-bs` is a deprecated alias that stores cuda_graph_max_bs_decode; speculative_adaptive reads
# False when SGLang turned adaptive speculation off (`_maybe_disable_adaptive`, arg_groups/speculative_hook.py).
FACT_FIELDS = (
    "flashinfer_allreduce_fusion_backend",
    "enable_flashinfer_allreduce_fusion",
    "enforce_disable_flashinfer_allreduce_fusion",
    "speculative_adaptive",
    "speculative_adaptive_config",
    "cuda_graph_max_bs_decode",
)
FUSION_FLAGS = ("--flashinfer-allreduce-fusion-backend", "--enable-flashinfer-allreduce-fusion")


def summarize_server_info(raw: dict[str, Any], endpoint: str = "/server_info") -> dict[str, Any]:
    """The interesting facts of an SGLang /server_info payload, plus the payload with every secret masked
    (`redact.redact_facts`: api_key, admin_api_key, launch_command's --api-key, ...): summary.json and MLflow
    keep what this returns."""
    raw = redact_facts(raw)
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
        **{f: raw.get(f) for f in FACT_FIELDS},
        # cumulative since start: mixes levels, informational only (cells use per-request spec_verify_ct)
        "avg_spec_accept_length_cumulative": state0.get("avg_spec_accept_length"),
        "raw": raw,
    }
    for f in SPEC_FIELDS:
        info[f] = raw.get(f)
    return info


ENGINE = SGLangEngine()


# What SGLang 0.5.19 logs about FlashInfer's fusion workspace (sglang/srt/layers/flashinfer_comm_fusion.py): set up
# at the first fused step (warm-up), or failed, after which it runs plain all-reduces for the server's life while
# /server_info still reports the backend it was asked for.
FUSION_WORKSPACE_UP = "FlashInfer AllReduce Fusion enabled and workspace initialized"
FUSION_WORKSPACE_FAILED = "Disabling flashinfer allreduce fusion permanently"


def log_facts(lines: list[str]) -> dict[str, Any]:
    """`fusion_workspace` from the server log of the running instance: "failed: <line>" (a failure wins),
    "initialized: <line>", or None when the log says neither."""
    failed = next((ln for ln in lines if FUSION_WORKSPACE_FAILED in ln), None)
    up = next((ln for ln in lines if FUSION_WORKSPACE_UP in ln), None)
    seen = f"failed: {failed}" if failed else f"initialized: {up}" if up else None
    return {"fusion_workspace": redact_text(seen.strip())[:500] if seen else None}


def served_as_asked(argv: list[str], info: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(reasons, flags): what the command line asked for and the server reports it does not do, judged on read
    from a cell's stored command and server facts. Fusion asked for (either flag) and reported off
    (flashinfer_allreduce_fusion_backend null) or adaptive speculation asked for and reported off: the cell
    measured another stack than its variant or arm names, so it is invalid. A fact the server did not report is
    a flag ("not judged")."""
    reasons: list[str] = []
    flags: list[str] = []
    fusion = flag_value(argv, FUSION_FLAGS[0]) or ("auto" if FUSION_FLAGS[1] in argv else None)
    if fusion:
        if "flashinfer_allreduce_fusion_backend" not in info:
            flags.append(
                "FlashInfer all-reduce fusion not judged: the server reported no flashinfer_allreduce_fusion_backend"
            )
        elif info["flashinfer_allreduce_fusion_backend"] is None:
            reasons.append(
                f"asked for FlashInfer all-reduce fusion (backend {fusion}) but the server reports "
                "flashinfer_allreduce_fusion_backend=null: it ran without fusion (SGLang 0.5.19 turns it off for "
                "deterministic inference or --enforce-disable-flashinfer-allreduce-fusion; see the server log)"
            )
        workspace = info.get("fusion_workspace", "")  # absent: a cell measured before the log was read
        if workspace and workspace.startswith("failed"):
            reasons.append(
                "asked for FlashInfer all-reduce fusion, and the server log says its workspace set-up failed, after "
                f"which SGLang runs plain all-reduces ({workspace}): it ran without fusion"
            )
        elif workspace is None:
            flags.append(
                "FlashInfer all-reduce fusion not seen in the server log (no workspace set-up line: the model may "
                "not reach a fused layer, or the log level hides it)"
            )
    if "--speculative-adaptive" in argv:
        if "speculative_adaptive" not in info:
            flags.append("adaptive speculation not judged: the server reported no speculative_adaptive")
        elif info["speculative_adaptive"] is not True:
            reasons.append(
                "asked for adaptive speculation (--speculative-adaptive) but the server reports "
                f"speculative_adaptive={info['speculative_adaptive']}: it served static speculation (SGLang turns "
                "adaptive off with only a warning, e.g. for topk > 1, DP attention or two-batch overlap; see the "
                "server log)"
            )
    return reasons, flags
