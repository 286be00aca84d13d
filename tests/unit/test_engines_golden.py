"""Golden command lines: the exact server each example config asks for, per variant x arm.

Regenerate after an intended change with `SPECSWEEP_UPDATE_GOLDEN=1 pytest tests/unit/test_engines_golden.py`
and review the diff of tests/golden/.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from specsweep import config as ssconfig
from specsweep.engines import get_engine
from specsweep.engines import sglang as sglang_mod
from specsweep.engines import vllm as vllm_mod
from specsweep.engines.speculation import sglang_adaptive_config
from specsweep.redact import MissingAPIKey

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = ["kimi-k25-8gpu", "vllm-cpu-tiny"]
PORT = 30000
EXAMPLE_SCHEDULE = [[1, 16, 3], [17, 256, 0]]  # what a policy arm serves: K=3 up to 16 running requests, then 0

pytestmark = pytest.mark.unit


def commands_for(config_name: str) -> dict[str, dict]:
    """The commands the pipeline would launch: validated config (defaults filled), resolved variant, engine."""
    cfg = ssconfig.load(ROOT / "config" / "examples" / f"{config_name}.yaml")
    out: dict[str, dict] = {}
    for vname in cfg["variants"]:
        variant = ssconfig.variant_for_server(cfg, vname, absolute=False)
        engine = get_engine(variant["engine"])
        for aname, arm in cfg["arms"].items():
            if arm.get("policy"):  # serves the schedule the sweep derives: an example one here
                file = f"results/{cfg['experiment']}/{vname}/policy/{arm['family']}.sglang-adaptive.json"
                arm = {**arm, "schedule": EXAMPLE_SCHEDULE, "schedule_file": file}
            python = f"/envs/{vname}/bin/python"
            spec = engine.server_spec(variant, aname, arm, variant.get("host", "127.0.0.1"), PORT, python)
            d = spec.public_dict()
            if arm.get("policy") and variant["engine"] == "sglang":
                out[f"{vname}/{aname}.adaptive_config"] = {"content": sglang_adaptive_config(EXAMPLE_SCHEDULE)[0]}
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


@pytest.mark.parametrize("config_name", EXAMPLES)
def test_golden_commands(config_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):  # identities must not depend on the developer's environment
        if k.startswith(("CUDA_", "VLLM_")):
            monkeypatch.delenv(k, raising=False)
    got = commands_for(config_name)
    path = GOLDEN / f"{config_name}.commands.json"
    if os.environ.get("SPECSWEEP_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert got == want, f"command lines changed; if intended, regenerate {path} (see module docstring)"


def test_kimi_fusion_only_in_cu130() -> None:
    got = commands_for("kimi-k25-8gpu")
    assert "--enable-flashinfer-allreduce-fusion" in got["cu130-fusion/eagle3"]["argv"]
    assert "--enable-flashinfer-allreduce-fusion" not in got["cu129/eagle3"]["argv"]
    eagle = got["cu130-fusion/eagle3"]["argv"]
    assert eagle[eagle.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert eagle[eagle.index("--max-running-requests") + 1] == "256"
    assert eagle[eagle.index("--tp-size") + 1] == "8"
    assert got["cu129/baseline"]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert got["cu129/baseline"]["resource"] == got["cu130-fusion/baseline"]["resource"]
    assert not any(a.startswith("--speculative") for a in got["cu129/baseline"]["argv"])


def test_vllm_tiny_speculative_config_is_json() -> None:
    got = commands_for("vllm-cpu-tiny")
    ngram = {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    for k in (1, 3):  # draft_lengths [1, 3]: one sub-arm per K
        cfg = vllm_mod.speculative_config_from_argv(got[f"cpu-tiny/ngram-k{k}"]["argv"])
        assert cfg == {**ngram, "num_speculative_tokens": k}
    policy = vllm_mod.speculative_config_from_argv(got["cpu-tiny/ngram-policy"]["argv"])
    assert policy == {**ngram, "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": EXAMPLE_SCHEDULE}
    assert vllm_mod.speculative_config_from_argv(got["cpu-tiny/baseline"]["argv"]) is None
    assert got["cpu-tiny/baseline"]["client_backend"] == "openai"
    assert got["cpu-tiny/baseline"]["resource"] == "cpu"


def test_port_not_in_identity() -> None:
    v = {"engine": "vllm", "model": "/m", "tp": 1}
    e = vllm_mod.VLLMEngine()
    a = e.server_spec(v, "baseline", {"speculative": False}, "127.0.0.1", 1111, "py")
    b = e.server_spec(v, "baseline", {"speculative": False}, "127.0.0.1", 2222, "py")
    assert a.identity == b.identity and a.argv != b.argv


SECRET = "sk-test-0123456789abcdef"


@pytest.mark.parametrize("engine_cls", [sglang_mod.SGLangEngine, vllm_mod.VLLMEngine])
def test_api_key_passed_and_redacted(engine_cls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVER_API_KEY", SECRET)
    variant = {"model": "/m", "tp": 1, "api_key_env": "MY_SERVER_API_KEY"}
    spec = engine_cls().server_spec(variant, "baseline", {"speculative": False}, "127.0.0.1", 1234, "py")
    i = spec.argv.index("--api-key")
    assert spec.argv[i + 1] == SECRET  # the server gets the real key
    assert spec.secret_env == ("MY_SERVER_API_KEY",)
    public = spec.public_dict()
    assert SECRET not in json.dumps(public)
    assert public["argv"][i + 1] == "***"
    assert "MY_SERVER_API_KEY" not in spec.env  # the value never travels in the stored env


@pytest.mark.parametrize("engine_cls", [sglang_mod.SGLangEngine, vllm_mod.VLLMEngine])
def test_api_key_env_missing_is_clear(engine_cls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_API_KEY", raising=False)
    variant = {"model": "/m", "api_key_env": "NOT_SET_API_KEY"}
    with pytest.raises(MissingAPIKey, match="NOT_SET_API_KEY"):
        engine_cls().server_spec(variant, "baseline", {"speculative": False}, "127.0.0.1", 1, "py")


def test_speculative_flag_must_match_args() -> None:
    e = sglang_mod.SGLangEngine()
    v = {"model": "/m"}
    with pytest.raises(ValueError, match="speculative"):
        e.server_spec(v, "eagle3", {"speculative": True}, "127.0.0.1", 1, "py")
    with pytest.raises(ValueError, match="not speculative"):
        e.server_spec(
            v,
            "baseline",
            {"speculative": False, "server_args": ["--speculative-algorithm", "EAGLE3"]},
            "127.0.0.1",
            1,
            "py",
        )
    with pytest.raises(ValueError, match="model"):
        e.server_spec({}, "baseline", {"speculative": False}, "127.0.0.1", 1, "py")


def test_defaults_and_env_vars() -> None:
    v = {"model": "/m", "gpus": "0, 1", "env_vars": {"NCCL_DEBUG": "WARN", "N": 3}, "startup_timeout_s": 60}
    spec = sglang_mod.SGLangEngine().server_spec(v, "baseline", {}, "", 5, "py")
    assert spec.host == "127.0.0.1"
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "WARN", "N": "3"}
    assert spec.resource == "gpus:0,1"
    assert spec.readiness_paths == ("/health_generate", "/health")
    assert spec.client_backend == "sglang"
    assert spec.startup_timeout_s == 60.0
    assert spec.argv[:4] == ["py", "-m", "sglang.launch_server", "--model-path"]
    vs = vllm_mod.VLLMEngine().server_spec({"model": "/m"}, "baseline", {}, "127.0.0.1", 5, "py")
    assert vs.readiness_paths == ("/health",) and vs.client_backend == "openai"
    assert vs.startup_timeout_s == 900.0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_arm_server_args_and_arm_env_reach_real_engines(engine: str) -> None:
    """Per-variant extra flags for one arm, and an arm's env vars, land in that arm's server only."""
    variant = {
        "engine": engine,
        "model": "/m",
        "tp": 2,
        "gpus": "0,1",
        "server_args": ["--v"],
        "arm_server_args": {"spec": ["--x"]},
        "env_vars": {"A": "1"},
    }
    flag = "--speculative-algorithm" if engine == "sglang" else "--speculative-config"
    spec_arm = {"speculative": True, "server_args": [flag, "EAGLE3"], "env_vars": {"B": "2"}}
    e = get_engine(engine)
    spec = e.server_spec(variant, "spec", spec_arm, "127.0.0.1", 1, "py")
    base = e.server_spec(variant, "base", {"speculative": False}, "127.0.0.1", 1, "py")
    assert spec.argv[-4:] == ["--v", flag, "EAGLE3", "--x"]
    assert "--x" not in base.argv
    launcher_env = {"VLLM_SERVER_DEV_MODE": "1"} if engine == "vllm" else {}  # /reset_prefix_cache
    assert spec.env == {**launcher_env, "CUDA_VISIBLE_DEVICES": "0,1", "A": "1", "B": "2"} and "B" not in base.env


def test_kimi_policy_arm_serves_the_schedule_with_sglang_adaptive_speculation() -> None:
    """SGLang has no switch that turns speculation off by load; the policy arm uses batch-size-aware adaptive
    speculation (SGLang 0.5.19, envs/sglang-*.txt): one slot per range with one step count, 0 = drafting off."""
    got = commands_for("kimi-k25-8gpu")
    argv = got["cu129/eagle3-policy"]["argv"]
    assert "--speculative-adaptive" in argv
    assert argv[argv.index("--speculative-adaptive-config") + 1].endswith("cu129/policy/eagle3.sglang-adaptive.json")
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    assert got["cu129/eagle3-policy.adaptive_config"]["content"] == {
        "1": {"candidate_steps": [3]},
        "17": {"candidate_steps": [0]},
    }
