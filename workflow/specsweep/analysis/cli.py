"""`specsweep crossover`: a variant's crossover.json, crossover_table.csv, plots and policy.yaml.

Runs standalone too: `python -m specsweep.analysis.cli --variant V --cells-root DIR --out-dir DIR`.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from specsweep.analysis.analyze import AnalysisSettings, analyze_variant, crossover_text, levels_text
from specsweep.analysis.cells import Cell, find_cells, load_cell
from specsweep.analysis.policy import choose_threshold, dump_yaml, policy_document
from specsweep.io import atomic_write_text

__all__ = [
    "add_arguments",
    "atomic_write_text",
    "format_table",
    "load_config",
    "main",
    "run",
    "run_crossover",
    "server_args",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", required=True, help="variant name (a key of config 'variants')")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--cells-root", type=Path, help="directory holding <arm>/c<C>/summary.json")
    src.add_argument("--summaries", type=Path, nargs="+", help="explicit summary.json paths (one per cell)")
    parser.add_argument("--config", help="resolved config: a YAML/JSON file or inline JSON (arms, levels, analysis)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where crossover.json, plots, policy go")
    parser.add_argument("--experiment", help="experiment name (default: config, else the cells' summaries)")
    parser.add_argument("--baseline-arm", help="default: the config arm with speculative: false")
    parser.add_argument("--spec-arms", nargs="+", help="default: the config arms with speculative: true")
    parser.add_argument("--replicates", type=int, help="bootstrap replicates (overrides config)")
    parser.add_argument("--seed", type=int, help="bootstrap seed (overrides config)")
    parser.add_argument("--include-invalid", action="store_true", help="use cells marked invalid")
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")


def load_config(value: str | Path | None) -> dict[str, Any]:
    """The config from a YAML/JSON file path, or inline JSON text (as the Snakemake rules pass it)."""
    if value is None or str(value) == "":
        return {}
    text = str(value)
    if not text.lstrip().startswith("{") and Path(text).exists():
        text = Path(text).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SystemExit(f"--config: neither a config file nor inline JSON/YAML: {str(value)[:80]!r}")
    return data


def server_args(config: dict[str, Any], variant: str, arm: str) -> dict[str, Any]:
    """The arm's config with `server_args` merged as the engine sees them: variant, arm, variant-per-arm."""
    v = (config.get("variants") or {}).get(variant) or {}
    a = dict((config.get("arms") or {}).get(arm) or {})
    argv = [
        *(v.get("server_args") or []),
        *(a.get("server_args") or []),
        *((v.get("arm_server_args") or {}).get(arm) or []),
    ]
    a["server_args"] = [str(x) for x in argv]
    return a


def _arm_roles(
    config: dict[str, Any],
    arms_found: list[str],
    baseline: str | None,
    spec: list[str] | None,
    default_base: str,
) -> tuple[str, list[str]]:
    """Baseline and speculative arms: flags first, then config (`analysis.baseline_arm`, `speculative:`)."""
    arms_cfg = config.get("arms") or {}
    if baseline is None:
        plain = [a for a, c in arms_cfg.items() if not (c or {}).get("speculative", False)]
        baseline = default_base if default_base in arms_cfg or not plain else plain[0]
    if spec is None:
        spec = [a for a, c in arms_cfg.items() if (c or {}).get("speculative", False)] or [
            a for a in arms_found if a != baseline
        ]
    return baseline, [a for a in spec if a != baseline]


def _fmt(v: float | None, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}g}"


