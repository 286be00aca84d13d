"""A variant's crossover: each speculative arm against the baseline, level by level (the body of crossover.json).

Assembly only: the cells are judged as read (`analysis/cells.py`), each level's speedup is the paired estimate
(`analysis/paired.py`) or the two cells' bootstraps, the curve and its crossover come from `analysis/curve.py`,
the verdict from `analysis/verdict.py`, the notes from `analysis/notes.py` and the A/A bands from
`analysis/noise.py`. Plots, policy and the printed table are made from the result (layout in docs/analysis.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from specsweep.analysis.bootstrap import METRICS, THROUGHPUT, CellBootstrap, MetricSpec, bootstrap_cell, cell_rng
from specsweep.analysis.cells import BLOCK_LIFETIMES, MIN_BLOCKS, N_BLOCKS, Cell
from specsweep.analysis.contents import level_content
from specsweep.analysis.crossover import INTERPOLANTS
from specsweep.analysis.curve import json_float, metric_result
from specsweep.analysis.hoststate import HostSplit, host_split
from specsweep.analysis.noise import noise_floor, within_noise_notes
from specsweep.analysis.notes import arm_notes
from specsweep.analysis.outputs import output_match
from specsweep.analysis.paired import PairedEstimate, paired_estimate
from specsweep.analysis.precision import LevelPrecision, level_precision
from specsweep.analysis.running import running_requests_view
from specsweep.analysis.settings import LEVEL_SYMBOL, AnalysisSettings
from specsweep.analysis.verdict import decide_verdict

__all__ = ["analyze_arm", "analyze_variant"]

SCHEMA_VERSION = 1


def _paired_entry(pe: PairedEstimate | None) -> dict[str, Any] | None:
    """How a level's speedup was estimated when its arms were interleaved (None: from separate cells)."""
    if pe is None:
        return None
    out = {
        "blocks": pe.pairs,
        "unit": pe.unit,
        "df": pe.df,
        "spread_dominates": pe.spread_dominates,
        "log_se": pe.log_se if math.isfinite(pe.log_se) else None,
    }
    return out if pe.instance_effect is None else {**out, "instance_effect": pe.instance_effect}


def _as_dict(p: LevelPrecision | HostSplit | None) -> dict[str, Any] | None:
    return p.as_dict() if p is not None else None


def _cell_entry(cell: Cell, included: bool) -> dict[str, Any]:
    return {
        "arm": cell.arm,
        "concurrency": json_float(cell.concurrency),
        "key": cell.key,
        "reasons": cell.invalid_reasons,
        "included": included,
    }


