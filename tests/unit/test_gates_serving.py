"""The serving-side gate (specsweep.measure.gates.server_state_gate): a block served by a slower machine than the
arm's other blocks at the level is re-measured (a transient reason, `heal`), a server throttled alike in every
block is one operating point (flagged), and a figure that is missing is said to be, never read as a number."""

from __future__ import annotations

from typing import Any

import pytest

from specsweep.config import defaults
from specsweep.measure.gates import server_state_gate
from specsweep.measure.heal import is_transient

pytestmark = pytest.mark.unit

GATES = defaults("gates")


def cpu(granted: float | None, throttled: float | None = 0.0, used: float = 1.0) -> dict[str, Any]:
    """A block's CPU figures: `used` cores, and the wait that `granted` implies (got / (got + waited))."""
    wait = None if granted is None else used * (1 / granted - 1)
    return {
        "granted_share": granted,
        "wait_cores": wait,
        "cpu_cores": used,
        "allowed_cores": 1.0,
        "cgroup_throttled_share": throttled,
    }


def gpu(index: int, mhz: float | None, reasons: tuple[str, ...] = (), other_mib: float = 0.0) -> dict[str, Any]:
    thermal = bool({"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"} & set(reasons))
    return {
        "index": index,
        "sm_clock_mhz": mhz,
        "throttle_reasons": list(reasons),
        "throttled_thermal_power": thermal,
        "other_processes_mib": other_mib,
    }


def level(states: list[dict[str, Any] | None], instances: list[int] | None = None) -> dict[str, Any]:
    blocks = [
        {"arm": "a", "repeat": r, **({"instance": instances[r]} if instances else {})} for r in range(len(states))
    ]
    return {
        "repeats": [{"repeat": r, "metrics": {}, "server_state": st} for r, st in enumerate(states)],
        "pairing": {"mode": "interleaved", "blocks": blocks},
    }


def served(c: dict[str, Any] | None, gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"cpu": c, "gpus_watched": gpus is not None, "gpus": gpus}


def test_a_block_whose_server_got_less_of_its_cpus_is_remeasured() -> None:
    reasons, _ = server_state_gate(level([served(cpu(0.97)), served(cpu(0.51, 0.45)), served(cpu(0.98))]), GATES)
    assert len(reasons) == 1 and reasons[0].startswith("repeat 1: server slowed: its threads got 51%")
    assert "47% below the arm's median 97%" in reasons[0] and "throttled it 45%" in reasons[0]
    assert is_transient(f"[ngram-k1] {reasons[0]}")  # measured again like the host's transient causes


def test_blocks_alike_pass_and_a_quota_that_binds_everywhere_is_flagged() -> None:
    reasons, flags = server_state_gate(level([served(cpu(0.50, 0.5)) for _ in range(3)]), GATES)
    assert reasons == []
    assert any("cgroup CPU quota throttled it in repeat(s) [0, 1, 2]" in f for f in flags)
    reasons, flags = server_state_gate(level([served(cpu(0.95)), served(cpu(0.9)), served(cpu(0.97))]), GATES)
    assert reasons == [] and flags == []  # 0.90 is 5% below the median: within max_server_slowdown


def test_a_server_that_barely_uses_its_cpus_is_not_slowed_by_a_few_ms_of_waiting() -> None:
    """The simulated engine at 0.15 of a core in 0.2 s blocks: 0.90 granted against 0.997 is 17 ms of waiting per
    second, not a slower machine (measured: the default run re-measured three levels for it before this rule)."""
    states = [served(cpu(g, used=0.15)) for g in (0.997, 0.901, 0.999)]
    assert server_state_gate(level(states), GATES) == ([], [])
    states = [served(cpu(g, used=0.6)) for g in (0.99, 0.5, 0.99)]  # 0.6 s of waiting per second: slowed
    assert len(server_state_gate(level(states), GATES)[0]) == 1


def test_each_instance_is_its_own_reference() -> None:
    """Two server instances may run at different CPU shares (another socket, another host): each block is judged
    against its own instance's blocks."""
    states = [served(cpu(g)) for g in (0.95, 0.60, 0.96, 0.61)]
    assert server_state_gate(level(states, [1, 2, 1, 2]), GATES)[0] == []
    assert len(server_state_gate(level(states), GATES)[0]) == 2  # one instance: the 0.6 blocks are slowed


def test_gpu_clock_drop_and_thermal_throttle_are_slowed_blocks() -> None:
    states = [
        served(cpu(0.99), [gpu(0, 1980), gpu(1, 1980)]),
        served(cpu(0.99), [gpu(0, 1980), gpu(1, 1500, ("hw_thermal_slowdown", "sw_thermal_slowdown"))]),
        served(cpu(0.99), [gpu(0, 1965, ("sw_power_cap",), other_mib=20480), gpu(1, 1975)]),
    ]
    reasons, flags = server_state_gate(level(states), GATES)
    assert reasons == [
        "repeat 1: server slowed: GPU 1 SM clock 1500 MHz, 24% below the arm's median 1975 MHz at this level "
        "(> 10%); re-measure it",
        "repeat 1: server slowed: GPU 1 throttled (hw_thermal_slowdown, sw_thermal_slowdown); re-measure it",
    ]
    assert any("GPU 0: other processes held 20480 MiB" in f for f in flags)  # a power cap alone is no slowdown


def test_missing_figures_are_said_not_judged() -> None:
    _, flags = server_state_gate(level([None, None]), GATES)
    assert flags and flags[0].startswith("serving side not watched")
    _, flags = server_state_gate(level([served(cpu(None)), served(cpu(None))]), GATES)
    assert any(f.startswith("server CPU share not judged") for f in flags)
    _, flags = server_state_gate(level([served(cpu(0.9), []) | {"gpus": None}, served(cpu(0.9), [])]), GATES)
    assert any(f.startswith("GPU state not judged: NVML unavailable") for f in flags)
    assert server_state_gate(level([served(cpu(0.2))]), GATES) == ([], [])  # one block: nothing to compare
