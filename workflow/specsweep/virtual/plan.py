"""`specsweep plan`: the sweep a config will run, in virtual time, before any GPU time is spent.

For one variant and a profile (the variant's own for the simulated engine, or a calibrated one via `--profile`)
it drives every cell of the config through the engine core in virtual time (`specsweep.virtual.predict.run_level`,
the same closed loop, ramp and request counts as the pipeline), judges the records with the pipeline's metrics
and analysis (`specsweep.measure.summary.judged`, `specsweep.analysis.analyze.analyze_variant`), and prints, for the
fixed grid and for adaptive levels (`specsweep.analysis.adaptive.next_levels`, the pipeline's own rule): the
levels, the requests per level, the expected measuring time per arm (server starts + levels) and the crossover
interval with its width. Virtual time has the engine's own randomness (acceptance) but no host noise: widths
are what the design achieves at best, and several `--seeds` show their spread.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from specsweep.analysis.adaptive import AdaptiveSettings, next_levels
from specsweep.analysis.analyze import analyze_variant
from specsweep.analysis.cells import Cell, request_arrays, summary_windows
from specsweep.analysis.precision import units_for
from specsweep.analysis.proof import policy_proof
from specsweep.analysis.schedule import derive_schedules
from specsweep.analysis.settings import AnalysisSettings
from specsweep.client.loadgen import warmup_count
from specsweep.config import (
    fixed_arms,
    instances,
    interleaved_instances,
    load_mode,
    max_instances,
    policy_arms,
    requests_for,
    speculative_arms,
)
from specsweep.measure.summary import cell_identity, judged, summary_body
from specsweep.records.base import RecordError, read
from specsweep.records.crossover import Crossover
from specsweep.sim.engine import parse_schedule
from specsweep.sim.profile import Profile, load_profile
from specsweep.virtual.fit import Target, mean_field_tok_s
from specsweep.virtual.predict import CLIENT_TURNAROUND_S, level_records, run_level

__all__ = ["PlannedSweep", "plan_sweep", "virtual_cell"]

SOURCE = "simulated (virtual time)"


@dataclass
class PlannedSweep:
    """One planned sweep of a variant: what it measures, what it costs, what it answers."""

    mode: str  # "fixed" or "adaptive"
    levels: list[int]
    requests: dict[int, int]  # measured requests per level and repeat
    measure_s: dict[str, float]  # per arm: levels in virtual time + server starts
    server_starts: dict[str, int]
    rounds: list[dict[str, Any]] = field(default_factory=list)  # adaptive rounds: added levels, why it stopped
    crossover: dict[str, dict[str, Any]] = field(default_factory=dict)  # per speculative arm
    schedules: dict[str, Any] = field(default_factory=dict)  # per family: the derived schedule (None: none)
    proof: dict[str, Any] = field(default_factory=dict)  # per family: the policy arm against the best fixed arm
    instances: int = 1  # server instances per fixed arm (pairing.instances of a sequential variant)
    max_instances: int = 1  # the most the segment rule may take (precision.max_instances; = instances: fixed)
    held_instances: int = 1  # server instances per arm held at once (pairing.instances of an interleaved variant)
    replicated_arms: list[str] = field(default_factory=list)  # the arms whose cost is instances x

    @property
    def total_s(self) -> float:
        return float(sum(self.measure_s.values()))

    def pair_s(self) -> float:
        """One instance pair more (a sequential variant): every replicated arm's server start and sweep."""
        return float(sum(self.measure_s[a] / self.instances for a in self.replicated_arms))

    def one_instance_s(self) -> float:
        """What the sweep would cost with one server instance per arm (no replication)."""
        return float(sum(s / self.instances if a in self.replicated_arms else s for a, s in self.measure_s.items()))

    def width(self, arm: str) -> float | None:
        """hi/lo of the arm's crossover interval, None when it is open or there is none."""
        x = self.crossover.get(arm) or {}
        st = x.get("states") or {}
        if st.get("lo") == st.get("hi") == "within":
            return float(x["hi"] / x["lo"])
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "levels": self.levels,
            "requests": {str(c): n for c, n in self.requests.items()},
            "measure_s": self.measure_s,
            "server_starts": self.server_starts,
            "total_s": self.total_s,
            "instances": self.instances,
            "max_instances": self.max_instances,
            "held_instances": self.held_instances,
            "total_s_one_instance": self.one_instance_s(),
            "rounds": self.rounds,
            "schedules": self.schedules,
            "policy_proof": {
                f: {k: p.get(k) for k in ("verdict", "failing_levels", "holds", "per_level")}
                for f, p in self.proof.items()
            },
            "crossover": {
                a: {k: x.get(k) for k in ("estimate", "lo", "hi", "states")} | {"width": self.width(a)}
                for a, x in self.crossover.items()
            },
        }


