"""What the measured cells pin down, what they leave free, and the prediction intervals that follow.

Why: a calibrated profile reproduces the cells it was fitted to whatever story its free parameters tell, and
where `predict` extrapolates (an unmeasured arm, levels beyond the measured ones) that story decides the answer.
Method (docs/sim.md, "Uncertainty"): fit within the physical bounds (`virtual.bounds`); for each parameter, a
profile-likelihood scan: hold it at values across its bounds, refit the others, and keep the values whose
squared error rises by at most chi2(1, 90%) = 2.71 noise units (noise = the larger of the fit's own relative
error and its leave-one-out error, at least `NOISE_FLOOR`). A parameter whose plausible range is narrow (< 3x)
is *pinned*; the others are *free*. Every refit inside that range is a plausible profile; predictions over all
of them, widened by the noise, give each level's 90% interval and the crossover's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsweep.sim.profile import Profile
from specsweep.virtual.bounds import Bound, parameter_bounds
from specsweep.virtual.fit import (
    DEFAULT_PARAMS_BASELINE,
    DEFAULT_PARAMS_SPECULATIVE,
    Target,
    fit_profile,
    mean_field_tok_s,
)

CHI2_1_90 = 2.706  # chi-square, 1 degree of freedom, 90%: the profile-likelihood threshold
Z_90 = 1.645  # two-sided 90% normal quantile, for the noise band
NOISE_FLOOR = 0.02  # relative noise of one measured level (bootstrap intervals of the pipeline's cells: 2-5%)
PINNED_RATIO = 3.0  # a plausible range narrower than this is "pinned" by the data
GRID = 9
REFINE = 4  # bisection steps for each end of a plausible range


@dataclass
class ParamRange:
    name: str
    best: float
    lo: float  # plausible range (90%)
    hi: float
    bound: Bound

    @property
    def pinned(self) -> bool:
        return self.hi / self.lo < PINNED_RATIO if self.lo > 0 else False

    def as_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "lo": self.lo,
            "hi": self.hi,
            "pinned": self.pinned,
            "bound_lo": self.bound.lo,
            "bound_hi": self.bound.hi,
            "physical": self.bound.physical,
            "why": self.bound.why,
        }


@dataclass
class Identification:
    profile: Profile  # the best fit within bounds
    ranges: list[ParamRange]
    noise: float  # relative error per level used for the threshold and the band: max(rms, loo, floor)
    rms: float  # the best fit's rms relative error (mean field, corrected)
    loo: float = 0.0  # rms relative error of leave-one-out predictions of the targets
    ensemble: list[dict[str, float]] = field(default_factory=list)  # plausible parameter sets
    measured: list[tuple[str, int]] = field(default_factory=list)  # (arm, C) of the targets

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": "profile likelihood within physical bounds (docs/sim.md, Uncertainty)",
            "noise": self.noise,
            "rms": self.rms,
            "loo": self.loo,
            "params": {r.name: r.as_dict() for r in self.ranges},
            "measured": [list(m) for m in self.measured],
            "ensemble": self.ensemble,
        }


def _sse(profile: Profile, targets: list[Target], corr: np.ndarray) -> float:
    r = np.array([mean_field_tok_s(profile, t) * k / t.tok_s - 1 for t, k in zip(targets, corr, strict=True)])
    return float(np.sum(r**2))


def _leave_one_out(
    best: Profile, targets: list[Target], params: list[str], box: dict[str, tuple[float, float]], corr: np.ndarray
) -> float:
    """RMS relative error of each target predicted by a fit to the others: the model's out-of-sample error,
    which a fit with nearly as many parameters as targets hides (its own residuals shrink towards zero)."""
    if len(targets) < 3:
        return 0.0
    errors = []
    for i, t in enumerate(targets):
        rest = [u for j, u in enumerate(targets) if j != i]
        k = np.delete(corr, i)
        prof, _ = fit_profile(best, rest, params, bounds=box, simulate=False, corr=k)
        errors.append(mean_field_tok_s(prof, t) * corr[i] / t.tok_s - 1)
    return float(np.sqrt(np.mean(np.square(errors))))


def identify(
    base: Profile,
    targets: list[Target],
    params: list[str] | None = None,
    grid: int = GRID,
    seed: int = 0,
) -> Identification:
    """Fit within bounds, then scan each parameter (see the module docstring). By default every step and
    speculation cost is scanned, also those no target depends on (an arm never measured): their likelihood is
    flat, so they come out free over their whole range and the unmeasured arm's interval says so."""
    default = [*DEFAULT_PARAMS_BASELINE, *DEFAULT_PARAMS_SPECULATIVE]
    params = [p for p in (params or default) if base.get(p) > 0]
    bounds = parameter_bounds(base, params)
    box = {p: (b.lo, b.hi) for p, b in bounds.items()}
    best, pairs = fit_profile(base, targets, params, bounds=box, seed=seed)
    corr = np.array([s / mean_field_tok_s(best, t) for t, s in pairs])
    sse_best = _sse(best, targets, corr)
    rms = math.sqrt(sse_best / len(targets))
    loo = _leave_one_out(best, targets, params, box, corr)
    noise = max(rms, loo, NOISE_FLOOR)
    ensemble = [{p: best.get(p) for p in params}]
    ranges = []
    for name in params:
        b = bounds[name]

        def plausible_at(v: float, name: str = name) -> dict[str, float] | None:
            """The refit with `name` held at v, if its error stays within the threshold."""
            prof, _ = fit_profile(best, targets, params, bounds=box, fixed={name: v}, simulate=False, corr=corr)
            if (_sse(prof, targets, corr) - sse_best) / noise**2 <= CHI2_1_90:
                return {p: prof.get(p) for p in params}
            return None

        centre = best.get(name)
        values = sorted({*np.geomspace(b.lo, b.hi, grid).tolist(), centre})
        found = {v: plausible_at(v) for v in values}
        ensemble += [m for m in found.values() if m is not None]
        # the plausible run around the best value, its ends refined by bisection (in log) towards the first
        # implausible grid value on each side
        i = values.index(centre)
        lo_i, hi_i = i, i
        while lo_i > 0 and found[values[lo_i - 1]] is not None:
            lo_i -= 1
        while hi_i < len(values) - 1 and found[values[hi_i + 1]] is not None:
            hi_i += 1
        ends = []
        for inside, outside in (
            (values[lo_i], values[lo_i - 1] if lo_i > 0 else None),
            (values[hi_i], values[hi_i + 1] if hi_i < len(values) - 1 else None),
        ):
            for _ in range(REFINE if outside is not None else 0):
                mid = math.sqrt(inside * outside)
                member = plausible_at(mid)
                if member is not None:
                    inside = mid
                    ensemble.append(member)
                else:
                    outside = mid
            ends.append(inside)
        ranges.append(ParamRange(name, centre, min(ends), max(ends), b))
    measured = sorted({("spec" if t.speculative else "baseline", t.concurrency) for t in targets})
    return Identification(best, ranges, noise, rms, loo, ensemble, measured)


