"""`specsweep predict`: a sweep and its crossover in virtual time (`sim.predict`), with 90% intervals from a
calibrated profile's plausible parameters (`sim.uncertainty`) when it has them.

A command of its own, not part of `sim.predict`: the intervals are built on the fit (`sim.fit`), which
simulates with `sim.predict`, so the library cannot import them back.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from specsweep.sim.engine import parse_schedule
from specsweep.sim.predict import DEFAULT_LEVELS, WORKLOAD_DEFAULTS, format_sweep, predict_sweep
from specsweep.sim.profile import Profile, load_profile
from specsweep.sim.uncertainty import format_intervals, sweep_intervals


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = WORKLOAD_DEFAULTS
    parser.add_argument("--profile", default="demo", help="packaged profile name or YAML path")
    parser.add_argument("--concurrency", type=_int_list, default=DEFAULT_LEVELS, help="comma-separated levels")
    # Unset workload options take the profile's reference workload (what it was calibrated on), else these.
    parser.add_argument(
        "--input-tokens", type=int, default=None, help=f"default: profile's reference, else {d['input_tokens']}"
    )
    parser.add_argument(
        "--output-tokens", type=int, default=None, help=f"default: profile's reference, else {d['output_tokens']}"
    )
    parser.add_argument(
        "--requests-per-concurrency",
        type=float,
        default=None,
        help=f"measured requests per unit of C; default: reference, else {d['requests_per_concurrency']}",
    )
    parser.add_argument(
        "--requests-floor", type=int, default=None, help=f"default: reference, else {d['requests_floor']}"
    )
    parser.add_argument(
        "--stagger",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one shortened ramp request per slot first, as the pipeline's client (default: on)",
    )
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument(
        "--schedule",
        type=parse_schedule,
        default=None,
        metavar="JSON",
        help="speculative arm: draft tokens per number of running requests, e.g. '[[1, 15, 3], [16, 1024, 0]]'",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _workload_value(key: str, value: Any) -> Any:
    if key == "stagger":
        return bool(value)
    if key == "requests_per_concurrency":
        v = float(value)
        return int(v) if v.is_integer() else v
    return int(value)


def resolve_workload(args: argparse.Namespace, profile: Profile) -> None:
    """Fill unset workload options from the profile's reference workload, then from WORKLOAD_DEFAULTS.

    Not `stagger`: a prediction is of the pipeline's measurement, which staggers its slots unless told not to;
    the reference workload's `stagger` says how the profile's reference figures were taken (for calibrate)."""
    ref = (profile.reference or {}).get("workload") or {}
    for key, default in WORKLOAD_DEFAULTS.items():
        value = getattr(args, key)
        if value is None:
            value = default if key == "stagger" else ref.get(key, default)
        setattr(args, key, _workload_value(key, value))


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    resolve_workload(args, profile)
    workload = {k: getattr(args, k) for k in WORKLOAD_DEFAULTS}
    t = time.perf_counter()
    sweep = predict_sweep(
        profile,
        args.concurrency,
        args.input_tokens,
        args.output_tokens,
        args.requests_per_concurrency,
        args.requests_floor,
        args.seed,
        args.max_running_requests,
        stagger=args.stagger,
        schedule=args.schedule,
    )
    intervals = None
    uncertainty = (profile.reference or {}).get("uncertainty")
    if uncertainty:
        intervals = sweep_intervals(
            profile,
            uncertainty,
            args.concurrency,
            [p.aggregate_tok_s for p in sweep.baseline],
            [p.aggregate_tok_s for p in sweep.speculative],
            args.input_tokens,
            args.output_tokens,
        )
    elapsed = time.perf_counter() - t
    if args.json:
        print(
            json.dumps(
                {
                    "profile": profile.name,
                    "illustrative": profile.illustrative,
                    "workload": workload,
                    "baseline": [p.as_dict() for p in sweep.baseline],
                    "speculative": [p.as_dict() for p in sweep.speculative],
                    "speedup": sweep.speedup(),
                    "crossovers": sweep.crossovers(),
                    "intervals": None
                    if intervals is None
                    else {
                        "levels": [dataclasses.asdict(lv) for lv in intervals.levels],
                        "crossover_interval": intervals.crossover_interval(),
                        "plausible_crossovers": intervals.crossovers,
                        "verdict": intervals.verdict(),
                        "measure_next": intervals.suggestions,
                    },
                    "elapsed_s": elapsed,
                },
                indent=2,
            )
        )
    else:
        ramp = "after one staggered ramp request per slot" if args.stagger else "no ramp requests"
        rule = f"{args.requests_floor}, {args.requests_per_concurrency} x C" + (
            ", 2 x C" if args.requests_per_concurrency < 2 else ""
        )
        print(
            f"workload: input {args.input_tokens} / output {args.output_tokens} tokens, measured requests per "
            f"level max({rule}), {ramp}"
        )
        print(format_sweep(profile, sweep))
        if intervals is not None:
            print(format_intervals(intervals))
        else:
            print("(no prediction intervals: no `reference.uncertainty` in the profile; `specsweep calibrate` adds it)")
        print(f"(predicted in {elapsed:.3f} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m specsweep.sim.predict_cli", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
