"""Preflight: in seconds, before any environment build or server start, what would make a variant fail later.

Per variant: the GPUs it names (count and model, from `nvidia-smi --query-gpu`), their compute capability
against what the variant asks for (FlashInfer all-reduce fusion on SM120 needs a patch in the recipe), the
driver against the recipe's CUDA lane, each GPU's state (clocks, power limit, temperature, throttle reasons,
persistence mode, other processes' memory: NVML, `specsweep.telemetry.gpu`), free disk for the environment
and the results, the model and draft model folders (each with a `config.json` the engine can read), a fixed
port that is already taken, and the package indexes the recipe names (when its environment is not built yet).
Each finding names its fix.

    specsweep preflight --configfile config/examples/kimi-k25-8gpu.yaml [--variant cu130-fusion]

The workflow runs it as the first job of each variant (`workflow/rules/env.smk`, rule `preflight`): errors
stop that variant before its environment is built.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import socket
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specsweep.redact import redact_uri
from specsweep.stack import envbuild
from specsweep.telemetry.gpu import gpu_snapshot, query_smi

GPU_FIELDS = ("index", "name", "compute_cap", "driver_version", "memory.total")
SMI_TIMEOUT_S = 5.0
INDEX_TIMEOUT_S = 3.0
# Disk an environment not yet built takes (estimated: a CUDA stack's torch, CUDA libraries, DeepGEMM/DeepEP,
# FlashInfer and JIT caches; a CPU stack's torch and engine), and what the results need at least.
ENV_GB_CUDA = 20.0
ENV_GB_CPU = 6.0
RESULTS_GB = 2.0
# Oldest Linux driver per CUDA lane that supports it fully (CUDA release notes' "CUDA Toolkit and Corresponding
# Driver Versions": 12.8 GA 570.26, 12.9 GA 575.51.03, 13.0 GA 580.65.06), and the floor of minor-version
# compatibility per major (12.x: R525; 13.x: R580), where PTX JIT compilation is not supported.
LANE_DRIVER = {"cu126": "560.28.03", "cu128": "570.26", "cu129": "575.51.03", "cu130": "580.65.06"}
MINOR_COMPAT_FLOOR = {"12": "525.60.13", "13": "580.65.06"}
# SGLang (read in the 0.5.19 wheel): FlashInfer all-reduce fusion accepts compute capability 9.x and 10.x only,
# in two files: `_resolve_backend` in the first raises "requires SM90 or SM10X" at start-up, and
# `apply_flashinfer_allreduce_fusion` in the second fuses only on SM90/SM100 (elsewhere it runs plain all-reduces,
# silently). The deprecated switch and the new flag.
FUSION_FILE = "sglang/srt/layers/flashinfer_comm_fusion.py"
FUSION_GATE_FILE = "sglang/srt/layers/communicator.py"
FUSION_PATCH_FILES = (FUSION_FILE, FUSION_GATE_FILE)
FUSION_CAPS = (9, 10)
FUSION_FLAGS = ("--enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend")
FUSION_OFF_FLAG = "--enforce-disable-flashinfer-allreduce-fusion"
GPU_ENGINES = ("sglang",)  # engines that always run on GPUs (vLLM may be its CPU build: then only with `gpus`)


@dataclass
class Finding:
    """One thing preflight found: `error` stops the variant, `warning` and `ok` are shown."""

    level: str
    variant: str
    check: str
    message: str
    fix: str = ""

    def line(self) -> str:
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.level.upper():7} [{self.variant}] {self.check}: {self.message}.{fix}"


def query_gpus(timeout: float = SMI_TIMEOUT_S) -> tuple[list[dict[str, str]] | None, str]:
    """The GPUs as nvidia-smi lists them (None and why when it cannot be asked)."""
    return query_smi(GPU_FIELDS, timeout)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def cuda_lane(recipe: dict[str, Any]) -> str | None:
    """The recipe's CUDA lane (cu128, cu129, cu130, ...) from its index URLs or its `+cuXXX` tags."""
    lanes = set()
    for line in recipe["lines"]:
        lanes.update(re.findall(r"(?:/whl/|\+)(cu1\d\d)\b", line))
    return sorted(lanes)[-1] if lanes else None


