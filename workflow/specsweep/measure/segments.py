"""One cell per arm and level from the cells its server instances measured (`pairing.instances`).

Why: where one server holds the GPUs, arms cannot be interleaved; measured one after the other on one instance
each, the instance's own speed and the host's drift go straight into the ratio. So each arm is measured on
several instances in a counterbalanced segment order (baseline i1, eagle3 i1, eagle3 i2, baseline i2), each
instance's cells under `<cell>/instances/i<k>/`, and this module merges them into the arm's cell: the records of
every instance with their repeats numbered on (instance k's repeat r is k x R + r), the repeats' own metrics
kept, and a `pairing` block whose blocks are every arm's instance repeats in time order, so the analysis compares
the arms' means over their instances (`analysis/paired.py`, Welch): the instance effect and the drift left over
both show in the spread of the instances.

Run by the Snakemake `merge_segments` rule and standalone: `specsweep merge-segments --variant-root DIR
--level c10 --arms baseline eagle3 --instances 2`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd

from specsweep.measure.metrics import jsonable, pooled_metrics
from specsweep.measure.summary import read_records, read_summary, write_cell
from specsweep.records import SegmentDecision


def instance_dir(cell_dir: Path, instance: int) -> Path:
    return cell_dir / "instances" / f"i{instance}"


def _merge_arm(cell_dir: Path, instances: int) -> tuple[pd.DataFrame, dict[str, Any], list[dict[str, Any]]]:
    """One arm's merged records and summary (its pairing block left to the caller) and its blocks."""
    frames, repeats, blocks, servers, referrals = [], [], [], [], []
    first: dict[str, Any] | None = None
    offset, measured_s = 0, 0.0
    for k in range(1, instances + 1):
        d = instance_dir(cell_dir, k)
        summary = read_summary(d / "summary.json")
        df = read_records(d / "requests.parquet")
        first = first or summary
        n = len(summary["repeats"])
        frames.append(df.assign(repeat=df["repeat"] + offset))
        for rep in summary["repeats"]:
            renumbered = {**rep, "repeat": int(rep["repeat"]) + offset, "instance": k}
            repeats.append(renumbered)
            t0 = rep.get("t0_unix")
            wall = (rep.get("metrics") or {}).get("client", {}).get("wall_s") or 0.0
            blocks.append({"repeat": renumbered["repeat"], "instance": k, "start_unix": t0, "end_unix": t0 + wall})
        referral = summary.get("output_referral")
        if referral:  # each instance's referral, its rounds numbered on as the records are
            referrals.append(
                {**referral, "referred": [{**x, "repeat": x["repeat"] + offset} for x in referral["referred"]]}
            )
        srv = summary["server"]
        servers.append({"instance": k, "identity": srv["identity"], "pid": srv["pid"], "started_at": srv["started_at"]})
        offset += n
    assert first is not None
    records = pd.concat(frames, ignore_index=True)
    merged = dict(first)
    merged["repeats"] = repeats
    merged["metrics"] = pooled_metrics(records, int(first["concurrency"]), repeats)
    merged["server"] = {**first["server"], "instances": servers}
    merged["measured_s"] = measured_s
    merged.pop("output_referral", None)
    if referrals:  # an instance compared with the baseline instance measured before it (measure/referral.py)
        merged["output_referral"] = {
            **referrals[0],
            "compared": sum(r["compared"] for r in referrals),
            "differ": sum(r["differ"] for r in referrals),
            "referred": [x for r in referrals for x in r["referred"]],
            # a check that failed on any instance speaks for the merged cell
            "check": min((r["check"] for r in referrals if r.get("check")), key=lambda c: c["agrees"], default=None),
        }
    return records, merged, blocks


def instance_log(answers: list[SegmentDecision], target: float, most: int, instances: int) -> dict[str, Any]:
    """The pairing block's log of the segment rule (records.InstanceLog): its answer after each pair, in order."""
    ordered = sorted(answers, key=lambda a: a.instances)
    return {
        "target": target,
        "max_instances": most,
        "instances": instances,
        "decisions": [f"i{a.instances}: {a.decision}" for a in ordered],
    }


def merged_level(
    variant_root: Path, level: str, arms: list[str], instances: int
) -> dict[str, tuple[pd.DataFrame, dict[str, Any]]]:
    """Every arm's cell at `level` merged from its first `instances` instance cells, in memory: arm -> (records,
    summary with its pairing block). The segment rule judges these between pairs; `merge_level` writes them."""
    merged: dict[str, tuple[pd.DataFrame, dict[str, Any]]] = {}
    blocks: list[dict[str, Any]] = []
    for arm in arms:
        records, summary, arm_blocks = _merge_arm(variant_root / arm / level, instances)
        merged[arm] = (records, summary)
        blocks += [{"arm": arm, **b} for b in arm_blocks]
    blocks.sort(key=lambda b: b["start_unix"])
    ident = hashlib.sha256(json.dumps([(b["arm"], b["start_unix"]) for b in blocks]).encode()).hexdigest()[:12]
    pairing = {"mode": "segments", "id": ident, "arms": arms, "instances": instances, "blocks": blocks}
    for _, summary in merged.values():
        summary["pairing"] = dict(pairing)
    return merged


def merge_level(
    variant_root: Path, level: str, arms: list[str], instances: int, log: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Merge every arm's instance cells at `level` and write each arm's cell; returns arm -> summary. `log`: the
    segment rule's answers after each instance pair (precision.max_instances), kept in the pairing block."""
    out = {}
    for arm, (records, summary) in merged_level(variant_root, level, arms, instances).items():
        if log is not None:
            summary["pairing"]["instance_log"] = log
        write_cell(variant_root / arm / level, records, jsonable(summary))
        out[arm] = summary
    return out


def pair_seconds(variant_root: Path, level: str, arms: list[str], instances: int) -> float:
    """What one more instance pair at a sequential level is expected to take: for each arm, a server start (the
    longest any of its instance cells waited for its server, at any level: a new instance starts one) and its
    last instance's closed loops at this level (`measured_s`)."""
    total = 0.0
    for arm in arms:
        waits = [
            float((read_summary(p).get("server") or {}).get("ready_after_s") or 0.0)
            for p in (variant_root / arm).glob("c*/instances/i*/summary.json")
        ]
        last = read_summary(instance_dir(variant_root / arm / level, instances) / "summary.json")
        total += max(waits, default=0.0) + float(last.get("measured_s") or 0.0)
    return total
