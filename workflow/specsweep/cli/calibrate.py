"""`specsweep calibrate`: fit a simulated-engine profile to measured cells (`specsweep.virtual.calibrate`)."""

from __future__ import annotations

import argparse
import sys

from specsweep.sim.profile import dump_profile, load_profile
from specsweep.virtual.bounds import check_profile
from specsweep.virtual.calibrate import calibrate, format_fit
from specsweep.virtual.fit import fit_params, load_targets, workload_of
from specsweep.virtual.uncertainty import format_identification


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--measured", required=True, help="seed-style CSV or a results directory of cells")
    parser.add_argument("--profile", required=True, help="base profile (name or YAML path)")
    parser.add_argument("--out", required=True, help="fitted profile YAML to write")
    parser.add_argument("--arm", default="eagle3", help="name of the speculative arm in the measurements")
    parser.add_argument("--stack", default=None, help="CSV only: which stack's rows (default: most rows)")
    parser.add_argument("--variant", default=None, help="results directory only: which variant")
    parser.add_argument("--name", default=None, help="name of the fitted profile (default: <base>-fitted)")
    parser.add_argument("--params", default=None, help="comma-separated dotted parameters to fit")
    parser.add_argument("--no-single-stream", action="store_true", help="ignore single-stream rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-uncertainty",
        action="store_true",
        help="skip the identifiability scan (pinned / free parameters, the plausible profiles predict uses)",
    )


def run(args: argparse.Namespace) -> int:
    base = load_profile(args.profile)
    targets = load_targets(
        args.measured,
        args.arm,
        workload_of(base),
        stack=args.stack,
        variant=args.variant,
        single_stream=not args.no_single_stream,
    )
    if not targets:
        print(f"no measured cells found in {args.measured}", file=sys.stderr)
        return 1
    params = args.params.split(",") if args.params else None
    fitted, pairs, ident = calibrate(base, targets, params, args.rounds, not args.no_uncertainty, args.name)
    dump_profile(
        fitted,
        args.out,
        header=f"# fitted by `specsweep calibrate` from {args.measured} (base profile {base.name})",
    )
    print(format_fit(pairs))
    for problem in check_profile(fitted, params or fit_params(base, targets)):
        print(f"outside physical bounds: {problem}")
    if ident is not None:
        print(format_identification(ident))
    print(f"wrote {args.out}")
    return 0
