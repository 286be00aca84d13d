"""preflight: findings from a stand-in nvidia-smi (8 x RTX PRO 6000 Blackwell, SM120), recipes, models, ports,
indexes; the user's example names its fusion patch; the default sim config passes. No network: index probes
go to a local server or are replaced."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from specsweep import cli
from specsweep import config as ssconfig
from specsweep.stack import preflight
from tests.support import fakenvml, nvidia_smi

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
KIMI = REPO / "config" / "examples" / "kimi-k25-8gpu.yaml"


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a stand-in nvidia-smi for the given GPUs, first on PATH."""

    def put(gpus: list[dict[str, Any]]) -> None:
        nvidia_smi.install(tmp_path / "bin", gpus)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")

    return put


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Index probes answered here (recorded), so the tests never reach out."""
    asked: list[str] = []

    def fake(url: str, timeout: float = 0) -> str:
        asked.append(url)
        return ""

    monkeypatch.setattr(preflight, "reachable", fake)
    return asked


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(["preflight", *argv])
    return rc, capsys.readouterr().out


def _pre(tmp_path: Path, spec: dict[str, Any], arm_args: dict[str, list[str]] | None = None) -> dict[str, Any]:
    base = {"engine": "sglang", "recipe": None, "python": None, "model": None, "model_builder": None}
    base |= {"tp": 8, "gpus": "0,1,2,3,4,5,6,7", "host": "127.0.0.1", "port": None, "server_args": []}
    return {
        "results_dir": str(tmp_path / "results"),
        "envs_dir": None,
        "variant": "v",
        "spec": base | spec,
        "arm_args": arm_args or {},
    }


def _model(folder: Path, config: Any = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"architectures": ["KimiK25ForConditionalGeneration"]}))
    return str(folder)


def test_kimi_example_on_8_sm120_names_the_fusion_patch(smi, no_network, capsys) -> None:
    smi([nvidia_smi.RTX_PRO_6000] * 8)
    rc, out = _run(["--configfile", str(KIMI), "--root", str(REPO)], capsys)
    assert rc == 1  # the models are placeholders here
    cfg = ssconfig.load(KIMI)
    fusion = [
        v for v in cfg["variants"] if preflight.asks_for_fusion(preflight.all_args(ssconfig.preflight_spec(cfg, v)))
    ]
    assert fusion, "the example has a fusion variant"
    for v in cfg["variants"]:
        assert (
            f"OK      [{v}] GPUs: 8 x NVIDIA RTX PRO 6000 Blackwell Workstation Edition (compute capability 12.0" in out
        )
        line = next((x for x in out.splitlines() if f"[{v}] fusion:" in x), None)
        if v in fusion:  # the CUDA 13 recipe carries the SM120 fusion patch
            assert line and line.startswith("OK ") and "SM120" in line, out
            assert "sglang-0.5.19-sm120-fusion.patch" in line, line
        else:
            assert line is None
        assert f"ERROR   [{v}] served model: /models/Kimi-K2.5 does not exist" in out
    assert any(u.startswith("https://download.pytorch.org/whl/cu1") for u in no_network)  # the recipes' indexes


def test_kimi_example_here_lists_what_is_missing_in_seconds(capsys, monkeypatch) -> None:
    """This machine: no GPU, no model. The real command, the indexes probed for real (short timeout)."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi
    t0 = time.monotonic()
    rc, out = _run(["--configfile", str(KIMI), "--root", str(REPO)], capsys)
    took = time.monotonic() - t0
    assert rc == 1 and took < 10, (took, out)
    assert "no nvidia-smi on PATH" in out and "/models/Kimi-K2.5 does not exist" in out
    assert "/models/Kimi-K2.5-EAGLE3 does not exist" in out
    assert out.rstrip().splitlines()[-1].startswith("preflight FAILED:")


def _hunk(path: str) -> str:
    return f"--- a/python/{path}\n+++ b/python/{path}\n@@ -1 +1 @@\n-x\n+y\n"


