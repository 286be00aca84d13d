"""HTTP helpers every engine uses: JSON facts, Prometheus counters, prefix-cache resets.

Why here: the SGLang, vLLM and simulated engines speak overlapping APIs (the simulator mirrors both), so the
calls live once and each engine picks the ones its server has.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from specsweep.client.cpu import parse_cpus
from specsweep.engines.base import ServerSpec
from specsweep.engines.prometheus import samples
from specsweep.redact import api_key_from_env, is_secret_flag

__all__ = [
    "CACHE_COUNTERS",
    "DEFAULT_HOST",
    "SPEC_COUNTERS",
    "api_key_args",
    "as_args",
    "auth_headers",
    "check_speculation",
    "engine_counters",
    "get_json",
    "post_flush_cache",
    "post_reset_prefix_cache",
    "real_server_spec",
    "require_model",
    "resource_of",
    "server_cpus",
    "server_env",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 900.0

# Prometheus sample names (vLLM V1 spelling, mirrored by the simulator) -> our counter names.
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}
CACHE_COUNTERS = {
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
}


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
    """The Authorization header for the engine's own calls, when the variant names an API key variable."""
    key = api_key_from_env(api_key_env)
    return {"Authorization": f"Bearer {key}"} if key else None


async def engine_counters(
    session: aiohttp.ClientSession, base_url: str, headers: dict[str, str] | None = None
) -> dict[str, float] | None:
    """Cumulative spec-decode and prefix-cache counters from `/metrics`; None when they cannot be read.

    None (not {}) on failure, so that a failed read can never act as a zero baseline: a cell's deltas would
    then be the server's totals since start. A counter the server does not export is absent from the dict.
    """
    try:
        async with session.get(base_url.rstrip("/") + "/metrics", headers=headers) as r:
            if r.status != 200:
                return None
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    totals = samples(text)
    out = {key: totals[name] for name, key in {**SPEC_COUNTERS, **CACHE_COUNTERS}.items() if name in totals}
    return out


FIRST_RETRY_S = 0.01  # the first wait before a refused POST is tried again (`_post_until`)


async def _post_until(
    session: aiohttp.ClientSession,
    url: str,
    ok: Any,
    headers: dict[str, str] | None,
    timeout_s: float,
    retry_s: float,
) -> str:
    """POST until `ok(status, body)` says done: 'ok', 'unsupported' (404/405), 'timeout' or 'error: ...'.

    The waits between tries double from FIRST_RETRY_S up to `retry_s`: a flush after a block waits for the
    engine to drop the fillers the client aborted, a step or two (at a fixed 0.2 s the default run's C=250 blocks
    waited 0.2-0.45 s each for that)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    wait = min(FIRST_RETRY_S, retry_s)
    while True:
        try:
            async with session.post(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
                status = r.status
                body = await r.text()
            if status in (404, 405):
                return "unsupported"
            if ok(status, body):
                return "ok"
            last = f"HTTP {status}: {body[:120]}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            last = f"error: {type(e).__name__}: {e}"
        if time.monotonic() + wait > deadline:
            return "timeout" if last.startswith("HTTP") else last
        await asyncio.sleep(wait)
        wait = min(2 * wait, retry_s)


async def post_flush_cache(
    session: aiohttp.ClientSession,
    base_url: str,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    retry_s: float = 0.2,
) -> str:
    """SGLang's `POST /flush_cache` (400 while requests run, so retried): 'flushed', 'unsupported', ..."""
    res = await _post_until(
        session, base_url.rstrip("/") + "/flush_cache", lambda s, b: s == 200, headers, timeout_s, retry_s
    )
    return "flushed" if res == "ok" else res


async def post_reset_prefix_cache(
    session: aiohttp.ClientSession,
    base_url: str,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    retry_s: float = 0.2,
) -> str:
    """vLLM's `POST /reset_prefix_cache` (only with VLLM_SERVER_DEV_MODE=1; `{"success": false}` while blocks
    are held, so retried): 'reset', 'unsupported' (404: the server was started without dev mode), ..."""

    def done(status: int, body: str) -> bool:
        return status == 200 and '"success":false' not in body.replace(" ", "").lower()

    res = await _post_until(session, base_url.rstrip("/") + "/reset_prefix_cache", done, headers, timeout_s, retry_s)
    return "reset" if res == "ok" else res


# ---- server command lines ----------------------------------------------------------------------------


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
    """`--api-key VALUE` from the variable named by `api_key_env` at launch time, and the secret names."""
    name = variant.get("api_key_env")
    value = api_key_from_env(name)
    return (["--api-key", value], (name,)) if value else ([], ())


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


def server_cpus(variant: dict[str, Any]) -> tuple[int, ...] | None:
    """The server's CPU set as resolved by the cell runner (`cpu.plan_cpus`); 'auto' unresolved -> None."""
    value = variant.get("cpus")
    if value in (None, "auto"):
        return None
    return parse_cpus(value)


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
    speculation: Callable[[list[str], dict[str, Any]], list[str]] | None = None,
) -> ServerSpec:
    """A real engine's server: launcher, host/port, the variant's then the arm's flags, the API key last.

    Argument order: variant `server_args`, arm `server_args`, the variant's `arm_server_args[arm]`. The arm's
    `speculative` flag must agree with the speculative flags it ends up with. `speculation` writes the arm's
    draft length or schedule into those flags (engines/speculation.py).
    """
    host = host or variant.get("host") or DEFAULT_HOST
    vargs = as_args(variant.get("server_args"), "variant")
    aargs = as_args(arm.get("server_args"), f"arm {arm_name}")
    extra = as_args((variant.get("arm_server_args") or {}).get(arm_name), f"arm_server_args.{arm_name}")
    check_speculation(engine, arm_name, arm, vargs + aargs + extra, speculative_prefix)
    own = [*vargs, *aargs, *extra]
    literal = [a.split("=", 1)[0] for a in own if is_secret_flag(a.split("=", 1)[0])]
    if literal:
        raise ValueError(
            f"{engine} arm {arm_name!r}: server_args hold {', '.join(literal)}, whose value would be stored in "
            "clear or masked at launch (fix: remove it; the server's API key comes from the variant's "
            "api_key_env, which specsweep passes as --api-key and never stores)"
        )
    if speculation is not None and arm.get("speculative"):
        own = speculation(own, arm)
    key_args, secret = api_key_args(variant)
    argv = [*launcher, "--host", str(host), "--port", str(int(port)), *own, *key_args]
    env = {**server_env(variant), **{str(k): str(v) for k, v in (arm.get("env_vars") or {}).items()}}
    cpus = server_cpus(variant)
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
        cpus=cpus,
    )
