"""Cells against a stand-in SGLang server (tests/support/standin_sglang): what the server reports is judged.

The stand-in is launched exactly as SGLang would be (`<python> -m sglang.launch_server ...`, specsweep's SGLang
engine) and answers /server_info with every field of SGLang 0.5.19's ServerArgs plus 0.5.23's launch_command.
A variant that asks for fusion and whose server reports it off, and an arm that asks for adaptive speculation
and whose server reports it off, are invalid with the reason; a server's API keys reach no stored file and no
MLflow payload.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from specsweep import config as ssconfig
from specsweep.tracking import payloads
from specsweep.tracking.notes import cell_note
from tests.conftest import REPO

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

STANDIN = REPO / "tests" / "support" / "standin_sglang"
EAGLE = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]
EAGLE += ["--speculative-num-draft-tokens", "4"]


def standin_config(
    tmp: Path, server_args: list[str], info: dict[str, Any] | None = None, log: str | None = None, **extra: Any
) -> dict:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    env = {"PYTHONPATH": f"{STANDIN}:{REPO / 'workflow'}"}
    if info is not None:
        env["SPECSWEEP_STANDIN_INFO"] = json.dumps(info)
    if log is not None:
        env["SPECSWEEP_STANDIN_LOG"] = log
    raw = {
        "experiment": "standin",
        "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
        "concurrency": [2],
        "workload": {
            "input_tokens": 8,
            "output_tokens": 16,
            "requests": {"floor": 6},
            "warmup_requests": 0,
            "request_timeout_s": 10,
        },
        "arms": {
            "baseline": {"speculative": False},
            "eagle3": {"speculative": True, "server_args": EAGLE},
            "adaptive": {"speculative": True, "server_args": [*EAGLE, "--speculative-adaptive"]},
        },
        "variants": {
            "sgl": {
                "engine": "sglang",
                "recipe": str(REPO / "envs" / "sglang-cu130.txt"),  # not built: the cell gets the interpreter
                "python": sys.executable,
                "model": str(model),
                "server_args": server_args,
                "env_vars": env,
                "startup_timeout_s": 60,
                **extra,
            }
        },
    }
    return ssconfig.validate(raw)


FUSED = ["--flashinfer-allreduce-fusion-backend", "auto"]


def test_fusion_reported_off_makes_the_cell_invalid(cells, tmp_path: Path) -> None:
    off = cells.run(standin_config(tmp_path, FUSED, {"flashinfer_allreduce_fusion_backend": None}), variant="sgl")
    assert off["server"]["info"]["flashinfer_allreduce_fusion_backend"] is None
    assert not off["validity"]["valid"]
    assert any("asked for FlashInfer all-reduce fusion" in r for r in off["validity"]["reasons"])
    on = cells.run(standin_config(tmp_path, FUSED), variant="sgl", name="on")
    assert on["server"]["info"]["flashinfer_allreduce_fusion_backend"] == "auto"
    assert not any("fusion" in r for r in on["validity"]["reasons"]), on["validity"]


# SGLang 0.5.19's lines (sglang/srt/layers/flashinfer_comm_fusion.py), as its logger prints them
WORKSPACE_FAILED = (
    "[2026-12-02 10:00:00 TP0] Failed to initialize FlashInfer workspace (backend=trtllm): CUDA error: no kernel "
    "image is available for execution on the device. Disabling flashinfer allreduce fusion permanently."
)
WORKSPACE_UP = (
    "[2026-12-02 10:00:00 TP0] FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, "
    "rank=0, world_size=8, max_token_num=2048, hidden_dim=7168"
)


def test_fusion_dropped_at_run_time_is_read_from_the_server_log(cells, tmp_path: Path) -> None:
    """/server_info still says `auto`: only the log says the server runs plain all-reduces."""
    failed = cells.run(standin_config(tmp_path, FUSED, log=WORKSPACE_FAILED), variant="sgl")
    assert failed["server"]["info"]["flashinfer_allreduce_fusion_backend"] == "auto"
    assert failed["server"]["info"]["fusion_workspace"].startswith("failed: ")
    assert not failed["validity"]["valid"]
    assert any("workspace set-up failed" in r for r in failed["validity"]["reasons"]), failed["validity"]
    up = cells.run(standin_config(tmp_path, FUSED, log=WORKSPACE_UP), variant="sgl", name="up")
    assert up["server"]["info"]["fusion_workspace"].startswith("initialized: ")
    assert not any("fusion" in r for r in up["validity"]["reasons"] + up["validity"]["flags"]), up["validity"]
    # no line either way: a flag, not a verdict
    quiet = cells.run(standin_config(tmp_path, FUSED), variant="sgl", name="quiet")
    assert quiet["server"]["info"]["fusion_workspace"] is None
    assert any("not seen in the server log" in f for f in quiet["validity"]["flags"]), quiet["validity"]


def test_adaptive_reported_off_makes_the_cell_invalid(cells, tmp_path: Path) -> None:
    off = cells.run(standin_config(tmp_path, [], {"speculative_adaptive": False}), arm="adaptive", variant="sgl")
    assert off["server"]["info"]["speculative_adaptive"] is False
    assert not off["validity"]["valid"]
    assert any("served static speculation" in r for r in off["validity"]["reasons"])
    on = cells.run(standin_config(tmp_path, []), arm="adaptive", variant="sgl", name="on")
    assert on["server"]["info"]["speculative_adaptive"] is True
    assert not any("adaptive" in r for r in on["validity"]["reasons"]), on["validity"]


def test_server_facts_keep_no_secret(cells, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Variable names without secret words, so only the masking of SGLang's fields and flags can hide them."""
    key, admin = "sk-standin-api-key-31337", "adm-standin-admin-key-27182"
    monkeypatch.setenv("STANDIN_SERVER_ACCESS", key)
    monkeypatch.setenv("STANDIN_ADMIN_VALUE", admin)  # the server reports it; specsweep never sees it otherwise
    summary = cells.run(standin_config(tmp_path, [], api_key_env="STANDIN_SERVER_ACCESS"), arm="eagle3", variant="sgl")
    m = summary["metrics"]
    assert m["errors"]["count"] == 0 and m["n_ok"] >= m["n_measured"] > 0  # the key was sent
    raw = summary["server"]["info"]["raw"]
    assert raw["api_key"] == raw["admin_api_key"] == "***"
    assert "--api-key ***" in raw["launch_command"]
    assert raw["speculative_num_draft_tokens"] == 4 and raw["max_total_num_tokens"] == 655360  # facts are kept
    stored = cells.all_text() + pd.read_parquet(cells.out_dir("cell") / "requests.parquet").to_json()
    payload = json.dumps(
        [payloads.cell_params(summary), payloads.cell_metrics(summary), cell_note(summary)], default=str
    )
    for secret in (key, admin):
        assert secret not in stored, f"{secret} stored under {cells.root}"
        assert secret not in payload, "a key reached the MLflow payload"


def test_a_secret_flag_in_server_args_is_refused(tmp_path: Path) -> None:
    from specsweep.engines import get_engine

    cfg = standin_config(tmp_path, ["--admin-api-key", "adm-literal"])
    with pytest.raises(ValueError, match="--admin-api-key"):
        get_engine("sglang").server_spec(cfg["variants"]["sgl"], "baseline", {"speculative": False}, "h", 1, "py")