def _crossover_line(name: str, ar: dict[str, Any]) -> str:
    x = ar.get("crossover")
    m = ar["metrics"][ar["primary_metric"]]
    if x is None:
        return f"{name}: no usable levels"
    if not ar["crossings"]:
        sm = ar["smallest_margin"]
        inconclusive = (ar.get("verdict") or {}).get("kind") == "inconclusive"
        where = f"level measured validly (C={levels_text(ar['levels'])})" if inconclusive else "level"
        return (
            f"{name}: no crossing: {ar['winner']} wins at every {where}; smallest margin "
            f"{_fmt(sm['speedup'])} [{_fmt(sm['lo'])}, {_fmt(sm['hi'])}] at C={_fmt(sm['concurrency'])}"
        )
    parts = [
        f"C={_fmt(c['concurrency'])} ({c['direction']}) [{_fmt(c['lo'])}, {_fmt(c['hi'])}]" for c in ar["crossings"]
    ]
    mono = "" if ar["monotone"] else " NON-MONOTONE"
    return (
        f"{name}: crossover ({m['orientation']} {ar['primary_metric']}) {crossover_text(x)}{mono}; "
        "crossings: " + "; ".join(parts) + _interpolation_text(x)
    )


def _interpolation_text(x: dict[str, Any]) -> str:
    """' (interpolants: loglinear 22, linear 24.4, ...; interval widened)' when they disagree, else ''."""
    ip = x.get("interpolation") or {}
    est = ip.get("estimates") or {}
    if not ip.get("widened") and ip.get("estimate_min") == ip.get("estimate_max"):
        return ""
    shown = ", ".join(f"{k} {_fmt(v)}" for k, v in est.items())
    return f" (interpolants: {shown}{'; interval widened to their envelope' if ip.get('widened') else ''})"


