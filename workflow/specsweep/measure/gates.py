"""Validity gates and SLOs: a measured summary judged, the one place validity is decided (docs/metrics.md).

Why apart from `specsweep.measure.metrics`: the metrics say what was measured and are stored; the judgement is made
whenever a cell is read (`summary.read_judged`), so a changed gate or SLO re-judges finished cells without
measuring them again. Pure like the metrics: no clocks, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from specsweep.measure.heal import SLOWED_PREFIX
from specsweep.measure.metrics import goodput_rps, measure_summary, send_lag, stats

# A repeat whose chunks were kernel-stamped in at least this share of reads: loop lag cannot move its stamps.
KERNEL_STAMPED = 0.99


def _stored_window(metrics: Mapping[str, Any]) -> tuple[float, float]:
    """The steady window a repeat was measured with (its summary's), NaN where it had none: the one window its
    throughput, goodput and the analysis's blocks use."""
    w = metrics.get("steady_window") or {}
    start, end = w.get("start_s"), w.get("end_s")
    return (math.nan, math.nan) if start is None or end is None else (float(start), float(end))


def output_length_reasons(df: pd.DataFrame, stop: str) -> list[str]:
    """Answers of the wrong length: under a fixed stop (ignore_eos) any short of its asked length; under a
    natural one any past its cap (the server ignored it), a shorter one being an answer that ended."""
    short = int((df["error_kind"] == "short_output").sum())
    if stop == "natural":
        long = int(((df["output_tokens"] > df["expected_output_tokens"]) & df["ok"]).sum())
        reasons = (
            [f"{long} request(s) produced more output tokens than their cap: the server ignored it"] if long else []
        )
    else:
        short += int(((df["output_tokens"] < df["expected_output_tokens"]) & df["ok"]).sum())
        reasons = []
    return reasons + ([f"{short} request(s) produced fewer output tokens than asked"] if short else [])


def validity(
    m: Mapping[str, Any],
    df: pd.DataFrame,
    concurrency: int,
    gates: Mapping[str, Any],
    server_max_running: int | None = None,
    stop: str = "fixed",
) -> dict[str, Any]:
    """Gates on one repeat's metrics -> {valid, reasons[], flags[]}. Reasons invalidate; flags inform.
    `stop` (workload.stop): under a fixed one every answer must be its asked length; under a natural one an
    answer may end sooner (at the model's end of text), never later.

    The client gates judge the client by what can go wrong with it, not by the host's jitter: its own CPU
    time (saturated), its run-queue wait (starved by another task on its core), the closed loop's fidelity
    (achieved concurrency: in-flight drops below C only between an end and the next send), and loop lag only
    where it can move timestamps (chunks not stamped by the kernel), measured above the host's idle lag.
    `gates` uses the config's key names (workflow/schemas/config.schema.yaml, `gates:`).
    """
    reasons: list[str] = []
    flags: list[str] = []
    c = m["client"]
    if c["busy_share"] is None:
        flags.append("client saturation not judged: its CPU share is missing (no CPU accounting from the client)")
    elif c["busy_share"] > gates["max_client_cpu_share"]:
        reasons.append(
            f"client saturated: its own work used {c['busy_share']:.0%} of its CPU "
            f"> {gates['max_client_cpu_share']:.0%} (fewer streams per client, or a faster client CPU)"
        )
    if c["wait_share"] is None:
        flags.append("client run-queue wait unknown (no /proc/self/schedstat): starvation not checked")
    elif c["wait_share"] > gates["max_client_wait_share"]:
        reasons.append(
            f"client starved: it waited for a CPU {c['wait_share']:.0%} of the time "
            f"> {gates['max_client_wait_share']:.0%} (another process shares its core; see client.cpus)"
        )
    if c.get("shared_cpus") and not gates["allow_shared_cpus"]:
        reasons.append(
            f"client and server share CPUs {c['shared_cpus']}: the engine's figures include the client's work and "
            "the client can be starved (give them separate CPUs: client.cpus, variants.<name>.cpus)"
        )
    foreign, resolution = c.get("foreign_cpu_share"), c.get("foreign_cpu_resolution") or 0.0
    if foreign is None:
        flags.append(
            "machine busy not judged: other processes' CPU share is missing (the server's CPU time was not read: "
            "a server on another host, or no CPU accounting from the client)"
        )
    elif foreign - resolution > gates["max_foreign_cpu_share"]:
        reasons.append(
            f"machine busy: other processes used {foreign:.0%} (±{resolution:.0%}: clock ticks) of the "
            f"measurement's CPUs > {gates['max_foreign_cpu_share']:.0%} (the engine and client shared them with "
            "other work)"
        )
    elif resolution >= gates["max_foreign_cpu_share"]:
        flags.append(
            f"other processes' CPU share not judged: the repeat is too short for the clock-tick counters "
            f"(±{resolution:.0%} >= {gates['max_foreign_cpu_share']:.0%}; longer windows: workload.requests)"
        )
    kernel = (c["stamps"] or {}).get("kernel_share")
    kernel_stamped = kernel is not None and kernel >= KERNEL_STAMPED  # a late loop then delays parsing, not stamps
    excess = c["loop_lag_excess_p99_ms"]
    if excess is None:
        flags.append("no loop-lag samples: client keep-up not checked")
    elif not kernel_stamped and excess > gates["max_loop_lag_excess_ms"]:
        reasons.append(
            f"client event-loop lag p99 {c['loop_lag_ms']['p99']:.2f} ms is {excess:.2f} ms above the host's idle "
            f"{c['idle_lag_ms']['p99'] or 0:.2f} ms (> {gates['max_loop_lag_excess_ms']:g} ms) and chunks are "
            "not kernel-stamped: timestamps include client delay"
        )
    ach = m["achieved_concurrency"]
    if m.get("load") == "open":
        _open_loop_validity(m, df, gates, reasons, flags)
    elif ach is None or ach < gates["min_achieved_concurrency_ratio"] * concurrency:
        shown = "n/a" if ach is None else f"{ach:.2f}"
        reasons.append(
            f"achieved concurrency {shown} < {gates['min_achieved_concurrency_ratio']:.0%} of C={concurrency}"
            + ("" if m["steady_window_s"] else ": empty steady window (raise workload.requests.per_concurrency)")
        )
    err = m["errors"]
    if err["rate"] > gates["max_error_rate"]:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(err["by_kind"].items()))
        reasons.append(f"error rate {err['rate']:.2%} > {gates['max_error_rate']:.2%} ({kinds})")
    reasons += output_length_reasons(df, stop)
    hit = m["prefix_cache"]["hit_rate"]
    if m["prefix_cache"]["source"] is None:
        flags.append("prefix-cache hits not reported by this server: cell isolation not checked")
    elif hit is not None and hit > gates["max_prefix_cache_hit_rate"]:
        reasons.append(
            f"prefix-cache hit rate {hit:.1%} > {gates['max_prefix_cache_hit_rate']:.0%}: requests were served "
            "from an earlier cell's cache (reset the cache between cells; see docs/engines.md)"
        )
    if server_max_running is not None and m.get("load") != "open" and concurrency > server_max_running:
        flags.append(
            f"C={concurrency} exceeds the server's running-request cap {server_max_running}: "
            "the excess requests queue inside the server"
        )
    okdf = df[df["ok"] & (df["server_output_tokens"] >= 0)]
    mismatch = int((okdf["server_output_tokens"] != okdf["output_tokens"]).sum())
    if mismatch:
        flags.append(f"{mismatch} request(s): streamed token count differs from the server's usage")
    return {"valid": not reasons, "reasons": reasons, "flags": flags}


