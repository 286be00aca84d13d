"""What text stays local: the outputs' text (and so whatever a user's prompts made the model write) reaches MLflow
only when the config opts in (`mlflow.log_texts`); otherwise the runs get redacted copies.

Where text sits: summary.json's `output_referral` (each referred difference's tokens and head, the replay check's
heads, errors that quote tokens) and crossover.json's `output_match` (the first difference's `example` spans, the
referral's clear and unresolved examples, `why` and `errors` quoting tokens, the verdict notes quoting them: see
`analysis/notes.py`). A text field's value is replaced by `WHY`; a quoted text inside a note (a Python repr, as
the notes write them) by `QUOTED`. Numbers, nulls, booleans, keys and the structure are kept, so the MLflow UI and
whoever reads the logged artifacts get every figure. Prompts are never in these files (their hashes are).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["QUOTED", "WHY", "digest_mark", "logs_texts", "private_note", "redact_note", "redacted", "shareable"]

WHY = "text kept local: mlflow.log_texts is false"
QUOTED = "<text kept local>"

# keys whose string value is output text wherever they sit (records.ReferredOutput, the crossover's examples)
TEXT_KEYS = frozenset({"other_head", "reference_token", "other_token", "bound_token"})
# keys whose string value is output text under a parent key: the first difference's spans, the replay check's heads
TEXT_KEYS_UNDER = {"example": frozenset({"baseline", "spec"}), "check": frozenset({"expected", "top"})}
# keys whose strings are prose that may quote a text (notes, reasons, errors); their quoted literals are replaced
NOTE_KEYS = frozenset(
    {"notes", "note", "reason", "reasons", "why", "error", "errors", "interval_note", "content_warning", "verdict"}
)
# a quoted literal as repr() writes it: opened after a space or punctuation (not an apostrophe inside a word, as in
# "eagle3's"), closed before one; escapes inside, never across lines
_QUOTED_LITERAL = re.compile(r"""(?<![\w'"])(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")(?!\w)""")


def logs_texts(config: dict[str, Any]) -> bool:
    """Whether the config (or a tracking spec: its `mlflow` slice) opts in to texts in MLflow."""
    return bool((config.get("mlflow") or {}).get("log_texts", False))


def digest_mark(config: dict[str, Any]) -> str:
    """What a run's content digest adds for the texts' setting: a run logged with texts is not reused without
    them, nor the other way round."""
    return "+texts" if logs_texts(config) else ""


def texts_of(body: Any) -> set[str]:
    """Every output text the body's text fields hold (non-empty strings)."""
    out: set[str] = set()

    def walk(value: Any, parent: str | None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, str) and v and _is_text(k, parent):
                    out.add(v)
                else:
                    walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, parent)

    walk(body, None)
    return out


def _is_text(key: str, parent: str | None) -> bool:
    return key in TEXT_KEYS or key in TEXT_KEYS_UNDER.get(parent or "", ())


def redact_note(note: str, texts: Iterable[str] = ()) -> str:
    """A note with its quoted texts replaced by QUOTED: every quoted literal, and the quoted form of each of the
    known `texts` wherever it sits."""
    for text in sorted(set(texts), key=len, reverse=True):
        note = note.replace(repr(text), QUOTED)
    return _QUOTED_LITERAL.sub(QUOTED, note)


def redacted(body: Any) -> Any:
    """A copy of a summary or crossover body with its text fields replaced by WHY and the texts quoted in its
    notes by QUOTED; numbers, nulls, keys and the structure as they were."""
    texts = texts_of(body)

    def walk(value: Any, parent: str | None, in_note: bool) -> Any:
        if isinstance(value, dict):
            return {
                k: WHY if isinstance(v, str) and v and _is_text(k, parent) else walk(v, k, in_note or k in NOTE_KEYS)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [walk(v, parent, in_note) for v in value]
        if isinstance(value, str):
            if in_note:
                return redact_note(value, texts)
            for text in texts:  # a text quoted anywhere else (it never is today)
                if repr(text) in value:
                    value = value.replace(repr(text), QUOTED)
            return value
        return value

    return walk(body, None, False)


def private_note(note: str, config: dict[str, Any], body: Any = None) -> str:
    """A run's description or tag as MLflow gets it: as written when the config opts in, else redacted (with the
    texts of `body`, the file the note was made from)."""
    return note if logs_texts(config) else redact_note(note, texts_of(body))


@contextmanager
def shareable(path: Path, config: dict[str, Any]) -> Iterator[Path]:
    """The JSON file to log as `path`'s artifact: `path` itself when the config opts in to texts or the file
    holds none, else a redacted copy of the same name in a temporary folder (removed after the block)."""
    if logs_texts(config):
        yield path
        return
    body = json.loads(Path(path).read_text())
    copy = redacted(body)
    if copy == body:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="specsweep-private-") as tmp:
        out = Path(tmp) / Path(path).name
        out.write_text(json.dumps(copy, indent=1) + "\n")
        yield out
