"""`specsweep predict`: a sweep and its crossover in virtual time, with intervals (`specsweep.virtual.forecast`)."""

from __future__ import annotations

import argparse
import json

from specsweep.sim.engine import parse_schedule
from specsweep.sim.profile import load_profile
from specsweep.virtual.forecast import forecast, resolve_workload
from specsweep.virtual.predict import DEFAULT_LEVELS, WORKLOAD_DEFAULTS


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


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    workload = resolve_workload({k: getattr(args, k) for k in WORKLOAD_DEFAULTS}, profile)
    result = forecast(profile, workload, args.concurrency, args.seed, args.max_running_requests, args.schedule)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.format())
    return 0
