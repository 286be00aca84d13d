"""Same output, only faster: the share of a speculative cell's outputs equal to the baseline's, and the
client's recording of the generated text (hash and head) on both streaming APIs."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from specsweep.analysis.outputs import output_match
from specsweep.client.backends import OpenAIParser, RequestRecord, SGLangParser

pytestmark = pytest.mark.unit


def outputs(texts: list[str], repeat: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "repeat": repeat,
            "prompt_index": range(len(texts)),
            "expected_output_tokens": 8,
            "ok": True,
            "output_sha256": [hashlib.sha256(t.encode()).hexdigest() for t in texts],
            "output_prefix": texts,
        }
    )


def test_identical_outputs_match() -> None:
    texts = [f"answer {i} w1 w2" for i in range(10)]
    m = output_match(outputs(texts), outputs(texts))
    assert m == {"share": 1.0, "compared": 10, "differ": 0, "first_difference": None, "example": None}


def test_differing_outputs_are_counted_and_located() -> None:
    base = [f"answer {i} w1 w2 w3" for i in range(10)]
    spec = list(base)
    spec[3] = "answer 3 w1 XX w3"
    m = output_match(outputs(base), outputs(spec))
    assert m["share"] == 0.9 and m["differ"] == 1
    assert m["first_difference"] == {"char": len("answer 3 w1 "), "beyond_prefix": False}
    assert m["example"]["prompt_index"] == 3 and "XX" in m["example"]["spec"]


def test_pairs_only_the_same_prompt_and_length() -> None:
    base, spec = outputs(["a", "b", "c"]), outputs(["a", "b", "x"], repeat=1)  # another repeat: other prompts
    assert output_match(base, spec) is None
    spec = outputs(["a", "b", "x"])
    spec.loc[2, "expected_output_tokens"] = 4  # a ramp request of another length is not comparable
    assert output_match(base, spec)["share"] == 1.0
    assert output_match(base, spec.drop(columns=["output_sha256"])) is None  # cells without outputs


def _line(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode()


def test_parsers_record_the_generated_text() -> None:
    rec = RequestRecord(0, 0, 3, 2)
    p = SGLangParser(rec)  # cumulative text
    for i, text in enumerate(["a", "a b", "a b c"], start=1):
        p.feed(float(i), _line({"text": text, "meta_info": {"completion_tokens": i, "finish_reason": None}}))
    p.feed(4.0, _line({"text": "a b c", "meta_info": {"completion_tokens": 3, "finish_reason": {"type": "length"}}}))
    p.finish(b"")
    assert rec.output_prefix == "a b c" and rec.output_sha256 == hashlib.sha256(b"a b c").hexdigest()
    rec = RequestRecord(0, 0, 3, 2)
    p = OpenAIParser(rec, chat=False)  # deltas
    for i, text in enumerate(["a", " b", " c"]):
        fin = "length" if i == 2 else None
        p.feed(float(i), _line({"choices": [{"text": text, "finish_reason": fin}]}))
    p.finish(b"")
    assert rec.output_prefix == "a b c" and rec.output_sha256 == hashlib.sha256(b"a b c").hexdigest()
