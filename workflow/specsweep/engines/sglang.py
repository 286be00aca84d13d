"""SGLang: command line, readiness, server facts. Accept length comes per request
(`meta_info.spec_verify_ct`).

Command: `<python> -m sglang.launch_server --model-path M --tp-size N --host H --port P [variant server_args]
[arm server_args] [--api-key ***]`. Flag names follow SGLang's server arguments (`--tp-size`, alias `--tp`;
`--max-running-requests`; `--enable-metrics`; `--speculative-algorithm EAGLE3 ...`), checked against
SGLang's docs; see docs/engines.md.
"""

from __future__ import annotations

import os
from typing import Any

from specsweep.engines.base import ServerSpec

DEFAULT_HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 900.0


# ---- helpers shared with engines/vllm.py ---------------------------------------------------------------


def as_args(value: Any, what: str) -> list[str]:
    """A config's `server_args` as a list of strings (a single string is split on whitespace)."""
    if value is None:
        return []
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    raise TypeError(f"{what}: server_args must be a list of strings, got {type(value).__name__}")


def has_flag(args: list[str], prefix: str) -> bool:
    """Whether any argument is a flag starting with `prefix` (either `--flag value` or `--flag=value`)."""
    return any(a.startswith(prefix) for a in args)


def server_env(variant: dict[str, Any]) -> dict[str, str]:
    """Extra environment of the server: CUDA_VISIBLE_DEVICES from `gpus`, then the variant's `env_vars`."""
    env: dict[str, str] = {}
    gpus = variant.get("gpus")
    if gpus not in (None, ""):
        env["CUDA_VISIBLE_DEVICES"] = str(gpus).replace(" ", "")
    for k, v in (variant.get("env_vars") or {}).items():
        env[str(k)] = str(v)
    return env


def resource_of(variant: dict[str, Any]) -> str:
    """What the server holds exclusively: its GPU set, or the host's CPUs when it has none."""
    gpus = variant.get("gpus")
    if gpus not in (None, ""):
        return "gpus:" + str(gpus).replace(" ", "")
    return "cpu"


def api_key_args(variant: dict[str, Any]) -> tuple[list[str], tuple[str, ...]]:
    """`--api-key VALUE` read from the env var named by `api_key_env` at launch time, and the secret names."""
    name = variant.get("api_key_env")
    if not name:
        return [], ()
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"api_key_env names {name!r} but that environment variable is not set "
            f"(fix: export {name}=<key> before running, or remove api_key_env from the variant)"
        )
    return ["--api-key", value], (name,)


def check_speculation(engine: str, arm_name: str, arm: dict[str, Any], args: list[str], prefix: str) -> None:
    """An arm's `speculative` flag must agree with its server arguments (no silent baseline-vs-baseline)."""
    spec = bool(arm.get("speculative", False))
    has = has_flag(args, prefix)
    if spec and not has:
        raise ValueError(
            f"{engine} arm {arm_name!r} is speculative but its server_args have no {prefix}* flag "
            f"(fix: add the speculative flags to the arm's server_args)"
        )
    if not spec and has:
        raise ValueError(
            f"{engine} arm {arm_name!r} is not speculative but its server_args contain {prefix}* flags "
            f"(fix: set speculative: true, or move the flags to the speculative arm)"
        )


async def get_json(session: Any, url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON or None) of a GET; (0, None) when the server cannot be reached."""
    try:
        async with session.get(url, headers=headers) as resp:
            if resp.status != 200:
                return resp.status, None
            try:
                return 200, await resp.json(content_type=None)
            except ValueError:
                return 200, None
    except Exception:  # connection refused, timeout, ... : the caller treats it as "unavailable"
        return 0, None


def auth_headers(api_key_env: str | None) -> dict[str, str] | None:
    if api_key_env and os.environ.get(api_key_env):
        return {"Authorization": f"Bearer {os.environ[api_key_env]}"}
    return None


# ---- the engine -------------------------------------------------------------------------------------------

SPEC_FIELDS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)


def require_model(engine: str, variant: dict[str, Any]) -> str:
    model = variant.get("model")
    if not model:
        raise ValueError(f"{engine} variant needs `model` (a model path or Hugging Face id)")
    return str(model)


def real_server_spec(
    engine: str,
    launcher: list[str],
    speculative_prefix: str,
    variant: dict[str, Any],
    arm_name: str,
    arm: dict[str, Any],
    host: str,
    port: int,
    readiness_paths: tuple[str, ...],
    default_backend: str,
) -> ServerSpec:
    """A real engine's server: launcher, host/port, the variant's then the arm's flags, the API key last.

    Argument order: variant `server_args`, arm `server_args`, the variant's `arm_server_args[arm]`. The arm's
    `speculative` flag must agree with the speculative flags it ends up with.
    """
    host = host or variant.get("host") or DEFAULT_HOST
    vargs = as_args(variant.get("server_args"), "variant")
    aargs = as_args(arm.get("server_args"), f"arm {arm_name}")
    extra = as_args((variant.get("arm_server_args") or {}).get(arm_name), f"arm_server_args.{arm_name}")
    check_speculation(engine, arm_name, arm, vargs + aargs + extra, speculative_prefix)
    key_args, secret = api_key_args(variant)
    argv = [*launcher, "--host", str(host), "--port", str(int(port)), *vargs, *aargs, *extra, *key_args]
    env = {**server_env(variant), **{str(k): str(v) for k, v in (arm.get("env_vars") or {}).items()}}
    return ServerSpec(
        engine=engine,
        argv=argv,
        host=str(host),
        port=int(port),
        resource=resource_of(variant),
        env=env,
        readiness_paths=readiness_paths,
        startup_timeout_s=float(variant.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S)),
        client_backend=str(variant.get("client_backend") or default_backend),
        source="real",
        secret_env=secret,
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
            self.name, launcher, "--speculative-", variant, arm_name, arm, host, port, self.readiness_paths, "sglang"
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

    async def spec_counters(self, session: Any, base_url: str) -> dict[str, float] | None:
        return None  # accept length per request: completion_tokens / meta_info.spec_verify_ct


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
