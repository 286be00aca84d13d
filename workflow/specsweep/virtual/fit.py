"""Fit a profile's step-time parameters to measured cells, so `predict` can extend a partial sweep.

The fit minimises squared relative error of aggregate throughput. Simulating every candidate would be slow,
so the optimiser works on a mean-field model of the steady state, and a few outer rounds multiply each
target's mean-field value by the ratio simulation/mean-field of the previous round; the reported error is
always the full simulation's. Parameters move in log space (accept_prob in logit space) with a weak pull
towards the base profile, because a handful of cells cannot pin down every parameter on its own.

The library half of `specsweep calibrate` (`virtual.calibrate.calibrate` runs it): `virtual.uncertainty` builds
on this fit, and `virtual.calibrate` on both, so neither imports the other back.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from specsweep.config import defaults
from specsweep.measure.summary import SCHEMA_VERSION, read_judged
from specsweep.sim.engine import step_time
from specsweep.sim.profile import Profile
from specsweep.virtual.predict import WORKLOAD_DEFAULTS, requests_for_level, simulate_level

DEFAULT_PARAMS_BASELINE = [
    "step.fixed_s",
    "step.per_seq_s",
    "step.per_token_s",
    "step.per_context_token_s",
    "step.expert_read_s",
]
DEFAULT_PARAMS_SPECULATIVE = [
    "speculative.accept_prob",
    "speculative.draft_step_s",
    "speculative.draft_per_seq_s",
]


def seed_csv_path() -> Path:
    """The package's copy of the user's seed measurements (usable without the team's shared folder)."""
    return Path(str(resources.files("specsweep") / "data" / "seed_measurements.csv"))


# Throughput keys of a cell summary, preferred first, per kind of figure (docs/metrics.md): the steady window
# (`output_tok_s_steady`, predict's `aggregate_tok_s`) and the whole level (`output_tok_s_total`).
STEADY_KEYS = ("aggregate_tok_s", "output_tok_s_steady")
TOTAL_KEYS = ("output_tok_s_total",)
THROUGHPUTS = ("steady", "total")


@dataclass(frozen=True)
class Target:
    """One measured number to reproduce, with how it was measured."""

    speculative: bool
    mode: str  # "closed_loop" (steady aggregate tok/s) or "single_stream" (decode tok/s of one request)
    concurrency: int
    tok_s: float
    input_tokens: int
    output_tokens: int
    n_requests: int  # measured requests (after the C ramp requests when `stagger`)
    stagger: bool = False  # the level began with one ramp request per slot (the pipeline since it staggers)
    throughput: str = "steady"  # closed loop: "steady" (steady window) or "total" (whole level) tok/s

    @property
    def label(self) -> str:
        arm = "spec" if self.speculative else "base"
        return f"{arm} {self.mode} C={self.concurrency}"


def workload_of(profile: Profile) -> dict[str, Any]:
    """How the profile's reference measurements (CSV rows) were taken: its `reference.workload`, else predict's
    defaults. `stagger` defaults to False here (a table in the seed's form records no ramp requests) and
    `throughput` (which figure the rows hold) to "steady" with a ramp, else "total": without staggered slots
    the steady window of a level of 2C requests holds only the end of the first wave."""
    w = dict(profile.reference.get("workload", {}) or {})
    d = WORKLOAD_DEFAULTS
    per = float(w.get("requests_per_concurrency", d["requests_per_concurrency"]))
    stagger = bool(w.get("stagger", False))
    throughput = str(w.get("throughput", "steady" if stagger else "total"))
    if throughput not in THROUGHPUTS:
        raise ValueError(f"reference.workload.throughput: expected one of {THROUGHPUTS}, got {throughput!r}")
    return {
        "input_tokens": int(w.get("input_tokens", d["input_tokens"])),
        "output_tokens": int(w.get("output_tokens", d["output_tokens"])),
        "requests_per_concurrency": int(per) if per.is_integer() else per,
        "requests_floor": int(w.get("requests_floor", d["requests_floor"])),
        "single_stream_input_tokens": int(w.get("single_stream_input_tokens", w.get("input_tokens", 128))),
        "stagger": stagger,
        "throughput": throughput,
    }


def load_targets(
    path: str | Path,
    spec_arm: str,
    workload: dict[str, Any],
    stack: str | None = None,
    variant: str | None = None,
    single_stream: bool = True,
) -> list[Target]:
    """Targets from a CSV in the seed table's form or a results directory of cell summaries.

    CSV rows are simulated with `workload` (the profile's reference workload); cells of a results directory with
    their own `workload` section."""
    p = Path(path)
    if p.is_dir():
        return _targets_from_results(p, spec_arm, workload, variant)
    rows = list(csv.DictReader(p.open()))
    if stack is None:
        counts: dict[str, int] = {}
        for r in rows:
            if r.get("mode", "closed_loop") == "closed_loop":
                counts[r["stack"]] = counts.get(r["stack"], 0) + 1
        stack = max(counts, key=lambda s: counts[s]) if counts else None
    out: list[Target] = []
    for r in rows:
        if stack is not None and r.get("stack") != stack:
            continue
        if r["arm"] not in ("baseline", spec_arm):
            continue
        mode = r.get("mode", "closed_loop") or "closed_loop"
        if mode == "single_stream" and not single_stream:
            continue
        c = int(r["concurrency"])
        single = mode == "single_stream"
        out.append(
            Target(
                speculative=r["arm"] != "baseline",
                mode=mode,
                concurrency=c,
                tok_s=float(r["aggregate_tok_s"]),
                input_tokens=workload["single_stream_input_tokens" if single else "input_tokens"],
                output_tokens=workload["output_tokens"],
                n_requests=1
                if single
                else requests_for_level(c, workload["requests_per_concurrency"], workload["requests_floor"]),
                stagger=bool(workload["stagger"]) and not single,
                throughput=workload["throughput"],
            )
        )
    return out


def _targets_from_results(root: Path, spec_arm: str, workload: dict[str, Any], variant: str | None) -> list[Target]:
    """Valid cells as targets, each simulated the way it was measured.

    Cells of the staggering client (`workload.stagger` present): their steady-window throughput, with
    `workload.n_requests` measured requests after C ramp requests if `stagger`. Older cells (no such key) had
    neither the ramp nor today's steady window (theirs began at the C-th send), so their whole-level
    throughput (`output_tok_s_total`, unchanged) is fitted, with all their requests as `n_requests`."""
    out: list[Target] = []
    for f in sorted(root.glob("**/c*/summary.json")):
        s = json.loads(f.read_text())
        if s.get("schema_version") == SCHEMA_VERSION:  # judged by the default gates; older cells carry their own
            s = read_judged(f.parent, defaults("gates"))[0]
        cell = s.get("cell", {})
        arm = cell.get("arm", f.parent.parent.name)
        var = cell.get("variant", f.parent.parent.parent.name)
        if (variant and var != variant) or arm not in ("baseline", spec_arm):
            continue
        w = s.get("workload", {})
        metrics = s.get("metrics") or {}
        new = "stagger" in w
        throughput = "steady" if new else "total"
        keys = STEADY_KEYS if new else TOTAL_KEYS + STEADY_KEYS
        key = next((k for k in keys if metrics.get(k) is not None), None)
        if key is None or not s["validity"]["valid"]:
            continue
        if key in STEADY_KEYS:
            throughput = "steady"  # an older cell without a whole-level figure: the best there is
        tok_s = metrics[key]
        c = int(cell.get("concurrency", f.parent.name.lstrip("c")))
        out_tok = w.get("output_tokens", workload["output_tokens"])
        if not isinstance(out_tok, int):  # e.g. {uniform: [lo, hi]}: the simulation has one fixed length
            print(f"calibrate: skipping {f}: output_tokens {out_tok!r} is not a fixed length", file=sys.stderr)
            continue
        in_tok = w.get("input_tokens", w.get("input_tokens_mean"))
        n_req = next((w[k] for k in ("n_requests", "requests") if isinstance(w.get(k), int)), None)
        out.append(
            Target(
                speculative=arm != "baseline",
                mode="closed_loop",
                concurrency=c,
                tok_s=float(tok_s),
                input_tokens=round(in_tok) if in_tok is not None else workload["input_tokens"],
                output_tokens=out_tok,
                n_requests=n_req
                or requests_for_level(c, workload["requests_per_concurrency"], workload["requests_floor"]),
                stagger=bool(w.get("stagger", False)),
                throughput=throughput,
            )
        )
    return out


def mean_field_tok_s(profile: Profile, t: Target) -> float:
    """Steady-state throughput with every slot decoding at the mean context length (fast, approximate)."""
    spec = t.speculative
    cap = profile.running_cap(spec, t.input_tokens + t.output_tokens)
    b = 1 if t.mode == "single_stream" else min(t.concurrency, cap)
    width = profile.speculative.draft_tokens + 1 if spec else 1
    accept = profile.expected_accept_length() if spec else 1.0
    ctx = b * (t.input_tokens + t.output_tokens / 2)
    td = step_time(profile, spec, b, b * width, 0, b, ctx)
    if t.mode == "single_stream":
        return accept / td
    c = profile.step_costs(spec)
    steps = 1 + (t.output_tokens - 1) / accept
    prefill = t.input_tokens * c.prefill_token_s
    return b * t.output_tokens / (steps * td + b * prefill)


def simulated_tok_s(profile: Profile, t: Target, seed: int = 0) -> float:
    """The target's figure, simulated the way it was measured (ramp requests only if it had them)."""
    if t.mode == "single_stream":
        p = simulate_level(profile, t.speculative, 1, 3, t.input_tokens, t.output_tokens, seed=seed, stagger=False)
        return 1.0 / p.tpot_s
    p = simulate_level(
        profile,
        t.speculative,
        t.concurrency,
        t.n_requests,
        t.input_tokens,
        t.output_tokens,
        seed=seed,
        stagger=t.stagger,
    )
    return p.aggregate_total_tok_s if t.throughput == "total" else p.aggregate_tok_s


def _to_x(name: str, v: float) -> float:
    if name == "speculative.accept_prob":
        return math.log(v / (1 - v))
    return math.log(v)


def _from_x(name: str, x: float) -> float:
    if name == "speculative.accept_prob":
        return min(0.995, 1 / (1 + math.exp(-x)))
    return math.exp(x)


def fit_profile(
    base: Profile,
    targets: list[Target],
    params: list[str] | None = None,
    rounds: int = 3,
    prior_weight: float = 0.01,
    seed: int = 0,
    bounds: dict[str, tuple[float, float]] | None = None,
    fixed: dict[str, float] | None = None,
    simulate: bool = True,
    corr: np.ndarray | None = None,
) -> tuple[Profile, list[tuple[Target, float]]]:
    """Fit; return the fitted profile and (target, simulated tok/s) pairs.

    `bounds` (dotted name -> (lo, hi)) keep each parameter in its physical range (`virtual.bounds`); `fixed` holds
    some parameters at given values (the profile-likelihood scan of `virtual.uncertainty`). With `simulate=False`
    the mean-field model alone is fitted, corrected by `corr` (simulation over mean field per target)."""
    from scipy.optimize import least_squares

    fixed = fixed or {}
    params = [p for p in (params or fit_params(base, targets)) if p not in fixed and base.get(p) > 0]
    base = base.with_params(fixed) if fixed else base
    bounds = bounds or {}
    lo = np.array([_to_x(p, bounds[p][0]) if p in bounds else -np.inf for p in params])
    hi = np.array([_to_x(p, bounds[p][1]) if p in bounds else np.inf for p in params])
    x0 = np.clip(np.array([_to_x(p, base.get(p)) for p in params]), lo + 1e-9, hi - 1e-9)
    corr = np.ones(len(targets)) if corr is None else corr
    profile = base

    def residuals(x: np.ndarray) -> np.ndarray:
        prof = base.with_params({p: _from_x(p, v) for p, v in zip(params, x, strict=True)})
        r = [mean_field_tok_s(prof, t) * k / t.tok_s - 1 for t, k in zip(targets, corr, strict=True)]
        return np.concatenate([np.array(r), prior_weight * (x - x0)])

    x = x0
    sims: list[float] = []
    for _ in range(rounds if simulate else 1):
        if params:
            x = least_squares(residuals, x, bounds=(lo, hi), method="trf", x_scale=1.0).x
        profile = base.with_params({p: _from_x(p, v) for p, v in zip(params, x, strict=True)})
        if not simulate:
            sims = [mean_field_tok_s(profile, t) * k for t, k in zip(targets, corr, strict=True)]
            break
        sims = [simulated_tok_s(profile, t, seed) for t in targets]
        corr = np.array([s / mean_field_tok_s(profile, t) for s, t in zip(sims, targets, strict=True)])
    return profile, list(zip(targets, sims, strict=True))


def fit_params(base: Profile, targets: list[Target]) -> list[str]:
    """The parameters fitted by default: the step costs, plus speculation's when speculative cells are among
    the targets; a parameter that is zero in the base profile is a structural choice and stays zero."""
    params = list(DEFAULT_PARAMS_BASELINE)
    if any(t.speculative for t in targets):
        params += DEFAULT_PARAMS_SPECULATIVE
    return [p for p in params if base.get(p) > 0]
