"""From measured draft lengths to a schedule: K per number of running requests, K=0 being plain decoding.

Each speculative arm of the config is a family: its sub-arms `<arm>-k<K>` (or the arm itself, one K) and the
baseline (K=0). Two rules, both conservative towards the smaller K (what a noisy measurement cannot tell
apart, it does not pay to switch on):

- One K (no `draft_lengths`): today's threshold (`policy.choose_threshold`): speculate with K while running
  requests <= N, plain decoding above, as [[1, N, K], [N+1, upper, 0]].
- Several K: per measured level, the best arm by point value, then the smallest K whose ratio to the best has
  an interval reaching 1 (not shown worse); K=0 is within the noise when the best arm's speedup interval
  reaches 1. Between two measured levels the larger K is kept only where it was measured best: going up to a
  smaller K the boundary is the lower level, going up to a larger K it is just below the upper level. Below the
  lowest and above the highest measured level the nearest level's choice holds.

`policy.schedules` in the config replaces the derived schedule (a hand-made one, measured the same way).
An inconclusive family (single K: an inconclusive verdict; several K: no usable level) gets no schedule and no
policy arm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specsweep.analysis import decisions
from specsweep.analysis.analyze import analyze_arm
from specsweep.analysis.bootstrap import CellBootstrap
from specsweep.analysis.cells import Cell
from specsweep.analysis.policy import choose_threshold
from specsweep.analysis.proof import best_fixed
from specsweep.analysis.settings import AnalysisSettings
from specsweep.analysis.unmeasured import unmeasured_range
from specsweep.analysis.variant import analyze_cells
from specsweep.config import server_args
from specsweep.engines.speculation import (
    batch_upper,
    configured_k,
    sglang_adaptive_config,
    static_k,
    threshold_schedule,
)
from specsweep.io import atomic_write_json

__all__ = [
    "derive_schedules",
    "schedule_job",
    "level_choices",
    "ranges_from_choices",
    "threshold_schedule",
    "write_engine_files",
]


def ranges_from_choices(choices: list[tuple[int, int]], upper: int) -> list[list[int]]:
    """[(level, K)] sorted by level -> inclusive ranges covering 1..upper (module docstring's boundary rule)."""
    if not choices:
        return []
    bounds: list[tuple[int, int]] = []  # (last batch size of a range, its K)
    for (c0, k0), (c1, k1) in zip(choices, choices[1:], strict=False):
        if k0 == k1:
            continue
        end = c0 if k1 < k0 else c1 - 1
        bounds.append((max(end, bounds[-1][0] + 1 if bounds else 1), k0))
    bounds.append((upper, choices[-1][1]))
    out: list[list[int]] = []
    start = 1
    for end, k in bounds:
        end = min(max(end, start), upper)
        if out and out[-1][2] == k:
            out[-1][1] = end
        else:
            out.append([start, end, k])
        start = end + 1
        if start > upper:
            break
    return out


def level_choices(
    cells: dict[str, dict[float, Cell]],
    baseline: str,
    members: dict[str, int],
    settings: AnalysisSettings,
    cache: dict[str, CellBootstrap] | None = None,
) -> list[dict[str, Any]]:
    """Per level where the baseline is usable: every candidate K (0 = baseline), the best, and the choice."""
    cache = {} if cache is None else cache
    pairs: dict[tuple[str, str], dict[float, dict[str, Any]]] = {}

    def rows(ref: str, arm: str) -> dict[float, dict[str, Any]]:
        """Per level: `arm` against `ref` (speedup > 1: arm better), with its interval."""
        if (ref, arm) not in pairs:
            res = analyze_arm(cells, ref, arm, settings, cache)
            pairs[(ref, arm)] = {r["concurrency"]: r for r in res["per_level"] if r["used"]}
        return pairs[(ref, arm)]

    levels = sorted({c for m in members for c in rows(baseline, m)})
    out = []
    for c in levels:
        cands = [{"arm": baseline, "k": 0, "speedup": 1.0}]
        for arm, k in sorted(members.items(), key=lambda kv: kv[1]):
            r = rows(baseline, arm).get(c)
            if r is not None:
                cands.append(
                    {"arm": arm, "k": k, "speedup": r["speedup"], "lo": r["speedup_lo"], "hi": r["speedup_hi"]}
                )
        best = max(cands, key=lambda x: (x["speedup"], -x["k"]))
        for cand in cands:
            if cand["arm"] == best["arm"]:
                cand.update(ratio=1.0, ratio_lo=1.0, ratio_hi=1.0, within_noise=True)
                continue
            if cand["k"] == 0:  # baseline / best = 1 / speedup(best)
                lo, hi = best.get("lo"), best.get("hi")
                cand.update(
                    ratio=1.0 / best["speedup"],
                    ratio_lo=None if hi is None else 1.0 / hi,
                    ratio_hi=None if lo is None else 1.0 / lo,
                )
            else:
                r = rows(best["arm"], cand["arm"]).get(c) or {}
                cand.update(ratio=r.get("speedup"), ratio_lo=r.get("speedup_lo"), ratio_hi=r.get("speedup_hi"))
            band = settings.noise_band_at(c)  # the level's A/A band, where measured: a ratio inside it is no loss
            cand["within_noise"] = (cand["ratio_hi"] is not None and cand["ratio_hi"] >= 1.0) or (
                band is not None and cand["ratio"] is not None and cand["ratio"] >= band[0]
            )
        chosen = next(x for x in cands if x["within_noise"])  # sorted by K: the smallest not shown worse
        out.append(
            {"concurrency": c, "best": best["arm"], "chosen": chosen["arm"], "k": chosen["k"], "candidates": cands}
        )
    return out


def _family_schedule(
    family: str,
    members: dict[str, int],
    result: dict[str, Any],
    cells: dict[str, dict[float, Cell]],
    settings: AnalysisSettings,
    upper: int,
    cache: dict[str, CellBootstrap],
) -> dict[str, Any]:
    baseline = result["baseline_arm"]
    choices = level_choices(cells, baseline, members, settings, cache)
    entry: dict[str, Any] = {"members": members, "upper": upper, "per_level": choices}
    if len(members) == 1:
        ((arm, k),) = members.items()
        t = choose_threshold(result["arms"][arm], settings.policy_rule)
        entry.update(rule=f"threshold ({settings.policy_rule})", threshold=t["threshold"], reason=t["reason"])
        x = t.get("crossover")  # the interval the threshold was drawn from: the proof reads the rule's caution in it
        entry["crossover"] = {f: x.get(f) for f in ("estimate", "lo", "hi", "states")} if x else None
        entry["schedule"] = None if t["threshold"] is None else threshold_schedule(t["threshold"], k, upper)
        return entry
    entry["rule"] = "best K per level, the smallest within the noise; boundaries at measured levels"
    if not choices:
        entry.update(schedule=None, reason="no level where the baseline and a draft length were both usable")
        return entry
    entry["schedule"] = ranges_from_choices([(int(x["concurrency"]), x["k"]) for x in choices], upper)
    entry["reason"] = "; ".join(f"C={x['concurrency']:g}: K={x['k']} ({x['chosen']})" for x in choices)
    return entry


def derive_schedules(
    config: dict[str, Any],
    variant: str,
    result: dict[str, Any],
    cells: dict[str, dict[float, Cell]],
    settings: AnalysisSettings,
    file_dir: Path | None = None,
) -> dict[str, Any]:
    """schedule.json's body: per family, the schedule the policy arm serves and how it was chosen."""
    arms = config["arms"]
    vcfg = config["variants"][variant]
    engine = vcfg["engine"]
    max_level = max((c for by in cells.values() for c in by), default=0)
    cache: dict[str, CellBootstrap] = {}
    fams: dict[str, Any] = {}
    for family in dict.fromkeys(a["family"] for a in arms.values() if a.get("family") and not a.get("policy")):
        names = [n for n, a in arms.items() if a.get("family") == family and not a.get("policy")]
        argvs = {n: server_args(config, variant, n)["server_args"] for n in names}
        members = {n: configured_k(engine, arms[n], argvs[n], vcfg.get("profile")) for n in names}
        missing = [n for n, k in members.items() if k is None]
        upper = batch_upper(engine, argvs[names[0]], max_level)
        if missing:
            fams[family] = {"schedule": None, "reason": f"draft length of {missing} unknown: set draft_length"}
            continue
        override = (config.get("policy") or {}).get("schedules", {}).get(family)
        entry = _family_schedule(family, members, result, cells, settings, upper, cache)
        if override:
            entry.update(derived=entry.get("schedule"), schedule=[list(map(int, e)) for e in override])
            entry["rule"] = "given in the config (policy.schedules)"
        entry["served_by"] = served_by(entry.get("schedule"), members, result["baseline_arm"])
        entry["unmeasured"] = unmeasured_range(
            entry.get("schedule"),
            max((x["concurrency"] for x in entry.get("per_level") or []), default=None),
            config.get("concurrency") or [],
            _evidence(entry.get("per_level") or [], result["baseline_arm"]),
        )
        if engine == "sglang" and entry.get("schedule") and entry["served_by"] is None and file_dir is not None:
            _, unreachable = sglang_adaptive_config(entry["schedule"])
            path = file_dir / f"{family}.sglang-adaptive.json"
            entry.update(file=str(path), approximate=bool(unreachable), unreachable_ranges=unreachable)
        # the arm the policy is measured against at each level (in interleaved blocks, where the variant
        # interleaves): the best fixed arm by point value, as the proof judges it
        metric = settings.primary_metric
        entry["best_fixed"] = {
            f"{c:g}": best
            for c in sorted(cells.get(result["baseline_arm"], {}))
            if (best := best_fixed(cells, [result["baseline_arm"], *members], metric, c)) is not None
        }
        fams[family] = entry
    doc = {"variant": variant, "engine": engine, "baseline_arm": result["baseline_arm"], "families": fams}
    write_engine_files(doc)
    return doc


def _evidence(choices: list[dict[str, Any]], baseline: str) -> str:
    """What the highest measured level showed, in words: its best arm's speedup over the baseline."""
    if not choices:
        return ""
    top = choices[-1]
    best = next((x for x in top["candidates"] if x["arm"] == top["best"]), None)
    if best is None or best["arm"] == baseline:
        return f"the baseline was best at C={top['concurrency']:g}"
    ci = f" [{best['lo']:.3g}, {best['hi']:.3g}]" if best.get("lo") is not None and best.get("hi") is not None else ""
    return f"{best['arm']} measured {best['speedup']:.3g}{ci} over {baseline} at C={top['concurrency']:g}"


def served_by(schedule: list[list[int]] | None, members: dict[str, int], baseline: str) -> str | None:
    """The fixed arm that serves `schedule` as it is: one K over the whole range is that K's arm with its static
    flag (K=0: the baseline server, no speculative configuration at all); None for a schedule that switches K
    (served by a policy arm of its own) or for no schedule."""
    k = static_k(schedule) if schedule else None
    if k is None:
        return None
    if k == 0:
        return baseline
    return next((name for name, mk in members.items() if mk == k), None)


def write_engine_files(doc: dict[str, Any]) -> None:
    """The files an engine reads its schedule from (SGLang's adaptive config), written from schedule.json
    whether the schedule was just derived or kept, so a lost file comes back with the schedule job."""
    if doc.get("engine") != "sglang":
        return
    for entry in doc["families"].values():
        if entry.get("schedule") and entry.get("file") and not entry.get("served_by"):
            atomic_write_json(entry["file"], sglang_adaptive_config(entry["schedule"])[0])


def schedule_job(
    variant: str, decision: dict[str, Any], config: dict[str, Any], summaries: list[Path], out: Path
) -> tuple[dict[str, Any], bool]:
    """What `specsweep schedule` does: derive the variant's schedules from the fixed arms' cells, or keep the
    ones decided before on the same cells and `decision` settings (analysis/decisions.py), and write them to
    `out` (schedule.json) with the engine's files. Returns the document and whether it was kept."""
    key = decisions.decision_key(decision, summaries)
    doc = decisions.kept(out.parent, "schedule", key)
    kept = doc is not None
    if doc is None:
        settings = AnalysisSettings.from_config(config)
        result, cells = analyze_cells(config, variant, summaries=summaries, settings=settings)
        doc = derive_schedules(config, variant, result, cells, settings, out.parent / "policy")
        doc.update(decision_key=key, judged_with={k: config.get(k) for k in ("gates", "slo", "analysis")})
        decisions.keep(out.parent, "schedule", key, doc)
    else:
        write_engine_files(doc)
    atomic_write_json(out, doc)
    return doc, kept