def index_urls(recipe: dict[str, Any]) -> list[str]:
    """The package indexes and find-links URLs a recipe names (pip's own configuration is not read)."""
    urls = []
    for line in recipe["lines"] + recipe["pip_args"]:
        words = line.split()
        for i, w in enumerate(words):
            opt, _, val = w.partition("=")
            if opt in ("-i", "--index-url", "--extra-index-url", "-f", "--find-links"):
                val = val or (words[i + 1] if i + 1 < len(words) else "")
                if val.startswith(("http://", "https://")) and val not in urls:
                    urls.append(val)
    return urls


def reachable(url: str, timeout: float = INDEX_TIMEOUT_S) -> str:
    """ "" when the index answered (any HTTP status below 500), else why not."""
    req = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "specsweep-preflight"})
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            return ""
    except urllib.error.HTTPError as e:
        return "" if e.code < 500 else f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return str(getattr(e, "reason", e))


def _arg_values(args: list[str], flag: str) -> list[str]:
    """Values of `flag` in an argument list (`--flag value` or `--flag=value`)."""
    out = []
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(flag + "="):
            out.append(a.split("=", 1)[1])
    return out


def asks_for_fusion(args: list[str]) -> bool:
    """Whether server arguments turn SGLang's FlashInfer all-reduce fusion on (the deprecated switch or the
    backend flag with any value), and do not force it off."""
    on = any(a == f or a.startswith(f + "=") for a in args for f in FUSION_FLAGS)
    return on and FUSION_OFF_FLAG not in args


def draft_paths(engine: str, args: list[str]) -> list[str]:
    """Draft model paths in an arm's arguments: SGLang's flag, vLLM's --speculative-config JSON `model`."""
    paths = _arg_values(args, "--speculative-draft-model-path")
    for text in _arg_values(args, "--speculative-config"):
        try:
            model = json.loads(text).get("model")
        except (ValueError, AttributeError):
            model = None
        if isinstance(model, str) and engine == "vllm":
            paths.append(model)
    return paths


def _model_finding(variant: str, what: str, path: str) -> Finding:
    p = Path(path)
    check = f"{what} model"
    if not p.exists():
        if not path.startswith(("/", ".", "~")) and path.count("/") == 1:
            return Finding(
                "warning",
                variant,
                check,
                f"{path} is not a local folder; the engine would fetch it from the Hugging Face Hub",
                "download it first and give its local path (a server start should not depend on a download)",
            )
        return Finding(
            "error", variant, check, f"{path} does not exist", f"put the checkpoint at {path} or fix the path"
        )
    cfg = p / "config.json"
    if not cfg.is_file():
        return Finding("error", variant, check, f"{path} has no config.json", "point it at the model's folder")
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError) as e:
        return Finding("error", variant, check, f"{cfg} is not readable JSON ({e})", "repair or re-download it")
    if not isinstance(data, dict) or not (data.get("architectures") or data.get("model_type")):
        return Finding(
            "error", variant, check, f"{cfg} names no architectures/model_type", "use the model's own config.json"
        )
    return Finding("ok", variant, check, f"{path} ({', '.join(data.get('architectures') or [data['model_type']])})")


def _gpu_set(spec: dict[str, Any]) -> list[str]:
    if spec.get("gpus"):
        return [g.strip() for g in str(spec["gpus"]).split(",") if g.strip()]
    return [str(i) for i in range(int(spec.get("tp") or 1))]


def check_gpus(
    variant: str, spec: dict[str, Any], recipe: dict[str, Any] | None, all_args: list[str], gpus: Any
) -> list[Finding]:
    """GPU count and model, compute capability against fusion, driver against the CUDA lane."""
    engine = spec["engine"]
    if engine not in GPU_ENGINES and not spec.get("gpus"):
        return []
    wanted = _gpu_set(spec)
    found: list[Finding] = []
    fusion = engine == "sglang" and asks_for_fusion(all_args)
    smi, why = gpus
    if smi is None:
        found.append(
            Finding(
                "error",
                variant,
                "GPUs",
                f"needs GPUs {','.join(wanted)}, and {why}",
                "run on the GPU host (under the SLURM profile this job runs on a GPU node), or install the driver",
            )
        )
        if fusion:
            found.append(
                Finding("warning", variant, "compute capability", "not checked (no GPU): the variant asks for fusion")
            )
        return found
    by_index = {g["index"]: g for g in smi}
    missing = [i for i in wanted if i not in by_index]
    if missing:
        found.append(
            Finding(
                "error",
                variant,
                "GPUs",
                f"needs GPUs {','.join(wanted)}; this machine has {len(smi)} ({','.join(by_index) or 'none'})",
                "set variants.<name>.gpus to GPUs that exist, or run on a host with enough GPUs",
            )
        )
    used = [by_index[i] for i in wanted if i in by_index]
    if int(spec.get("tp") or 1) > len(wanted):
        found.append(
            Finding(
                "error",
                variant,
                "GPUs",
                f"tp {spec['tp']} is more than the {len(wanted)} GPUs in its set",
                "make gpus list tp GPUs",
            )
        )
    if not used:
        return found
    names = sorted({g["name"] for g in used})
    caps = sorted({g["compute_cap"] for g in used})
    found.append(
        Finding(
            "ok" if len(names) == 1 else "warning",
            variant,
            "GPUs",
            f"{len(used)} x {' + '.join(names)} (compute capability {', '.join(caps)}, "
            f"driver {used[0]['driver_version']})",
            "" if len(names) == 1 else "a tensor-parallel group of mixed GPUs runs at the slowest one's pace",
        )
    )
    if fusion:
        found += _fusion_findings(variant, spec, recipe, caps)
    if recipe is not None:
        found += _driver_findings(variant, recipe, used[0]["driver_version"])
    return found


