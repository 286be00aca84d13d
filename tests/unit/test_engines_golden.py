"""Golden command lines: the exact server each example config asks for, per variant x arm.

Regenerate after an intended change with `SPECSWEEP_UPDATE_GOLDEN=1 pytest tests/unit/test_engines_golden.py`
and review the diff of tests/golden/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specsweep.engines import get_engine
from specsweep.engines import sglang as sglang_mod
from specsweep.engines import vllm as vllm_mod
from specsweep.redact import MissingAPIKey
from tests.support.commands import EXAMPLE_SCHEDULE, commands_for, stacks_for

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = ["kimi-k25-8gpu", "vllm-cpu-tiny"]

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("config_name", EXAMPLES)
def test_golden_commands(config_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):  # identities must not depend on the developer's environment
        if k.startswith(("CUDA_", "VLLM_")):
            monkeypatch.delenv(k, raising=False)
    _matches_golden(commands_for(config_name), GOLDEN / f"{config_name}.commands.json", "command lines")


def _matches_golden(got: dict, path: Path, what: str) -> None:
    """`got` equals the golden file at `path` (rewritten first under SPECSWEEP_UPDATE_GOLDEN)."""
    if os.environ.get("SPECSWEEP_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert got == want, f"{what} changed; if intended, regenerate {path} (see module docstring)"


@pytest.mark.parametrize("config_name", EXAMPLES)
def test_golden_stacks(config_name: str) -> None:
    """Each variant's recipe and the patches it applies after pip (a changed patch changes the stack)."""
    _matches_golden(stacks_for(config_name), GOLDEN / f"{config_name}.stacks.json", "stacks")


def test_kimi_fusion_stack_carries_the_sm120_patch_of_both_files_that_gate_fusion() -> None:
    stacks = stacks_for("kimi-k25-8gpu")
    assert stacks["cu130"] == stacks["cu130-fusion"]  # one environment: the two differ only in the fusion flag
    [patch] = stacks["cu130-fusion"]["patches"]
    assert patch["file"] == "envs/patches/sglang-0.5.19-sm120-fusion.patch"
    assert patch["files"] == ["sglang/srt/layers/communicator.py", "sglang/srt/layers/flashinfer_comm_fusion.py"]
    assert stacks["cu129"]["patches"] == []  # the CUDA 12 lane: no fusion asked


def test_kimi_three_stacks_fusion_only_in_cu130_fusion() -> None:
    """The seed's comparison: the CUDA 12 lane, CUDA 13, and CUDA 13 with fusion (SGLang 0.5.19's current flag)."""
    got = commands_for("kimi-k25-8gpu")
    assert {k.split("/")[0] for k in got} == {"cu129", "cu130", "cu130-fusion"}
    fused = got["cu130-fusion/eagle3"]["argv"]
    assert fused[fused.index("--flashinfer-allreduce-fusion-backend") + 1] == "auto"
    for variant in ("cu129", "cu130"):
        assert not any("allreduce-fusion" in a for a in got[f"{variant}/eagle3"]["argv"])
    assert not any("--enable-flashinfer-allreduce-fusion" in a for k, c in got.items() for a in c.get("argv", []))
    # cu130 and cu130-fusion differ only in the fusion flag
    plain = got["cu130/eagle3"]["argv"]
    assert [a for a in fused if "allreduce-fusion" not in a and a != "auto"] == [
        a.replace("/envs/cu130/", "/envs/cu130-fusion/") for a in plain
    ]
    assert fused[fused.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert fused[fused.index("--max-running-requests") + 1] == "256"
    assert fused[fused.index("--tp-size") + 1] == "8"
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
