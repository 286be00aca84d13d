"""A sweep and its crossover in virtual time (`virtual.predict`), with 90% intervals from a calibrated profile's
plausible parameters (`virtual.uncertainty`) when it has them: what `specsweep predict` prints.

Not part of `virtual.predict`: the intervals are built on the fit (`virtual.fit`), which simulates with
`virtual.predict`, so `virtual.predict` cannot import them back.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from specsweep.sim.engine import Schedule
from specsweep.sim.profile import Profile
from specsweep.virtual.predict import WORKLOAD_DEFAULTS, SweepPrediction, format_sweep, predict_sweep
from specsweep.virtual.uncertainty import SweepIntervals, format_intervals, sweep_intervals


def _workload_value(key: str, value: Any) -> Any:
    if key == "stagger":
        return bool(value)
    if key == "requests_per_concurrency":
        v = float(value)
        return int(v) if v.is_integer() else v
    return int(value)


def resolve_workload(given: dict[str, Any], profile: Profile) -> dict[str, Any]:
    """The workload of a prediction: each WORKLOAD_DEFAULTS key from `given` (None: unset), else the profile's
    reference workload, else the default.

    Not `stagger`: a prediction is of the pipeline's measurement, which staggers its slots unless told not to;
    the reference workload's `stagger` says how the profile's reference figures were taken (for calibrate)."""
    ref = (profile.reference or {}).get("workload") or {}
    out = {}
    for key, default in WORKLOAD_DEFAULTS.items():
        value = given.get(key)
        if value is None:
            value = default if key == "stagger" else ref.get(key, default)
        out[key] = _workload_value(key, value)
    return out


@dataclasses.dataclass
class Forecast:
    profile: Profile
    workload: dict[str, Any]
    sweep: SweepPrediction
    intervals: SweepIntervals | None
    elapsed_s: float  # measured: the prediction's wall time

    def as_dict(self) -> dict[str, Any]:
        iv = self.intervals
        return {
            "profile": self.profile.name,
            "illustrative": self.profile.illustrative,
            "workload": self.workload,
            "baseline": [p.as_dict() for p in self.sweep.baseline],
            "speculative": [p.as_dict() for p in self.sweep.speculative],
            "speedup": self.sweep.speedup(),
            "crossovers": self.sweep.crossovers(),
            "intervals": None
            if iv is None
            else {
                "levels": [dataclasses.asdict(lv) for lv in iv.levels],
                "crossover_interval": iv.crossover_interval(),
                "plausible_crossovers": iv.crossovers,
                "verdict": iv.verdict(),
                "measure_next": iv.suggestions,
            },
            "elapsed_s": self.elapsed_s,
        }

    def format(self) -> str:
        w = self.workload
        ramp = "after one staggered ramp request per slot" if w["stagger"] else "no ramp requests"
        rule = f"{w['requests_floor']}, {w['requests_per_concurrency']} x C" + (
            ", 2 x C" if w["requests_per_concurrency"] < 2 else ""
        )
        lines = [
            f"workload: input {w['input_tokens']} / output {w['output_tokens']} tokens, measured requests per "
            f"level max({rule}), {ramp}",
            format_sweep(self.profile, self.sweep),
            format_intervals(self.intervals)
            if self.intervals is not None
            else "(no prediction intervals: no `reference.uncertainty` in the profile; `specsweep calibrate` adds it)",
            f"(predicted in {self.elapsed_s:.3f} s)",
        ]
        return "\n".join(lines)


def forecast(
    profile: Profile,
    workload: dict[str, Any],
    concurrency: list[int],
    seed: int = 0,
    max_running_requests: int | None = None,
    schedule: Schedule | None = None,
) -> Forecast:
    """Predict both arms at `concurrency` under `workload` (resolve_workload's), with intervals when the profile
    is calibrated."""
    t = time.perf_counter()
    sweep = predict_sweep(
        profile,
        concurrency,
        workload["input_tokens"],
        workload["output_tokens"],
        workload["requests_per_concurrency"],
        workload["requests_floor"],
        seed,
        max_running_requests,
        stagger=workload["stagger"],
        schedule=schedule,
    )
    intervals = None
    uncertainty = (profile.reference or {}).get("uncertainty")
    if uncertainty:
        intervals = sweep_intervals(
            profile,
            uncertainty,
            concurrency,
            [p.aggregate_tok_s for p in sweep.baseline],
            [p.aggregate_tok_s for p in sweep.speculative],
            workload["input_tokens"],
            workload["output_tokens"],
        )
    return Forecast(profile, workload, sweep, intervals, time.perf_counter() - t)
