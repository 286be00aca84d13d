"""Fit a profile to measured cells (`virtual.fit`), scan which parameters the data pin down
(`virtual.uncertainty`), and write the fitted profile YAML with its plausible ranges
(`specsweep calibrate`).
"""

from __future__ import annotations

import dataclasses

from specsweep.sim.profile import Profile, profile_from_dict
from specsweep.virtual.bounds import parameter_bounds
from specsweep.virtual.fit import Target, fit_params, fit_profile, simulated_tok_s
from specsweep.virtual.uncertainty import Identification, identify


def format_fit(pairs: list[tuple[Target, float]]) -> str:
    lines = [f"{'target':>28} {'measured':>9} {'fitted':>9} {'error':>7}"]
    for t, s in pairs:
        lines.append(f"{t.label:>28} {t.tok_s:>9.1f} {s:>9.1f} {100 * (s / t.tok_s - 1):>+6.1f}%")
    worst = max((abs(s / t.tok_s - 1) for t, s in pairs), default=0.0)
    lines.append(f"max |error| {100 * worst:.1f}%")
    return "\n".join(lines)


def calibrate(
    base: Profile,
    targets: list[Target],
    params: list[str] | None = None,
    rounds: int = 3,
    uncertainty: bool = True,
    name: str | None = None,
) -> tuple[Profile, list[tuple[Target, float]], Identification | None]:
    """Fit `base` to `targets` (only `params`, default: those the targets inform) and name it `name` (default
    <base>-fitted); with `uncertainty`, the identifiability scan too, its plausible ranges kept in the profile's
    `reference.uncertainty`. Returns the fitted profile, each target with its fitted figure, and the scan."""
    ident = None
    if not uncertainty:
        box = {p: (b.lo, b.hi) for p, b in parameter_bounds(base, params or fit_params(base, targets)).items()}
        fitted, pairs = fit_profile(base, targets, params, rounds=rounds, bounds=box)
    else:
        ident = identify(base, targets, params)
        fitted = ident.profile
        pairs = [(t, simulated_tok_s(fitted, t)) for t in targets]
    name = name or f"{base.name}-fitted"
    fitted = fitted.with_params({}) if name == fitted.name else _renamed(fitted, name)
    if ident is not None:
        fitted = dataclasses.replace(fitted, reference={**fitted.reference, "uncertainty": ident.as_dict()})
    return fitted, pairs, ident


def _renamed(profile: Profile, name: str) -> Profile:
    d = profile.to_dict()
    d["name"] = name
    d["illustrative"] = False
    return profile_from_dict(d)
