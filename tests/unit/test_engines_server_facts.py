"""SGLang server facts: the fields SGLang 0.5.19 really sets, masked secrets, and what the server must confirm.

The payload is tests/support/sglang_server_info.json: every field of the pinned release's ServerArgs (checked
against the release in tests/engine_args), plus 0.5.23's launch_command.
"""

from __future__ import annotations

import json

import pytest

from specsweep import config as ssconfig
from specsweep.engines import get_engine, served_as_asked
from specsweep.engines.sglang import summarize_server_info
from specsweep.engines.speculation import sglang_args
from specsweep.redact import MASK, is_secret_key, redact_argv, redact_command_text, redact_facts, unredact_argv
from tests.conftest import REPO
from tests.support.commands import example_path

pytestmark = pytest.mark.unit

PAYLOAD = json.loads((REPO / "tests" / "support" / "sglang_server_info.json").read_text())
KEY, ADMIN = "sk-unit-0123456789", "adm-unit-9876543210"


def payload(**fields) -> dict:
    return {**PAYLOAD, **fields}


def test_secret_names_by_word() -> None:
    for name in ("api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key_b", "hf_token", "--api-key"):
        assert is_secret_key(name), name
    for name in ("max_total_num_tokens", "speculative_num_draft_tokens", "speculative_token_map", "ssl_keyfile"):
        assert not is_secret_key(name), name


def test_server_info_masked_and_real_fields_recorded() -> None:
    raw = payload(
        api_key=KEY,
        admin_api_key=ADMIN,
        launch_command=f"--model-path /m --api-key {KEY} --admin-api-key={ADMIN} --tp-size 8",
        flashinfer_allreduce_fusion_backend="auto",
        enable_flashinfer_allreduce_fusion=False,  # what 0.5.19 reports after rewriting the deprecated switch
        speculative_adaptive=True,
        speculative_adaptive_config="/r/eagle3.sglang-adaptive.json",
        cuda_graph_max_bs_decode=64,
    )
    info = summarize_server_info(raw)
    text = json.dumps(info)
    assert KEY not in text and ADMIN not in text
    assert info["raw"]["api_key"] == info["raw"]["admin_api_key"] == MASK
    assert info["raw"]["launch_command"] == f"--model-path /m --api-key {MASK} --admin-api-key={MASK} --tp-size 8"
    assert info["flashinfer_allreduce_fusion_backend"] == "auto" and info["speculative_adaptive"] is True
    assert info["speculative_adaptive_config"].endswith("eagle3.sglang-adaptive.json")
    assert info["cuda_graph_max_bs_decode"] == 64 and "cuda_graph_max_bs" not in info
    assert info["raw"]["max_total_num_tokens"] == PAYLOAD["max_total_num_tokens"]  # facts stay
    assert redact_facts({"api_key": None})["api_key"] is None  # "no key" is a fact, not a secret


def test_secret_flags_in_text_and_argv() -> None:
    assert (
        redact_command_text(f"--enable-metrics --api-key {KEY} --port 1")
        == f"--enable-metrics --api-key {MASK} --port 1"
    )
    argv = ["py", "--watermark-key", "w1", "--disable-api-key-check", "--port", "1"]
    public = redact_argv(argv)
    assert public == ["py", "--watermark-key", MASK, "--disable-api-key-check", "--port", "1"]


def test_unredact_puts_the_key_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIT_API_KEY", KEY)
    assert unredact_argv(["--api-key", MASK, "--port", "1"], ("UNIT_API_KEY",)) == ["--api-key", KEY, "--port", "1"]


FUSED = ["--flashinfer-allreduce-fusion-backend", "auto"]


@pytest.mark.parametrize(
    ("argv", "fields", "reason"),
    [
        (FUSED, {"flashinfer_allreduce_fusion_backend": None}, "all-reduce fusion"),
        (["--enable-flashinfer-allreduce-fusion"], {"flashinfer_allreduce_fusion_backend": None}, "all-reduce fusion"),
        (["--speculative-adaptive"], {"speculative_adaptive": False}, "static speculation"),
    ],
)
def test_asked_for_and_reported_off_is_invalid(argv: list[str], fields: dict, reason: str) -> None:
    reasons, flags = served_as_asked("sglang", argv, summarize_server_info(payload(**fields)))
    assert len(reasons) == 1 and reason in reasons[0] and not flags


