"""Every speculative arm's outputs against the reference arm's, each difference referred to a server of the target
model while it is up (`client/referral.py` says what is asked and why).

An interleaved level refers them at its end on the reference (baseline) arm's server (`refer_level`). A
sequential cell (one server at a time: GPU variants) refers them against the baseline cell already measured at
its level, from that cell's recorded outputs (`requests.parquet` `output_prefix`, the first 2,048 characters), on
its own server (`refer_recorded`): the replay's log-probabilities are the target model's either way, scored
through the arm's verify pass.

The analysis judges the referred differences (`analysis/outputs.py`): a near-tie is other batch numerics, a clear
margin is an arm that generates other text. Only the first MAX_REFERRED differences per arm are referred, within
BUDGET_S seconds per arm: a broken verify path shows in the first few, and a level's time is not spent on
hundreds of replays (a replay of a 512-token output on an 8-GPU box takes seconds)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from specsweep.client.backends import OUTPUT_PREFIX_CHARS, RequestSpec
from specsweep.client.loadgen import RepeatResult
from specsweep.client.prompts import PromptSet
from specsweep.client.referral import TOP_K, refer, self_check
from specsweep.measure.summary import read_records

__all__ = ["MAX_REFERRED", "baseline_cell_dirs", "refer_level", "refer_recorded"]

MAX_REFERRED = 32
_HEAD_SLACK = 64  # characters past the difference a recorded head must hold (the parting token and the next)
BUDGET_S = 120.0  # per arm and level: the differences past it are left unreferred (and counted so)


@dataclass(frozen=True, slots=True)
class _Reference:
    """One reference output: its hash, its text (whole, or the recorded head), requested and generated tokens."""

    sha256: str
    text: str
    expected_tokens: int
    tokens: int
    whole: bool = True


Key = tuple[int, int]  # (round, prompt index): the same prompt in every arm


def _compared(references: dict[Key, _Reference], repeats: list[RepeatResult]) -> tuple[int, list[tuple]]:
    """How many of the arm's outputs pair with a reference one (same prompt and length, both ok), and the pairs
    that differ: (round, the arm's record, the reference)."""
    compared, differ = 0, []
    for rep in repeats:
        for rec in rep.records:
            ref = references.get((rep.repeat, rec.prompt_index))
            if not rec.ok or ref is None or ref.expected_tokens != rec.expected_output_tokens:
                continue
            compared += 1
            if ref.sha256 != rec.output_sha256:
                differ.append((rep.repeat, rec, ref))
    return compared, differ


async def _check(
    session: aiohttp.ClientSession, req: RequestSpec, sets: list[PromptSet], repeats: list[RepeatResult]
) -> dict[str, Any] | None:
    """One of the replaying server's own outputs replayed and read back: where its tokens' texts do not join to its
    text, positions cannot be found and no referral is trusted (analysis/outputs.py)."""
    for rep in repeats:
        for rec in rep.records:
            if rec.ok and rec.output_text:
                prompt = sets[rep.repeat].request(rec.prompt_index, req.sends_messages)
                check = await self_check(session, req, prompt, rec.output_text, rec.output_tokens, rec.content)
                return {**asdict(check), "repeat": rep.repeat, "prompt_index": rec.prompt_index}
    return None


async def _referred(
    session: aiohttp.ClientSession, req: RequestSpec, sets: list[PromptSet], differ: list[tuple], against: str
) -> list[dict[str, Any]]:
    """The first MAX_REFERRED differences within BUDGET_S, each replayed and judged (records.ReferredOutput)."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + BUDGET_S
    for r, rec, ref in differ[:MAX_REFERRED]:
        if time.monotonic() > deadline:
            break
        char = len(os.path.commonprefix([ref.text, rec.output_text]))
        if not ref.whole and char >= len(ref.text) - _HEAD_SLACK:
            why = f"the difference lies past the {against} output's recorded {OUTPUT_PREFIX_CHARS} characters"
            out.append({"repeat": r, "prompt_index": rec.prompt_index, "char": char, "token_char": char, "steps": 0})
            out[-1]["error"] = why
            continue
        prompt = sets[r].request(rec.prompt_index, req.sends_messages)
        found = await refer(session, req, prompt, ref.text, rec.output_text, ref.tokens, rec.content)
        out.append({"repeat": r, "prompt_index": rec.prompt_index, **asdict(found)})
    return out


async def refer_level(
    reference: str, repeats: dict[str, list[RepeatResult]], req: RequestSpec, sets: list[PromptSet], url: str
) -> dict[str, dict[str, Any]]:
    """arm -> its `output_referral` (records.OutputReferral) for every arm besides `reference`, whose server
    answers at `url` to the reference's requests (`req`, its rounds' prompt `sets`)."""
    req = replace(req, url=url)
    references = {
        (rep.repeat, rec.prompt_index): _Reference(
            rec.output_sha256, rec.output_text, rec.expected_output_tokens, rec.output_tokens
        )
        for rep in repeats[reference]
        for rec in rep.records
        if rec.ok
    }
    out: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession() as session:
        check = await _check(session, req, sets, repeats[reference])
        for arm, reps in repeats.items():
            if arm == reference:
                continue
            compared, differ = _compared(references, reps)
            out[arm] = {
                "against": reference,
                "compared": compared,
                "differ": len(differ),
                "top_k": TOP_K,
                "replayed_by": "reference",
                "check": check,
                "referred": await _referred(session, req, sets, differ, reference),
            }
    return out


def baseline_cell_dirs(out_dir: Path, arm: str, baseline: str) -> list[Path]:
    """The baseline's cells at this cell's level, this cell's own server instance first: `<variant>/<arm>/<level>`
    or `<variant>/<arm>/<level>/instances/i<k>` with the arm's folder replaced (an instance cell compares with
    any of the baseline's instances: every instance sends the level's same prompts)."""
    parts = list(Path(out_dir).parts)
    at = len(parts) - 1 - parts[::-1].index(arm)
    level = Path(*parts[:at], baseline, parts[at + 1])
    found = [Path(*parts[:at], baseline, *parts[at + 1 :])]
    if (level / "instances").is_dir():
        found += sorted(p for p in (level / "instances").iterdir() if p.is_dir())
    found.append(level)
    return [d for i, d in enumerate(found) if (d / "requests.parquet").is_file() and d not in found[:i]]


async def refer_recorded(
    baseline: str, dirs: list[Path], repeats: list[RepeatResult], req: RequestSpec, sets: list[PromptSet], url: str
) -> dict[str, Any]:
    """This sequential cell's `output_referral` (records.OutputReferral): its outputs against the baseline cell's
    recorded ones (the first of `dirs`), differences replayed on this cell's server at `url` (its requests `req`,
    its rounds' prompt `sets`)."""
    req = replace(req, url=url)
    out: dict[str, Any] = {"against": baseline, "replayed_by": "own", "compared": 0, "differ": 0, "top_k": TOP_K}
    out.update(check=None, referred=[])
    if not dirs:
        out["error"] = f"no {baseline} cell at this level was measured before this one: nothing to compare with"
        return out
    base = read_records(dirs[0] / "requests.parquet")
    base = base[base["ok"] & (base["output_sha256"] != "")]
    references = {
        (int(r.repeat), int(r.prompt_index)): _Reference(
            r.output_sha256,
            r.output_prefix,
            int(r.expected_output_tokens),
            int(r.output_tokens),
            whole=len(r.output_prefix) < OUTPUT_PREFIX_CHARS,
        )
        for r in base.itertuples()
    }
    out["compared"], differ = _compared(references, repeats)
    out["differ"] = len(differ)
    async with aiohttp.ClientSession() as session:
        out["check"] = await _check(session, req, sets, repeats)
        out["referred"] = await _referred(session, req, sets, differ, baseline)
    return out