def virtual_cell(
    profile: Profile, config: dict[str, Any], variant: str, arm: str, concurrency: int, seed: int
) -> tuple[Cell, float]:
    """One cell measured in virtual time, judged by the config's gates: (cell, its seconds incl. idle probes)."""
    w = config["workload"]
    out = w["output_tokens"]
    # one length stands for a distribution: a uniform range's mean, a reference range's middle (the virtual
    # sweep models the synthetic fixed-length workload, not a dataset's entries)
    bounds = out if isinstance(out, int) else out.get("uniform") or list(out["reference"].values())
    output_tokens = bounds if isinstance(bounds, int) else int(round(np.mean(bounds)))
    arm_cfg = config["arms"][arm]
    speculative = bool(arm_cfg["speculative"])
    if speculative and arm_cfg.get("draft_length"):
        profile = profile.with_params({"speculative.draft_tokens": int(arm_cfg["draft_length"])})
    schedule = parse_schedule(arm_cfg["schedule"]) if speculative and arm_cfg.get("schedule") else None
    n = requests_for(config, concurrency)
    frames, seconds = [], 0.0
    for r in range(config["repeats"]):
        level = run_level(
            profile,
            speculative,
            concurrency,
            n,
            w["input_tokens"],
            output_tokens,
            seed=seed * 1000 + r,
            turnaround_s=CLIENT_TURNAROUND_S,
            stagger=w["stagger"],
            trace=True,
            schedule=schedule,
        )
        df = level_records(level).assign(repeat=r)
        frames.append(df)
        # the closed loop, the idle probe, and the warm-up: max(w, C) requests of <= 32 tokens at C in flight,
        # about 32/output of one turnover of the slots
        e2e = float((df["end_s"] - df["send_s"]).median())
        warmup = (
            math.ceil(warmup_count(w["warmup_requests"], concurrency) / concurrency)
            * e2e
            * min(32, output_tokens)
            / output_tokens
        )
        seconds += float(df["end_s"].max() - df["send_s"].min()) + config["client"]["idle_probe_s"] + warmup
    df = pd.concat(frames, ignore_index=True)
    body = summary_body(
        df,
        concurrency,
        workload={"n_requests": n, "output_tokens": output_tokens, "input_tokens": w["input_tokens"]},
        extra={
            "cell": cell_identity(config["experiment"], variant, arm, concurrency, speculative),
            "source": SOURCE,
            "engine": "sim",
            "level_s": seconds,
        },
    )
    summary = judged(body, df, config["gates"], config["slo"])
    cell = Cell(arm, float(concurrency), Path(variant) / arm / f"c{concurrency}", summary)
    cell.requests = request_arrays(df, concurrency, summary_windows(summary) or None)
    return cell, seconds


