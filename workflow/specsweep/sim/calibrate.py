"""`specsweep calibrate`: fit a profile to measured cells (`sim.fit`), scan which parameters the data pin down
(`sim.uncertainty`), and write the fitted profile YAML with its plausible ranges.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from specsweep.sim.bounds import check_profile, parameter_bounds
from specsweep.sim.fit import Target, fit_params, fit_profile, load_targets, simulated_tok_s, workload_of
from specsweep.sim.profile import Profile, dump_profile, load_profile, profile_from_dict
from specsweep.sim.uncertainty import format_identification, identify


def format_fit(pairs: list[tuple[Target, float]]) -> str:
    lines = [f"{'target':>28} {'measured':>9} {'fitted':>9} {'error':>7}"]
    for t, s in pairs:
        lines.append(f"{t.label:>28} {t.tok_s:>9.1f} {s:>9.1f} {100 * (s / t.tok_s - 1):>+6.1f}%")
    worst = max((abs(s / t.tok_s - 1) for t, s in pairs), default=0.0)
    lines.append(f"max |error| {100 * worst:.1f}%")
    return "\n".join(lines)


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
    ident = None
    if args.no_uncertainty:
        box = {p: (b.lo, b.hi) for p, b in parameter_bounds(base, params or fit_params(base, targets)).items()}
        fitted, pairs = fit_profile(base, targets, params, rounds=args.rounds, bounds=box)
    else:
        ident = identify(base, targets, params)
        fitted = ident.profile
        pairs = [(t, simulated_tok_s(fitted, t)) for t in targets]
    name = args.name or f"{base.name}-fitted"
    fitted = fitted.with_params({}) if name == fitted.name else _renamed(fitted, name)
    if ident is not None:
        fitted = dataclasses.replace(fitted, reference={**fitted.reference, "uncertainty": ident.as_dict()})
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


def _renamed(profile: Profile, name: str) -> Profile:
    d = profile.to_dict()
    d["name"] = name
    d["illustrative"] = False
    return profile_from_dict(d)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m specsweep.sim.calibrate", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
