"""`specsweep track`: log cells and crossovers to MLflow (`specsweep.tracking`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specsweep.config import load_arg
from specsweep.io import atomic_write_json
from specsweep.tracking.log import TrackingFailed, track, track_variant


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True)
    sw = sub.add_parser("sweep", help="log one variant x arm: its cells and the sweep run")
    sw.add_argument("--config", required=True, help="config as JSON text or a YAML/JSON file")
    sw.add_argument("--variant", required=True)
    sw.add_argument("--arm", required=True)
    sw.add_argument("--out", required=True, type=Path, help="marker JSON with the run ids")
    sw.add_argument("summaries", nargs="*", type=Path, help="none: a policy arm that served no schedule")
    cx = sub.add_parser("crossover", help="log one variant's crossover run")
    cx.add_argument("--config", required=True)
    cx.add_argument("--variant", required=True)
    cx.add_argument("--crossover", required=True, type=Path)
    cx.add_argument("--out", required=True, type=Path)
    cx.add_argument("sweeps", nargs="+", type=Path)
    va = sub.add_parser("variant", help="log one variant: every arm's sweep, then its crossover (the workflow's job)")
    va.add_argument("--config", required=True)
    va.add_argument("--variant", required=True)
    va.add_argument("--crossover", required=True, type=Path)
    va.add_argument("--out", required=True, type=Path, help="the crossover's marker JSON")
    va.add_argument("--sweeps", required=True, nargs="+", type=Path, help="<variant>/<arm>/mlflow_sweep.json per arm")
    va.add_argument("--cells", nargs="*", type=Path, default=[], help="<variant>/<arm>/c<C>/summary.json")


def run(args: argparse.Namespace) -> int:
    config = load_arg(args.config)
    try:
        if args.what == "sweep":
            marker = track(config, "sweep", args.variant, arm=args.arm, summaries=list(args.summaries))
        elif args.what == "crossover":
            marker = track(config, "crossover", args.variant, crossover=args.crossover, sweeps=list(args.sweeps))
        else:
            marker = track_variant(config, args.variant, list(args.cells), args.crossover, list(args.sweeps))
    except TrackingFailed as e:
        if e.bug_traceback:
            print(e.bug_traceback, file=sys.stderr)
        print(e, file=sys.stderr, flush=True)
        return 1
    atomic_write_json(args.out, marker)
    print(json.dumps(marker, indent=2))
    return 0
