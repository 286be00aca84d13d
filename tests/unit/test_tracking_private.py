"""What text stays local (tracking/private.py): every text field of summary.json's referral and crossover.json's
output match replaced, the tokens the notes quote replaced, every number and the structure kept."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from specsweep.analysis.notes import differ_note, unresolved_note
from specsweep.analysis.outputs import output_match
from specsweep.analysis.settings import AnalysisSettings
from specsweep.tracking.private import (
    QUOTED,
    WHY,
    digest_mark,
    logs_texts,
    private_note,
    redact_note,
    redacted,
    shareable,
    texts_of,
)

pytestmark = pytest.mark.unit

SECRET = "zebra-marker-7731"  # in every text below: no redacted copy may hold it
OFF = {"mlflow": {"log_texts": False}}
ON = {"mlflow": {"log_texts": True}}


def referred(i: int, *, other_token: str | None, margin: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "repeat": 0,
        "prompt_index": i,
        "char": 9,
        "token_char": 8,
        "reference_token": f" {SECRET}ref",
        "other_token": other_token,
        "reference_logprob": -0.05,
        "other_logprob": None if margin is None else -0.05 - margin,
        "margin_nats": margin,
        "steps": 1,
        "error": None,
        "other_head": f" {SECRET}head w1 w2",
        **extra,
    }


def summary_referral() -> dict[str, Any]:
    """records.OutputReferral with a scored, an unmatched-and-bounded and a failed difference, and its check."""
    return {
        "against": "baseline",
        "replayed_by": "reference",
        "compared": 10,
        "differ": 3,
        "top_k": 5,
        "check": {
            "repeat": 0,
            "prompt_index": 1,
            "char": 24,
            "agrees": True,
            "expected": f"{SECRET} exp",
            "top": f"{SECRET} top",
            "reproduces": True,
            "error": None,
        },
        "referred": [
            referred(0, other_token=f" {SECRET}tok", margin=2.5),
            referred(1, other_token=None, margin=None, margin_at_least_nats=0.05, bound_rank=5, bound_token="\ufffd"),
            {
                "repeat": 0,
                "prompt_index": 2,
                "char": 9,
                "token_char": 8,
                "steps": 1,
                "other_head": "",
                "error": f"its top two there ' {SECRET}a' \" {SECRET}b's\", 0.001 nats apart",
            },
        ],
    }


def outputs(texts: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "repeat": 0,
            "prompt_index": range(len(texts)),
            "expected_output_tokens": 8,
            "ok": True,
            "output_sha256": [hashlib.sha256(t.encode()).hexdigest() for t in texts],
            "output_prefix": texts,
        }
    )


def crossover_row() -> dict[str, Any]:
    """A level row as the analysis writes it: the output match of three differing outputs with their referral."""
    base = [f"answer {i} w1 w2 w3" for i in range(10)]
    spec = [t.replace("w1", f"{SECRET}ref") if i < 3 else t for i, t in enumerate(base)]
    match = output_match(outputs(base), outputs(spec), summary_referral(), tie_nats=0.1)
    return {"concurrency": 2.0, "speedup": 1.25, "speedup_lo": 1.1, "speedup_hi": None, "output_match": match}


def crossover_body() -> dict[str, Any]:
    row = crossover_row()
    settings = AnalysisSettings()
    notes = [differ_note([row], "eagle3", "baseline", settings, "C")]
    unresolved = {**row, "output_match": {**row["output_match"]}}
    unresolved["output_match"]["referral"] = {**row["output_match"]["referral"], "clear": 0}
    notes.append(unresolved_note([unresolved], "eagle3", "baseline", 0.1, "C"))
    arm = {"per_level": [row], "verdict": {"kind": "crossover", "reason": "r", "notes": notes}, "threshold": 2}
    proof = {"policy_arm": "eagle3-policy", "per_level": [{"concurrency": 2.0, "ratio": 0.98, "output_match": row}]}
    return {"arms": {"eagle3": arm}, "policy_proof": {"eagle3": proof}, "variant": "sim"}


def strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def numbers(value: Any, path: str = "") -> dict[str, Any]:
    """Every non-string leaf by its path: numbers, booleans and nulls."""
    if isinstance(value, dict):
        return {p: v for k, x in value.items() for p, v in numbers(x, f"{path}.{k}").items()}
    if isinstance(value, list):
        return {p: v for i, x in enumerate(value) for p, v in numbers(x, f"{path}[{i}]").items()}
    return {} if isinstance(value, str) else {path: value}


def test_the_fixtures_hold_the_texts_the_redaction_must_take() -> None:
    body = crossover_body()
    text = json.dumps(body)
    assert SECRET in text
    m = body["arms"]["eagle3"]["per_level"][0]["output_match"]
    assert SECRET in m["example"]["spec"]
    assert SECRET in m["referral"]["clear_examples"][0]["other_token"]
    assert SECRET in m["referral"]["unresolved_examples"][0]["other_head"]
    assert "'\ufffd'" in m["referral"]["unresolved_examples"][0]["why"]  # the bound token, quoted in `why`
    notes = body["arms"]["eagle3"]["verdict"]["notes"]
    assert f"' {SECRET}ref'" in notes[0] and f"' {SECRET}head w1 w2'" in notes[1]


@pytest.mark.parametrize("make", [lambda: {"output_referral": summary_referral()}, crossover_body])
def test_every_text_field_and_quoted_token_is_replaced(make: Any) -> None:
    body = make()
    before = json.dumps(body)
    copy = redacted(body)
    assert json.dumps(body) == before  # the original untouched
    assert SECRET not in json.dumps(copy)
    assert "\ufffd" not in json.dumps(copy, ensure_ascii=False)  # the bound token, quoted in `why` too
    assert numbers(copy) == numbers(body)  # every number, boolean and null where it was
    assert WHY in strings(copy)


def test_each_known_text_field_reads_why() -> None:
    ref = redacted({"output_referral": summary_referral()})["output_referral"]
    assert ref["check"]["expected"] == ref["check"]["top"] == WHY
    for x in ref["referred"][:2]:
        assert x["reference_token"] == x["other_head"] == WHY
    assert ref["referred"][0]["other_token"] == WHY and ref["referred"][1]["other_token"] is None  # null stays null
    assert ref["referred"][1]["bound_token"] == WHY
    assert ref["referred"][2]["other_head"] == ""  # nothing to keep local
    assert ref["referred"][2]["error"] == f"its top two there {QUOTED} {QUOTED}, 0.001 nats apart"
    m = redacted(crossover_body())["arms"]["eagle3"]["per_level"][0]["output_match"]
    assert m["example"]["baseline"] == m["example"]["spec"] == WHY
    assert m["example"]["prompt_index"] == 0 and m["first_difference"]["char"] > 0
    for x in m["referral"]["clear_examples"] + m["referral"]["unresolved_examples"]:
        assert {x[k] for k in ("reference_token", "other_head")} == {WHY}
    assert texts_of(redacted(crossover_body())) == {WHY}


def test_a_note_keeps_its_words_and_loses_its_quoted_tokens() -> None:
    note = redacted(crossover_body())["arms"]["eagle3"]["verdict"]["notes"][0]
    assert note.startswith("OUTPUTS DIFFER at C=2: only 70% of eagle3's outputs equal baseline's at C=2")
    assert f"baseline {QUOTED} over eagle3 {QUOTED} by 2.5 nats" in note
    assert "check the draft and verify path" in note
    assert redact_note("eagle3's 'tok' and the arms' \"it's\" (' x\\'y') ok") == (
        f"eagle3's {QUOTED} and the arms' {QUOTED} ({QUOTED}) ok"
    )
    assert redact_note("no quotes here, only baseline's words") == "no quotes here, only baseline's words"
    # a known text quoted where no quote opens a literal (after a word character) goes too
    assert redact_note(f"x{SECRET!r}", [SECRET]) == f"x{QUOTED}"


def test_descriptions_and_tags_are_redacted_unless_the_config_opts_in() -> None:
    body = crossover_body()
    note = body["arms"]["eagle3"]["verdict"]["notes"][0]
    assert private_note(note, ON, body) == note
    assert SECRET not in private_note(note, OFF, body) and SECRET not in private_note(note, {}, body)
    assert not logs_texts({}) and not logs_texts({"mlflow": {}}) and logs_texts(ON)
    assert digest_mark(OFF) != digest_mark(ON)  # a run logged one way is not reused the other


def test_the_logged_copy_has_the_same_name_and_the_original_stays(tmp_path: Path) -> None:
    path = tmp_path / "crossover.json"
    path.write_text(json.dumps(crossover_body(), indent=1))
    original = path.read_bytes()
    with shareable(path, OFF) as shared:
        assert shared.name == "crossover.json" and shared != path
        copy = json.loads(shared.read_text())
        assert SECRET not in shared.read_text() and numbers(copy) == numbers(crossover_body())
    assert not shared.exists() and path.read_bytes() == original
    with shareable(path, ON) as shared:
        assert shared == path
    plain = tmp_path / "summary.json"
    plain.write_text(json.dumps({"metrics": {"x": 1.0}, "output_referral": None}))
    with shareable(plain, OFF) as shared:
        assert shared == plain  # no text in it: the file itself