def analyze_arm(
    cells: dict[str, dict[float, Cell]],
    baseline_arm: str,
    spec_arm: str,
    settings: AnalysisSettings,
    cache: dict[str, CellBootstrap] | None = None,
) -> dict[str, Any]:
    """Compare one speculative arm against the baseline arm of the same variant, level by level."""
    cache = {} if cache is None else cache
    base_cells, spec_cells = cells.get(baseline_arm, {}), cells.get(spec_arm, {})
    configured = sorted(set(settings.levels or []) | set(base_cells) | set(spec_cells))
    invalid, missing, per_level = [], [], []
    used: list[float] = []
    for c in configured:
        row: dict[str, Any] = {"concurrency": json_float(c)}
        usable = True
        for role, arm_name, group in (("baseline", baseline_arm, base_cells), ("spec", spec_arm, spec_cells)):
            cell = group.get(c)
            if cell is None:
                missing.append({"arm": arm_name, "concurrency": json_float(c)})
                row[f"{role}_key"], row[f"{role}_valid"] = None, None
                usable = False
                continue
            row[f"{role}_key"], row[f"{role}_valid"] = cell.key, cell.valid
            row[f"{role}_n_requests"] = len(cell.requests) if cell.requests is not None else None
            if not cell.valid:
                invalid.append(_cell_entry(cell, settings.include_invalid))
                usable = usable and settings.include_invalid
        if c in base_cells and c in spec_cells:
            referral = spec_cells[c].summary.get("output_referral")
            if referral and referral.get("against") != base_cells[c].arm:
                referral = None  # referred against another arm's server (a policy level's reference arm)
            row["output_match"] = output_match(
                base_cells[c].outputs, spec_cells[c].outputs, referral, settings.output_tie_nats
            )
        row["content"] = level_content(base_cells.get(c), spec_cells.get(c))
        row["used"] = usable
        per_level.append(row)
        if usable:
            used.append(c)

    def boot(cell: Cell) -> CellBootstrap:
        if cell.key not in cache:
            cache[cell.key] = bootstrap_cell(cell, settings.replicates, settings.seed, settings.slo)
        return cache[cell.key]

    levels = np.array(used, dtype=float)
    base_b = [boot(base_cells[c]) for c in used]
    spec_b = [boot(spec_cells[c]) for c in used]

    def pair(m: MetricSpec, i: int, c: float) -> PairedEstimate | None:
        b, s = base_cells[c], spec_cells[c]
        rng = cell_rng(settings.seed, f"paired/{b.key}/{s.key}/{m.name}")
        return paired_estimate(b, s, base_b[i], spec_b[i], m.name, m.higher_is_better, settings.replicates, rng)

    paired = {m.name: [pair(m, i, c) for i, c in enumerate(used)] for m in METRICS}
    metrics = {
        m.name: metric_result(m, levels, base_b, spec_b, settings.confidence, spec_arm, baseline_arm, paired[m.name])
        for m in METRICS
    }
    prim = metrics[settings.primary_metric]
    pname = settings.primary_metric
    for row in per_level:
        if row["used"]:
            i = used.index(row["concurrency"])
            row.update(
                baseline_value=prim["baseline"][i],
                spec_value=prim["spec"][i],
                speedup=prim["speedup"][i],
                speedup_lo=prim["speedup_lo"][i],
                speedup_hi=prim["speedup_hi"][i],
                baseline_n_repeats=base_b[i].n_repeats.get(pname, 0),
                spec_n_repeats=spec_b[i].n_repeats.get(pname, 0),
                paired=_paired_entry(paired[pname][i]),
                precision=_as_dict(level_precision(spec_cells[used[i]], paired[THROUGHPUT][i], settings.confidence)),
                host_split=_as_dict(host_split(paired[THROUGHPUT][i], settings.confidence)),
            )
        else:  # left out: its point values are still shown (flagged), without an interval
            pm = next(m for m in METRICS if m.name == settings.primary_metric)
            c = row["concurrency"]
            b = pm.value(base_cells[c].summary) if c in base_cells else float("nan")
            s = pm.value(spec_cells[c].summary) if c in spec_cells else float("nan")
            with np.errstate(invalid="ignore", divide="ignore"):
                sp = s / b if pm.higher_is_better else b / s
            row.update(
                baseline_value=json_float(b),
                spec_value=json_float(s),
                speedup=json_float(sp),
                speedup_lo=None,
                speedup_hi=None,
            )
    sources = sorted({cl.source for grp in (base_cells, spec_cells) for cl in grp.values()})
    notes = sorted({n for grp in (base_cells, spec_cells) for cl in grp.values() for n in cl.notes})
    bad = [r["concurrency"] for r in per_level if not r["used"]]
    upward = any(x["direction"] == "up" for x in prim.get("crossings") or [])
    no_interval = [c for c, has in zip(used, prim["interval_available"], strict=True) if not has]
    sym = LEVEL_SYMBOL[settings.load]
    verdict = decide_verdict(
        prim["crossover"],
        used,
        configured,
        bad,
        settings.max_crossover_ratio,
        upward,
        no_interval,
        symbol=sym,
        integer=settings.load == "closed",
    )
    said = arm_notes(
        per_level, used, base_cells, spec_cells, base_b + spec_b, invalid, spec_arm, baseline_arm, settings
    )
    verdict["notes"].extend(said.notes)
    within_only, interval_note = said.within_only, said.interval_note
    return {
        "baseline_arm": baseline_arm,
        "spec_arm": spec_arm,
        "source": sources[0] if len(sources) == 1 else ("mixed" if sources else "unknown"),
        "levels": [json_float(c) for c in used],
        "configured_levels": [json_float(c) for c in configured],
        "cell_keys": {
            "baseline": [base_cells[c].key for c in used],
            "spec": [spec_cells[c].key for c in used],
        },
        "n_repeats": {
            "baseline": [b.n_repeats.get(pname, 0) for b in base_b],
            "spec": [b.n_repeats.get(pname, 0) for b in spec_b],
        },
        "within_run_only": within_only,
        "interval_note": interval_note,
        "per_level": per_level,
        "invalid_cells": invalid,
        "missing_cells": missing,
        "primary_metric": settings.primary_metric,
        # flat copies for trackers: null where out of range (see crossover.states)
        "crossover_concurrency": (prim["crossover"] or {}).get("estimate"),
        "crossover_ci_low": (prim["crossover"] or {}).get("lo"),
        "crossover_ci_high": (prim["crossover"] or {}).get("hi"),
        "crossover": prim["crossover"],
        "interpolation": (prim["crossover"] or {}).get("interpolation"),
        "crossings": prim["crossings"],
        "monotone": prim["monotone"],
        "winner": prim["winner"],
        "output_match_min": said.output_match_min,
        "smallest_margin": prim["smallest_margin"],
        "verdict": verdict,
        "metrics": metrics,
        "notes": notes + ([interval_note] if interval_note else []),
    }


