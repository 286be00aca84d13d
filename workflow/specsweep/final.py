"""What the workflow prints when it ends: the crossover table, where the results are, how to open MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specsweep.analysis.cli import format_table
from specsweep.io import read_json
from specsweep.tracking import ui_command


def final_text(config: dict[str, Any]) -> str:
    res = Path(config["results_dir"]) / config["experiment"]
    lines = ["", "=" * 100]
    for variant in config["variants"]:
        path = res / variant / "crossover.json"
        if path.is_file():
            lines += [
                format_table(read_json(path)),
                f"  -> {path} (plots: {res / variant / 'plots'}, policy: {res / variant / 'policy.yaml'})",
                "",
            ]
        else:
            lines.append(f"{config['experiment']}/{variant}: no crossover.json yet")
    comparison = res / "comparison" / "comparison_table.csv"
    if comparison.is_file():
        lines.append(f"variants compared arm by arm: {comparison} (plots beside it)")
    lines.append(f"results: {res.resolve()}")
    if config["mlflow"]["enabled"]:
        lines.append(f"MLflow UI: {ui_command(config)}   (then open http://127.0.0.1:5000)")
    lines.append("=" * 100)
    return "\n".join(lines)


def print_final(config: dict[str, Any]) -> None:
    print(final_text(config), flush=True)
