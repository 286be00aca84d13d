"""The same arm across variants (e.g. cu128 vs cu130-fusion), level by level.

For each arm and level: each variant's value and its ratio to the reference variant with a bootstrap interval
(oriented so that > 1 means the variant is better than the reference), plus each variant's crossover from its
crossover.json when present. Writes comparison.json, comparison_table.csv and plots (`compare_experiment`).
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from specsweep.analysis.bootstrap import METRICS, CellBootstrap, bootstrap_cell, percentile_interval
from specsweep.analysis.cells import Cell, find_cells, load_cell
from specsweep.analysis.curve import json_float
from specsweep.analysis.settings import AnalysisSettings
from specsweep.analysis.verdict import crossover_text
from specsweep.io import atomic_write_text
from specsweep.records import CROSSOVER_FIX, Crossover, read

__all__ = ["COMPARED", "compare_experiment", "compare_variants", "format_compare"]

COMPARED = ("aggregate_tok_s", "per_request_tok_s_mean", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s")


def _load_variant(
    root: Path, arms: list[str] | None, levels: list[float] | None, settings: AnalysisSettings
) -> dict[str, dict[float, Cell]]:
    """A variant's cells, judged by the config's gates and SLOs as they are read."""
    out: dict[str, dict[float, Cell]] = {}
    for arm, by_level in find_cells(root, arms, levels).items():
        out[arm] = {
            c: load_cell(d, arm=arm, concurrency=c, gates=settings.gates, slos=settings.slo_ms)
            for c, d in by_level.items()
        }
    return out


def compare_variants(
    variants: dict[str, dict[str, dict[float, Cell]]],
    settings: AnalysisSettings,
    arms: list[str] | None = None,
    crossovers: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Ratios of each variant to the first (the reference), per arm, level and metric, with intervals."""
    names = list(variants)
    ref = names[0]
    crossovers = crossovers or {}
    shared = set.intersection(*(set(v) for v in variants.values())) if variants else set()
    arm_list = [a for a in (arms or sorted(shared)) if a in shared]
    cache: dict[str, CellBootstrap] = {}

    def boot(cell: Cell) -> CellBootstrap:
        k = f"{cell.path}"
        if k not in cache:
            cache[k] = bootstrap_cell(cell, settings.replicates, settings.seed, settings.slo)
        return cache[k]

    specs = {m.name: m for m in METRICS}
    result: dict[str, Any] = {
        "reference": ref,
        "variants": names,
        "arms": {},
        "confidence": settings.confidence,
        "replicates": settings.replicates,
        "sources": {v: sorted({c.source for a in variants[v].values() for c in a.values()}) for v in names},
    }
    for arm in arm_list:
        levels = sorted(set.union(*(set(variants[v][arm]) for v in names)))
        rows = []
        for c in levels:
            row: dict[str, Any] = {"concurrency": json_float(c), "cells": {}}
            ref_cell = variants[ref][arm].get(c)
            for v in names:
                cell = variants[v][arm].get(c)
                entry: dict[str, Any] = {
                    "key": cell.key if cell else None,
                    "valid": cell.valid if cell else None,
                }
                if cell is not None:
                    b = boot(cell)
                    entry["values"] = {m: json_float(b.point[m]) for m in COMPARED}
                    usable = ref_cell is not None and (settings.include_invalid or (cell.valid and ref_cell.valid))
                    if v != ref and usable:
                        rb = boot(ref_cell)
                        ratios = {}
                        for m in COMPARED:
                            hib = specs[m].higher_is_better
                            with np.errstate(invalid="ignore", divide="ignore"):
                                pt = b.point[m] / rb.point[m] if hib else rb.point[m] / b.point[m]
                                reps = b.replicates[m] / rb.replicates[m] if hib else rb.replicates[m] / b.replicates[m]
                            with warnings.catch_warnings():
                                warnings.simplefilter("ignore", RuntimeWarning)
                                lo, hi = percentile_interval(reps, settings.confidence)
                            has = b.has_interval[m] and rb.has_interval[m]
                            ratios[m] = {
                                "ratio": json_float(pt),
                                "lo": json_float(lo) if has else None,
                                "hi": json_float(hi) if has else None,
                            }
                        entry["vs_reference"] = ratios
                row["cells"][v] = entry
            rows.append(row)
        result["arms"][arm] = {"levels": [json_float(c) for c in levels], "rows": rows}
    result["crossovers"] = {
        v: {
            a: {
                "crossover": ar.get("crossover"),
                "crossings": ar.get("crossings"),
                "monotone": ar.get("monotone"),
                "policy": (x.get("policy") or {}).get(a),
                "verdict": ar.get("verdict"),
            }
            for a, ar in x.get("arms", {}).items()
        }
        for v, x in crossovers.items()
    }
    result["orientation"] = "ratio > 1: the variant is better than the reference (throughput v/ref, latency ref/v)"
    return result


