"""A stand-in for the `pynvml` module on machines without NVIDIA GPUs, driven by a recorded payload
(tests/support/nvml_payloads, format in its README.md): the NVML calls `specsweep.telemetry.gpu` makes, each
returning that GPU's next recorded reading. Constants and `NVMLError` are the real module's, so reason bitmasks
and error classes are the real ones; a field recorded as null raises NVML_ERROR_NOT_SUPPORTED as NVML does."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

PAYLOADS = Path(__file__).resolve().parent / "nvml_payloads"

# The constants gpu.py reads (tests/unit/test_telemetry_gpu.py checks the list against gpu.py's source).
CONSTANTS = (
    "NVML_CLOCK_SM",
    "NVML_CLOCK_MEM",
    "NVML_TEMPERATURE_GPU",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_VOLATILE_ECC",
    "NVML_FEATURE_ENABLED",
    "nvmlEventTypeXidCriticalError",
    *(n for n in dir(pynvml) if n.startswith(("nvmlClocksEventReason", "nvmlClocksThrottleReason"))),
)


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class _EventSet:
    def __init__(self) -> None:
        self.gpus: list[int] = []
        self.pending: list[tuple[int, int]] = []  # (gpu index, xid)
        self.loaded = False
        self.freed = False


class FakeNvml:
    """`pynvml` answering from a payload. `init_error`: the NVML error code nvmlInit raises (e.g.
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND). `legacy_reasons`: a driver before 535, without
    nvmlDeviceGetCurrentClocksEventReasons (pynvml raises NVML_ERROR_FUNCTION_NOT_FOUND)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, payload: dict[str, Any], init_error: int | None = None, legacy_reasons: bool = False):
        for name in CONSTANTS:
            setattr(self, name, getattr(pynvml, name))
        self.gpus: list[dict[str, Any]] = payload["gpus"]
        self.init_error = init_error
        self.legacy_reasons = legacy_reasons
        self.inits = 0
        self.shutdowns = 0
        self.calls: Counter[str] = Counter()
        self.event_sets: list[_EventSet] = []
        self._cursor: Counter[tuple[int, str]] = Counter()

    @classmethod
    def load(cls, name: str, **kwargs: Any) -> FakeNvml:
        """The fake for tests/support/nvml_payloads/<name>.json."""
        return cls(json.loads((PAYLOADS / f"{name}.json").read_text()), **kwargs)

    # -- the payload ----------------------------------------------------------------------------------------
    def _gpu(self, handle: _Handle) -> dict[str, Any]:
        return self.gpus[handle.index]

    def _fixed(self, handle: _Handle, key: str) -> Any:
        value = self._gpu(handle)[key]
        if value is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _next(self, handle: _Handle, key: str) -> Any:
        """The next recorded reading of `key` (the last one again once they run out)."""
        readings = self._gpu(handle)["readings"][key]
        if readings is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        n = self._cursor[(handle.index, key)]
        self._cursor[(handle.index, key)] += 1
        return readings[min(n, len(readings) - 1)]

    def _count(self, name: str) -> None:
        self.calls[name] += 1

    # -- library --------------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise _error(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        if self.shutdowns >= self.inits:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._count("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # -- identity and limits --------------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._count("nvmlDeviceGetName")
        return self._fixed(handle, "name")

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._count("nvmlDeviceGetUUID")
        return self._fixed(handle, "uuid")

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, clock: int) -> int:
        self._count("nvmlDeviceGetMaxClockInfo")
        if clock != pynvml.NVML_CLOCK_SM:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # not recorded
        return self._fixed(handle, "max_sm_clock_mhz")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetEnforcedPowerLimit")
        return self._fixed(handle, "power_limit_mw")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetPowerManagementDefaultLimit")
        return self._fixed(handle, "default_power_limit_mw")

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetPersistenceMode")
        return self._fixed(handle, "persistence_mode")

    # -- readings -------------------------------------------------------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock: int) -> int:
        self._count("nvmlDeviceGetClockInfo")
        key = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "mem_clock_mhz"}.get(clock)
        if key is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._next(handle, key)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetPowerUsage")
        return self._next(handle, "power_mw")

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self._count("nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._next(handle, "temperature_c")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetCurrentClocksEventReasons")
        if self.legacy_reasons:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._next(handle, "clocks_event_reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetCurrentClocksThrottleReasons")
        return self._next(handle, "clocks_event_reasons")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        self._count("nvmlDeviceGetComputeRunningProcesses")
        procs = self._next(handle, "compute_processes")
        return [
            SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_gpu_memory"], gpuInstanceId=0xFFFFFFFF) for p in procs
        ]

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        self._count("nvmlDeviceGetTotalEccErrors")
        if (error_type, counter_type) != (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only the volatile uncorrected count is recorded
        return self._next(handle, "ecc_uncorrected_volatile")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetTotalEnergyConsumption")
        return self._next(handle, "energy_mj")

    # -- events ---------------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> _EventSet:
        self._count("nvmlEventSetCreate")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: _EventSet) -> None:
        self._count("nvmlDeviceRegisterEvents")
        if self._gpu(handle)["readings"]["xid_events"] is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if types & ~pynvml.nvmlEventTypeXidCriticalError:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only XID events are recorded
        event_set.gpus.append(handle.index)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        """Each poll (waits until one times out) delivers one recorded reading: the XIDs pending then."""
        self._count("nvmlEventSetWait_v2")
        if event_set.freed:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not event_set.loaded:
            event_set.loaded = True
            for i in event_set.gpus:
                event_set.pending += [(i, xid) for xid in self._next(_Handle(i), "xid_events")]
        if not event_set.pending:
            event_set.loaded = False
            raise _error(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = event_set.pending.pop(0)
        return SimpleNamespace(
            device=_Handle(index), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid, gpuInstanceId=0
        )

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._count("nvmlEventSetFree")
        event_set.freed = True


def load(name: str, **kwargs: Any) -> FakeNvml:
    """FakeNvml.load: the fake for tests/support/nvml_payloads/<name>.json."""
    return FakeNvml.load(name, **kwargs)