def _policy_line(name: str, ar: dict[str, Any], rule: str) -> str:
    """'policy: speculate while running requests <= N (...)', or INCONCLUSIVE with what to measure."""
    t = choose_threshold(ar, rule)
    if t["threshold"] is not None:
        return f"{name}: policy: speculate while running requests <= {t['threshold']} ({t['reason']})"
    v = ar.get("verdict") or {}
    todo = []
    if v.get("add_levels"):
        todo.append(f"add levels: {levels_text(v['add_levels'])}")
    if v.get("remeasure_levels"):
        todo.append(f"re-measure: {levels_text(v['remeasure_levels'])}")
    return f"{name}: policy: INCONCLUSIVE, no threshold ({t['reason']})" + ("; " + "; ".join(todo) if todo else "")


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (speculative arm, level), for the printed table and crossover_table.csv."""
    rows = []
    for name, ar in result["arms"].items():
        invalid = {(e["arm"], e["concurrency"]): e for e in ar["invalid_cells"]}
        for r in ar["per_level"]:
            why = [
                f"{a}: {','.join(invalid[(a, r['concurrency'])]['reasons']) or 'invalid'}"
                for a in (ar["baseline_arm"], name)
                if (a, r["concurrency"]) in invalid
            ]
            missing = [m["arm"] for m in ar["missing_cells"] if m["concurrency"] == r["concurrency"]]
            valid = (
                "yes" if not why and not missing else "no (" + "; ".join(why + [f"{a}: missing" for a in missing]) + ")"
            )
            rows.append(
                {
                    "arm": name,
                    "concurrency": r["concurrency"],
                    "baseline_tok_s": r.get("baseline_value"),
                    "spec_tok_s": r.get("spec_value"),
                    "speedup": r.get("speedup"),
                    "speedup_lo": r.get("speedup_lo"),
                    "speedup_hi": r.get("speedup_hi"),
                    "used": r["used"],
                    "valid": valid,
                }
            )
    return rows


def format_table(result: dict[str, Any]) -> str:
    """The compact table (C | baseline tok/s | spec tok/s | speedup [95% CI] | valid) and crossover line."""
    lines = []
    conf = int(round(100 * result["bootstrap"]["confidence"]))
    for name, ar in result["arms"].items():
        lines.append(
            f"{result.get('experiment')}/{result.get('variant')}: {name} vs {ar['baseline_arm']} "
            f"({result.get('source')}; metric {ar['primary_metric']})"
        )
        lines.append(f"{'C':>6} | {'baseline tok/s':>14} | {'spec tok/s':>10} | {f'speedup [{conf}% CI]':<24} | valid")
        for r in (r for r in table_rows(result) if r["arm"] == name):
            ci = f"{_fmt(r['speedup'])} [{_fmt(r['speedup_lo'])}, {_fmt(r['speedup_hi'])}]"
            lines.append(
                f"{_fmt(r['concurrency'], 6):>6} | {_fmt(r['baseline_tok_s'], 5):>14} | "
                f"{_fmt(r['spec_tok_s'], 5):>10} | {ci:<24} | {r['valid']}"
            )
        lines.append(_crossover_line(name, ar))
        if ar.get("interval_note"):
            lines.append(f"{name}: note: {ar['interval_note']}")
        for note in (ar.get("verdict") or {}).get("notes") or []:
            lines.append(f"{name}: note: {note}")
        lines.append(_policy_line(name, ar, result.get("policy_rule", "crossover_lower")))
    return "\n".join(lines)


def _table_csv(result: dict[str, Any]) -> str:
    buf = io.StringIO()
    rows = table_rows(result)
    fields = [
        "arm",
        "concurrency",
        "baseline_tok_s",
        "spec_tok_s",
        "speedup",
        "speedup_lo",
        "speedup_hi",
        "used",
        "valid",
    ]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _load_cells(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, dict[float, Cell]]:
    levels = config.get("concurrency")
    arms = list((config.get("arms") or {}).keys()) or None
    cells: dict[str, dict[float, Cell]] = {}
    if args.summaries:
        for p in args.summaries:
            cell = load_cell(p)
            cells.setdefault(cell.arm, {})[cell.concurrency] = cell
        return cells
    for arm, by_level in find_cells(args.cells_root, arms, levels).items():
        for c, d in by_level.items():
            cells.setdefault(arm, {})[c] = load_cell(d, arm=arm, concurrency=c)
    return cells


def run_crossover(args: argparse.Namespace) -> dict[str, Any]:
    """Everything `specsweep crossover` does; returns the crossover.json body."""
    config = load_config(args.config)
    settings = AnalysisSettings.from_config(config)
    if args.replicates is not None:
        settings.replicates = args.replicates
    if args.seed is not None:
        settings.seed = args.seed
    if args.include_invalid:
        settings.include_invalid = True
    cells = _load_cells(args, config)
    if not cells:
        raise SystemExit(f"no cells found for variant {args.variant}")
    baseline, spec_arms = _arm_roles(config, sorted(cells), args.baseline_arm, args.spec_arms, settings.baseline_arm)
    variant_cfg = (config.get("variants") or {}).get(args.variant) or {}
    any_summary = next(iter(next(iter(cells.values())).values())).summary
    engine = str(variant_cfg.get("engine") or any_summary.get("engine") or "")
    experiment = args.experiment or config.get("experiment") or any_summary.get("cell", {}).get("experiment", "")
    result = analyze_variant(
        cells, baseline, spec_arms, settings, experiment=experiment, variant=args.variant, engine=engine
    )
    result["policy_rule"] = settings.policy_rule
    out: Path = args.out_dir
    arms_cfg = {a: server_args(config, args.variant, a) for a in spec_arms}
    policy = policy_document(result, engine, arms_cfg, variant_cfg, settings.policy_rule)
    result["policy"] = {
        a: {"threshold": p["threshold"], "rule": p["rule"], "verdict": p["verdict"]} for a, p in policy["arms"].items()
    }
    for a, p in policy["arms"].items():
        result["arms"][a]["threshold"] = p["threshold"]
    if not args.no_plots:
        from specsweep.analysis.plots import plot_variant

        files = plot_variant(result, cells, out / "plots")
        result["plots"] = [str(p.relative_to(out)) for p in files]
    atomic_write_text(out / "crossover.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
    atomic_write_text(out / "crossover_table.csv", _table_csv(result))
    atomic_write_text(out / "policy.yaml", dump_yaml(policy))
    return result


def run(args: argparse.Namespace) -> int:
    result = run_crossover(args)
    print(format_table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specsweep crossover", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