def plan_sweep(
    profile: Profile,
    config: dict[str, Any],
    variant: str,
    adaptive: AdaptiveSettings | None,
    seed: int = 0,
    server_start_s: float = 0.0,
) -> PlannedSweep:
    """The fixed grid (`adaptive` None: the config's grid and request counts, adaptive levels off) or adaptive
    levels, measured and analysed in virtual time."""
    config = {**config, "adaptive": {**config.get("adaptive", {}), "enabled": adaptive is not None}}
    arms = fixed_arms(config)
    settings = AnalysisSettings.from_config(config)
    spec_arms = speculative_arms(config)
    grid = sorted(int(c) for c in config["concurrency"])
    cells: dict[str, dict[float, Cell]] = {a: {} for a in arms}
    seconds = dict.fromkeys(arms, 0.0)
    starts = dict.fromkeys(arms, 0)
    n = instances(config, variant)  # each replicated segment measures every level again, on a fresh server
    held = interleaved_instances(config, variant)  # interleaved: each arm's instances up at once, started once

    def measure(levels: list[int]) -> dict[str, Any]:
        first = not any(cells[a] for a in arms)
        for i, a in enumerate(arms):
            if held > 1:
                starts[a] += held if first else 0
                seconds[a] += held * server_start_s if first else 0.0
            else:
                starts[a] += n  # one server start per arm, instance and round (arms take turns on the GPUs)
                seconds[a] += n * server_start_s
            for c in levels:
                cells[a][float(c)], s = virtual_cell(profile, config, variant, a, c, seed * 7919 + i)
                seconds[a] += n * s
        return analyze_variant(cells, settings.baseline_arm, spec_arms, settings, config["experiment"], variant, "sim")

    result = measure(grid)
    rounds: list[dict[str, Any]] = []
    if adaptive is not None:
        for r in range(1, adaptive.max_rounds + 1):
            measured = sorted(int(c) for c in cells[arms[0]])
            step = next_levels(result, measured, grid, adaptive, sum(seconds.values()))
            rounds.append({"round": r, "add": step["add"], "stop": step["stop"]})
            if step["stop"]:
                break
            result = measure(step["add"])
    levels = sorted(int(c) for c in cells[arms[0]])
    schedules = derive_schedules(config, variant, result, cells, settings)
    proof: dict[str, Any] = {}
    if policy_arms(config):
        served = {a: {**config["arms"][a]} for a in policy_arms(config)}
        for a, fam in policy_arms(config).items():
            family = schedules["families"].get(fam, {})
            # a schedule of one K is served by that fixed arm's own static setting: no policy server (as measured)
            served[a]["schedule"] = None if family.get("served_by") else family.get("schedule")
        policy_config = {**config, "arms": {**config["arms"], **served}}
        for i, (a, arm) in enumerate(served.items()):
            if not arm["schedule"]:
                continue
            cells[a], seconds[a], starts[a] = {}, held * server_start_s, held
            for c in levels:
                cells[a][float(c)], s = virtual_cell(profile, policy_config, variant, a, c, seed * 7919 + 101 + i)
                seconds[a] += s
        proof = policy_proof(cells, policy_config["arms"], settings.baseline_arm, settings, schedules)
    return PlannedSweep(
        mode="adaptive" if adaptive is not None else "fixed",
        levels=levels,
        requests={c: requests_for(config, c) for c in levels},
        measure_s=seconds,
        server_starts=starts,
        rounds=rounds,
        crossover={a: result["arms"][a]["crossover"] or {} for a in spec_arms},
        schedules={f: e.get("schedule") for f, e in schedules["families"].items()},
        proof=proof,
        instances=n,
        max_instances=max_instances(config, variant),
        held_instances=held,
        replicated_arms=list(arms),
    )


def _interval(p: PlannedSweep, arm: str) -> str:
    x = p.crossover.get(arm) or {}
    if not x:
        return "none"
    st = x["states"]

    def end(k: str) -> str:
        return {"below_range": "<min", "above_range": ">max"}.get(st[k], f"{x[k]:.3g}" if x[k] is not None else "-")

    w = p.width(arm)
    return f"{end('estimate')} [{end('lo')}, {end('hi')}]" + (f" {w:.2f}x" if w else " open")


