"""Same answer, only faster? The share of a speculative cell's outputs that equal the baseline's.

Speculative decoding is lossless at temperature 0: for the same prompt it must generate what plain decoding
generates. A broken draft or verify path can produce different text faster and win a throughput race, so each
request's output is recorded (hash and head, `requests.parquet` `output_sha256`, `output_prefix`) and each
speculative cell is compared with the baseline cell of the same level, prompt by prompt (the prompt sets are
the same in every arm: `client/prompts.py`). Exact equality is not guaranteed (batch-shape dependent kernels:
the verify pass scores K+1 tokens at once), so a difference is referred before it is reported: an interleaved
level asks the baseline server, while it is up, for the log-probabilities of the token where the two outputs
part (`measure/referral.py`). A near-tie (the two tokens within `analysis.output_tie_nats`) is other batch
numerics, reported with its share. A clear difference is a measured margin above it: both tokens scored, or the
arm's token outside the server's top candidates while the likeliest it could still be lies more than the tie
margin below the reference's token; that arm generates other text: "OUTPUTS DIFFER", named with the prompt and
position. Where the margin is not measured (the arm's token unmatched, and the last candidate or a partial
character it may be within the tie margin: a flat distribution, a byte piece) the difference is "not resolved":
neither a tie nor a clear difference, counted and explained apart, never OUTPUTS DIFFER. Differences nobody
referred (sequential cells: no baseline server beside the arm) are judged by their share
(`analysis.min_output_match`).
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

__all__ = ["OUTPUT_COLUMNS", "output_match", "output_verdict", "referral_kind", "referred_figures"]

_EXAMPLE_KEYS = (
    "repeat",
    "prompt_index",
    "char",
    "reference_token",
    "other_token",
    "other_head",
    "margin_nats",
    "margin_at_least_nats",
)
OUTPUT_COLUMNS = ("repeat", "prompt_index", "expected_output_tokens", "ok", "output_sha256", "output_prefix")


def _recorded(df: pd.DataFrame | None) -> pd.DataFrame | None:
    if df is None or "output_sha256" not in df:
        return None
    out = df[df["ok"] & (df["output_sha256"] != "")]
    return out if len(out) else None


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def referral_kind(x: dict[str, Any], tie_nats: float, top_k: int) -> tuple[str, str | None]:
    """One answered referral (records.ReferredOutput) judged: ("tie" | "clear" | "unresolved", why unresolved).

    Clear only on a measured margin above `tie_nats`: both tokens scored, or the arm's token unmatched with the
    likeliest it could be (`bound_rank`) more than `tie_nats` below the reference's token. An unmatched token
    within that bound, or with none recorded (older referrals), is not resolved: its margin is not measured."""
    if x.get("margin_nats") is not None:
        return ("tie" if abs(x["margin_nats"]) <= tie_nats else "clear"), None
    bound, rank = x.get("margin_at_least_nats"), x.get("bound_rank")
    if bound is None or rank is None:
        return "unresolved", (
            f"the arm's token is not among the top {top_k} and no bound on its log-probability was recorded: the "
            "margin is not measured"
        )
    if bound > tie_nats:
        return "clear", None
    token = x.get("bound_token") or ""
    if not token or "\ufffd" in token:
        return "unresolved", (
            f"the arm's text matches none of the top {top_k} and the {_ordinal(rank)} candidate, {token!r}, is a "
            f"partial character (a byte piece, which no output text matches) {bound:.3g} nats from the reference's "
            "token: the margin is not measured"
        )
    return "unresolved", (
        f"the arm's token is not among the top {top_k} and the {_ordinal(rank)} candidate is {bound:.3g} nats from "
        "the reference's token: the margin is not measured"
    )


def _none_referred(against: str | None, unreferred: int | None, errors: list[str]) -> dict[str, Any]:
    out = {"referred": 0, "near_ties": 0, "clear": 0, "unresolved": 0, "unreferred": unreferred}
    out |= {"clear_examples": [], "unresolved_examples": [], "errors": errors}
    return out if against is None else {"against": against, **out}


def referred_figures(referral: dict[str, Any] | None, tie_nats: float, differ: int | None = None) -> dict[str, Any]:
    """What the referral of a cell's differences says (records.OutputReferral): near-ties, clear differences
    (with up to three named), differences not resolved (up to three named, with why), and the differences left
    unreferred (past the cap, or the server could not say). `differ`: the differences the analysis counts now; a
    referral that counted others is stale."""
    if not referral:
        return _none_referred(None, None, [])
    check = referral.get("check")
    if check is not None and not check["agrees"]:  # positions in an output are not positions in its tokens
        why = check.get("error") or (
            f"the {referral['against']} server's replay of one of its outputs does not read back (its tokens' texts "
            f"do not join to its text {check.get('top')!r}): referrals not trusted"
        )
        return _none_referred(referral["against"], int(referral["differ"]), [why])
    stale = differ is not None and int(referral["differ"]) != differ
    if stale:  # referred against another measurement of the baseline cell (re-measured since): not this one's
        why = (
            f"referred against another measurement of the {referral['against']} cell "
            f"({referral['differ']} differences then, {differ} now): re-measure this cell to refer them"
        )
        return _none_referred(referral["against"], differ, [why])
    answered = [x for x in referral["referred"] if x.get("error") is None]
    kinds = [(x, *referral_kind(x, tie_nats, int(referral.get("top_k") or 0))) for x in answered]
    ties = [x for x, kind, _ in kinds if kind == "tie"]
    clear = [x for x, kind, _ in kinds if kind == "clear"]
    unresolved = [{**x, "why": why} for x, kind, why in kinds if kind == "unresolved"]
    return {
        "against": referral["against"],
        "referred": len(answered),
        "near_ties": len(ties),
        "clear": len(clear),
        "unresolved": len(unresolved),
        "unreferred": int(referral["differ"]) - len(answered),
        "max_tie_margin_nats": max((abs(x["margin_nats"]) for x in ties), default=None),
        "clear_examples": [{k: x.get(k) for k in _EXAMPLE_KEYS} for x in clear[:3]],
        "unresolved_examples": [{k: x.get(k) for k in (*_EXAMPLE_KEYS, "why")} for x in unresolved[:3]],
        "errors": sorted({x["error"] for x in referral["referred"] if x.get("error")})[:3],
    }


def output_match(
    baseline: pd.DataFrame | None,
    spec: pd.DataFrame | None,
    referral: dict[str, Any] | None = None,
    tie_nats: float = 0.1,
) -> dict[str, Any] | None:
    """{share, compared, differ, first_difference, example, referral} over the prompts both cells completed
    with the same requested length; None when either cell recorded no outputs (older cells, virtual-time cells).
    `referral`: the spec cell's referred differences against the baseline (None: not referred), judged with
    `tie_nats` (`referred_figures`); `tie_share` is the share of compared requests that differ at a near-tie."""
    b, s = _recorded(baseline), _recorded(spec)
    if b is None or s is None:
        return None
    m = s.merge(b, on=["repeat", "prompt_index"], suffixes=("", "_base"))
    m = m[m["expected_output_tokens"] == m["expected_output_tokens_base"]]
    if m.empty:
        return None
    same = (m["output_sha256"] == m["output_sha256_base"]).to_numpy()
    out: dict[str, Any] = {
        "share": float(same.mean()),
        "compared": int(len(m)),
        "differ": int((~same).sum()),
        "first_difference": None,
        "example": None,
        "referral": referred_figures(referral, tie_nats, int((~same).sum())) if referral else None,
    }
    out["tie_share"] = out["referral"]["near_ties"] / len(m) if referral else None
    if out["differ"]:
        bad = m[~same]
        positions = [
            len(os.path.commonprefix([a, c]))
            for a, c in zip(bad["output_prefix"], bad["output_prefix_base"], strict=True)
        ]
        i = min(range(len(positions)), key=positions.__getitem__)
        pos, row = positions[i], bad.iloc[i]
        # a difference past the recorded head shows as its length: "at or after" that character
        out["first_difference"] = {
            "char": pos,
            "beyond_prefix": pos >= min(len(row["output_prefix"]), len(row["output_prefix_base"])),
        }
        out["example"] = {
            "repeat": int(row["repeat"]),
            "prompt_index": int(row["prompt_index"]),
            "baseline": row["output_prefix_base"][max(0, pos - 20) : pos + 40],
            "spec": row["output_prefix"][max(0, pos - 20) : pos + 40],
        }
    return out


def output_verdict(match: dict[str, Any], min_share: float) -> str:
    """ "same" (no difference), "numerics" (every referred difference a near-tie), "unresolved" (none clear, one
    or more not resolved: the server's candidates could not tell), "differ" (a clear difference, or unreferred
    differences above 1 - `min_share`), "under_threshold" (unreferred, within it). Differences not resolved never
    make "differ": their margin was not measured."""
    if not match["differ"]:
        return "same"
    ref = match.get("referral")
    if ref and ref["clear"]:
        return "differ"
    if ref and ref["referred"]:
        return "unresolved" if ref.get("unresolved") else "numerics"
    return "differ" if match["share"] < min_share else "under_threshold"
