"""The A/A noise floor: how far from 1 two copies of one arm read, per level (`arms: {<name>: {same_as: ...}}`)."""

from __future__ import annotations

import math
from typing import Any

from specsweep.analysis.settings import LEVEL_SYMBOL, AnalysisSettings
from specsweep.analysis.verdict import levels_text

__all__ = ["noise_floor", "within_noise_notes"]


def noise_floor(comparisons: dict[str, tuple[str, dict[str, Any]]], metric: str) -> dict[str, Any] | None:
    """The A/A comparisons (A/A arm -> the arm it repeats and `analyze_arm` of the one against the other): per
    level the ratio and interval, the share of levels whose interval excludes 1 (a verdict that says "different"
    where nothing differs), and the bands: per level, the furthest either end of an A/A interval there strayed
    from 1, made symmetric on the log scale (with several A/A arms, the widest at that level); `band` is the
    widest of them, the set-up's worst level.

    Why per level: an A/A level interval can be wide for a reason of its level alone (two server instances that
    disagree give a t with one degree of freedom: [0.14, 7.5] at C=16 in one vLLM CPU run whose other levels
    read [0.94, 1.66], [0.69, 1.49], [0.88, 1.36]); one band for all levels made every level "within the noise"."""
    if not comparisons:
        return None
    out, judged, excluding = {}, 0, 0
    per_level: dict[float, float] = {}
    for aa, (twin, res) in comparisons.items():
        rows = []
        for r in res["per_level"]:
            lo, hi = r.get("speedup_lo"), r.get("speedup_hi")
            row = {"concurrency": r["concurrency"], "ratio": r.get("speedup"), "lo": lo, "hi": hi}
            if r["used"] and lo is not None and hi is not None and lo > 0:
                judged += 1
                row["excludes_one"] = bool(lo > 1.0 or hi < 1.0)
                excluding += row["excludes_one"]
                c, half_c = float(r["concurrency"]), max(abs(math.log(lo)), abs(math.log(hi)))
                per_level[c] = max(per_level.get(c, 0.0), half_c)
            else:
                row["excludes_one"] = None
            rows.append(row)
        out[aa] = {"of": twin, "per_level": rows}
    half = max(per_level.values()) if per_level else None
    return {
        "metric": metric,
        "comparisons": out,
        "levels_judged": judged,
        "levels_excluding_one": excluding,
        "false_verdict_share": excluding / judged if judged else None,
        "band": {"lo": math.exp(-half), "hi": math.exp(half)} if half is not None else None,
        "bands": [{"concurrency": c, "lo": math.exp(-h), "hi": math.exp(h)} for c, h in sorted(per_level.items())],
    }


def within_noise_notes(arm: dict[str, Any], settings: AnalysisSettings) -> list[str]:
    """Mark each used level of one arm's analysis `within_noise` (its speedup inside that level's A/A band, None
    where no band judged it) and say which levels are within the noise, and which have no band."""
    inside, unjudged = [], []
    for row in arm["per_level"]:
        sp, band = row.get("speedup"), settings.noise_band_at(row["concurrency"])
        if sp is None or not row["used"]:
            row["within_noise"] = None
        elif band is None:
            row["within_noise"] = None
            unjudged.append(row["concurrency"])
        else:
            row["within_noise"] = bool(band[0] <= sp <= band[1])
            if row["within_noise"]:
                inside.append(f"{row['concurrency']:g} [{band[0]:.3g}, {band[1]:.3g}]")
    sym = LEVEL_SYMBOL[settings.load]
    notes = []
    if inside:
        notes.append(
            f"{sym}={', '.join(inside)}: within the noise (inside that level's A/A band): no better or "
            "worse than the baseline as far as this set-up can tell"
        )
    if unjudged:
        notes.append(
            f"{sym}={levels_text(unjudged)}: no A/A band (the A/A comparison did not judge the level): "
            "the noise there is not known"
        )
    return notes