def _open_loop_validity(
    m: Mapping[str, Any], df: pd.DataFrame, gates: Mapping[str, Any], reasons: list[str], flags: list[str]
) -> None:
    """An open loop's own gates: a window to measure in, and sends on plan. A send counts as late when it
    left more than `max_loop_lag_excess_ms` after its plan beyond the host's idle timer jitter (the loop-lag
    gate's rule); the repeat is invalid when more than `max_late_send_share` of its sends were late. Why a
    share, not a p99: a starved client sends many requests late, while one stall of a jittery host (measured
    here: one 106 ms pause of the client's loop in a 12 s repeat, 2 of 96 sends late) leaves the offered load
    as planned. Requests the in-flight cap held back are the load's doing, flagged."""
    if not m["steady_window_s"]:
        reasons.append("empty steady window: the level ended within one request time (raise load.duration_s)")
    idle_p99 = m["client"]["idle_lag_ms"]["p99"] or 0.0
    lag_ms = send_lag(df) * 1e3
    if lag_ms.size:
        late = float((lag_ms - idle_p99 > gates["max_loop_lag_excess_ms"]).mean())
        if late > gates["max_late_send_share"]:
            limit, excess = gates["max_late_send_share"], gates["max_loop_lag_excess_ms"]
            reasons.append(
                f"client sent late: {late:.0%} of requests left more than {excess:g} ms after their planned time "
                f"beyond the host's idle {idle_p99:.2f} ms (> {limit:.0%}; send lag p99 "
                f"{m['send_lag_ms']['p99']:.2f} ms): the arrivals were not the planned ones"
            )
        elif late > 0:
            flags.append(f"{late:.1%} of requests sent late (a stall of the client or the host; within the gate)")
    held = m.get("held_share")
    if held:
        flags.append(
            f"the in-flight cap held back {held:.0%} of arrivals: the server did not keep up with the offered rate "
            "(above it the level is a closed loop at the cap; load.max_in_flight)"
        )


