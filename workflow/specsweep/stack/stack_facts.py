"""The facts a stack comparison needs, read from one cell's summary.json and the fingerprint it names.

Why one place: MLflow params (`tracking`) put them on every cell and sweep run, so two variants compare side by
side in the UI on engine, model, TP, GPUs and the exact server command. Every value is what the server reported
or what the run recorded; a fact the engine does not report is left out rather than guessed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specsweep.engines.speculation import flag_value
from specsweep.redact import redact_argv

PORT_FLAGS = ("--port",)
# packages that tell two stacks apart (the fingerprint holds every probed package)
STACK_PACKAGES = ("sglang", "vllm", "torch", "flashinfer-python", "sglang-kernel", "sgl-kernel", "triton")


def server_command(argv: list[str]) -> str:
    """The server's command line, secrets masked and the per-start port replaced by `<port>` (so the command
    is the same for every cell the server served, and for a rerun on another port)."""
    out: list[str] = []
    after_port = False
    for a in redact_argv([str(x) for x in argv]):
        if after_port:
            out.append("<port>")
            after_port = False
        elif a in PORT_FLAGS:
            out.append(a)
            after_port = True
        elif "=" in a and a.split("=", 1)[0] in PORT_FLAGS:
            out.append(a.split("=", 1)[0] + "=<port>")
        else:
            out.append(a)
    return " ".join(out)


def draft_model(info: dict[str, Any], speculative: bool) -> str:
    """The draft model as the server reports it: a path, or the method when it drafts without one (ngram)."""
    if not speculative:
        return "none (no speculation)"
    path = info.get("speculative_draft_model_path")
    spec_cfg = info.get("speculative_config") or {}
    if path:
        return str(path)
    if spec_cfg.get("model"):
        return str(spec_cfg["model"])
    method = info.get("speculative_algorithm") or spec_cfg.get("method") or info.get("speculative_method")
    raw = info.get("raw") or {}
    if raw.get("engine") == "specsweep-sim":
        return f"simulated {method or 'draft'} head"
    return f"{method} (no draft model)" if method else "not reported"


def file_sha256(path: str | Path | None) -> str | None:
    if not path or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def stack_facts(summary: dict[str, Any]) -> dict[str, Any]:
    """`stack.*` facts of the server that measured this cell (None where not known; callers drop those)."""
    server = summary["server"]
    info = server["info"]
    argv = [str(a) for a in server["argv"]]
    stack = summary["stack"]
    fp_path = stack["fingerprint"]
    fp: dict[str, Any] = {}
    if fp_path and Path(fp_path).is_file():
        fp = json.loads(Path(fp_path).read_text())
    recipe = stack["recipe"] or fp.get("recipe") or {}
    tp = info.get("tp_size") or next(
        (v for f in ("--tp-size", "--tp", "--tensor-parallel-size", "-tp") if (v := flag_value(argv, f))), None
    )
    gpus_env = server["env"].get("CUDA_VISIBLE_DEVICES") or fp.get("cuda_visible_devices")
    smi = fp.get("nvidia_smi") or {}
    gpu_names = sorted({g.get("name") for g in smi.get("gpus") or [] if g.get("name")})
    packages = fp.get("packages") or {}
    facts: dict[str, Any] = {
        "stack.engine": summary["engine"],
        "stack.engine_version": info.get("version"),
        "stack.model": info.get("model_path") or info.get("served_model"),
        "stack.draft_model": draft_model(info, bool(summary["cell"]["speculative"])),
        "stack.tp": tp if tp is not None else (1 if summary["engine"] == "vllm" else None),
        "stack.gpus": gpus_env if gpus_env else ("none (CPU)" if server["resource"] == "cpu" else None),
        "stack.gpu_model": ", ".join(gpu_names) or None,
        "stack.driver": ", ".join(sorted({g.get("driver_version") for g in smi.get("gpus") or []} - {None})) or None,
        "stack.server_command": server_command(argv) if argv else None,
        "stack.recipe": recipe.get("path"),
        "stack.recipe_sha256": recipe.get("sha256") or recipe.get("env_recipe_sha256"),
        "stack.fingerprint_sha256": file_sha256(fp_path),
        "stack.packages": ", ".join(f"{k}={v}" for k, v in sorted(packages.items()) if v and k in STACK_PACKAGES)
        or None,
        "stack.torch_cuda": (fp.get("torch") or {}).get("cuda"),
        # what SGLang reports it runs (the field it sets, not the deprecated switch): compared across variants
        "stack.allreduce_fusion": info.get("flashinfer_allreduce_fusion_backend"),
        "stack.speculative_adaptive": info.get("speculative_adaptive") if info.get("speculative_adaptive") else None,
    }
    return {k: v for k, v in facts.items() if v is not None}