def format_identification(ident: Identification) -> str:
    lines = [
        f"identifiability (90% profile likelihood, noise {100 * ident.noise:.1f}% per level = the largest of fit rms "
        f"{100 * ident.rms:.1f}%, leave-one-out rms {100 * ident.loo:.1f}%, floor {100 * NOISE_FLOOR:.0f}%):",
        f"{'parameter':>28} {'best':>10} {'plausible range':>23}  {'':8} bound",
    ]
    for r in ident.ranges:
        state = "pinned" if r.pinned else "FREE"
        lines.append(
            f"{r.name:>28} {r.best:>10.3g} [{r.lo:>9.3g}, {r.hi:>9.3g}]  {state:8} "
            f"[{r.bound.lo:.3g}, {r.bound.hi:.3g}] {r.bound.why}"
        )
    return "\n".join(lines)


@dataclass
class LevelInterval:
    concurrency: int
    baseline: tuple[float, float, float]  # point, lo, hi (tok/s)
    speculative: tuple[float, float, float]
    speedup: tuple[float, float, float]


@dataclass
class SweepIntervals:
    levels: list[LevelInterval]
    crossovers: list[float | None]  # one per plausible profile (None: no crossing in range)
    directions: list[str | None]  # "down": speculation wins below the crossover; "up": above it
    members: int
    suggestions: list[tuple[str, int, float]]  # (arm, C, spread hi/lo) of unmeasured cells worth measuring

    def crossover_interval(self) -> tuple[float, float] | None:
        found = [c for c in self.crossovers if c is not None]
        return (min(found), max(found)) if found else None

    def verdict(self) -> str:
        """The crossover as the whole ensemble says it; 'no crossover' only when every plausible profile agrees."""
        found = [c for c in self.crossovers if c is not None]
        if not found:
            lo = min(lv.speedup[1] for lv in self.levels)
            hi = max(lv.speedup[2] for lv in self.levels)
            if lo > 1:
                return "no crossover in range: speculation wins at every level in every plausible profile"
            if hi < 1:
                return "no crossover in range: speculation loses at every level in every plausible profile"
            return "no crossover in range in any plausible profile"
        lo, hi = min(found), max(found)
        missing = len(self.crossovers) - len(found)
        down = sum(d == "down" for d in self.directions if d)
        up = sum(d == "up" for d in self.directions if d)
        text = f"crossover C in [{lo:.1f}, {hi:.1f}] over {len(self.crossovers)} plausible profiles"
        text += f" ({down} with speculation winning below it, {up} winning above it)"
        if missing:
            text += f"; {missing} of them cross nowhere in range (the interval is open on that side)"
        return text


