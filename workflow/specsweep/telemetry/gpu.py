"""The GPUs' clocks, power, temperature, throttle reasons, foreign processes, ECC errors and XID events, read
through NVML (`pynvml`, the nvidia-ml-py package): per block by `GpuWatch` (a daemon thread in the load
generator's process), once by `gpu_snapshot` for `specsweep preflight`.

Why: a block measured on a GPU slowed by heat or power, or sharing it with another process, measures the GPU's
state, not the arm. Nothing here judges; `specsweep.measure.gates` does (docs/metrics.md, "Serving side"). Where NVML is
missing the entry points return None and say why; a reading a GPU does not expose is None, never an error.
GPU indices are NVML's (the order `nvidia-smi` lists them in).
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import threading
from collections.abc import Collection, Sequence
from typing import Any

try:
    import pynvml
except ImportError:  # a dependency (pyproject.toml); without it every entry point says so
    pynvml = None

# Throttle reasons that mean heat or power slowed the GPU below the clock it would run at. Not sw_power_cap: a
# GPU held at its power cap under full load is a normal operating point (its clock is what that load gets at
# that limit); it is still recorded in `throttle_reasons`, and a lowered limit shows in `power_limit_w`.
THERMAL_POWER_REASONS: frozenset[str] = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)
# NVML's reason constants (nvmlClocksEventReason<Suffix>, before driver 535 nvmlClocksThrottleReason<Suffix>):
# their bits are taken from the module at hand, so the names follow the real bitmask.
_REASONS = (
    ("GpuIdle", "gpu_idle"),
    ("ApplicationsClocksSetting", "applications_clocks_setting"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal_slowdown"),
    ("HwThermalSlowdown", "hw_thermal_slowdown"),
    ("HwPowerBrakeSlowdown", "hw_power_brake_slowdown"),
    ("DisplayClockSetting", "display_clock_setting"),
    ("BoardLimit", "board_limit"),
    ("Reliability", "reliability"),
)
_REASON_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
MIB = 1024 * 1024
EVENTS_PER_POLL = 32  # XID events drained per GPU per sample, at most (a storm must not stall the sampler)
SMI_TIMEOUT_S = 5.0
SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "power.draw",
    "power.limit",
    "power.default_limit",
    "temperature.gpu",
    "persistence_mode",
    "clocks_throttle_reasons.active",
)
KEYS = (
    "index",
    "uuid",
    "name",
    "source",
    "samples",
    "sm_clock_mhz",
    "sm_clock_min_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "power_w",
    "power_limit_w",
    "temperature_c",
    "throttle_reasons",
    "throttled_thermal_power",
    "other_processes_mib",
    "other_processes",
    "ecc_uncorrected",
    "xid_events",
    "energy_j",
)


def _const(nvml: Any, name: str, default: int) -> int:
    value = getattr(nvml, name, default)
    return value if isinstance(value, int) else default


def reason_bits(nvml: Any) -> list[tuple[int, str]]:
    """(bit, name) of every throttle reason the module defines (a bit named twice keeps its first name)."""
    bits: dict[int, str] = {}
    for suffix, name in _REASONS:
        for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
            bit = getattr(nvml, prefix + suffix, None)
            if isinstance(bit, int) and bit and bit not in bits:
                bits[bit] = name
                break
    return sorted(bits.items())


def decode_reasons(mask: int, bits: list[tuple[int, str]]) -> list[str]:
    """The names of the bits set in a reasons bitmask; a bit the module does not name as `bit_0x...`."""
    names = [name for bit, name in bits if mask & bit]
    rest = mask & ~sum(bit for bit, _ in bits)
    while rest:
        low = rest & -rest
        names.append(f"bit_0x{low:x}")
        rest &= ~low
    return sorted(names)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _init(nvml: Any) -> tuple[Any, str]:
    """The module with NVML initialised, or None and why not."""
    if nvml is None:
        return None, "the nvidia-ml-py package (pynvml) is not installed"
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as e:
        return None, f"NVML cannot be initialised ({e})"
    return nvml, ""


def _shutdown(nvml: Any) -> None:
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


def _open(nvml: Any, indices: Sequence[int] | None) -> list[tuple[int, Any]] | None:
    """(index, handle) of each GPU asked for that NVML can open; None when NVML cannot count them."""
    try:
        wanted = list(indices) if indices is not None else list(range(nvml.nvmlDeviceGetCount()))
    except nvml.NVMLError:
        return None
    devices = []
    for i in wanted:
        try:
            devices.append((int(i), nvml.nvmlDeviceGetHandleByIndex(int(i))))
        except nvml.NVMLError:
            continue  # not there (preflight's GPU check names it); nothing to read
    return devices


class _Device:
    """One GPU's handle and its NVML calls; a call NVML answers not supported is not made again."""

    def __init__(self, nvml: Any, index: int, handle: Any) -> None:
        self.nvml, self.index, self.handle = nvml, index, handle
        self.unsupported: set[str] = set()
        self._skip = (
            _const(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
            _const(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
        )

    def read(self, fn: str, *args: Any) -> Any:
        key = f"{fn}{args}"
        call = getattr(self.nvml, fn, None)
        if key in self.unsupported or call is None:
            return None
        try:
            return call(self.handle, *args)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) in self._skip:
                self.unsupported.add(key)
            return None

    def reasons(self) -> int | None:
        for fn in _REASON_CALLS:  # the newer name first; an older driver lacks its function
            if f"{fn}()" in self.unsupported or getattr(self.nvml, fn, None) is None:
                continue
            mask = self.read(fn)
            if mask is not None or f"{fn}()" not in self.unsupported:
                return mask
        return None

    def processes(self, server_pids: Collection[int]) -> tuple[float, list[int]] | None:
        """MiB held by compute processes not in `server_pids`, and their pids (usedGpuMemory None counts 0)."""
        procs = self.read("nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return None
        other = [p for p in procs if int(p.pid) not in server_pids]
        return sum(int(p.usedGpuMemory or 0) for p in other) / MIB, sorted({int(p.pid) for p in other})

    def ecc(self) -> int | None:
        nvml = self.nvml
        kind = _const(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        return self.read("nvmlDeviceGetTotalEccErrors", kind, _const(nvml, "NVML_VOLATILE_ECC", 0))

    def watts(self, fn: str) -> float | None:
        mw = self.read(fn)
        return None if mw is None else mw / 1000.0

    def identity(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": _text(self.read("nvmlDeviceGetUUID")),
            "name": _text(self.read("nvmlDeviceGetName")),
            "source": "nvml",
        }


class _Series:
    """One GPU's readings over a block."""

    def __init__(self, device: _Device) -> None:
        self.device = device
        self.samples = 0
        self.sm: list[int] = []
        self.mem: list[int] = []
        self.power_mw: list[int] = []
        self.temp: list[int] = []
        self.reasons: int | None = None  # OR of every sample's bitmask
        self.other_mib: float | None = None
        self.other_pids: set[int] = set()
        self.ecc0: int | None = None
        self.energy0: int | None = None
        self.events: Any = None  # NVML event set for XID errors; None where events are not supported
        self.xids: list[int] | None = None
        self.fixed: dict[str, Any] = {}


class GpuWatch:
    """Samples the given GPUs during one block."""

    def __init__(self, nvml: Any, devices: list[tuple[int, Any]], server_pids: Collection[int], interval_s: float):
        self.nvml = nvml
        self.interval_s = interval_s
        self.server_pids = frozenset(int(p) for p in server_pids)
        self._gpus = [_Series(_Device(nvml, i, h)) for i, h in devices]
        self._bits = reason_bits(nvml)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: list[dict] | None = None

    def start(self) -> None:
        """Baseline readings (identity, limits, ECC and energy counters, XID event sets), then the sampler."""
        for g in self._gpus:
            d = g.device
            g.fixed = d.identity() | {
                "sm_clock_max_mhz": d.read("nvmlDeviceGetMaxClockInfo", _const(self.nvml, "NVML_CLOCK_SM", 1)),
                "power_limit_w": d.watts("nvmlDeviceGetEnforcedPowerLimit"),
            }
            g.ecc0 = d.ecc()
            g.energy0 = d.read("nvmlDeviceGetTotalEnergyConsumption")
            g.events, g.xids = self._event_set(d)
        self._thread = threading.Thread(target=self._run, name="specsweep-gpu-watch", daemon=True)
        self._thread.start()

    def _event_set(self, d: _Device) -> tuple[Any, list[int] | None]:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return None, None
        try:
            nvml.nvmlDeviceRegisterEvents(d.handle, _const(nvml, "nvmlEventTypeXidCriticalError", 8), events)
        except nvml.NVMLError:
            self._free(events)
            return None, None
        return events, []

    def _free(self, events: Any) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlEventSetFree(events)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """One reading of every GPU: a short NVML call per field (the sampler thread calls it each interval)."""
        nvml = self.nvml
        sm_id, mem_id = _const(nvml, "NVML_CLOCK_SM", 1), _const(nvml, "NVML_CLOCK_MEM", 2)
        temp_id = _const(nvml, "NVML_TEMPERATURE_GPU", 0)
        with self._lock:
            for g in self._gpus:
                d = g.device
                g.samples += 1
                for series, value in (
                    (g.sm, d.read("nvmlDeviceGetClockInfo", sm_id)),
                    (g.mem, d.read("nvmlDeviceGetClockInfo", mem_id)),
                    (g.power_mw, d.read("nvmlDeviceGetPowerUsage")),
                    (g.temp, d.read("nvmlDeviceGetTemperature", temp_id)),
                ):
                    if value is not None:
                        series.append(int(value))
                mask = d.reasons()
                if mask is not None:
                    g.reasons = (g.reasons or 0) | int(mask)
                procs = d.processes(self.server_pids)
                if procs is not None:
                    g.other_mib = max(g.other_mib or 0.0, procs[0])
                    g.other_pids.update(procs[1])
                self._poll_events(g)

    def _poll_events(self, g: _Series) -> None:
        if g.events is None or g.xids is None:
            return
        nvml = self.nvml
        xid = _const(nvml, "nvmlEventTypeXidCriticalError", 8)
        for _ in range(EVENTS_PER_POLL):
            try:
                data = nvml.nvmlEventSetWait_v2(g.events, 0)
            except nvml.NVMLError:
                return  # timed out: nothing pending (or the set is gone)
            if int(data.eventType) & xid:
                g.xids.append(int(data.eventData))

    def stop(self) -> list[dict]:
        """Stops the sampler; one JSON-able dict per GPU (docs/metrics.md, "Serving side"). A second call returns
        the same."""
        if self._result is not None:
            return self._result
        self._stop.set()
        stuck = False
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 4 * self.interval_s))
            stuck = self._thread.is_alive()  # inside an NVML call that hangs: leave NVML to it
        if not stuck:
            if not any(g.samples for g in self._gpus):
                self.sample()  # a block shorter than the interval still gets one reading
            with self._lock:
                for g in self._gpus:
                    self._poll_events(g)
        self._result = [self._summary(g, final=not stuck) for g in self._gpus]
        if not stuck:
            for g in self._gpus:
                if g.events is not None:
                    self._free(g.events)
            _shutdown(self.nvml)
        return self._result

    def _summary(self, g: _Series, final: bool) -> dict[str, Any]:
        d = g.device
        ecc1 = d.ecc() if final and g.ecc0 is not None else None
        energy1 = d.read("nvmlDeviceGetTotalEnergyConsumption") if final and g.energy0 is not None else None
        fixed = g.fixed or d.identity()
        reasons = None if g.reasons is None else decode_reasons(g.reasons, self._bits)
        return {
            "index": d.index,
            "uuid": fixed.get("uuid"),
            "name": fixed.get("name"),
            "source": "nvml",
            "samples": g.samples,
            "sm_clock_mhz": statistics.median(g.sm) if g.sm else None,
            "sm_clock_min_mhz": min(g.sm) if g.sm else None,
            "sm_clock_max_mhz": fixed.get("sm_clock_max_mhz"),
            "mem_clock_mhz": statistics.median(g.mem) if g.mem else None,
            "power_w": round(statistics.fmean(g.power_mw) / 1000.0, 3) if g.power_mw else None,
            "power_limit_w": fixed.get("power_limit_w"),
            "temperature_c": max(g.temp) if g.temp else None,
            "throttle_reasons": reasons,
            "throttled_thermal_power": None if reasons is None else bool(THERMAL_POWER_REASONS.intersection(reasons)),
            "other_processes_mib": None if g.other_mib is None else round(g.other_mib, 1),
            "other_processes": sorted(g.other_pids) if g.other_mib is not None else None,
            "ecc_uncorrected": None if ecc1 is None or g.ecc0 is None else int(ecc1) - int(g.ecc0),
            "xid_events": list(g.xids) if g.xids is not None else None,
            "energy_j": None if energy1 is None or g.energy0 is None else (int(energy1) - int(g.energy0)) / 1000.0,
        }


def gpu_watch(
    indices: Sequence[int] | None, server_pids: Collection[int], interval_s: float = 0.5, nvml: Any = None
) -> GpuWatch | None:
    """A watch over `indices` (None: every GPU NVML sees), not started; None where NVML cannot be initialised.
    `server_pids`: the server's processes (their GPU memory is not "other"). `nvml`: the module (tests: a fake)."""
    nv, _why = _init(nvml if nvml is not None else pynvml)
    if nv is None:
        return None
    devices = _open(nv, indices)
    if devices is None:
        _shutdown(nv)
        return None
    return GpuWatch(nv, devices, server_pids, interval_s)


def gpu_snapshot(
    indices: Sequence[int] | None = None, server_pids: Collection[int] = (), nvml: Any = None
) -> tuple[list[dict] | None, str]:
    """One reading per GPU now (preflight): the watch's keys (samples 1; `ecc_uncorrected` the volatile count
    since the driver loaded, `xid_events` None) plus `persistence_mode` and `power_limit_default_w`. Without
    NVML, what `nvidia-smi --query-gpu` gives (`source` "nvidia-smi"); (None, why) without either."""
    module = nvml if nvml is not None else pynvml
    nv, why = _init(module)
    if nv is None:
        return _smi_snapshot(indices, why, module)
    try:
        devices = _open(nv, indices)
        if devices is None:
            return None, "NVML cannot count the GPUs"
        bits = reason_bits(nv)
        pids = frozenset(int(p) for p in server_pids)
        return [_read_now(_Device(nv, i, h), bits, pids) for i, h in devices], ""
    finally:
        _shutdown(nv)


def _read_now(d: _Device, bits: list[tuple[int, str]], server_pids: frozenset[int]) -> dict[str, Any]:
    nvml = d.nvml
    sm = d.read("nvmlDeviceGetClockInfo", _const(nvml, "NVML_CLOCK_SM", 1))
    mask = d.reasons()
    reasons = None if mask is None else decode_reasons(int(mask), bits)
    procs = d.processes(server_pids)
    persistence = d.read("nvmlDeviceGetPersistenceMode")
    return d.identity() | {
        "samples": 1,
        "sm_clock_mhz": sm,
        "sm_clock_min_mhz": sm,
        "sm_clock_max_mhz": d.read("nvmlDeviceGetMaxClockInfo", _const(nvml, "NVML_CLOCK_SM", 1)),
        "mem_clock_mhz": d.read("nvmlDeviceGetClockInfo", _const(nvml, "NVML_CLOCK_MEM", 2)),
        "power_w": d.watts("nvmlDeviceGetPowerUsage"),
        "power_limit_w": d.watts("nvmlDeviceGetEnforcedPowerLimit"),
        "temperature_c": d.read("nvmlDeviceGetTemperature", _const(nvml, "NVML_TEMPERATURE_GPU", 0)),
        "throttle_reasons": reasons,
        "throttled_thermal_power": None if reasons is None else bool(THERMAL_POWER_REASONS.intersection(reasons)),
        "other_processes_mib": None if procs is None else round(procs[0], 1),
        "other_processes": None if procs is None else procs[1],
        "ecc_uncorrected": d.ecc(),
        "xid_events": None,
        "energy_j": None,
        "persistence_mode": None if persistence is None else persistence == _const(nvml, "NVML_FEATURE_ENABLED", 1),
        "power_limit_default_w": d.watts("nvmlDeviceGetPowerManagementDefaultLimit"),
    }


def _smi_number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None  # [N/A], [Not Supported], [Unknown Error]


def query_smi(fields: Sequence[str], timeout: float = SMI_TIMEOUT_S) -> tuple[list[dict[str, str]] | None, str]:
    """`nvidia-smi --query-gpu=<fields>`, one dict per GPU (None and why when it cannot be asked): the one place
    nvidia-smi is asked, by preflight's GPU checks and by the snapshot where NVML is missing."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "no nvidia-smi on PATH (no NVIDIA driver on this machine)"
    cmd = [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi failed: {e}"
    if proc.returncode != 0:
        return None, f"nvidia-smi exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[:300]}"
    rows = []
    for row in proc.stdout.strip().splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) == len(fields):
            rows.append(dict(zip(fields, cells, strict=True)))
    return rows, ""


def _smi_snapshot(indices: Sequence[int] | None, nvml_why: str, module: Any) -> tuple[list[dict] | None, str]:
    rows, why = query_smi(SMI_FIELDS)
    if rows is None:
        return None, f"{nvml_why}, and {why}"
    bits = reason_bits(module) if module is not None else []
    wanted = None if indices is None else {int(i) for i in indices}
    gpus = []
    for cell in rows:
        index = _smi_number(cell["index"])
        if index is None or (wanted is not None and int(index) not in wanted):
            continue
        try:
            mask: int | None = int(cell["clocks_throttle_reasons.active"], 16)
        except ValueError:
            mask = None
        reasons = None if mask is None else decode_reasons(mask, bits)
        sm = _smi_number(cell["clocks.sm"])
        mode = cell["persistence_mode"].lower()
        gpus.append(
            dict.fromkeys(KEYS)
            | {
                "index": int(index),
                "uuid": cell["uuid"] or None,
                "name": cell["name"] or None,
                "source": "nvidia-smi",
                "samples": 1,
                "sm_clock_mhz": sm,
                "sm_clock_min_mhz": sm,
                "sm_clock_max_mhz": _smi_number(cell["clocks.max.sm"]),
                "mem_clock_mhz": _smi_number(cell["clocks.mem"]),
                "power_w": _smi_number(cell["power.draw"]),
                "power_limit_w": _smi_number(cell["power.limit"]),
                "temperature_c": _smi_number(cell["temperature.gpu"]),
                "throttle_reasons": reasons,
                "throttled_thermal_power": None
                if reasons is None
                else bool(THERMAL_POWER_REASONS.intersection(reasons)),
                "persistence_mode": True if mode == "enabled" else False if mode == "disabled" else None,
                "power_limit_default_w": _smi_number(cell["power.default_limit"]),
            }
        )
    return gpus, ""
