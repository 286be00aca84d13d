"""The contracts of specsweep's files, as typed records (pydantic models with described fields): the cell spec a
rule hands to a cell, summary.json, crossover.json; the request record is `client.loadgen.RECORD_SCHEMA` (Arrow)
with `client.backends.RequestRecord`. A file missing a field fails where it is read, naming the field and the fix;
`docs/records.md` is generated from these models (`specsweep records-doc`). A leaf: imports nothing of specsweep
but itself."""

from specsweep.records.base import Record, RecordError, check, read
from specsweep.records.cellspec import CELL_SPEC_FIX, CellSpec
from specsweep.records.crossover import CROSSOVER_FIX, Contents, Crossover
from specsweep.records.summary import SUMMARY_FIX, CellSummary, MeasuredLevel, SegmentDecision

__all__ = [
    "CELL_SPEC_FIX",
    "CROSSOVER_FIX",
    "SUMMARY_FIX",
    "CellSpec",
    "CellSummary",
    "Contents",
    "Crossover",
    "MeasuredLevel",
    "Record",
    "RecordError",
    "SegmentDecision",
    "check",
    "read",
]