def _fmt(v: float | None, nd: int = 4) -> str:
    return "-" if v is None else f"{v:.{nd}g}"


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    ref = result["reference"]
    for arm, a in result["arms"].items():
        for r in a["rows"]:
            for v, e in r["cells"].items():
                if v == ref:
                    continue
                vs = (e.get("vs_reference") or {}).get("aggregate_tok_s", {})
                tp = (e.get("vs_reference") or {}).get("tpot_p50_s", {})
                refv = (r["cells"].get(ref, {}).get("values") or {}).get("aggregate_tok_s")
                rows.append(
                    {
                        "arm": arm,
                        "concurrency": r["concurrency"],
                        "reference": ref,
                        "variant": v,
                        "reference_tok_s": refv,
                        "variant_tok_s": (e.get("values") or {}).get("aggregate_tok_s"),
                        "tok_s_ratio": vs.get("ratio"),
                        "tok_s_ratio_lo": vs.get("lo"),
                        "tok_s_ratio_hi": vs.get("hi"),
                        "tpot_p50_ratio": tp.get("ratio"),
                        "valid": bool(e.get("valid")) and bool(r["cells"].get(ref, {}).get("valid")),
                    }
                )
    return rows


def format_compare(result: dict[str, Any]) -> str:
    """C | ref tok/s | variant tok/s | ratio [CI] | TPOT p50 ratio | valid, per arm and variant."""
    lines = [f"reference: {result['reference']}; {result['orientation']}"]
    for arm in result["arms"]:
        lines.append(f"arm {arm}")
        lines.append(
            f"{'C':>6} | {'variant':<14} | {'ref tok/s':>9} | {'tok/s':>9} | {'ratio [CI]':<24} | "
            f"{'TPOT p50 ratio':>14} | valid"
        )
        for r in (r for r in table_rows(result) if r["arm"] == arm):
            ci = f"{_fmt(r['tok_s_ratio'])} [{_fmt(r['tok_s_ratio_lo'])}, {_fmt(r['tok_s_ratio_hi'])}]"
            lines.append(
                f"{_fmt(r['concurrency']):>6} | {r['variant']:<14} | {_fmt(r['reference_tok_s']):>9} | "
                f"{_fmt(r['variant_tok_s']):>9} | {ci:<24} | {_fmt(r['tpot_p50_ratio']):>14} | "
                f"{'yes' if r['valid'] else 'no'}"
            )
    for v, arms in result["crossovers"].items():
        for a, x in arms.items():
            lines.append(f"{v}/{a}: crossover {crossover_text(x.get('crossover'))}; policy {x.get('policy')}")
    return "\n".join(lines)


