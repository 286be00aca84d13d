"""An open or trace sweep's answer in running requests: the unit the policy acts on.

Why: an open sweep's levels are request rates (a trace's, time scales), but an engine's speculation switch
(vLLM's per-batch-size draft length, SGLang's adaptive tiers) sees the number of running requests in the batch
it steps. Each cell measures the requests it held in flight over its steady window (the in-flight curve, with
Little's law as a check); the batch is that count while the engine is busy (`running_requests.busy_mean`: at a
low rate the plain mean counts idle time as zero, and a threshold read from it would fall below the batch of
one that every step has). The crossover found in the level's unit is mapped through those curves: at a level
the two arms hold different numbers of running requests (the faster one fewer), so the mapping uses the mean
of the two arms' curves and keeps each arm's own. A closed sweep needs none of this: its level is the
running-request count.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from specsweep.analysis.cells import Cell

__all__ = ["running_requests_view"]


def _running(cell: Cell | None) -> float:
    """The cell's running requests as the engine's batch: the in-flight mean while any request runs."""
    if cell is None:
        return math.nan
    v = ((cell.summary.get("metrics") or {}).get("running_requests") or {}).get("busy_mean")
    return float(v) if isinstance(v, int | float) else math.nan


def _plain(cell: Cell | None) -> float | None:
    """The time-weighted in-flight mean over the whole window (idle time counted as zero)."""
    v = ((cell.summary.get("metrics") or {}).get("running_requests") or {}).get("mean") if cell else None
    return float(v) if isinstance(v, int | float) else None


def _littles(cell: Cell | None) -> float | None:
    if cell is None:
        return None
    v = ((cell.summary.get("metrics") or {}).get("running_requests") or {}).get("littles_law")
    return float(v) if isinstance(v, int | float) else None


def _map(levels: np.ndarray, running: np.ndarray, x: float | None) -> float | None:
    """Running requests at level `x`: log-log interpolation between measured levels (None outside them)."""
    if x is None or not math.isfinite(x) or x <= 0:
        return None
    ok = np.isfinite(running) & (running > 0)
    lv, rr = levels[ok], running[ok]
    if lv.size == 0 or x < lv.min() or x > lv.max():
        return None
    if lv.size == 1:
        return float(rr[0])
    return float(np.exp(np.interp(np.log(x), np.log(lv), np.log(rr))))


def _mapped_crossover(x: dict[str, Any] | None, levels: np.ndarray, running: np.ndarray) -> dict[str, Any] | None:
    """The level-unit crossover with its estimate and interval ends in running requests; out-of-range ends
    keep their state (below: 0, above: the largest measured running count), as the level-unit one does."""
    if not x:
        return None
    ok = np.isfinite(running)
    top = float(running[ok].max()) if ok.any() else None
    bottom = float(running[ok].min()) if ok.any() else None
    out: dict[str, Any] = {"states": dict(x["states"]), "min_level": bottom, "max_level": top}
    for end in ("estimate", "lo", "hi"):
        state = x["states"][end]
        if state == "below_range":
            out[end] = 0.0
        elif state == "above_range":
            out[end] = None
        else:
            out[end] = _map(levels, running, x.get(end))
    return out


def running_requests_view(
    arm_result: dict[str, Any], base_cells: dict[float, Cell], spec_cells: dict[float, Cell]
) -> dict[str, Any]:
    """Per level each arm's running requests, and the primary metric's crossover in running requests."""
    used = [float(c) for c in arm_result["levels"]]
    rows = []
    for c in arm_result["configured_levels"]:
        b, s = base_cells.get(c), spec_cells.get(c)
        rows.append(
            {
                "level": c,
                "baseline": _finite(_running(b)),
                "spec": _finite(_running(s)),
                "baseline_mean": _plain(b),
                "spec_mean": _plain(s),
                "baseline_littles_law": _littles(b),
                "spec_littles_law": _littles(s),
            }
        )
    lv = np.array(used, dtype=float)
    base = np.array([_running(base_cells.get(c)) for c in used], dtype=float)
    spec = np.array([_running(spec_cells.get(c)) for c in used], dtype=float)
    mean = np.nanmean(np.vstack([base, spec]), axis=0) if lv.size else np.array([])
    x = arm_result["metrics"][arm_result["primary_metric"]].get("crossover")
    crossover = _mapped_crossover(x, lv, mean)
    if crossover is not None:
        crossover["by_arm"] = {
            "baseline": {e: _map(lv, base, (x or {}).get(e)) for e in ("estimate", "lo", "hi")},
            "spec": {e: _map(lv, spec, (x or {}).get(e)) for e in ("estimate", "lo", "hi")},
        }
    return {
        "per_level": rows,
        "levels": [_finite(v) for v in mean],  # running requests at each used level (mean of the arms)
        "crossover": crossover,
        "method": (
            "in-flight count while any request runs (the engine's batch), time-weighted over each cell's steady "
            "window; log-log interpolation by level"
        ),
    }


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None
