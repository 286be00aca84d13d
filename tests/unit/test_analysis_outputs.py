"""Same output, only faster: the share of a speculative cell's outputs equal to the baseline's, and the
client's recording of the generated text (hash and head) on both streaming APIs."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from specsweep.analysis.notes import differ_note, unresolved_note
from specsweep.analysis.outputs import output_match, output_verdict
from specsweep.analysis.settings import AnalysisSettings
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
    assert m == {
        "share": 1.0,
        "compared": 10,
        "differ": 0,
        "first_difference": None,
        "example": None,
        "referral": None,
        "tie_share": None,
    }
    assert output_verdict(m, 0.9) == "same"


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


Bound = tuple[float, int, str]  # the arm's token unmatched: margin_at_least_nats, bound_rank, bound_token


def referral(margins: list[float | Bound | None], differ: int, errors: int = 0) -> dict:
    """records.OutputReferral with one referred difference per margin: a number, both tokens scored; a Bound,
    the arm's token matched by no candidate, with the likeliest it could be; None, unmatched with no bound (an
    older referral)."""
    referred = []
    for i, m in enumerate(margins):
        x = {
            "repeat": 0,
            "prompt_index": i,
            "char": 5,
            "token_char": 4,
            "reference_token": " w1",
            "margin_nats": m if isinstance(m, float | int) else None,
            "other_token": " w2" if isinstance(m, float | int) else None,
            "other_head": " CORRUPTED",
            "steps": 1,
            "error": None,
        }
        if isinstance(m, tuple):
            x |= {"margin_at_least_nats": m[0], "bound_rank": m[1], "bound_token": m[2]}
        referred.append(x)
    referred += [
        {"repeat": 0, "prompt_index": 90 + i, "char": 5, "token_char": 4, "steps": 1, "error": "HTTP 500"}
        for i in range(errors)
    ]
    return {"against": "baseline", "compared": 10, "differ": differ, "top_k": 5, "referred": referred}


def _differing(n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    base = [f"answer {i} w1 w2 w3" for i in range(10)]
    spec = [t.replace("w2", "w9") if i < n else t for i, t in enumerate(base)]
    return outputs(base), outputs(spec)


def test_near_ties_are_numerics_whatever_their_share() -> None:
    """Four of ten outputs differ (below min_output_match 0.9), each at a near-tie: numerics, not OUTPUTS DIFFER;
    the share that differs at near-ties is reported."""
    m = output_match(*_differing(4), referral([0.004, -0.002, 0.0, 0.05], 4), tie_nats=0.1)
    assert m["share"] == 0.6 and m["tie_share"] == 0.4
    assert m["referral"]["near_ties"] == 4 and m["referral"]["clear"] == 0 and m["referral"]["unreferred"] == 0
    assert m["referral"]["max_tie_margin_nats"] == 0.05
    assert output_verdict(m, 0.9) == "numerics"


def test_one_clear_difference_is_outputs_differ_whatever_the_share() -> None:
    """One of ten differs (above min_output_match) with a clear margin: reported, named."""
    m = output_match(*_differing(1), referral([2.5], 1), tie_nats=0.1)
    assert m["share"] == 0.9 and output_verdict(m, 0.8) == "differ"
    assert m["referral"]["clear_examples"][0]["margin_nats"] == 2.5
    # a token not among the top k, the 5th candidate 2.4 nats below the reference's: at least that much, clear
    m = output_match(*_differing(2), referral([0.001, (2.4, 5, " w7")], 2), tie_nats=0.1)
    assert m["referral"]["clear"] == 1 and m["referral"]["near_ties"] == 1 and output_verdict(m, 0.5) == "differ"
    assert m["referral"]["unresolved"] == 0 and m["referral"]["clear_examples"][0]["margin_at_least_nats"] == 2.4
    note = differ_note([{"concurrency": 4, "output_match": m}], "eagle3", "baseline", AnalysisSettings(), "C")
    assert "OUTPUTS DIFFER" in note and "' CORRUPTED' not among the baseline's top candidates, at least 2.4" in note


def _unresolved_match() -> dict:
    """Three of ten differ: a near-tie, an unmatched token whose 5th candidate is within the tie margin, and a
    byte piece (a partial character) within it."""
    margins = [0.01, (0.05, 5, " w7"), (0.02, 2, " \ufffd")]
    return output_match(*_differing(3), referral(margins, 3), tie_nats=0.1)


def test_an_unmatched_token_within_the_tie_margin_is_not_resolved() -> None:
    """Neither a near-tie nor OUTPUTS DIFFER, whatever the share: "unresolved", each with why; an unmatched token
    with no bound recorded (an older referral) is not resolved either, never clear."""
    m = _unresolved_match()
    ref = m["referral"]
    assert ref["near_ties"] == 1 and ref["clear"] == 0 and ref["unresolved"] == 2 and ref["referred"] == 3
    assert output_verdict(m, 0.9) == "unresolved" and output_verdict(m, 0.5) == "unresolved"
    flat, piece = ref["unresolved_examples"]
    assert flat["why"] == (
        "the arm's token is not among the top 5 and the 5th candidate is 0.05 nats from the reference's token: the "
        "margin is not measured"
    )
    assert "2nd candidate, ' \ufffd', is a partial character" in piece["why"] and "0.02 nats" in piece["why"]
    assert m["tie_share"] == 0.1  # the near-ties alone
    old = output_match(*_differing(1), referral([None], 1), tie_nats=0.1)
    assert output_verdict(old, 0.5) == "unresolved" and "no bound" in old["referral"]["unresolved_examples"][0]["why"]
    # one clear difference beside them: OUTPUTS DIFFER, the unresolved counted apart
    m = output_match(*_differing(3), referral([3.0, (0.05, 5, " w7"), 0.01], 3), tie_nats=0.1)
    assert output_verdict(m, 0.5) == "differ" and m["referral"]["unresolved"] == 1
    note = differ_note([{"concurrency": 4, "output_match": m}], "eagle3", "baseline", AnalysisSettings(), "C")
    assert "OUTPUTS DIFFER" in note and "1 more not resolved (the arm's token is not among the top 5" in note


def test_the_unresolved_note_names_them_and_never_says_outputs_differ() -> None:
    m = _unresolved_match()
    note = unresolved_note([{"concurrency": 4, "output_match": m}], "eagle3", "baseline", 0.1, "C")
    assert "OUTPUTS DIFFER" not in note and "not resolved" in note, note
    assert "C=4 3 of 10 (1 near-ties, 2 not resolved)" in note, note
    assert "prompt 1 of round 0 at character 5 (eagle3's ' CORRUPTED')" in note, note
    assert "the 5th candidate is 0.05 nats from the reference's token" in note and "output_tie_nats 0.1" in note


def test_unreferred_differences_fall_back_on_the_share() -> None:
    """Nothing referred (a sequential cell, or every referral failed): min_output_match judges, as before."""
    for ref in (None, referral([], 3, errors=3)):
        m = output_match(*_differing(3), ref, tie_nats=0.1)
        assert output_verdict(m, 0.9) == "differ" and output_verdict(m, 0.5) == "under_threshold"
    m = output_match(*_differing(3), referral([], 3, errors=3), tie_nats=0.1)
    assert m["referral"]["errors"] == ["HTTP 500"] and m["referral"]["unreferred"] == 3


def test_a_server_that_does_not_reproduce_the_reference_is_not_trusted() -> None:
    """The self-check failed (the forced prefix not tokenized as generated, say): the near-ties it reported are
    not counted; the differences fall back on the share."""
    ref = referral([0.004, 0.001, 0.002], 3)
    ref["check"] = {"repeat": 0, "prompt_index": 0, "char": 9, "agrees": False, "expected": " w5 w6", "top": " w7"}
    m = output_match(*_differing(3), ref, tie_nats=0.1)
    assert (
        m["referral"]["near_ties"] == 0
        and m["referral"]["unreferred"] == 3
        and "not trusted" in m["referral"]["errors"][0]
    )
    assert output_verdict(m, 0.9) == "differ"
    ref["check"]["agrees"] = True
    assert output_verdict(output_match(*_differing(3), ref, tie_nats=0.1), 0.9) == "numerics"
