"""specsweep.telemetry.gpu against recorded NVML payloads (tests/support/nvml_payloads) through a fake pynvml:
per-block medians, throttle reasons, foreign processes, ECC and XID; None (and why) without NVML; the
nvidia-smi fallback of the snapshot."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from specsweep.telemetry import gpu
from tests.support import fakenvml, nvidia_smi

pytestmark = pytest.mark.unit

SERVER = {4100, 4101}


def _watch(name: str, samples: int | None = None, **kwargs: Any) -> tuple[list[dict], fakenvml.FakeNvml]:
    """A block over every GPU of a payload, sampled once per recorded reading (deterministic: no thread tick)."""
    fake = fakenvml.load(name, **kwargs)
    watch = gpu.gpu_watch(None, SERVER, interval_s=3600, nvml=fake)
    assert watch is not None
    watch.start()
    n = samples if samples is not None else len(fake.gpus[0]["readings"]["sm_clock_mhz"] or [0])
    for _ in range(n):
        watch.sample()
    out = watch.stop()
    assert fake.inits == fake.shutdowns == 1  # NVML is refcounted: one init, one shutdown per watch
    assert all(s.freed for s in fake.event_sets)
    json.dumps(out)  # JSON-able as it is
    for g in out:
        assert set(gpu.KEYS) <= set(g), set(gpu.KEYS) - set(g)
    return out, fake


def test_clean_two_gpus_under_load() -> None:
    out, _ = _watch("clean")
    assert [g["index"] for g in out] == [0, 1]
    a, b = out
    assert a["samples"] == 6 and a["source"] == "nvml" and a["name"] == "NVIDIA H100 80GB HBM3"
    assert a["uuid"].startswith("GPU-") and a["uuid"] != b["uuid"]
    assert a["sm_clock_mhz"] == 1980 and a["sm_clock_min_mhz"] == 1965 and a["sm_clock_max_mhz"] == 1980
    assert b["sm_clock_min_mhz"] == 1950 and a["mem_clock_mhz"] == 2619
    assert a["power_w"] == pytest.approx((598214 + 612480 + 604973 + 589301 + 607722 + 601110) / 6000, abs=1e-3)
    assert a["power_limit_w"] == 700.0 and a["temperature_c"] == 64 and b["temperature_c"] == 61
    assert a["throttle_reasons"] == [] and a["throttled_thermal_power"] is False
    assert a["other_processes_mib"] == 0 and a["other_processes"] == []  # the server's own memory is not "other"
    assert a["ecc_uncorrected"] == 0 and a["xid_events"] == []
    assert a["energy_j"] == pytest.approx((91831004937 - 91827364512) / 1000)


def test_thermal_throttle_is_a_slowed_block() -> None:
    [g], _ = _watch("throttled")
    assert g["sm_clock_mhz"] == (1410 + 1650) / 2  # the median of 1980 ... 1200
    assert g["sm_clock_min_mhz"] == 1200 and g["sm_clock_max_mhz"] == 1980 and g["temperature_c"] == 91
    assert g["throttle_reasons"] == ["hw_thermal_slowdown", "sw_thermal_slowdown"]  # any sample's, sorted
    assert g["throttled_thermal_power"] is True


def test_an_older_driver_names_the_same_reasons() -> None:
    """Before driver 535 there is only nvmlDeviceGetCurrentClocksThrottleReasons (same bits)."""
    [g], fake = _watch("throttled", legacy_reasons=True)
    assert g["throttle_reasons"] == ["hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # answered "function not found": not again
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 6


def test_power_cap_is_recorded_and_is_not_a_slowdown() -> None:
    [g], _ = _watch("power_capped")
    assert g["throttle_reasons"] == ["sw_power_cap"] and g["throttled_thermal_power"] is False
    assert g["sm_clock_mhz"] == 1890 and g["power_w"] == pytest.approx(699.6, abs=0.1)
    assert "sw_power_cap" not in gpu.THERMAL_POWER_REASONS
    assert gpu.THERMAL_POWER_REASONS == {
        "hw_slowdown",
        "hw_thermal_slowdown",
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }


def test_another_process_on_the_gpu() -> None:
    a, b = _watch("shared")[0]
    assert a["other_processes_mib"] == 20480  # the max over samples (16 GiB, then 20 GiB)
    assert a["other_processes"] == [5321, 5400]  # 5400's memory is not reported (None): named, counted 0
    assert b["other_processes_mib"] == 0 and b["other_processes"] == []
    # without the server's pids every process is "other"
    fake = fakenvml.load("shared")
    watch = gpu.gpu_watch([1], (), interval_s=3600, nvml=fake)
    watch.start()
    watch.sample()
    [one] = watch.stop()
    assert one["index"] == 1 and one["other_processes"] == [4101] and one["other_processes_mib"] == 51200


def test_not_supported_fields_are_none_and_not_asked_again() -> None:
    [g], fake = _watch("not_supported")
    assert g["power_w"] is None and g["power_limit_w"] is None and g["energy_j"] is None
    assert g["ecc_uncorrected"] is None and g["xid_events"] is None
    assert g["sm_clock_mhz"] == 1695 and g["temperature_c"] == 72 and g["throttle_reasons"] == []
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1 and fake.calls["nvmlDeviceGetTotalEccErrors"] == 1
    assert fake.calls["nvmlEventSetWait_v2"] == 0


def test_ecc_error_and_xid_during_the_block() -> None:
    [g], _ = _watch("ecc_xid")
    assert g["ecc_uncorrected"] == 1 and g["xid_events"] == [94]
    assert g["throttled_thermal_power"] is False and g["throttle_reasons"] == ["gpu_idle"]


def test_a_block_shorter_than_the_interval_gets_one_reading() -> None:
    [g], fake = _watch("throttled", samples=0)
    assert g["samples"] == 1 and g["sm_clock_mhz"] == 1980 and g["throttled_thermal_power"] is False
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1


def test_the_sampler_thread_runs_and_stops() -> None:
    fake = fakenvml.load("throttled")
    watch = gpu.gpu_watch([0], SERVER, interval_s=0.01, nvml=fake)
    watch.start()
    deadline = time.monotonic() + 5
    while fake.calls["nvmlDeviceGetPowerUsage"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    [g] = watch.stop()
    assert not watch._thread.is_alive() and watch._thread.daemon
    assert g["samples"] >= 3 and g["throttled_thermal_power"] is True
    assert watch.stop() == [g]  # a second stop returns the same
    assert fake.inits == fake.shutdowns == 1


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_nvml_no_watch(code: int) -> None:
    fake = fakenvml.load("clean", init_error=code)
    assert gpu.gpu_watch(None, SERVER, nvml=fake) is None
    assert fake.calls["nvmlInit"] == 1 and fake.inits == 0


def test_no_pynvml_no_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "pynvml", None)
    assert gpu.gpu_watch(None, ()) is None
    monkeypatch.setenv("PATH", "/nonexistent")
    gpus, why = gpu.gpu_snapshot()
    assert gpus is None and "nvidia-ml-py" in why and "no nvidia-smi" in why


def test_a_gpu_that_is_not_there_is_left_out() -> None:
    fake = fakenvml.load("clean")
    watch = gpu.gpu_watch([1, 7], SERVER, interval_s=3600, nvml=fake)
    watch.start()
    assert [g["index"] for g in watch.stop()] == [1]


def test_unknown_reason_bits_are_kept() -> None:
    bits = gpu.reason_bits(pynvml)
    assert gpu.decode_reasons(0x4 | 0x8000, bits) == ["bit_0x8000", "sw_power_cap"]
    assert gpu.decode_reasons(0x1FF, bits) == sorted(name for _, name in gpu._REASONS[:9])
    assert gpu.decode_reasons(0, bits) == []


def test_the_fake_has_what_gpu_uses_and_pynvml_has_it_too() -> None:
    """Every NVML name gpu.py uses exists in the real module (no typo hides behind a default) and in the fake."""
    source = Path(gpu.__file__).read_text()
    names = set(re.findall(r"\b(nvml[A-Z]\w+|NVML_[A-Z_]+)\b", source))
    names -= {"NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason"}  # the reason constants' prefixes
    assert {"nvmlDeviceGetClockInfo", "NVML_CLOCK_SM", "nvmlEventSetWait_v2"} <= names
    fake = fakenvml.load("clean")
    for name in names:
        assert hasattr(pynvml, name), name
        assert hasattr(fake, name), name
    for suffix, _ in gpu._REASONS:
        assert hasattr(pynvml, f"nvmlClocksEventReason{suffix}") or hasattr(pynvml, f"nvmlClocksThrottleReason{suffix}")


def test_snapshot_through_nvml() -> None:
    fake = fakenvml.load("idle_mixed")
    gpus, why = gpu.gpu_snapshot(nvml=fake)
    assert why == "" and [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert fake.inits == fake.shutdowns == 1
    g0, g1, g2, g3 = gpus
    assert g0["sm_clock_mhz"] == 345 and g0["power_w"] == pytest.approx(75.312) and g0["temperature_c"] == 31
    assert g0["persistence_mode"] is True and g1["persistence_mode"] is False
    assert g2["power_limit_w"] == 500 and g2["power_limit_default_w"] == 700
    assert g3["throttle_reasons"] == ["gpu_idle", "hw_slowdown"] and g3["throttled_thermal_power"] is True
    assert g3["other_processes"] == [7777] and g3["other_processes_mib"] == 20480
    assert g0["samples"] == 1 and g0["xid_events"] is None and g0["source"] == "nvml"
    [only] = gpu.gpu_snapshot([3], server_pids={7777}, nvml=fakenvml.load("idle_mixed"))[0]
    assert only["index"] == 3 and only["other_processes"] == []


def _smi_gpu(**cells: str) -> dict[str, str]:
    base = {
        "uuid": "GPU-a0b1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c40",
        "name": "NVIDIA H200",
        "clocks.sm": "345",
        "clocks.mem": "3201",
        "clocks.max.sm": "1980",
        "power.draw": "75.31",
        "power.limit": "700.00",
        "power.default_limit": "700.00",
        "temperature.gpu": "31",
        "persistence_mode": "Enabled",
        "clocks_throttle_reasons.active": "0x0000000000000001",
    }
    return base | cells


def test_snapshot_falls_back_to_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hot = _smi_gpu(
        **{
            "clocks.sm": "1200",
            "power.draw": "[N/A]",
            "persistence_mode": "Disabled",
            "clocks_throttle_reasons.active": "0x0000000000000060",
        }
    )
    nvidia_smi.install(tmp_path / "bin", [_smi_gpu(), hot])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    no_nvml = fakenvml.load("clean", init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    gpus, why = gpu.gpu_snapshot(nvml=no_nvml)
    assert why == "" and [g["index"] for g in gpus] == [0, 1]
    a, b = gpus
    assert a["source"] == "nvidia-smi" and a["name"] == "NVIDIA H200" and a["samples"] == 1
    assert a["sm_clock_mhz"] == 345 and a["sm_clock_max_mhz"] == 1980 and a["mem_clock_mhz"] == 3201
    assert a["power_w"] == 75.31 and a["power_limit_w"] == 700 and a["power_limit_default_w"] == 700
    assert a["temperature_c"] == 31 and a["persistence_mode"] is True and a["throttle_reasons"] == ["gpu_idle"]
    assert a["other_processes"] is None and a["other_processes_mib"] is None and a["ecc_uncorrected"] is None
    assert b["power_w"] is None and b["persistence_mode"] is False and b["throttled_thermal_power"] is True
    assert b["throttle_reasons"] == ["hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert [g["index"] for g in gpu.gpu_snapshot([1], nvml=no_nvml)[0]] == [1]
    # an nvidia-smi that does not know a field: no snapshot, and why
    nvidia_smi.install(tmp_path / "bin", [nvidia_smi.H100])
    gpus, why = gpu.gpu_snapshot(nvml=no_nvml)
    assert gpus is None and "NVML Shared Library Not Found" in why and "nvidia-smi exited 2" in why


def test_snapshot_with_neither_nvml_nor_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu.shutil, "which", lambda name: None)
    gpus, why = gpu.gpu_snapshot(nvml=fakenvml.load("clean", init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert gpus is None and "NVML cannot be initialised" in why and "no nvidia-smi on PATH" in why