def test_reported_on_or_not_asked_is_valid_and_missing_is_not_judged() -> None:
    on = summarize_server_info(payload(flashinfer_allreduce_fusion_backend="auto", speculative_adaptive=True))
    assert served_as_asked("sglang", [*FUSED, "--speculative-adaptive"], on) == ([], [])
    assert served_as_asked("sglang", [], summarize_server_info(payload())) == ([], [])
    reasons, flags = served_as_asked("sglang", [*FUSED, "--speculative-adaptive"], {})
    assert not reasons and len(flags) == 2 and all("not judged" in f for f in flags)
    assert served_as_asked("vllm", FUSED, {}) == ([], [])


def test_all_zero_schedule_serves_the_baseline_command() -> None:
    cfg = ssconfig.load(example_path("kimi-k25-8gpu"))
    engine = get_engine("sglang")

    def argv(arm: str, served: dict | None = None) -> list[str]:
        spec = ssconfig.cell_spec(cfg, "cu130-fusion", arm, 10, served)
        variant = ssconfig.variant_for_server(spec, "cu130-fusion", absolute=False)
        return engine.server_spec(variant, spec["arm_name"], spec["arm"], "127.0.0.1", 1, "py").argv

    zero = argv("eagle3-policy", {"schedule": [[1, 256, 0]], "file": "f.json"})
    assert zero == argv("baseline") and not any(a.startswith("--speculative") for a in zero)
    mixed = argv("eagle3-policy", {"schedule": [[1, 16, 3], [17, 256, 0]], "file": "f.json"})
    assert "--speculative-adaptive" in mixed and mixed[mixed.index("--speculative-num-steps") + 1] == "3"
    with pytest.raises(ValueError, match="baseline's command"):
        sglang_args(["--speculative-algorithm", "EAGLE3"], {"schedule": [[1, 256, 0]], "schedule_file": "f"})


def test_stack_facts_carry_what_the_server_runs() -> None:
    from specsweep.stack.stack_facts import stack_facts

    def summary(info: dict) -> dict:  # what stack_facts reads of a summary.json (records.CellSummary)
        server = {"info": info, "argv": ["py"], "env": {}, "resource": "0,1"}
        return {
            "engine": "sglang",
            "server": server,
            "stack": {"fingerprint": "", "recipe": None},
            "cell": {"speculative": True},
        }

    info = summarize_server_info(payload(flashinfer_allreduce_fusion_backend="auto", speculative_adaptive=True))
    facts = stack_facts(summary(info))
    assert facts["stack.allreduce_fusion"] == "auto" and facts["stack.speculative_adaptive"] is True
    assert "stack.allreduce_fusion" not in stack_facts(summary(summarize_server_info(PAYLOAD)))


def test_fusion_workspace_is_read_from_the_running_instances_log(tmp_path) -> None:
    """The log is appended to across restarts: a failure an earlier instance logged is not this one's."""
    from specsweep.engines import log_facts
    from specsweep.serving.servers import instance_log

    log = tmp_path / "server.log"
    fail = "[TP0] Failed to initialize FlashInfer workspace (backend=trtllm): x. "
    fail += "Disabling flashinfer allreduce fusion permanently."
    up = "[TP0] FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, rank=0, world_size=8"
    log.write_text(f"\n=== 2026-12-02T10:00:00 starting v/a: python -m sglang.launch_server\n{fail}\n")
    assert log_facts("sglang", lambda: instance_log(log))["fusion_workspace"].startswith("failed: [TP0] Failed")
    with log.open("a") as f:
        f.write(f"\n=== 2026-12-02T11:00:00 starting v/a: python -m sglang.launch_server\n{up}\n")
    assert instance_log(log) == [up]
    assert log_facts("sglang", lambda: instance_log(log))["fusion_workspace"] == f"initialized: {up}"
    assert log_facts("sglang", lambda: [up, fail])["fusion_workspace"].startswith("failed")  # a failure wins
    assert log_facts("sglang", lambda: ["anything else"]) == {"fusion_workspace": None}
    assert log_facts("vllm", lambda: [fail]) == {} and instance_log(tmp_path / "none.log") == []

    def unread() -> list[str]:
        raise AssertionError("an engine without log facts had its server log read")

    assert log_facts("vllm", unread) == {} and log_facts("sim", unread) == {}
    fused = ["--flashinfer-allreduce-fusion-backend", "auto"]
    info = summarize_server_info(payload(flashinfer_allreduce_fusion_backend="auto"))
    reasons, _ = served_as_asked("sglang", fused, {**info, **log_facts("sglang", lambda: [fail])})
    assert any("workspace set-up failed" in r for r in reasons)
    assert served_as_asked("sglang", [], {**info, **log_facts("sglang", lambda: [fail])}) == (
        [],
        [],
    )  # fusion not asked
    reasons, flags = served_as_asked("sglang", fused, info)  # measured before the log was read: nothing new
    assert reasons == [] and not any("server log" in f for f in flags)