def test_fusion_needs_a_patch_of_both_files_that_gate_it(tmp_path, smi, no_network) -> None:
    """Patched where it raises but not where it fuses, a server would start and run plain all-reduces."""
    smi([nvidia_smi.RTX_PRO_6000] * 8)
    envs = tmp_path / "envs"
    (envs / "patches").mkdir(parents=True)
    (envs / "patches" / "sm120.patch").write_text(_hunk("sglang/srt/layers/flashinfer_comm_fusion.py"))
    (envs / "r.txt").write_text(
        "--extra-index-url https://download.pytorch.org/whl/cu130\ntorch==2.13.0+cu130\n"
        "# specsweep: patch patches/sm120.patch --strip 2\n"
    )
    args = ["--flashinfer-allreduce-fusion-backend", "auto"]
    pre = _pre(tmp_path, {"recipe": "envs/r.txt", "server_args": args})
    [fusion] = [f for f in preflight.preflight([pre], tmp_path) if f.check == "fusion"]
    assert fusion.level == "error" and "sglang/srt/layers/communicator.py" in fusion.message, fusion
    assert "flashinfer_comm_fusion.py" not in fusion.message.rsplit("no patch of", 1)[1]
    (envs / "patches" / "gate.patch").write_text(_hunk("sglang/srt/layers/communicator.py"))
    with (envs / "r.txt").open("a") as f:
        f.write("# specsweep: patch patches/gate.patch --strip 2\n")
    [fusion] = [f for f in preflight.preflight([pre], tmp_path) if f.check == "fusion"]
    assert fusion.level == "ok" and "sm120.patch" in fusion.message and "gate.patch" in fusion.message
    # the same recipe without the patch: an error; fusion forced off: no fusion finding at all
    (envs / "r.txt").write_text("torch==2.13.0+cu130\n")
    assert [f.level for f in preflight.preflight([pre], tmp_path) if f.check == "fusion"] == ["error"]
    pre["spec"]["server_args"] = args + ["--enforce-disable-flashinfer-allreduce-fusion"]
    assert [f for f in preflight.preflight([pre], tmp_path) if f.check == "fusion"] == []


def test_fusion_on_sm90_needs_no_patch(tmp_path, smi, no_network) -> None:
    smi([nvidia_smi.H100] * 8)
    (tmp_path / "r.txt").write_text("torch==2.13.0+cu129\n")
    pre = _pre(tmp_path, {"recipe": "r.txt", "server_args": ["--enable-flashinfer-allreduce-fusion"]})
    [fusion] = [f for f in preflight.preflight([pre], tmp_path) if f.check == "fusion"]
    assert fusion.level == "ok" and "9.0" in fusion.message


def test_driver_against_the_cuda_lane(tmp_path, smi, no_network) -> None:
    (tmp_path / "cu130.txt").write_text("--extra-index-url https://download.pytorch.org/whl/cu130\ntorch\n")
    (tmp_path / "cu129.txt").write_text("torch==2.13.0+cu129\n")
    smi([dict(nvidia_smi.RTX_PRO_6000, driver_version="570.124.06")] * 8)
    old = {
        name: [f for f in preflight.preflight([_pre(tmp_path, {"recipe": name})], tmp_path) if f.check == "driver"]
        for name in ("cu130.txt", "cu129.txt")
    }
    assert old["cu130.txt"][0].level == "error" and ">= 580.65.06" in old["cu130.txt"][0].message
    assert old["cu129.txt"][0].level == "warning" and "minor-version compatibility" in old["cu129.txt"][0].message
    smi([dict(nvidia_smi.RTX_PRO_6000, driver_version="515.105.01")] * 8)
    [f] = [f for f in preflight.preflight([_pre(tmp_path, {"recipe": "cu129.txt"})], tmp_path) if f.check == "driver"]
    assert f.level == "error" and "525.60.13" in f.message and f.fix


def test_gpu_count_and_no_driver(tmp_path, smi, no_network, monkeypatch) -> None:
    smi([nvidia_smi.RTX_PRO_6000] * 4)
    found = [f for f in preflight.preflight([_pre(tmp_path, {})], tmp_path) if f.check == "GPUs"]
    [gpus] = [f for f in found if f.level == "error"]
    assert "needs GPUs 0,1,2,3,4,5,6,7; this machine has 4" in gpus.message and "gpus" in gpus.fix
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    [gpus] = [f for f in preflight.preflight([_pre(tmp_path, {})], tmp_path) if f.check == "GPUs"]
    assert gpus.level == "error" and "no nvidia-smi" in gpus.message
    # a vLLM CPU variant (no gpus) asks for no GPU at all
    assert [
        f
        for f in preflight.preflight([_pre(tmp_path, {"engine": "vllm", "gpus": None})], tmp_path)
        if f.check == "GPUs"
    ] == []