def block_drift(measured_summary: Mapping[str, Any]) -> float | None:
    """How far an interleaved cell's steady throughput moved over the level, minus 1: the least-squares trend of
    its log over the arm's blocks in round order, from the first round to the last, all on the first block's
    server instance (pairing.instances: another instance's own speed is no drift). With two blocks it is the last
    over the first. The trend, not the last block over the first: each block carries its own regime (vLLM CPU
    at C=64: 17-19% SD of log throughput from one block to the next on this 2-core VM), and two single blocks
    differed by more than 35% in levels whose 24 blocks trended +18-27% (docs/analysis.md, "Paired measurement").
    None: not an interleaved cell with two blocks on one instance, or a block without the figure."""
    pairing = measured_summary.get("pairing") or {}
    reps = measured_summary["repeats"]
    if pairing.get("mode") != "interleaved" or len(reps) < 2:
        return None
    on = {int(b["repeat"]): b.get("instance") for b in pairing.get("blocks") or []}
    first = min(reps, key=lambda r: int(r["repeat"]))
    same = sorted(
        (r for r in reps if on.get(int(r["repeat"])) == on.get(int(first["repeat"]))), key=lambda r: int(r["repeat"])
    )
    if len(same) < 2:
        return None
    tok_s = [r["metrics"].get("output_tok_s_steady") for r in same]
    if any(not v for v in tok_s):
        return None
    rounds = np.array([int(r["repeat"]) for r in same], dtype=float)
    slope = np.polyfit(rounds, np.log(np.array(tok_s, dtype=float)), 1)[0]
    return math.expm1(float(slope) * (rounds[-1] - rounds[0]))