def format_plan(plans: list[PlannedSweep], spec_arms: list[str]) -> str:
    lines = []
    for p in plans:
        added = sorted(set(p.levels) - set(plans[0].levels)) if p.mode == "adaptive" else []
        lines.append(
            f"{p.mode:<9} levels {', '.join(map(str, p.levels))}"
            + (f" (added {', '.join(map(str, added))})" if added else "")
        )
        lines.append(f"          requests per level: {', '.join(f'{c}:{n}' for c, n in p.requests.items())}")
        cost = ", ".join(f"{a} {s / 60:.1f} min ({p.server_starts[a]} starts)" for a, s in p.measure_s.items())
        lines.append(f"          measuring: {cost}; total {p.total_s / 60:.1f} min")
        if p.instances > 1:
            lines.append(
                f"          replication: {p.instances} server instances per fixed arm (pairing.instances): "
                f"{p.total_s / 60:.1f} min; with one instance {p.one_instance_s() / 60:.1f} min"
            )
        if p.max_instances > p.instances:
            most = p.total_s + (p.max_instances - p.instances) * p.pair_s()
            lines.append(
                f"          segment rule: a level whose interval is wider than precision.target gets another "
                f"instance pair, up to {p.max_instances} per arm (precision.max_instances): at most {most / 60:.1f} "
                "min, every level at its budget"
            )
        if p.held_instances > 1:
            lines.append(
                f"          instances: {p.held_instances} server instances per arm, up at once (pairing.instances, "
                "interleaved): that many server starts and servers' memory, the same measuring time"
            )
        for a in spec_arms:
            lines.append(f"          {a}: crossover {_interval(p, a)}")
        for fam, sched in p.schedules.items():
            lines.append(f"          {fam}: schedule {sched}")
            pr = p.proof.get(fam) or {}
            if pr.get("per_level"):
                shown = ", ".join(
                    f"{r['concurrency']:g}: {r['ratio']:.3f} [{r['ratio_lo']:.3f}, {r['ratio_hi']:.3f}]"
                    if r["ratio_lo"] is not None
                    else f"{r['concurrency']:g}: -"
                    for r in pr["per_level"]
                )
                lines.append(f"          {pr['policy_arm']} / best fixed arm: {shown}")
                lines.append(f"          policy: {pr['verdict']}")
        if p.rounds:
            lines.append(
                "          rounds: "
                + "; ".join(
                    f"{r['round']}: +{r['add'] or 'nothing'}" + (f" ({r['stop']})" if r["stop"] else "")
                    for r in p.rounds
                )
            )
    return "\n".join(lines)


def plausible_members(profile: Profile, config: dict[str, Any], n: int) -> list[Profile]:
    """Up to `n` of the profile's plausible profiles (`reference.uncertainty.ensemble`, `virtual.uncertainty`):
    sorted by their speculative-over-baseline throughput at the grid's lowest level (mean field, fast), the two
    ends and evenly spaced ones between, so the plans span what the data leave open. None without an ensemble."""
    ensemble = ((profile.reference or {}).get("uncertainty") or {}).get("ensemble") or []
    if not ensemble or n < 1:
        return []
    w = config["workload"]
    out = w["output_tokens"] if isinstance(w["output_tokens"], int) else None
    out = out or int(np.mean(w["output_tokens"].get("uniform") or list(w["output_tokens"]["reference"].values())))
    c = int(min(config["concurrency"]))
    members = [profile.with_params(m) for m in ensemble]

    def speedup(m: Profile) -> float:
        ts = [Target(spec, "closed_loop", c, 0.0, w["input_tokens"], out, 2 * c) for spec in (False, True)]
        return mean_field_tok_s(m, ts[1]) / mean_field_tok_s(m, ts[0])

    ranked = sorted(members, key=speedup)
    picks = sorted({round(i * (len(ranked) - 1) / max(1, n - 1)) for i in range(n)})
    return [ranked[i] for i in picks]


MOST_UNITS = 1000  # a level needing more is reported as more than this


@dataclass(frozen=True)
class LevelNeed:
    """What one level of a measured run implies for a target: its units (interleaved rounds, or instance pairs of
    a sequential variant) at the variance it measured, and at that variance's own 95% interval."""

    arm: str
    concurrency: float
    unit: str  # "round" or "instance"
    measured: int  # the units its interval rested on
    df: int
    need: int | None  # None: more than MOST_UNITS
    need_lo: int | None
    need_hi: int | None
    speedup: float | None = None  # what the level measured
    unit_var: float | None = None  # one unit's log-ratio variance, as measured
    decide: int | None = None  # units its verdict needs (interval outside 1 +- margin); None: within the margin

    def half_width_at(self, units: int, confidence: float = 0.95) -> float | None:
        """The half-width `units` would give at the measured variance."""
        if self.unit_var is None or units < 2:
            return None
        t = float(sps.t.ppf(0.5 + confidence / 2, units - 1))
        return math.expm1(t * math.sqrt(self.unit_var / units))

    def shown(self) -> str:
        def n(x: int | None) -> str:
            return str(x) if x is not None else f">{MOST_UNITS}"

        return f"{self.concurrency:g}: {n(self.need)} [{n(self.need_lo)}, {n(self.need_hi)}]"