def test_models_and_drafts(tmp_path, no_network, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    good = _model(tmp_path / "m")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    arms = {
        "eagle3": ["--speculative-draft-model-path", str(bad)],
        "ngram": ["--speculative-config", json.dumps({"method": "eagle3", "model": "org/draft"})],
    }
    found = preflight.preflight([_pre(tmp_path, {"engine": "vllm", "gpus": None, "model": good}, arms)], tmp_path)
    models = {(f.check, f.level): f.message for f in found if "model" in f.check}
    assert "KimiK25ForConditionalGeneration" in models[("served model", "ok")]
    assert "not readable JSON" in models[("draft model", "error")]
    assert "Hugging Face Hub" in models[("draft model", "warning")]  # vLLM reads the draft from its JSON
    empty = _model(tmp_path / "e", {"hidden_size": 1})
    [f] = [
        f
        for f in preflight.preflight([_pre(tmp_path, {"engine": "vllm", "gpus": None, "model": empty})], tmp_path)
        if "model" in f.check
    ]
    assert f.level == "error" and "architectures" in f.message


def test_taken_port_and_missing_local_wheel(tmp_path, no_network, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    (tmp_path / "r.txt").write_text("./wheels/x-1.0-py3-none-any.whl\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        pre = _pre(
            tmp_path, {"engine": "vllm", "gpus": None, "recipe": "r.txt", "port": port, "model_builder": "tiny-llama"}
        )
        found = preflight.preflight([pre], tmp_path)
    [p] = [f for f in found if f.check == "port"]
    assert p.level == "error" and str(port) in p.message and "null" in p.fix
    [r] = [f for f in found if f.check == "recipe"]
    assert r.level == "error" and "x-1.0-py3-none-any.whl" in r.message
    free = [f for f in preflight.preflight([pre], tmp_path) if f.check == "port"]  # the socket is closed now
    assert free[0].level == "ok"


def test_index_probe_against_a_local_server() -> None:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/whl/cu130"
        assert preflight.reachable(url) == ""  # a 404 is an answer: the index is there
    finally:
        server.shutdown()
        server.server_close()
    assert preflight.reachable(url, timeout=1) != ""  # nothing listens any more


def test_recipe_lane_and_indexes() -> None:
    from specsweep.stack import envbuild

    for name, lane in (("sglang-cu129.txt", "cu129"), ("sglang-cu130.txt", "cu130"), ("vllm-cpu.txt", None)):
        recipe = envbuild.parse_recipe(REPO / "envs" / name)
        assert preflight.cuda_lane(recipe) == lane
    urls = preflight.index_urls(envbuild.parse_recipe(REPO / "envs" / "sglang-cu130.txt"))
    assert "https://download.pytorch.org/whl/cu130" in urls and len(urls) == 3


def test_default_sim_config_passes(capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    rc, out = _run(["--configfile", str(REPO / "config" / "config.yaml"), "--root", str(REPO)], capsys)
    assert rc == 0 and "preflight passed" in out


H200 = dict(nvidia_smi.H100, name="NVIDIA H200", **{"memory.total": "143771"})


def _state(found: list[preflight.Finding]) -> list[preflight.Finding]:
    return [f for f in found if f.check == "gpu state"]


def test_gpu_state_per_gpu_from_nvml(tmp_path, smi, no_network) -> None:
    """4 x H200 at idle (tests/support/nvml_payloads/idle_mixed.json): one finding per GPU of the variant."""
    smi([H200] * 4)
    fake = fakenvml.load("idle_mixed")
    pres = [_pre(tmp_path, {"tp": 4, "gpus": "0,1,2,3"}), _pre(tmp_path, {"tp": 2, "gpus": "1,3"}) | {"variant": "w"}]
    found = preflight.preflight(pres, tmp_path, nvml=fake)
    assert fake.calls["nvmlInit"] == 1 and fake.inits == fake.shutdowns  # one snapshot for every variant
    g0, g1, g2, g3 = _state([f for f in found if f.variant == "v"])
    assert (g0.level, g0.fix) == ("ok", "")
    assert g0.message == (
        "GPU 0 NVIDIA H200: SM 345/1980 MHz at idle, 75 W of 700 W limit (default 700 W), 31 C, persistence on, "
        "no other process"
    )
    assert g1.level == "warning" and "persistence off (the first CUDA call then waits for the driver" in g1.message
    assert "nvidia-smi -i 1 -pm 1" in g1.fix
    assert g2.level == "warning" and "77 W of 500 W limit (default 700 W)" in g2.message
    assert "nvidia-smi -i 2 -pl 700" in g2.fix
    assert g3.level == "warning" and "other process(es) 7777 hold 20480 MiB" in g3.message
    assert "hw_slowdown (slowed by heat or power)" in g3.message and "gpu_idle" not in g3.message.split("event")[-1]
    assert "stop them" in g3.fix and "cooling" in g3.fix
    assert [f.message.split(":")[0] for f in _state([f for f in found if f.variant == "w"])] == [
        "GPU 1 NVIDIA H200",
        "GPU 3 NVIDIA H200",
    ]
    # no `gpus`: every GPU the snapshot has
    found = preflight.preflight([_pre(tmp_path, {"tp": 1, "gpus": None})], tmp_path, nvml=fakenvml.load("idle_mixed"))
    assert len(_state(found)) == 4


def test_gpu_state_power_cap_is_reported_not_warned(tmp_path, smi, no_network) -> None:
    smi([nvidia_smi.H100])
    fake = fakenvml.load("power_capped")
    fake.gpus[0]["readings"]["compute_processes"] = [[]]  # recorded under load: the server's process, gone here
    found = preflight.preflight([_pre(tmp_path, {"tp": 1, "gpus": "0"})], tmp_path, nvml=fake)
    [g] = _state(found)
    assert g.level == "ok" and "clock event reasons: sw_power_cap" in g.message and "slowed" not in g.message
    assert "SM 1905/1980 MHz," in g.message and "699 W of 700 W limit" in g.message


def test_gpu_state_from_nvidia_smi_without_nvml(tmp_path, smi, no_network) -> None:
    smi_cells = {
        "uuid": "GPU-1",
        "clocks.sm": "345",
        "clocks.mem": "2619",
        "clocks.max.sm": "1980",
        "power.draw": "71.40",
        "power.limit": "700.00",
        "power.default_limit": "700.00",
        "temperature.gpu": "29",
        "persistence_mode": "Enabled",
        "clocks_throttle_reasons.active": "0x0000000000000001",
    }
    smi([dict(nvidia_smi.H100, **smi_cells)] * 2)
    no_nvml = fakenvml.load("clean", init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    [g0, g1] = _state(preflight.preflight([_pre(tmp_path, {"tp": 2, "gpus": "0,1"})], tmp_path, nvml=no_nvml))
    assert g0.level == "ok" and g0.message == (
        "GPU 0 NVIDIA H100 80GB HBM3: SM 345/1980 MHz at idle, 71 W of 700 W limit (default 700 W), 29 C, "
        "persistence on, other processes not read (read by nvidia-smi)"
    )
    # an nvidia-smi that lists the GPUs but not their state: one warning, and why
    smi([nvidia_smi.H100] * 2)
    [w] = _state(preflight.preflight([_pre(tmp_path, {"tp": 2, "gpus": "0,1"})], tmp_path, nvml=no_nvml))
    assert w.level == "warning" and "NVML Shared Library Not Found" in w.message and "libnvidia-ml" in w.fix


def test_gpu_state_without_nvml_or_nvidia_smi_adds_nothing(tmp_path, no_network, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    no_nvml = fakenvml.load("clean", init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    found = preflight.preflight([_pre(tmp_path, {})], tmp_path, nvml=no_nvml)
    assert _state(found) == []
    [gpus] = [f for f in found if f.check == "GPUs"]
    assert gpus.level == "error" and "no nvidia-smi" in gpus.message
