"""`specsweep plan`: plan a config's sweep in virtual time (`specsweep.virtual.plan`)."""

from __future__ import annotations

import argparse
import json
import sys

from specsweep.config import ConfigError, load
from specsweep.virtual.plan import PlanError, plan_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="config/config.yaml", help="the experiment config (YAML)")
    parser.add_argument("--variant", help="default: the config's first variant")
    parser.add_argument("--profile", help="a calibrated profile (name or YAML); default: the sim variant's own")
    parser.add_argument("--seeds", type=int, default=1, help="plan this many times (engine seeds 0..N-1)")
    parser.add_argument(
        "--server-start-s",
        type=float,
        default=None,
        help="seconds per server start (default: the variant's expected_start_s; a real 8-GPU start: minutes)",
    )
    parser.add_argument(
        "--plausible",
        type=int,
        default=5,
        metavar="N",
        help="also plan the fixed grid on N of a calibrated profile's plausible profiles (0: none), as predict's "
        "intervals do",
    )
    parser.add_argument(
        "--noise-from",
        metavar="CROSSOVER_JSON",
        help="a measured run's crossover.json: plan the rounds or instance pairs (and a sequential variant's GPU "
        "time) the target takes at the spread that run measured",
    )
    parser.add_argument(
        "--effect",
        type=float,
        help="the 95%% half-width to reach, relative: the effect to resolve (0.038: the 3.8%% of fusion at C=1); "
        "default precision.target",
    )
    parser.add_argument(
        "--budget-min",
        type=float,
        help="GPU minutes for this variant: the instance pairs they buy and, with --noise-from, which levels' "
        "verdicts they decide, and the GPU time a decided answer at every level needs",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    try:
        plan = plan_config(
            load(args.config),
            args.variant,
            args.profile,
            args.seeds,
            args.server_start_s,
            args.plausible,
            args.noise_from,
            args.effect,
            args.budget_min * 60 if args.budget_min is not None else None,
        )
    except (ConfigError, PlanError) as e:
        print(e, file=sys.stderr)
        return 2
    print(json.dumps(plan.as_json(), indent=1) if args.json else plan.format())
    return 0