def decide_target(speedup: float | None, margin: float) -> float | None:
    """The half-width at which a level measuring `speedup` has its verdict (its interval outside 1 +- margin);
    None where the speedup lies within the margin (only the target decides it there)."""
    if speedup is None or not speedup > 0:
        return None
    if speedup > 1 + margin:
        return speedup / (1 + margin) - 1
    if speedup < 1 - margin:
        return (1 - margin) / speedup - 1
    return None


def level_needs(measured: Crossover, target: float, confidence: float = 0.95, margin: float = 0.02) -> list[LevelNeed]:
    """Per speculative arm and level of a measured run: the units its own paired interval implies for `target`.
    One unit's variance is the interval's squared standard error times its units; with few degrees of freedom
    that variance is itself uncertain (a chi-square on df), so the need is given with the range its 95% interval
    implies: two instances (one degree of freedom) cannot say much, and the range says so."""
    out = []
    for arm, result in measured.arms.items():
        for row in result.per_level:
            p = row.paired
            if p is None or p.log_se is None or p.df < 1 or p.blocks < 1:
                continue
            # interleaved instances that showed no effect were pooled: the interval rests on their rounds
            # (df + 1 of them), not on the instances it counts in `blocks`
            unit, units = ("round", p.df + 1) if p.instance_effect is False else (p.unit, p.blocks)
            var = p.log_se**2 * units
            lo, hi = (p.df * var / float(sps.chi2.ppf(q, p.df)) for q in (0.5 + confidence / 2, 0.5 - confidence / 2))
            need, need_lo, need_hi = (units_for(v, target, confidence, MOST_UNITS) for v in (var, lo, hi))
            goal = decide_target(row.speedup, margin)
            decide = units_for(var, goal, confidence, MOST_UNITS) if goal else None
            out.append(
                LevelNeed(arm, row.concurrency, unit, units, p.df, need, need_lo, need_hi, row.speedup, var, decide)
            )
    return out


class PlanError(ValueError):
    """A config or request `specsweep plan` cannot plan; the message names what to change."""