def analyze_variant(
    cells: dict[str, dict[float, Cell]],
    baseline_arm: str,
    spec_arms: list[str],
    settings: AnalysisSettings,
    experiment: str = "",
    variant: str = "",
    engine: str = "",
    aa_arms: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every speculative arm of a variant against its baseline arm: the body of crossover.json. With A/A arms
    (arm -> the arm it repeats), their noise floor first: its bands per level are set on `settings.noise_bands`,
    and every level whose speedup lies inside its level's band reads "within the noise"."""
    cache: dict[str, CellBootstrap] = {}
    aa = {a: (twin, analyze_arm(cells, twin, a, settings, cache)) for a, twin in (aa_arms or {}).items()}
    noise = noise_floor(aa, settings.primary_metric)
    settings.noise_bands = {float(b["concurrency"]): (b["lo"], b["hi"]) for b in (noise or {}).get("bands", [])}
    arms = {a: analyze_arm(cells, baseline_arm, a, settings, cache) for a in spec_arms}
    if noise is not None:
        for ar in arms.values():
            ar["verdict"]["notes"].extend(within_noise_notes(ar, settings))
    if settings.load != "closed":  # the answer in the unit the policy acts on (analysis/running.py)
        for a, ar in arms.items():
            ar["running_requests"] = running_requests_view(ar, cells.get(baseline_arm, {}), cells.get(a, {}))
    sources = sorted({r["source"] for r in arms.values()})
    return {
        "schema_version": SCHEMA_VERSION,
        "experiment": experiment,
        "variant": variant,
        "engine": engine,
        "load": settings.load,  # the levels' unit: closed (concurrency), open (requests/s), trace (time scale)
        "source": sources[0] if len(sources) == 1 else ("mixed" if sources else "unknown"),
        "baseline_arm": baseline_arm,
        "bootstrap": {
            "replicates": settings.replicates,
            "seed": settings.seed,
            "confidence": settings.confidence,
            "method": (
                "per repeat: block bootstrap over equal time blocks of the steady window; R >= 2 repeats: "
                "t(R-1) around the reported value, scale s/sqrt(R) on the log scale, s floored by the "
                "within-repeat block variance; percentile intervals"
            ),
            "throughput_estimator": "tokens delivered in the chosen blocks / their summed length, scaled to summary",
            "blocks": {
                "max_blocks": N_BLOCKS,
                "min_blocks": MIN_BLOCKS,
                "min_block_lifetimes": BLOCK_LIFETIMES,
            },
            "interpolants": list(INTERPOLANTS),
        },
        "max_crossover_ratio": settings.max_crossover_ratio,
        "include_invalid": settings.include_invalid,
        "slo": settings.slo,
        "arms": arms,
        "noise_floor": noise,
    }
