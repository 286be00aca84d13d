"""What every record shares: extra keys are kept (a newer writer may add some), a missing or mistyped field is
an error that names the file, the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

R = TypeVar("R", bound=BaseModel)


class Record(BaseModel):
    """A JSON object of a specsweep file: its described fields are checked, any other key is kept as it is."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class RecordError(ValueError):
    """A file (or an in-memory record about to be written) that does not hold what its contract says."""


def problems(e: ValidationError) -> list[str]:
    """Each failed field as `path: what is wrong`."""
    out = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = "missing" if err["type"] == "missing" else f"{err['msg']} (got {str(err.get('input'))[:60]!r})"
        out.append(f"{where}: {got}")
    return out


def check(model: type[R], data: Any, where: str, fix: str) -> R:
    """`data` as `model`, or a RecordError naming `where`, every failed field and `fix`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        listed = problems(e)
        more = f" (and {len(listed) - 8} more)" if len(listed) > 8 else ""
        raise RecordError(
            f"{where} is not a valid {model.__name__}: {'; '.join(listed[:8])}{more}. Fix: {fix}"
        ) from None


def read(model: type[R], path: str | Path, fix: str) -> tuple[R, dict[str, Any]]:
    """A JSON file checked against `model`: the typed record and the file's own dict (every key kept)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RecordError(f"{path} is not JSON ({e}). Fix: {fix}") from None
    return check(model, data, str(path), fix), data
