"""docs/records.md from the records' own models: every described field with its type and whether it is required,
so the documented contract is the checked one (a test fails when the file is stale)."""

from __future__ import annotations

import typing
from pathlib import Path

from pydantic import BaseModel

from specsweep.records.cellspec import CellSpec
from specsweep.records.crossover import Contents, Crossover
from specsweep.records.summary import CellSummary, MeasuredLevel, SegmentDecision

DOC_PATH = Path(__file__).resolve().parents[3] / "docs" / "records.md"
FILES = (
    ("summary.json (a pipeline cell)", CellSummary),
    ("summary.json (`specsweep bench`)", MeasuredLevel),
    ("crossover.json", Crossover),
    ("contents.json", Contents),
    ("the cell spec (a rule's `spec` param)", CellSpec),
    ("a sequential level's next-pair answer (`segments/<level>/after-i<k>.json`)", SegmentDecision),
)


def _type(t: object) -> str:
    """A field's type as one short text (Optional shown as `| None`)."""
    text = str(t).replace("typing.", "").replace("specsweep.records.", "")
    for mod in ("summary.", "crossover.", "cellspec."):
        text = text.replace(mod, "")
    text = text.replace("<class '", "").replace("'>", "").replace("NoneType", "None")
    return text.replace(" | ", " or ")  # a markdown table's cell cannot hold a bare |


def _models(model: type[BaseModel], seen: list[type[BaseModel]]) -> None:
    """`model` and every record model its fields hold, in first-use order."""
    if model in seen:
        return
    seen.append(model)
    for f in model.model_fields.values():
        for t in [f.annotation, *typing.get_args(f.annotation)]:
            for u in [t, *typing.get_args(t)]:
                if isinstance(u, type) and issubclass(u, BaseModel):
                    _models(u, seen)


def render() -> str:
    lines = [
        "# The files' contracts",
        "",
        "Generated from `workflow/specsweep/records/` by `specsweep records-doc --write`; do not edit by hand.",
        "A file is checked against its record where it is read (and a summary or crossover before it is",
        "written): a missing or mistyped field is an error that names the file, the field and the fix. Keys not",
        "listed are kept as they are (the metric blocks hold more figures than listed; docs/metrics.md defines",
        "them). The request record (a row of requests.parquet) is `client.loadgen.RECORD_SCHEMA`, documented in",
        "docs/ARCHITECTURE.md; a file lacking one of its columns is refused the same way.",
        "",
    ]
    done: list[type[BaseModel]] = []
    for title, top in FILES:
        lines += [f"## {title}: `{top.__name__}`", ""]
        models: list[type[BaseModel]] = []
        _models(top, models)
        for m in models:
            if m in done:
                continue
            done.append(m)
            lines += [f"### `{m.__name__}`", "", " ".join((m.__doc__ or "").split()), ""]
            lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
            for name, f in m.model_fields.items():
                req = "yes" if f.is_required() else "no"
                lines.append(f"| `{name}` | `{_type(f.annotation)}` | {req} | {f.description or ''} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