def _gpu_state_message(g: dict[str, Any]) -> tuple[str, list[str]]:
    """One GPU's figures, and the fixes of what is off (not judged: idle clocks, sw_power_cap)."""
    i = g["index"]
    reasons = g.get("throttle_reasons")
    sm, sm_max = g.get("sm_clock_mhz"), g.get("sm_clock_max_mhz")
    parts = [
        ("SM clock not read" if sm is None else f"SM {sm:.0f}/{'?' if sm_max is None else f'{sm_max:.0f}'} MHz")
        + (" at idle" if reasons and "gpu_idle" in reasons else "")
    ]
    fixes = []
    power, limit, default = g.get("power_w"), g.get("power_limit_w"), g.get("power_limit_default_w")
    watts = "power not read" if power is None else f"{power:.0f} W"
    if limit is not None:
        watts += f" of {limit:.0f} W limit" + ("" if default is None else f" (default {default:.0f} W)")
    parts.append(watts)
    if limit is not None and default is not None and limit < default - 0.5:
        parts[-1] += ": the limit is lowered"
        fixes.append(f"restore the default limit (`sudo nvidia-smi -i {i} -pl {default:.0f}`)")
    if g.get("temperature_c") is not None:
        parts.append(f"{g['temperature_c']:.0f} C")
    if g.get("persistence_mode") is not None:
        parts.append("persistence on" if g["persistence_mode"] else "persistence off")
    if g.get("persistence_mode") is False:
        parts[-1] += " (the first CUDA call then waits for the driver to load)"
        fixes.append(f"turn persistence mode on (`sudo nvidia-smi -i {i} -pm 1`, or run nvidia-persistenced)")
    pids, mib = g.get("other_processes"), g.get("other_processes_mib")
    if pids is None:
        parts.append("other processes not read")
    elif not pids and not mib:
        parts.append("no other process")
    else:
        parts.append(f"other process(es) {', '.join(map(str, pids))} hold {mib or 0:.0f} MiB")
        fixes.append("stop them, or give the variant other GPUs (variants.<name>.gpus)")
    slowing = sorted(set(reasons or ()) - {"gpu_idle"})
    if slowing:
        parts.append(f"clock event reasons: {', '.join(slowing)}")
    if g.get("throttled_thermal_power"):
        parts[-1] += " (slowed by heat or power)"
        fixes.append(
            "check cooling and power delivery (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE` names the cause), "
            "and measure once it clears"
        )
    source = "" if g.get("source") == "nvml" else f" (read by {g.get('source')})"
    return f"GPU {i} {g.get('name') or '?'}: {', '.join(parts)}{source}", fixes


