"""Cells that heal themselves (specsweep.measure.heal): what counts as transient, when measuring stops, what is kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep.final import remeasure_command
from specsweep.measure.heal import (
    JUDGE_ENV,
    is_transient,
    judge_env,
    judge_settings,
    measure_until_valid,
    transient_only,
    transient_rounds,
    wait_for_quiet,
)

pytestmark = pytest.mark.unit

BUSY = "machine busy: other processes used 18% (±1%: clock ticks) of the measurement's CPUs > 10% (...)"
SHORT = "3 request(s) produced fewer output tokens than asked"


def test_transient_means_the_host_not_the_engine() -> None:
    assert is_transient(BUSY) and is_transient("repeat 2: client starved: it waited for a CPU 30% of the time")
    assert is_transient("client saturated: its own work used 95% of its CPU > 80% (...)")
    assert is_transient("client event-loop lag p99 9.00 ms is 7.00 ms above the host's idle 2.00 ms (...)")
    assert not is_transient("error rate 5.00% > 0.00% (http_500=2)")
    assert not is_transient(SHORT) and not is_transient("prefix-cache hit rate 40.0% > 5%: ...")
    assert not transient_only([]) and not transient_only([BUSY, SHORT]) and transient_only([BUSY, "repeat 1: " + BUSY])


def run(verdicts: list[list[str]], attempts: int) -> tuple[object, list[int], list[int]]:
    """measure_until_valid over scripted verdicts (reasons per attempt; [] = valid)."""
    measured, kept = [], []

    def once(n: int) -> int:
        measured.append(n)
        return n

    def keep(n: int, result: int) -> str:
        kept.append(result)
        return f"attempts/{n}"

    done = measure_until_valid(
        once, lambda n: {"valid": not verdicts[n - 1], "reasons": verdicts[n - 1]}, attempts, keep
    )
    return done, measured, kept


def test_a_busy_machine_is_measured_again_until_valid_and_every_attempt_is_kept() -> None:
    done, measured, kept = run([[BUSY], [BUSY], []], attempts=3)
    assert measured == [1, 2, 3] and kept == [1, 2] and done.result == 3 and done.counted == 3
    d = done.as_dict()
    assert d["why"] == "the first valid attempt" and d["made"] == 3
    assert [e["counts"] for e in d["log"]] == [False, False, True]
    assert d["log"][0] == {"attempt": 1, "valid": False, "reasons": [BUSY], "counts": False, "kept_at": "attempts/1"}


def test_a_cause_that_measuring_again_does_not_clear_stops_at_once() -> None:
    done, measured, kept = run([[BUSY, SHORT], []], attempts=3)
    assert measured == [1] and kept == [] and done.counted == 1
    assert "not the host's doing" in done.as_dict()["why"]


def test_attempts_end_at_the_configured_number() -> None:
    done, measured, kept = run([[BUSY]] * 5, attempts=2)
    assert measured == [1, 2] and kept == [1] and done.counted == 2
    assert done.as_dict()["why"] == "still invalid for a transient cause after the last attempt allowed"
    done, measured, _ = run([[]], attempts=1)
    assert measured == [1] and done.as_dict()["why"] == "valid at the first attempt"
    with pytest.raises(ValueError, match="cell_attempts"):
        run([[]], attempts=0)


DRIFT = "[baseline] drift: steady throughput +58% over the level ..."


def test_drift_is_not_a_cause_to_measure_again() -> None:
    """The drift gate flags (`gates.block_drift_gate`): a drift text among the reasons is not the host's transient
    doing that another attempt clears, and a level is never measured again for it."""
    assert not is_transient(DRIFT) and not transient_only([DRIFT, BUSY]) and transient_only([BUSY])
    done, measured, _ = run([[DRIFT], []], attempts=3)
    assert measured == [1] and done.counted == 1


def test_the_workflow_hands_gates_and_attempts_to_the_cell_jobs() -> None:
    env = {JUDGE_ENV: judge_env({"gates": {"max_client_cpu_share": 0.5}, "cell_attempts": 4})}
    assert judge_settings(env) == ({"max_client_cpu_share": 0.5}, 4)
    assert judge_settings({}) == (None, 1)  # a cell run by hand: measured once
    with pytest.raises(ValueError, match=JUDGE_ENV):
        judge_settings({JUDGE_ENV: json.dumps({"gates": {}})})


def test_remeasure_command_names_each_cell_and_the_configfile() -> None:
    paths = [Path("results/demo/sim/eagle3/c1/summary.json"), Path("results/demo/sim/baseline/c70/summary.json")]
    assert remeasure_command(paths, ["my config.yaml"]) == (
        "snakemake --cores 1 crossover --configfile 'my config.yaml' --forcerun "
        "results/demo/sim/eagle3/c1/summary.json results/demo/sim/baseline/c70/summary.json"
    )


def test_a_retry_waits_first_and_the_wait_is_logged() -> None:
    waits: list[int] = []

    def quiet(n: int) -> dict:
        waits.append(n)
        return {"waited_s": 2.0, "busy_share": 0.03, "quiet": True}

    verdicts = [[BUSY], []]
    done = measure_until_valid(
        lambda n: n, lambda n: {"valid": not verdicts[n - 1], "reasons": verdicts[n - 1]}, 3, None, quiet
    )
    assert waits == [2] and done.counted == 2  # no wait before the first attempt
    assert "before" not in done.log[0] and done.log[1]["before"]["quiet"] is True
    saturated = ["client saturated: its own work used 95% of its CPU > 80% (...)"]
    verdicts = [saturated, []]
    waits.clear()
    measure_until_valid(
        lambda n: n, lambda n: {"valid": not verdicts[n - 1], "reasons": verdicts[n - 1]}, 3, None, quiet
    )
    assert waits == []  # the client's own load: waiting for quiet CPUs would not help


def test_wait_for_quiet_returns_what_it_saw() -> None:
    seen = wait_for_quiet(None, max_share=1.0, timeout_s=5.0, window_s=0.1)  # any machine is under 100% busy
    assert seen["quiet"] and 0.0 <= seen["busy_share"] <= 1.0 and seen["waited_s"] < 1.0
    seen = wait_for_quiet((0,), max_share=-1.0, timeout_s=0.2, window_s=0.1)  # never quiet enough: gives up
    assert not seen["quiet"] and seen["waited_s"] >= 0.2


def test_an_interleaved_level_measures_again_only_the_rounds_the_host_spoiled() -> None:
    """The rounds a transient reason names (an interleaved level's reasons start with [arm] and name their
    round); None where a cause is not the host's or names no round: the whole level is measured again."""
    assert transient_rounds([f"[eagle3] repeat 3: {BUSY}", f"[baseline] repeat 1: {BUSY}"]) == (1, 3)
    assert transient_rounds([f"[eagle3] repeat 3: {BUSY}", f"[eagle3] repeat 3: {BUSY}"]) == (3,)
    assert transient_rounds([f"[eagle3] {BUSY}"]) is None  # a one-round level names no round
    assert transient_rounds([f"[eagle3] repeat 2: {BUSY}", f"[eagle3] repeat 1: {SHORT}"]) is None
    assert transient_rounds([]) is None


def test_the_attempt_log_names_the_rounds_measured_again() -> None:
    verdicts = [
        {"valid": False, "reasons": [f"[a] repeat 1: {BUSY}"]},
        {"valid": True, "reasons": [], "rounds_measured": [1]},
    ]
    done = measure_until_valid(lambda n: n, lambda n: verdicts[n - 1], 2)
    log = done.as_dict()["log"]
    assert "rounds_measured" not in log[0] and log[1]["rounds_measured"] == [1]
