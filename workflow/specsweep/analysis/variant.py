"""A variant's cells, judged as they are read, and compared arm by arm: the library half of `specsweep crossover`.

`analysis.report`, `analysis.schedule` and `analysis.adaptive` all start from `analyze_cells`; it lives here so that
none of them imports another for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specsweep.analysis.analyze import analyze_variant
from specsweep.analysis.cells import Cell, find_cells, load_cell
from specsweep.analysis.settings import AnalysisSettings
from specsweep.config import configured_levels


def _arm_roles(
    config: dict[str, Any],
    arms_found: list[str],
    baseline: str | None,
    spec: list[str] | None,
    default_base: str,
) -> tuple[str, list[str]]:
    """Baseline and speculative arms: flags first, then config (`analysis.baseline_arm`, `speculative:`)."""
    arms_cfg = {
        a: c for a, c in (config.get("arms") or {}).items() if not ((c or {}).get("policy") or (c or {}).get("same_as"))
    }
    arms_found = [a for a in arms_found if not ((config.get("arms") or {}).get(a) or {}).get("policy")]
    if baseline is None:
        plain = [a for a, c in arms_cfg.items() if not (c or {}).get("speculative", False)]
        baseline = default_base if default_base in arms_cfg or not plain else plain[0]
    if spec is None:
        spec = [a for a, c in arms_cfg.items() if (c or {}).get("speculative", False)] or [
            a for a in arms_found if a != baseline
        ]
    return baseline, [a for a in spec if a != baseline]


def _load_cells(
    config: dict[str, Any],
    settings: AnalysisSettings,
    summaries: list[Path] | None = None,
    cells_root: Path | None = None,
) -> dict[str, dict[float, Cell]]:
    """The variant's cells, each judged by the config's gates and SLOs as it is read: the given summaries, or
    those under `cells_root` at the configured arms and levels."""
    judge = {"gates": settings.gates, "slos": settings.slo_ms}
    cells: dict[str, dict[float, Cell]] = {}
    if summaries:
        for p in summaries:
            cell = load_cell(p, **judge)
            cells.setdefault(cell.arm, {})[cell.concurrency] = cell
        return cells
    arms = list((config.get("arms") or {}).keys()) or None
    for arm, by_level in find_cells(cells_root, arms, configured_levels(config)).items():
        for c, d in by_level.items():
            cells.setdefault(arm, {})[c] = load_cell(d, arm=arm, concurrency=c, **judge)
    return cells


def analyze_cells(
    config: dict[str, Any],
    variant: str,
    summaries: list[Path] | None = None,
    cells_root: Path | None = None,
    settings: AnalysisSettings | None = None,
    baseline_arm: str | None = None,
    spec_arms: list[str] | None = None,
    experiment: str | None = None,
) -> tuple[dict[str, Any], dict[str, dict[float, Cell]]]:
    """Judge a variant's cells and compare each speculative arm with the baseline: (result, cells)."""
    settings = settings or AnalysisSettings.from_config(config)
    cells = _load_cells(config, settings, summaries, cells_root)
    if not cells:
        raise SystemExit(f"no cells found for variant {variant}")
    baseline, spec = _arm_roles(config, sorted(cells), baseline_arm, spec_arms, settings.baseline_arm)
    variant_cfg = (config.get("variants") or {}).get(variant) or {}
    any_summary = next(iter(next(iter(cells.values())).values())).summary
    engine = str(variant_cfg.get("engine") or any_summary["engine"])
    experiment = experiment or config.get("experiment") or any_summary["cell"]["experiment"]
    aa = {a: c["same_as"] for a, c in (config.get("arms") or {}).items() if (c or {}).get("same_as") and a in cells}
    result = analyze_variant(
        cells, baseline, spec, settings, experiment=experiment, variant=variant, engine=engine, aa_arms=aa
    )
    return result, cells