def _plot(
    result: dict[str, Any],
    variants: dict[str, dict[str, dict[float, Cell]]],
    out_dir: Path,
    crossovers: dict[str, dict[str, Any]],
) -> list[Path]:
    from specsweep.analysis.plots import _INVALID, log_c_axis, plt, save_figure, source_label

    written: list[Path] = []
    arms = list(result["arms"])
    srcs = sorted({s for v in result["sources"].values() for s in v})
    src = ", ".join(source_label(s) for s in srcs)
    if arms:
        fig, axes = plt.subplots(1, len(arms), figsize=(6.5 * len(arms), 4.5), squeeze=False)
        for ax, arm in zip(axes[0], arms, strict=True):
            for v in result["variants"]:
                cells = variants[v].get(arm, {})
                x = np.array(sorted(cells), dtype=float)
                y = np.array([METRICS[0].value(cells[c].summary) for c in sorted(cells)], dtype=float)
                ok = np.array([cells[c].valid for c in sorted(cells)], dtype=bool)
                ax.plot(x, y, marker="o", label=v)
                if np.any(~ok):
                    ax.plot(x[~ok], y[~ok], **_INVALID, label="invalid cell")
            log_c_axis(ax, [c for v in result["variants"] for c in variants[v].get(arm, {})])
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("concurrency C (requests in flight)")
            ax.set_ylabel("aggregate throughput (output tok/s)")
            ax.set_title(f"arm {arm}")
            ax.legend(fontsize="small")
        fig.suptitle(f"Variants compared, reference {result['reference']} ({src})")
        written += save_figure(fig, out_dir / "comparison_throughput")
    if crossovers:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for v, x in crossovers.items():
            for a, ar in x.get("arms", {}).items():
                m = ar["metrics"][ar["primary_metric"]]
                lv = np.array(ar["levels"], dtype=float)
                if lv.size == 0:
                    continue
                y = np.array([np.nan if s is None else s for s in m["speedup"]], dtype=float)
                lo = np.array([np.nan if s is None else s for s in m["speedup_lo"]], dtype=float)
                hi = np.array([np.nan if s is None else s for s in m["speedup_hi"]], dtype=float)
                (line,) = ax.plot(lv, y, marker="o", label=f"{v}: {a}/{ar['baseline_arm']}")
                ax.fill_between(lv, lo, hi, color=line.get_color(), alpha=0.15)
        ax.axhline(1.0, color="black", linewidth=1, label="break-even (1.0)")
        log_c_axis(ax, [c for x in crossovers.values() for ar in x.get("arms", {}).values() for c in ar["levels"]])
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("concurrency C (requests in flight)")
        ax.set_ylabel("speedup (> 1: speculation better)")
        ax.set_title(f"Speedup of speculative decoding per variant ({src})")
        ax.legend(fontsize="small")
        written += save_figure(fig, out_dir / "comparison_speedup")
    return written


def _csv(result: dict[str, Any]) -> str:
    rows = table_rows(result)
    buf = io.StringIO()
    fields = [
        "arm",
        "concurrency",
        "reference",
        "variant",
        "reference_tok_s",
        "variant_tok_s",
        "tok_s_ratio",
        "tok_s_ratio_lo",
        "tok_s_ratio_hi",
        "tpot_p50_ratio",
        "valid",
    ]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def compare_experiment(
    config: dict[str, Any],
    results_root: Path,
    out_dir: Path,
    variants: list[str] | None = None,
    arms: list[str] | None = None,
    replicates: int | None = None,
    plots: bool = True,
) -> dict[str, Any]:
    """Everything `specsweep compare` does: compare `variants` (default: the config's; the first is the
    reference) under `results_root`, write comparison.json, its table and plots into `out_dir`; returns the
    comparison. ValueError: fewer than two variants; LookupError: a variant has no cells."""
    settings = AnalysisSettings.from_config(config)
    if replicates is not None:
        settings.replicates = replicates
    levels = config.get("concurrency")
    cells: dict[str, dict[str, dict[float, Cell]]] = {}
    crossovers: dict[str, dict[str, Any]] = {}
    names = variants or list((config.get("variants") or {}).keys())
    if len(names) < 2:
        raise ValueError("compare needs at least two variants (--variants or the config's variants)")
    for v in names:
        root = results_root / v
        cells[v] = _load_variant(root, arms, levels, settings)
        if not cells[v]:
            raise LookupError(f"no cells for variant {v} under {root}")
        if (root / "crossover.json").exists():
            crossovers[v] = read(Crossover, root / "crossover.json", CROSSOVER_FIX)[1]
    result = compare_variants(cells, settings, arms, crossovers)
    result["experiment"] = config.get("experiment") or results_root.name
    if plots:
        result["plots"] = [str(p.relative_to(out_dir)) for p in _plot(result, cells, out_dir, crossovers)]
    atomic_write_text(out_dir / "comparison.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
    atomic_write_text(out_dir / "comparison_table.csv", _csv(result))
    return result