def block_drift_gate(measured_summary: Mapping[str, Any], gates: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(reason, flag) of the drift gate: an arm whose throughput trended by more than max_block_drift over the level's
    interleaved blocks (`block_drift`) saw the host change speed inside the level. That is a flag, never a reason
    to measure the level again: a change between two rounds cancels in the paired ratio, and one inside a round
    moves that round's d alone, which the rounds' spread carries into the paired interval (a t over the rounds
    covers one moved round: benchmarks/precision_coverage.py, host steps and slow spells), so the interval is
    wide, not wrong, and a level with a precision target adds rounds to it. Measuring the level again from the
    start threw its rounds away and met the host again (vLLM CPU on a 2-core VM: 20-60% in every attempt)."""
    if (measured_summary.get("pairing") or {}).get("mode") != "interleaved" or len(measured_summary["repeats"]) < 2:
        return None, None
    drift = block_drift(measured_summary)
    if drift is None:
        return (
            None,
            "block drift not judged: no two blocks on one server instance, or a block's steady throughput is missing",
        )
    if abs(drift) <= gates["max_block_drift"]:
        return None, None
    return None, (
        f"drift: steady throughput {drift:+.0%} over the level (the trend of its interleaved blocks, first to last) "
        f"(> ±{gates['max_block_drift']:.0%}): the host changed speed during the level; its rounds are kept, the "
        "change in their spread and so in the paired interval"
    )


def _instance_of(measured_summary: Mapping[str, Any]) -> dict[int, Any]:
    """Each repeat's server instance (pairing.instances > 1), None for all where there is one."""
    return {int(b["repeat"]): b.get("instance") for b in (measured_summary.get("pairing") or {}).get("blocks") or []}


def _below_median(values: Mapping[int, float], tolerance: float) -> list[tuple[int, float, float]]:
    """(repeat, value, median) of each value more than `tolerance` (a share) below the median of `values`."""
    if len(values) < 2:
        return []
    med = float(np.median(list(values.values())))
    return [(r, v, med) for r, v in sorted(values.items()) if v < (1.0 - tolerance) * med]


def server_state_gate(measured_summary: Mapping[str, Any], gates: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(reasons, flags) of the serving side: each block against the arm's other blocks at this level on the same
    server instance. A block whose server's threads got a smaller share of the CPU time they were ready for (and
    waited more, by that share of its allowed CPUs), or whose GPU ran a lower SM clock, by more than
    `max_server_slowdown` below the median, or whose GPU had a thermal or power-brake throttle reason active, was
    served by a slower machine: a different operating point, which
    moves the paired ratio itself (pairing only cancels what scales both arms alike). Re-measured like the host's
    transient causes (`heal`). A server throttled alike in every block is one operating point: its cgroup's
    throttling is flagged, not judged."""
    reps = measured_summary["repeats"]
    states = {int(r["repeat"]): r.get("server_state") for r in reps}
    if len(reps) < 2:
        return [], []
    if all(st is None for st in states.values()):
        return [], [
            "serving side not watched: the server's process was not readable (a server on another host), "
            "so a block served by a slowed server is not seen"
        ]
    tol = float(gates["max_server_slowdown"])
    on = _instance_of(measured_summary)
    reasons: list[str] = []
    flags: list[str] = []
    by_instance: dict[Any, list[int]] = {}
    for r in states:
        by_instance.setdefault(on.get(r), []).append(r)
    judged_cpu = False
    for rs in by_instance.values():
        cpu = {r: (states[r] or {}).get("cpu") or {} for r in rs}
        granted = {r: float(c["granted_share"]) for r, c in cpu.items() if c.get("granted_share") is not None}
        judged_cpu |= len(granted) >= 2
        waits = [float(cpu[r]["wait_cores"]) for r in granted]
        for r, g, med in _below_median(granted, tol):
            # and it waited more by a tenth (tol) of the CPUs it was allowed: a server that barely uses its CPUs
            # (the simulated engine: 0.1-0.4 s blocks at 0.15 of a core, 0.8-1.0 granted by a few ms of wake-up
            # waits) has lost nothing that slows it
            if float(cpu[r]["wait_cores"]) - float(np.median(waits)) <= tol * float(cpu[r]["allowed_cores"]):
                continue
            throttled = cpu[r].get("cgroup_throttled_share")
            by = f"; its cgroup's CPU quota throttled it {throttled:.0%} of the block" if throttled else ""
            reasons.append(
                f"repeat {r}: {SLOWED_PREFIX} its threads got {g:.0%} of the CPU time they were ready for, "
                f"{1 - g / med:.0%} below the arm's median {med:.0%} at this level (> {tol:.0%}{by}): another "
                "operating point; re-measure it"
            )
        quota = [r for r, c in cpu.items() if (c.get("cgroup_throttled_share") or 0.0) > 0.01]
        if quota:
            flags.append(
                f"the server's cgroup CPU quota throttled it in repeat(s) {quota} "
                f"({cpu[quota[0]]['cgroup_throttled_share']:.0%} of the first): its quota binds"
            )
        gpus: dict[int, dict[int, Mapping[str, Any]]] = {}
        for r in rs:
            for g in (states[r] or {}).get("gpus") or []:
                gpus.setdefault(int(g["index"]), {})[r] = g
        for index, per_rep in sorted(gpus.items()):
            clocks = {r: float(g["sm_clock_mhz"]) for r, g in per_rep.items() if g.get("sm_clock_mhz") is not None}
            for r, mhz, med in _below_median(clocks, tol):
                reasons.append(
                    f"repeat {r}: {SLOWED_PREFIX} GPU {index} SM clock {mhz:.0f} MHz, {1 - mhz / med:.0%} below the "
                    f"arm's median {med:.0f} MHz at this level (> {tol:.0%}); re-measure it"
                )
            for r, g in sorted(per_rep.items()):
                if g.get("throttled_thermal_power"):
                    reasons.append(
                        f"repeat {r}: {SLOWED_PREFIX} GPU {index} throttled "
                        f"({', '.join(g.get('throttle_reasons') or [])}); re-measure it"
                    )
                if g.get("other_processes_mib"):
                    flags.append(
                        f"repeat {r}: GPU {index}: other processes held {g['other_processes_mib']:.0f} MiB "
                        "(they may take its SMs too)"
                    )
                if g.get("ecc_uncorrected") or g.get("xid_events"):
                    flags.append(
                        f"repeat {r}: GPU {index}: uncorrected ECC errors {g.get('ecc_uncorrected') or 0}, "
                        f"XID events {g.get('xid_events') or []}"
                    )
    if not judged_cpu:
        flags.append(
            "server CPU share not judged: no two blocks on one server instance with the scheduler's per-thread "
            "accounting (/proc/<pid>/task/<tid>/schedstat)"
        )
    if any((st or {}).get("gpus_watched") and (st or {}).get("gpus") is None for st in states.values()):
        flags.append("GPU state not judged: NVML unavailable (no NVIDIA driver library, or it failed to start)")
    return reasons, flags


def judge(
    measured_summary: Mapping[str, Any],
    records: pd.DataFrame,
    concurrency: int,
    gates: Mapping[str, Any],
    slos: Mapping[str, float] | None = None,
    server_max_running: int | None = None,
) -> dict[str, Any]:
    """A measured summary judged by `gates` and `slos`: {metrics, repeats, validity} with goodput filled in.

    The one place validity is decided. A cell is valid only if every repeat is. Runs on stored records, so
    the analysis re-judges finished cells under changed gates or SLOs without measuring again.
    """
    if "repeat" not in records:
        records = records.assign(repeat=0)
    slos = {k: float(v) for k, v in (slos or {}).items() if v is not None}
    per_rep: list[dict[str, Any]] = []
    valid, reasons, flags = True, [], []
    multi = len(measured_summary["repeats"]) > 1
    for rep in measured_summary["repeats"]:
        r = int(rep["repeat"])
        sub = records[records["repeat"] == r]
        m = {
            **rep["metrics"],
            "goodput_rps": goodput_rps(sub, slos, *_stored_window(rep["metrics"])),
            "slos": dict(slos),
        }
        stop = (measured_summary.get("workload") or {}).get("stop", "fixed")
        v = validity(m, sub, concurrency, gates, server_max_running, stop)
        per_rep.append({**rep, "metrics": m, "validity": v})  # what else the repeat recorded is kept
        valid &= v["valid"]
        prefix = f"repeat {r}: " if multi else ""
        reasons += [prefix + x for x in v["reasons"]]
        flags += [x if x.startswith("C=") else prefix + x for x in v["flags"]]
    served_reasons, served_flags = server_state_gate(measured_summary, gates)
    valid &= not served_reasons
    reasons += served_reasons
    flags += served_flags
    drift_reason, drift_flag = block_drift_gate(measured_summary, gates)
    if drift_reason:
        valid = False
        reasons.append(drift_reason)
    if drift_flag:
        flags.append(drift_flag)
    pooled = dict(measured_summary["metrics"])
    if pooled:
        pooled["slos"] = dict(slos)
        vals = [p["metrics"]["goodput_rps"] for p in per_rep if p["metrics"]["goodput_rps"] is not None]
        pooled["goodput_rps"] = float(np.mean(vals)) if vals else None
        pooled["repeat_spread"] = {**pooled.get("repeat_spread", {}), "goodput_rps": stats(vals)}
    if not per_rep:
        valid, reasons = False, ["no requests recorded"]
    return {
        "metrics": pooled,
        "repeats": per_rep,
        "validity": {"valid": bool(valid), "reasons": reasons, "flags": list(dict.fromkeys(flags))},
    }


def summarize(
    records: pd.DataFrame,
    concurrency: int,
    gates: Mapping[str, float],
    slos: Mapping[str, float] | None = None,
    repeats: Sequence[Mapping[str, Any]] | None = None,
    server_max_running: int | None = None,
) -> dict[str, Any]:
    """`measure_summary` judged at once by `judge`: for callers that hold the gates when they measure."""
    measured_summary = measure_summary(records, concurrency, repeats)
    return judge(measured_summary, records, concurrency, gates, slos, server_max_running)