@dataclass
class ConfigPlan:
    """A config's variant planned `seeds` times, each time without and with adaptive rounds."""

    variant: str
    profile: Profile
    adaptive: AdaptiveSettings
    spec_arms: list[str]
    server_start_s: float
    runs: list[list[PlannedSweep]]  # per seed: [fixed grid, adaptive]
    start_from: str = "--server-start-s"  # where server_start_s came from
    plausible: list[PlannedSweep] = field(default_factory=list)  # the fixed grid on plausible profiles (seed 0)
    ensemble_size: int = 0  # the profile's plausible profiles, of which `plausible` planned some
    target: float | None = None  # the 95% half-width to reach (--effect, else precision.target)
    noise_from: str | None = None  # a measured run's crossover.json (--noise-from)
    measured_variant: str | None = None  # the variant that run measured
    needs: list[LevelNeed] = field(default_factory=list)  # what its levels imply for the target
    budget_s: float | None = None  # --budget-min: the GPU time to spend on this variant

    def as_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "profile": self.profile.name,
            "server_start_s": self.server_start_s,
            "server_start_from": self.start_from,
            "runs": [[p.as_dict() for p in pair] for pair in self.runs],
            "plausible": [p.as_dict() for p in self.plausible],
            "ensemble_size": self.ensemble_size,
            "precision": {
                "target": self.target,
                "noise_from": self.noise_from,
                "measured_variant": self.measured_variant,
                "levels": [n.__dict__ for n in self.needs],
                "pair_s": self._pair_seconds(),
            },
            "budget": self._budget() if self.budget_s is not None else None,
        }

    def _budget(self) -> dict[str, Any]:
        """What `budget_s` buys a sequential variant: instance pairs past the fixed grid, on this profile and on
        each plausible one, and per level (at a measured run's spread) the half-width they give and whether its
        verdict is decided; and the pairs (and GPU time) a decided answer at every level needs."""
        assert self.budget_s is not None
        grid = self.runs[0][0]
        sweeps = [grid, *self.plausible]
        per_pair = [p.pair_s() for p in sweeps]
        pairs = [
            p.instances + max(-p.instances, math.floor((self.budget_s - p.total_s) / s)) if s > 0 else p.instances
            for p, s in zip(sweeps, per_pair, strict=True)
        ]
        levels = []
        for n in self.needs:
            k = pairs[0]
            hw = n.half_width_at(k)
            levels.append(
                {
                    "arm": n.arm,
                    "concurrency": n.concurrency,
                    "speedup": n.speedup,
                    "half_width": hw,
                    "decided": n.decide is not None and k >= n.decide,
                    "pairs_to_decide": n.decide,
                }
            )
        decide_all = [n.decide for n in self.needs]
        need = None if not decide_all or any(d is None for d in decide_all) else max(decide_all)
        return {
            "budget_s": self.budget_s,
            "fixed_grid_s": [p.total_s for p in sweeps],
            "pair_s": per_pair,
            "pairs": pairs,
            "levels": levels,
            "pairs_for_every_verdict": need,
            "s_for_every_verdict": [p.total_s + (need - p.instances) * s for p, s in zip(sweeps, per_pair, strict=True)]
            if need is not None
            else None,
        }

    def _budget_lines(self) -> list[str]:
        """The budget's account in words (`_budget`)."""
        if self.budget_s is None:
            return []
        grid = self.runs[0][0]
        head = f"budget {self.budget_s / 60:.0f} min of GPU time for variant {self.variant}:"
        if grid.instances < 2 or grid.pair_s() <= 0:
            return [
                f"{head} an interleaved variant: the run budget (budget.run_s) spreads it over the levels as they "
                f"measure; the fixed grid takes {grid.total_s / 60:.1f} min here at min_rounds"
            ]
        b = self._budget()

        def span(values: list[float]) -> str:
            lo, hi = min(values), max(values)
            return f"{lo / 60:.1f} min" if len(values) == 1 or hi - lo < 30 else f"{lo / 60:.1f}-{hi / 60:.1f} min"

        pairs = b["pairs"]
        fits = pairs[0] >= grid.instances
        lines = [
            f"{head} the fixed grid takes {span(b['fixed_grid_s'])} on {grid.instances} instance pairs "
            f"({b['pair_s'][0] / 60:.1f} min a pair)"
            + ("" if len(pairs) == 1 else f"; over the plausible profiles {min(pairs)}-{max(pairs)} pairs fit")
        ]
        if not fits:
            lines.append(
                f"  it falls short of the fixed grid by {(grid.total_s - self.budget_s) / 60:.1f} min "
                f"({max(0, pairs[0])} instance pair(s) fit, and one has no spread across instances): fewer levels "
                "(concurrency) or a larger budget"
            )
            return lines
        lines.append(f"  buys {pairs[0]} instance pairs per level ({pairs[0] - grid.instances} past the grid's)")
        if not b["levels"]:
            lines.append(
                "  what they decide rests on the box's spread: pass a measured run's crossover.json (--noise-from)"
            )
            return lines
        decided = [x for x in b["levels"] if x["decided"]]
        undecided = [x for x in b["levels"] if not x["decided"]]

        def where(rows: list[dict[str, Any]]) -> str:
            return ", ".join(f"{r['arm']} C={r['concurrency']:g}" for r in rows) or "none"

        widest = max((x["half_width"] for x in b["levels"] if x["half_width"] is not None), default=None)
        lines.append(
            f"  at the spread measured in {self.noise_from}: verdicts decided at {len(decided)} of "
            f"{len(b['levels'])} levels; not decided: {where(undecided)}"
            + (f"; the widest interval +-{widest:.1%}" if widest is not None else "")
        )
        if b["pairs_for_every_verdict"] is None:
            lines.append(
                "  a decided answer at every level: not within reach (a level within the decide margin of 1 is "
                "decided by the precision target only)"
            )
        else:
            need_s = b["s_for_every_verdict"]
            lines.append(
                f"  a decided answer at every level needs {b['pairs_for_every_verdict']} instance pairs: "
                f"{span(need_s)} of GPU time"
            )
        return lines

    def _pair_seconds(self) -> list[float]:
        """One more instance pair of a sequential variant: every replicated arm's server start and sweep, on the
        fixed grid (seed 0) and on each plausible profile."""
        return [p.pair_s() for p in [self.runs[0][0], *self.plausible] if p.instances > 1]

    def _precision_lines(self) -> list[str]:
        """The units and, for a sequential variant, the GPU time a target takes at a measured run's spread; without
        one, that it is not planned (virtual time has no host or instance noise to plan it with)."""
        goal = f"+-{self.target:.1%} (95%)" if self.target is not None else "a target"
        if self.noise_from is None:
            return [
                f"precision {goal}: the GPU time to reach it is not planned here: it rests on the box's spread "
                "between server instances and rounds, which virtual time does not have; measure a sweep (or an "
                "A/A) and pass its crossover.json (--noise-from)"
            ]
        if not self.needs:
            return [
                f"precision {goal}: {self.noise_from} has no paired intervals to plan with (a sequential variant "
                "needs pairing.instances >= 2; an interleaved one, its rounds)"
            ]
        other = f" (variant {self.measured_variant})" if self.measured_variant != self.variant else ""
        lines = [f"precision {goal} at the spread measured in {self.noise_from}{other}, per level: need [95% range]"]
        for arm in dict.fromkeys(n.arm for n in self.needs):
            rows = [n for n in self.needs if n.arm == arm]
            unit = "instance pairs" if rows[0].unit == "instance" else "rounds"
            lines.append(f"  {arm} ({unit}, measured {rows[0].measured}): " + ", ".join(n.shown() for n in rows))
        pairs = [n for n in self.needs if n.unit == "instance"]
        per_pair = self._pair_seconds()
        if pairs and per_pair:

            def most(key: str) -> int | None:
                values = [getattr(n, key) for n in pairs]
                return None if any(v is None for v in values) else max(values)

            need, lo, hi = most("need"), most("need_lo"), most("need_hi")
            widest = max(pairs, key=lambda n: n.need if n.need is not None else MOST_UNITS + 1)

            def hours(n: int | None, s: float) -> str:
                return f"{n * s / 3600:.1f} h" if n is not None else f"more than {MOST_UNITS * s / 3600:.0f} h"

            shown = hours(need, per_pair[0])
            line = (
                f"  GPU time: {need if need is not None else '>' + str(MOST_UNITS)} instance pairs "
                f"(C={widest.concurrency:g} decides) x {per_pair[0] / 60:.1f} min a pair = {shown}"
            )
            if len(per_pair) > 1:
                line += (
                    f"; over the plausible profiles {hours(need, min(per_pair[1:]))}-{hours(need, max(per_pair[1:]))}"
                )
            lines.append(line)
            lines.append(
                f"  at the measured spread's 95% interval: {hours(lo, min(per_pair))} to {hours(hi, max(per_pair))}"
                " (a spread measured on few instances is itself uncertain)"
            )
            budget = self.runs[0][0].max_instances
            if need is None or need > budget:
                lines.append(
                    f"  the segment rule's budget (precision.max_instances {budget}) stops short of it: levels then "
                    f"say so; {need if need is not None else 'more than ' + str(MOST_UNITS)} reach it"
                )
            else:
                lines.append(f"  within the segment rule's budget (precision.max_instances {budget})")
        return lines

    def _plausible_lines(self) -> list[str]:
        """The fixed grid's answers over the plausible profiles: each arm's crossover, each family's schedule and
        policy verdict, and the measuring time, as ranges (what `predict` shows as intervals)."""
        if not self.plausible:
            return []
        ps = self.plausible
        mins = [p.total_s / 60 for p in ps]
        lines = [
            f"over {len(ps)} of the profile's {self.ensemble_size} plausible profiles (spanning their C="
            f"{min(ps[0].levels)} speedup; fixed grid, seed 0): measuring {min(mins):.1f}-{max(mins):.1f} min"
        ]

        def tally(answers: list[str]) -> str:
            return "; ".join(f"{a} (x{n})" for a, n in Counter(answers).most_common())

        for a in self.spec_arms:
            lines.append(f"  {a}: crossover {tally([_interval(p, a) for p in ps])}")
        for fam in ps[0].schedules:
            lines.append(f"  {fam}: schedule {tally([json.dumps(p.schedules.get(fam)) for p in ps])}")
            verdicts = [(p.proof.get(fam) or {}).get("verdict") or "no policy arm" for p in ps]
            lines.append(f"  {fam}: policy {tally(verdicts)}")
        return lines

    def format(self) -> str:
        kind = "ILLUSTRATIVE" if self.profile.illustrative else "calibrated"
        a = self.adaptive
        lines = [
            f"plan: variant {self.variant}, profile {self.profile.name} ({kind}), {SOURCE}; server start "
            f"{self.server_start_s:g} s ({self.start_from}); adaptive target {a.target_ratio:g}x, "
            f"{a.max_rounds} rounds, {a.max_levels} levels"
        ]
        for seed, pair in enumerate(self.runs):
            lines += [f"seed {seed}:", format_plan(pair, self.spec_arms)]
        if len(self.runs) > 1:
            for arm in self.spec_arms:
                for i, mode in enumerate(("fixed", "adaptive")):
                    widths = [pair[i].width(arm) for pair in self.runs]
                    known = [w for w in widths if w is not None]
                    mins = [pair[i].total_s / 60 for pair in self.runs]
                    shown = f"median {np.median(known):.2f}x, {min(known):.2f}-{max(known):.2f}x" if known else "open"
                    lines.append(
                        f"{arm} {mode:<8}: interval width {shown} ({len(known)}/{len(widths)} closed); measuring "
                        f"median {np.median(mins):.1f} min"
                    )
        return "\n".join(lines + self._plausible_lines() + self._precision_lines() + self._budget_lines())