def check_gpu_state(variant: str, spec: dict[str, Any], state: Any, gpus: Any) -> list[Finding]:
    """One finding per GPU of the variant (its `gpus`; none given: every GPU) from the snapshot `state`:
    a warning for an active thermal/power throttle reason, a lowered power limit, persistence mode off, or
    another process's memory on it. No snapshot and no nvidia-smi: nothing (check_gpus says it)."""
    if spec["engine"] not in GPU_ENGINES and not spec.get("gpus"):
        return []
    snap, why = state
    if snap is None:
        if gpus[0] is None:
            return []
        return [
            Finding(
                "warning",
                variant,
                "gpu state",
                f"not read: {why.rstrip('.')}",
                "make NVML readable where preflight runs (the driver's libnvidia-ml.so.1 and the nvidia-ml-py "
                "package): the load generator reads the GPUs through it during each block too",
            )
        ]
    wanted = [g.strip() for g in str(spec.get("gpus") or "").split(",") if g.strip()]
    by_index = {str(g["index"]): g for g in snap}
    found = []
    for index in wanted or list(by_index):
        if index not in by_index:
            continue  # not there: check_gpus says so
        message, fixes = _gpu_state_message(by_index[index])
        found.append(Finding("warning" if fixes else "ok", variant, "gpu state", message, "; ".join(fixes)))
    return found


def _fusion_findings(variant: str, spec: dict[str, Any], recipe: dict[str, Any] | None, caps: list[str]) -> list:
    majors = {int(_version(c)[0]) for c in caps if _version(c)}
    unsupported = sorted(m for m in majors if m not in FUSION_CAPS)
    if not unsupported:
        return [Finding("ok", variant, "fusion", f"compute capability {', '.join(caps)} is one SGLang fuses on")]
    sm = ", ".join(f"SM{m}0" for m in unsupported)
    patches = (recipe or {}).get("patches", [])
    by_file = {
        f: [p for p in patches if any(_target_path(p, g).endswith(f) for g in envbuild.patched_files(p))]
        for f in FUSION_PATCH_FILES
    }
    how = (
        f"(`_resolve_backend` in {FUSION_FILE} raises at start-up, and `apply_flashinfer_allreduce_fusion` in "
        f"{FUSION_GATE_FILE} skips fusion silently)"
    )
    if all(by_file.values()):
        names = sorted({Path(p["path"]).name for ps in by_file.values() for p in ps})
        return [
            Finding(
                "ok", variant, "fusion", f"{sm}: the recipe patches both files that gate fusion ({', '.join(names)})"
            )
        ]
    local = [p for p in (recipe or {}).get("local", []) if "sglang" in Path(p).name.lower()]
    if local:
        return [
            Finding(
                "warning",
                variant,
                "fusion",
                f"{sm}: the recipe installs a local SGLang build ({local[0]}); whether it fuses on {sm} is not "
                "checked here",
                f"check that the build's {FUSION_FILE} and {FUSION_GATE_FILE} accept your GPUs",
            )
        ]
    missing = [f for f, ps in by_file.items() if not ps]
    return [
        Finding(
            "error",
            variant,
            "fusion",
            f"asks for FlashInfer all-reduce fusion, and the GPUs are {sm}: stock SGLang fuses on SM90 and SM10x "
            f"only {how}, and the recipe {spec.get('recipe')} carries no patch of {' or '.join(missing)}",
            f"add an SM120 patch of {' and '.join(missing)} to the recipe: `# specsweep: patch "
            "patches/<file>.patch` (envs/patches/sglang-0.5.19-sm120-fusion.patch is one for SGLang 0.5.19; "
            "docs/engines.md, 'Where the SM120 patches go'), or drop the fusion flag from this variant",
        )
    ]


def _target_path(patch: dict[str, Any], file: str) -> str:
    """A patched file's path under site-packages."""
    return f"{patch['target']}/{file}".strip("/")


def _driver_findings(variant: str, recipe: dict[str, Any], driver: str) -> list[Finding]:
    lane = cuda_lane(recipe)
    if lane is None:
        return []
    have = _version(driver)
    full = LANE_DRIVER.get(lane)
    major = lane[2:4]
    floor = MINOR_COMPAT_FLOOR.get(major)
    if floor and have < _version(floor):
        return [
            Finding(
                "error",
                variant,
                "driver",
                f"driver {driver} is too old for the recipe's CUDA lane {lane} (CUDA {major}.x needs >= {floor})",
                f"install a driver >= {full or floor}, or use a recipe of an older CUDA lane",
            )
        ]
    if full and have < _version(full):
        return [
            Finding(
                "warning",
                variant,
                "driver",
                f"driver {driver} runs CUDA lane {lane} only through minor-version compatibility (full support "
                f"from {full}): PTX JIT compilation is not supported, which JIT-compiled kernels may need",
                f"install a driver >= {full}",
            )
        ]
    return [Finding("ok", variant, "driver", f"driver {driver} supports the recipe's CUDA lane {lane}")]


def _free_gb(path: Path) -> tuple[float, Path]:
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free / 1e9, p


