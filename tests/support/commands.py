"""The server command lines a config asks for, per variant x arm: what the golden files hold and what the engine
argument tier (tests/engine_args) gives to each engine's own parser."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import Any

from specsweep import config as ssconfig
from specsweep.engines import get_engine
from specsweep.engines.speculation import sglang_adaptive_config
from specsweep.stack import envbuild

ROOT = Path(__file__).resolve().parents[2]
PORT = 30000
EXAMPLE_SCHEDULE = [[1, 16, 3], [17, 256, 0]]  # what a policy arm serves: K=3 up to 16 running requests, then 0


def example_path(name: str) -> Path:
    return ROOT / "config" / "examples" / f"{name}.yaml"


def commands_for_config(cfg: dict[str, Any], schedule: list[list[int]] | None = None) -> dict[str, dict]:
    """The commands the pipeline would launch: validated config (defaults filled), resolved variant, engine.

    A policy arm serves `schedule` (the example one by default); an SGLang policy arm's adaptive config file
    content is given under `<variant>/<arm>.adaptive_config`."""
    schedule = schedule or EXAMPLE_SCHEDULE
    out: dict[str, dict] = {}
    for vname in cfg["variants"]:
        variant = ssconfig.variant_for_server(cfg, vname, absolute=False)
        engine = get_engine(variant["engine"])
        for aname, arm in cfg["arms"].items():
            if arm.get("policy"):  # serves the schedule the sweep derives: an example one here
                file = f"results/{cfg['experiment']}/{vname}/policy/{arm['family']}.sglang-adaptive.json"
                arm = {**arm, "schedule": schedule, "schedule_file": file}
            python = f"/envs/{vname}/bin/python"
            spec = engine.server_spec(variant, aname, arm, variant.get("host", "127.0.0.1"), PORT, python)
            d = spec.public_dict()
            if arm.get("policy") and variant["engine"] == "sglang" and "--speculative-adaptive" in d["argv"]:
                out[f"{vname}/{aname}.adaptive_config"] = {"content": sglang_adaptive_config(schedule)[0]}
            out[f"{vname}/{aname}"] = {
                "command": shlex.join(d["argv"]),
                "argv": d["argv"],
                "env": d["env"],
                "resource": d["resource"],
                "readiness_paths": d["readiness_paths"],
                "client_backend": d["client_backend"],
                "startup_timeout_s": d["startup_timeout_s"],
            }
    return out


def stacks_for(config_name: str) -> dict[str, dict]:
    """Per variant of an example config: its recipe and the recipe's patch directives (file, sha256, where it
    applies, the files it changes), the stack the golden file pins beside the command lines."""
    cfg = ssconfig.load(example_path(config_name))
    out: dict[str, dict] = {}
    for vname, variant in cfg["variants"].items():
        recipe = variant.get("recipe")
        patches = envbuild.parse_recipe(ROOT / recipe)["patches"] if recipe else []
        out[vname] = {
            "recipe": recipe,
            "patches": [
                {
                    "file": str(p["path"].relative_to(ROOT)),
                    "sha256": hashlib.sha256(p["path"].read_bytes()).hexdigest(),
                    "target": p["target"],
                    "strip": p["strip"],
                    "files": sorted(set(envbuild.patched_files(p))),
                }
                for p in patches
            ],
        }
    return out


def commands_for(config_name: str) -> dict[str, dict]:
    """The commands of an example config (config/examples/<name>.yaml)."""
    return commands_for_config(ssconfig.load(example_path(config_name)))