def plan_config(
    config: dict[str, Any],
    variant: str | None = None,
    profile: str | None = None,
    seeds: int = 1,
    server_start_s: float | None = None,
    plausible: int = 0,
    noise_from: str | Path | None = None,
    target: float | None = None,
    budget_s: float | None = None,
) -> ConfigPlan:
    """What `specsweep plan` prints: `variant` (default: the config's first) planned with engine seeds
    0..seeds-1, on `profile` (default: the sim variant's own). PlanError names what to change: an open-loop
    config, an unknown variant, a real engine's variant without a profile."""
    if load_mode(config) != "closed":
        raise PlanError(
            f"specsweep plan predicts closed-loop sweeps in virtual time, and load.mode is {load_mode(config)}; "
            "plan the closed-loop sweep (load.mode: closed) or measure the open one"
        )
    variant = variant or next(iter(config["variants"]))
    if variant not in config["variants"]:
        raise PlanError(f"unknown variant {variant!r}; known: {', '.join(config['variants'])}")
    v = config["variants"][variant]
    name = profile or (v.get("profile") if v["engine"] == "sim" else None)
    if name is None:
        raise PlanError(f"variant {variant} runs {v['engine']}: pass --profile (a calibrated profile)")
    prof = load_profile(name)
    adaptive = AdaptiveSettings.from_config(config)
    start_from = "--server-start-s"
    if server_start_s is None:
        server_start_s = v.get("expected_start_s")
        start_from = f"variants.{variant}.expected_start_s"
    if server_start_s is None:
        server_start_s, start_from = 0.0, f"not given: variants.{variant}.expected_start_s or --server-start-s"
    runs = [
        [plan_sweep(prof, config, variant, m, seed, server_start_s) for m in (None, adaptive)] for seed in range(seeds)
    ]
    members = plausible_members(prof, config, plausible)
    on_members = [plan_sweep(m, config, variant, None, 0, server_start_s) for m in members]
    ensemble = len(((prof.reference or {}).get("uncertainty") or {}).get("ensemble") or [])
    target = target if target is not None else (config.get("precision") or {}).get("target")
    measured, needs = None, []
    if noise_from is not None:
        if target is None:
            raise PlanError("--noise-from needs a target: pass --effect (e.g. 0.038) or set precision.target")
        try:
            measured = read(Crossover, noise_from, "pass the crossover.json of a finished run")[0]
        except (OSError, RecordError) as e:
            raise PlanError(f"--noise-from {noise_from}: {e}") from None
        margin = (config.get("precision") or {}).get("decide_margin")
        needs = level_needs(measured, target, margin=0.02 if margin is None else float(margin))
    return ConfigPlan(
        variant,
        prof,
        adaptive,
        speculative_arms(config),
        float(server_start_s),
        runs,
        start_from,
        on_members,
        ensemble,
        target,
        str(noise_from) if noise_from is not None else None,
        measured.variant if measured is not None else None,
        needs,
        budget_s,
    )