def check_disk(variant: str, pre: dict[str, Any], recipe_path: Path | None, recipe: dict[str, Any] | None) -> list:
    """Free space where the environment (if not built yet) and the results go."""
    results = Path(pre["results_dir"])
    envs_root = Path(pre["envs_dir"] or results / "_envs")
    need_env = 0.0
    if recipe_path is not None and recipe is not None:
        built = envbuild.is_complete(envbuild.env_dir(recipe_path, envs_root, envbuild._base_interpreter()))
        if not built:
            need_env = ENV_GB_CUDA if cuda_lane(recipe) or pre["spec"]["engine"] in GPU_ENGINES else ENV_GB_CPU
    found = []
    free_env, at_env = _free_gb(envs_root)
    free_res, at_res = _free_gb(results)
    same = at_env.stat().st_dev == at_res.stat().st_dev
    what = "environment and results" if need_env and same else ("environment" if need_env else "results")
    needs = [(at_env, free_env, need_env + (RESULTS_GB if same else 0.0), what)]
    if not same:
        needs.append((at_res, free_res, RESULTS_GB, "results"))
    for at, free, need, what in needs:
        if need <= 0:
            continue
        level = "ok" if free >= need else "error"
        found.append(
            Finding(
                level,
                variant,
                "disk",
                f"{free:.1f} GB free at {at} for the {what} (needs about {need:.0f} GB, estimated)",
                "" if level == "ok" else "free space there, or set envs_dir/results_dir to a larger disk",
            )
        )
    return found


def check_port(variant: str, spec: dict[str, Any]) -> list[Finding]:
    """A fixed port must be free (a null port is picked free at start)."""
    port = spec.get("port")
    if not port:
        return []
    host = spec.get("host") or "127.0.0.1"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, int(port)))
        except OSError as e:
            return [
                Finding(
                    "error",
                    variant,
                    "port",
                    f"{host}:{port} is taken ({e.strerror})",
                    "stop what listens there (`ss -ltnp`), or set the variant's port to null (a free one is picked)",
                )
            ]
    return [Finding("ok", variant, "port", f"{host}:{port} is free")]


def all_args(pre: dict[str, Any]) -> list[str]:
    """Every server argument a variant's servers may get: its own and each arm's."""
    return list(pre["spec"].get("server_args") or []) + [a for args in pre["arm_args"].values() for a in args]


def check_variant(
    pre: dict[str, Any], root: Path, gpus: Any, state: Any = (None, "")
) -> tuple[list[Finding], list[tuple[str, str]]]:
    """Every check of one variant but the index probes, which are returned to run in parallel. `gpus`:
    query_gpus()'s answer; `state`: gpu_snapshot()'s."""
    variant, spec = pre["variant"], pre["spec"]
    found: list[Finding] = []
    recipe_path = recipe = None
    if spec.get("recipe") and not spec.get("python") and spec["engine"] != "sim":
        recipe_path = Path(spec["recipe"])
        recipe_path = recipe_path if recipe_path.is_absolute() else root / recipe_path
        try:
            recipe = envbuild.parse_recipe(recipe_path)
        except envbuild.RecipeError as e:
            found.append(Finding("error", variant, "recipe", str(e).rstrip(".")))
    elif spec["engine"] != "sim" and not spec.get("python"):
        found.append(Finding("error", variant, "recipe", "no recipe", "add `recipe: envs/<file>.txt`"))
    all_args_ = all_args(pre)
    found += check_gpus(variant, spec, recipe, all_args_, gpus)
    found += check_gpu_state(variant, spec, state, gpus)
    probes: list[tuple[str, str]] = []
    if recipe is not None and recipe_path is not None:
        for local in recipe["local"]:
            if not local.exists():
                found.append(
                    Finding(
                        "error",
                        variant,
                        "recipe",
                        f"{local} (named in {recipe_path}) does not exist",
                        "build the wheel or check out the source there, or fix the path",
                    )
                )
        if recipe["patches"] and shutil.which("patch") is None:
            found.append(
                Finding(
                    "error",
                    variant,
                    "recipe",
                    "the recipe has patches and GNU patch is not installed",
                    "apt-get install patch",
                )
            )
        envs_root = Path(pre["envs_dir"] or Path(pre["results_dir"]) / "_envs")
        if not envbuild.is_complete(envbuild.env_dir(recipe_path, envs_root, envbuild._base_interpreter())):
            probes = [(variant, url) for url in index_urls(recipe)]
    found += check_disk(variant, pre, recipe_path, recipe)
    if spec["engine"] != "sim":
        if spec.get("model"):
            found.append(_model_finding(variant, "served", spec["model"]))
        elif not spec.get("model_builder"):
            found.append(Finding("error", variant, "served model", "no model", "set variants.<name>.model"))
        for path in dict.fromkeys(p for args in pre["arm_args"].values() for p in draft_paths(spec["engine"], args)):
            found.append(_model_finding(variant, "draft", path))
    found += check_port(variant, spec)
    found += check_content(variant, pre)
    return found, probes


