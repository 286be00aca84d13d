"""At the end of an interleaved level: every arm's outputs against the reference arm's, each difference referred
to the reference server while it is still up (`client/referral.py` says what is asked and why).

The analysis judges the referred differences (`analysis/outputs.py`): a near-tie is other batch numerics, a clear
margin is an arm that generates other text. Only the first MAX_REFERRED differences per arm are referred, within
BUDGET_S seconds per arm: a broken verify path shows in the first few, and a level's time is not spent on
hundreds of replays (a replay of a 512-token output on an 8-GPU box takes seconds)."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any

import aiohttp

from specsweep.client.loadgen import RepeatResult
from specsweep.client.referral import TOP_K, refer, self_check
from specsweep.measure.cell import LevelInputs

__all__ = ["MAX_REFERRED", "refer_level"]

MAX_REFERRED = 32
BUDGET_S = 120.0  # per arm and level: the differences past it are left unreferred (and counted so)


async def refer_level(
    reference: str, repeats: dict[str, list[RepeatResult]], inputs: dict[str, LevelInputs], url: str
) -> dict[str, dict[str, Any]]:
    """arm -> its `output_referral` (records.OutputReferral) for every arm besides `reference`, whose server
    answers at `url`."""
    req = replace(inputs[reference].req, url=url)
    sets = inputs[reference].prompts.repeats
    ref_out = {(rep.repeat, rec.prompt_index): rec for rep in repeats[reference] for rec in rep.records if rec.ok}
    out: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession() as session:
        # first, one of the reference's own outputs replayed and read back: where its tokens' texts do not join
        # to its text, positions cannot be found and no referral is trusted (analysis/outputs.py)
        (r0, i0), first = next(iter(ref_out.items())) if ref_out else ((0, 0), None)
        check = None
        if first is not None and first.output_text:
            prompt = sets[r0].request(i0, req.sends_messages)
            check = asdict(await self_check(session, req, prompt, first.output_text, first.output_tokens))
            check.update(repeat=r0, prompt_index=i0)
        for arm, reps in repeats.items():
            if arm == reference:
                continue
            compared, differ = 0, []
            for rep in reps:
                for rec in rep.records:
                    base = ref_out.get((rep.repeat, rec.prompt_index))
                    if not rec.ok or base is None or base.expected_output_tokens != rec.expected_output_tokens:
                        continue
                    compared += 1
                    if base.output_sha256 != rec.output_sha256:
                        differ.append((rep.repeat, rec, base))
            referred: list[dict[str, Any]] = []
            deadline = time.monotonic() + BUDGET_S
            for r, rec, base in differ[:MAX_REFERRED]:
                if time.monotonic() > deadline:
                    break
                prompt = sets[r].request(rec.prompt_index, req.sends_messages)
                found = await refer(session, req, prompt, base.output_text, rec.output_text, base.output_tokens)
                referred.append({"repeat": r, "prompt_index": rec.prompt_index, **asdict(found)})
            out[arm] = {
                "against": reference,
                "compared": compared,
                "differ": len(differ),
                "top_k": TOP_K,
                "check": check,
                "referred": referred,
            }
    return out
