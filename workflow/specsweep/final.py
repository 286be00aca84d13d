"""What the workflow prints when it ends: the crossover table, where the results are, how to open MLflow."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from specsweep.analysis.contents import format_contents
from specsweep.analysis.table import format_table
from specsweep.config import sweep_units, unit_variant
from specsweep.io import read_json
from specsweep.measure.summary import read_judged
from specsweep.records import CROSSOVER_FIX, Contents, Crossover, read
from specsweep.tracking.uri import is_server_uri, ui_base, ui_command, ui_view_url
from specsweep.tracking.view import VIEW_NAME


def _table(path: Path) -> str:
    """The crossover table of one crossover.json; a file this version cannot lay out is named, not fatal.

    Why not fatal: this runs when the workflow ends, after every result is written; an inconclusive verdict
    (threshold null) or an older layout must not turn a finished run into a crash.
    """
    try:
        return format_table(read(Crossover, path, CROSSOVER_FIX)[1])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"{path}: cannot show the table ({type(exc).__name__}: {exc}); the file itself is intact"


def _contents(path: Path) -> str:
    """A variant's classes side by side (contents.json); a file this version cannot lay out is named."""
    try:
        return format_contents(read(Contents, path, CROSSOVER_FIX)[1])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"{path}: cannot show the classes ({type(exc).__name__}: {exc}); the file itself is intact"


def invalid_cells(config: dict[str, Any]) -> list[tuple[Path, list[str]]]:
    """(summary.json, reasons) of every stored cell of the experiment's variants that its gates call invalid."""
    res = Path(config["results_dir"]) / config["experiment"]
    out = []
    for unit in sweep_units(config):
        for path in sorted(res.glob(f"{unit}/*/*/summary.json")):
            try:
                v = read_judged(path.parent, config["gates"], config["slo"])[0]["validity"]
            except (OSError, ValueError, KeyError) as exc:  # a cell this version cannot judge: re-measure it too
                v = {"valid": False, "reasons": [f"cannot be judged ({type(exc).__name__}: {exc})"]}
            if not v["valid"]:
                out.append((path, list(v["reasons"])))
    return out


def remeasure_command(paths: list[Path], configfiles: list[str] | None = None) -> str:
    """The one command that measures exactly these cells again, and what depends on them."""
    cmd = ["snakemake", "--cores", "1", "crossover"]
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    return shlex.join([*cmd, "--forcerun", *map(str, paths)])


def _invalid_lines(config: dict[str, Any], configfiles: list[str] | None) -> list[str]:
    cells = invalid_cells(config)
    if not cells:
        return []
    lines = [f"{len(cells)} cell(s) still invalid by this experiment's gates:"]
    for path, reasons in cells:
        lines.append(f"  {path.parent}: {'; '.join(reasons)[:200]}")
    lines.append("re-measure exactly these (and what depends on them):")
    lines.append(f"  {remeasure_command([p for p, _ in cells], configfiles)}")
    return lines


def final_text(config: dict[str, Any], configfiles: list[str] | None = None) -> str:
    res = Path(config["results_dir"]) / config["experiment"]
    lines = ["", "=" * 100]
    units = sweep_units(config)
    for variant in config["variants"]:
        contents = res / variant / "contents.json"
        if contents.is_file():  # the classes side by side first: where they disagree is said before any table
            lines += [_contents(contents), f"  -> {contents}", ""]
        for unit in (u for u in units if unit_variant(u) == variant):
            path = res / unit / "crossover.json"
            if path.is_file():
                lines += [
                    _table(path),
                    f"  -> {path} (plots: {res / unit / 'plots'}, policy: {res / unit / 'policy.yaml'})",
                    "",
                ]
            else:
                lines.append(f"{config['experiment']}/{unit}: no crossover.json yet")
    comparison = res / "comparison" / "comparison_table.csv"
    if comparison.is_file():
        lines.append(f"variants compared arm by arm: {comparison} (plots beside it)")
    lines += _invalid_lines(config, configfiles)
    lines.append(f"results: {res.resolve()}")
    if config["mlflow"]["enabled"]:
        base = ui_base(config)  # never a user:password@ of the configured URI
        if is_server_uri(config["mlflow"]["tracking_uri"]):
            lines.append(f"MLflow UI: {base}   (the tracking server)")
        else:
            lines.append(f"MLflow UI: {ui_command(config)}   (then open {base})")
        marker = next(iter(sorted(res.glob("*/*/mlflow_sweep.json"))), None)
        exp_id = read_json(marker).get("experiment_id") if marker else None
        if exp_id:
            lines.append(f"  arms against C on a log axis: {ui_view_url(str(exp_id), base)}  (Views > {VIEW_NAME!r})")
    lines.append("=" * 100)
    return "\n".join(lines)


def print_final(config: dict[str, Any], configfiles: list[str] | None = None) -> None:
    print(final_text(config, configfiles), flush=True)
