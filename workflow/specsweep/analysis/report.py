"""A variant's analysis written out: crossover.json, crossover_table.csv, plots and policy.yaml
(`specsweep crossover`)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from specsweep.analysis.contents import content_warning
from specsweep.analysis.policy import dump_yaml, policy_document, schedule_entries
from specsweep.analysis.proof import policy_proof
from specsweep.analysis.schedule import derive_schedules
from specsweep.analysis.settings import AnalysisSettings
from specsweep.analysis.table import table_csv
from specsweep.analysis.unmeasured import unmeasured_comments
from specsweep.analysis.variant import analyze_cells
from specsweep.config import server_args
from specsweep.io import atomic_write_json, atomic_write_text, read_json
from specsweep.records import Crossover, check

__all__ = ["report_variant", "server_args"]


def policy_header(result: dict[str, Any]) -> str:
    """policy.yaml's opening comment, read before anything is pasted: what the requests held, and the content
    warning where the acceptance measured is not production's."""
    facts = result.get("content")
    if not facts:
        return ""
    lines = [
        f"measured on: {facts['prompts']}; {facts['stop']} stop"
        + (" (answers end at the model's end of text, output_tokens a cap)" if facts["stop"] == "natural" else "")
        + f"; {result['source']} engine ({facts['engine']})"
    ]
    if result.get("content_warning"):
        lines.append(result["content_warning"])
    wrapped = [textwrap.wrap(line, 110) for line in lines]
    return "".join(f"# {part}\n" for line in wrapped for part in line)


def report_variant(
    config: dict[str, Any],
    variant: str,
    out_dir: Path,
    summaries: list[Path] | None = None,
    cells_root: Path | None = None,
    *,
    experiment: str | None = None,
    baseline_arm: str | None = None,
    spec_arms: list[str] | None = None,
    replicates: int | None = None,
    seed: int | None = None,
    include_invalid: bool = False,
    plots: bool = True,
    schedule: Path | None = None,
) -> dict[str, Any]:
    """Everything `specsweep crossover` does: analyze `variant`'s cells (`summaries`, or those under
    `cells_root`) and write crossover.json, crossover_table.csv, plots (unless not `plots`) and policy.yaml into
    `out_dir`, with the policy arms' schedules from `schedule` (default: derived here); returns the
    crossover.json body."""
    settings = AnalysisSettings.from_config(config)
    if replicates is not None:
        settings.replicates = replicates
    if seed is not None:
        settings.seed = seed
    if include_invalid:
        settings.include_invalid = True
    result, cells = analyze_cells(config, variant, summaries, cells_root, settings, baseline_arm, spec_arms, experiment)
    spec_arms = list(result["arms"])
    engine = result["engine"]
    variant_cfg = (config.get("variants") or {}).get(variant) or {}
    result["policy_rule"] = settings.policy_rule
    facts = (config.get("contents") or {}).get(variant)
    result["content"] = facts
    result["content_warning"] = content_warning(facts) if spec_arms else None
    out: Path = out_dir
    arms_cfg = {a: server_args(config, variant, a) for a in spec_arms}
    policy = policy_document(result, engine, arms_cfg, variant_cfg, settings.policy_rule, str(out / "policy"))
    for entry in policy["arms"].values():  # the engine files policy.yaml names (SGLang's adaptive config)
        form = entry.get(engine) or {}
        if form.get("adaptive_config_file") and form.get("adaptive_config") is not None:
            atomic_write_json(form["adaptive_config_file"], form["adaptive_config"])
    result["policy"] = {
        a: {"threshold": p["threshold"], "rule": p["rule"], "verdict": p["verdict"]} for a, p in policy["arms"].items()
    }
    for a, p in policy["arms"].items():
        result["arms"][a]["threshold"] = p["threshold"]
    arms_all = config.get("arms") or {}
    if schedule is not None:
        schedules = read_json(schedule)
    else:
        schedules = derive_schedules(config, variant, result, cells, settings, out / "policy")
    result["schedules"] = schedules["families"]
    result["policy_proof"] = policy_proof(cells, arms_all, result["baseline_arm"], settings, schedules)
    argvs = {}
    for family in schedules["families"]:
        member = next((a for a, c in arms_all.items() if c.get("family") == family and not c.get("policy")), None)
        argvs[family] = server_args(config, variant, member)["server_args"] if member else []
    policy["schedules"] = schedule_entries(schedules, result["policy_proof"], engine, argvs)
    if plots:
        from specsweep.analysis.plots import plot_variant

        files = plot_variant(result, cells, out / "plots")
        result["plots"] = [str(p.relative_to(out)) for p in files]
    check(Crossover, result, f"the crossover of {out}", "this is a bug in the analysis: report it")
    atomic_write_text(out / "crossover.json", json.dumps(result, indent=1, allow_nan=False) + "\n")
    atomic_write_text(out / "crossover_table.csv", table_csv(result))
    atomic_write_text(out / "policy.yaml", policy_header(result) + unmeasured_comments(policy) + dump_yaml(policy))
    return result