def check_content(variant: str, pre: dict[str, Any]) -> list[Finding]:
    """A warning, before hours of GPU time, for each unit whose acceptance would not be production's (synthetic
    words or a fixed stop on a real engine: `client.contents.content_warning`)."""
    from specsweep.client.contents import content_warning

    out = []
    for facts in pre.get("contents") or []:
        why = content_warning(facts)
        if why:
            fix = why.split("Measure your content: ", 1)[-1]
            unit = f"{facts['unit']}: " if facts["unit"] != variant else ""
            said = why.split("; production", 1)[0].replace("was measured", "would be measured")
            out.append(Finding("warning", variant, "content", unit + said + ", not on your traffic", fix))
    return out


def preflight(pres: list[dict[str, Any]], root: Path, nvml: Any = None) -> list[Finding]:
    """Every variant's findings; nvidia-smi and NVML asked once, the indexes probed in parallel with a short
    timeout. `nvml`: the pynvml module to read the GPUs' state with (None: the real one; tests: a fake)."""
    needs_gpus = any(p["spec"]["engine"] in GPU_ENGINES or p["spec"].get("gpus") for p in pres)
    gpus = query_gpus() if needs_gpus else (None, "")
    state = gpu_snapshot(nvml=nvml) if needs_gpus else (None, "")
    found: list[Finding] = []
    probes: list[tuple[str, str]] = []
    for pre in pres:
        f, p = check_variant(pre, root, gpus, state)
        found += f
        probes += p
    urls = list(dict.fromkeys(url for _, url in probes))
    if urls:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
            answers = dict(zip(urls, pool.map(reachable, urls), strict=True))
        for variant, url in probes:
            why = answers[url]
            found.append(
                Finding(
                    "ok" if not why else "error",
                    variant,
                    "package index",
                    f"{redact_uri(url)} "
                    + ("answers" if not why else f"is unreachable ({why}; timeout {INDEX_TIMEOUT_S:.0f} s)"),
                    ""
                    if not why
                    else "build where it can be reached (a proxy: HTTPS_PROXY), or mirror its wheels "
                    "and point the recipe at the mirror (--find-links)",
                )
            )
    order = {p["variant"]: n for n, p in enumerate(pres)}
    return sorted(found, key=lambda f: order.get(f.variant, len(order)))  # stable: each variant's in check order


def config_specs(configfile: Path, variants: list[str] | None = None) -> list[dict[str, Any]]:
    """The preflight specs of a config's `variants` (default: all of them). ConfigError: the config is invalid;
    LookupError: a variant is not in it."""
    from specsweep import config as ssconfig  # local, as before: only --configfile needs it

    cfg = ssconfig.load(configfile)
    names = variants or list(cfg["variants"])
    unknown = [n for n in names if n not in cfg["variants"]]
    if unknown:
        raise LookupError(f"unknown variant(s) {unknown}; known: {list(cfg['variants'])}")
    return [ssconfig.preflight_spec(cfg, n) for n in names]


def verdict_line(found: list[Finding], took_s: float) -> str:
    """The closing line: passed or FAILED, with the counts and the (measured) seconds the checks took."""
    errors = sum(f.level == "error" for f in found)
    return (
        f"preflight {'FAILED' if errors else 'passed'}: {errors} error(s), "
        f"{sum(f.level == 'warning' for f in found)} warning(s), {took_s:.1f} s (measured)"
    )


def write_findings(path: Path, pres: list[dict[str, Any]], found: list[Finding]) -> None:
    """The findings as JSON (what the workflow's preflight rule keeps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "passed": not any(f.level == "error" for f in found),
        "variants": [p["variant"] for p in pres],
        "findings": [asdict(f) for f in found],
    }
    path.write_text(json.dumps(body, indent=2) + "\n")
