"""vLLM: command line, readiness, server facts, and accept-length counters from `/metrics`.

Command: `<python> -m vllm.entrypoints.openai.api_server --model M --host H --port P --tensor-parallel-size N
[variant server_args] [arm server_args] [--api-key ***]`. The module entry point is used rather than the
`vllm` console script (which fails on package metadata in the CPU build, and which a relocated environment
may not have). Speculation is configured by `--speculative-config '<json>'` in the arm's server_args.

Counters (Prometheus text at `/metrics`, summed over label sets):
`vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_total`; gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`.
A per-cell accept length is `1 + d(accepted) / d(drafts)` between two snapshots (tokens per verify step).
"""

from __future__ import annotations

import json
import math
from typing import Any

from specsweep.engines.base import ServerSpec
from specsweep.engines.prometheus import samples
from specsweep.engines.sglang import (
    auth_headers,
    get_json,
    real_server_spec,
    require_model,
)

COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}
GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of each sample's values over all label sets ({sample name: total}); NaN samples skipped."""
    return samples(text)


def counters_from_metrics(text: str) -> dict[str, float]:
    """The spec-decode counters and request gauges from `/metrics` text.

    `spec_decode_present` is 1.0 when the server exports spec-decode counters at all (a server without
    speculation exports none; its counters read 0.0)."""
    totals = parse_prometheus(text)
    out: dict[str, float] = {}
    present = False
    for metric, key in COUNTERS.items():
        if metric in totals:
            present = True
        out[key] = totals.get(metric, 0.0)
    for metric, key in GAUGES.items():
        out[key] = totals.get(metric, math.nan)
    out["spec_decode_present"] = 1.0 if present else 0.0
    return out


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
            self.name, launcher, "--speculative", variant, arm_name, arm, host, port, self.readiness_paths, "openai"
        )
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

    async def spec_counters(self, session: Any, base_url: str) -> dict[str, float] | None:
        """Cumulative counters from `/metrics` ({} on failure: the caller marks accept length unknown)."""
        try:
            async with session.get(base_url.rstrip("/") + "/metrics", headers=auth_headers(self.api_key_env)) as r:
                if r.status != 200:
                    return {}
                text = await r.text()
        except Exception:
            return {}
        return counters_from_metrics(text)


def accept_length(before: dict[str, float], after: dict[str, float]) -> float:
    """Tokens per verify step between two counter snapshots: 1 + accepted/drafts (NaN without drafts)."""
    drafts = after.get("num_drafts", 0.0) - before.get("num_drafts", 0.0)
    accepted = after.get("num_accepted_tokens", 0.0) - before.get("num_accepted_tokens", 0.0)
    if drafts <= 0:
        return math.nan
    return 1.0 + accepted / drafts


ENGINE = VLLMEngine()