def _target(spec: bool, c: int, input_tokens: int, output_tokens: int) -> Target:
    return Target(spec, "closed_loop", c, 0.0, input_tokens, output_tokens, 2 * c)


def sweep_intervals(
    profile: Profile,
    uncertainty: dict[str, Any],
    levels: list[int],
    point_baseline: list[float],
    point_speculative: list[float],
    input_tokens: int,
    output_tokens: int,
) -> SweepIntervals:
    """Per level and arm, the range of throughput over the plausible profiles (each the simulated point value
    scaled by that profile's mean-field ratio to the best fit's), widened by the noise band; the crossover of
    each plausible profile; and the unmeasured cells whose prediction is most uncertain near the crossover."""
    from specsweep.analysis.crossover import crossings_log_c  # local: keeps the sim importable alone

    noise = float(uncertainty.get("noise", NOISE_FLOOR))
    members = [profile.with_params(m) for m in uncertainty.get("ensemble") or [{}]]
    ratios = {}
    for spec in (False, True):
        ts = [_target(spec, c, input_tokens, output_tokens) for c in levels]
        ref = np.array([mean_field_tok_s(profile, t) for t in ts])
        ratios[spec] = np.array([[mean_field_tok_s(m, t) for t in ts] for m in members]) / ref
    base = ratios[False] * np.array(point_baseline)
    spec = ratios[True] * np.array(point_speculative)
    speed = spec / base
    band = Z_90 * noise
    out = []
    for i, c in enumerate(levels):
        out.append(
            LevelInterval(
                c,
                (point_baseline[i], base[:, i].min() * (1 - band), base[:, i].max() * (1 + band)),
                (point_speculative[i], spec[:, i].min() * (1 - band), spec[:, i].max() * (1 + band)),
                (
                    point_speculative[i] / point_baseline[i],
                    speed[:, i].min() * (1 - band * math.sqrt(2)),
                    speed[:, i].max() * (1 + band * math.sqrt(2)),
                ),
            )
        )
    crossovers: list[float | None] = []
    directions: list[str | None] = []
    for row in speed:
        found = crossings_log_c([float(c) for c in levels], row.tolist())
        crossovers.append(found[0] if found else None)
        directions.append(("down" if row[0] > 1 else "up") if found else None)
    measured = {(a, int(c)) for a, c in uncertainty.get("measured") or []}
    result = SweepIntervals(out, crossovers, directions, len(members), [])
    result.suggestions = _suggest(result, measured)
    return result


def _suggest(result: SweepIntervals, measured: set[tuple[str, int]], n: int = 2) -> list[tuple[str, int, float]]:
    """The unmeasured cells whose predicted throughput varies most over the plausible profiles, among the levels
    near the crossover interval (all levels when there is none): measuring them narrows the interval most."""
    cx = result.crossover_interval()
    near = [lv for lv in result.levels if cx is None or cx[0] / 3 <= lv.concurrency <= cx[1] * 3] or result.levels
    scored = []
    for lv in near:
        for arm, (_, lo, hi) in (("baseline", lv.baseline), ("spec", lv.speculative)):
            if (arm, lv.concurrency) not in measured and lo > 0:
                scored.append((arm, lv.concurrency, hi / lo))
    scored.sort(key=lambda s: -s[2])
    return scored[:n]


def format_intervals(result: SweepIntervals, spec_name: str = "speculative") -> str:
    lines = [
        f"90% prediction intervals over {result.members} plausible profiles (physical bounds, fit noise):",
        f"{'C':>5} {'baseline tok/s [90%]':>30} {spec_name + ' tok/s [90%]':>30} {'speedup [90%]':>22}",
    ]
    for lv in result.levels:
        b, s, x = lv.baseline, lv.speculative, lv.speedup
        lines.append(
            f"{lv.concurrency:>5} {b[0]:>10.1f} [{b[1]:>8.1f}, {b[2]:>8.1f}] {s[0]:>10.1f} [{s[1]:>8.1f}, "
            f"{s[2]:>8.1f}] {x[0]:>7.2f} [{x[1]:>5.2f}, {x[2]:>5.2f}]"
        )
    lines.append(result.verdict())
    if result.suggestions:
        cells = " and ".join(
            f"{'baseline' if a == 'baseline' else spec_name} at C={c}" for a, c, _ in result.suggestions
        )
        spread = ", ".join(f"x{r:.2f}" for _, _, r in result.suggestions)
        levels = sorted({c for _, c, _ in result.suggestions})
        lines.append(
            f"measure next: {cells} (their predictions vary {spread} over the plausible profiles):\n"
            f"  printf 'concurrency: {levels}\\n' > measure-next.yaml\n"
            "  snakemake --cores 1 crossover --configfile <your config> measure-next.yaml\n"
            "  then `specsweep calibrate --measured results/<experiment>` and predict again"
        )
    return "\n".join(lines)
