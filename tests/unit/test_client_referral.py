"""A difference between two arms' outputs, referred to the reference server over HTTP (client/referral.py):
near-ties found as near-ties, a wrong word as a clear difference, on every API the load generator speaks.

The simulated server answers log-probability requests for any prefix (its words follow from everything before
them, `sim.server.next_words`), and its faults make a speculative server part from the baseline at a near-tie
(`near_tie_output_fraction`) or replace a word (`corrupt_output_fraction`)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.referral import forced_start, next_tokens, refer, self_check
from specsweep.sim.faults import FaultConfig
from specsweep.sim.profile import load_profile
from specsweep.sim.server import CLEAR_NATS, TIE_NATS, SimServer

pytestmark = pytest.mark.unit

PROMPTS = [f"prompt number {i} about the weather" for i in range(40)]
FORMS = [("sglang", "completions"), ("openai", "completions"), ("openai", "chat")]


async def _outputs(spec: RequestSpec, session: aiohttp.ClientSession) -> list[str]:
    out = []
    for i, p in enumerate(PROMPTS):
        rec = await send_request(session, spec, p, RequestRecord(i, i, 24, 8))
        assert rec.ok, rec.error
        out.append(rec.output_text)
    return out


def _refer_all(backend: str, endpoint: str, faults: FaultConfig):
    async def main():
        base, spec = SimServer(load_profile("demo")), SimServer(load_profile("demo"), speculative=True, faults=faults)
        async with (
            TestServer(base.app(), host="127.0.0.1", port=0) as b,
            TestServer(spec.app(), host="127.0.0.1", port=0) as s,
        ):
            rs = RequestSpec(url=str(b.make_url("")), backend=backend, endpoint=endpoint)
            async with aiohttp.ClientSession() as session:
                ref = await _outputs(rs, session)
                other = await _outputs(
                    RequestSpec(url=str(s.make_url("")), backend=backend, endpoint=endpoint), session
                )
                found = [
                    (i, await refer(session, rs, PROMPTS[i], ref[i], other[i]))
                    for i in range(len(PROMPTS))
                    if ref[i] != other[i]
                ]
                check = await self_check(session, rs, PROMPTS[0], ref[0])
        assert check.agrees and check.error is None and ref[0][check.char :].startswith(check.top), check
        return ref, other, found

    return asyncio.run(main())


@pytest.mark.parametrize(("backend", "endpoint"), FORMS)
def test_a_near_tie_is_found_at_the_token_where_the_outputs_part(backend: str, endpoint: str) -> None:
    ref, other, found = _refer_all(backend, endpoint, FaultConfig(near_tie_output_fraction=0.5))
    assert 8 <= len(found) <= 32, len(found)  # about half the prompts, each at its first near-tie
    for i, x in found:
        assert x.error is None, (i, x)
        assert x.margin_nats == pytest.approx(TIE_NATS), (i, x)
        assert ref[i][x.token_char :].startswith(x.reference_token) and other[i][x.token_char :].startswith(
            x.other_token
        )
        assert x.token_char <= x.char < x.token_char + len(x.reference_token)
        assert ref[i][: x.token_char] == other[i][: x.token_char]


@pytest.mark.parametrize(("backend", "endpoint"), FORMS)
def test_a_replaced_word_is_a_clear_difference(backend: str, endpoint: str) -> None:
    ref, other, found = _refer_all(backend, endpoint, FaultConfig(corrupt_output_fraction=0.3))
    assert 4 <= len(found) <= 24, len(found)
    for i, x in found:
        assert x.error is None and x.margin_nats is None and x.other_token is None, (i, x)
        assert x.other_head.startswith(" CORRUPTED") and x.reference_logprob is not None
        assert x.steps >= 1


def test_a_clear_margin_between_two_candidates_is_measured() -> None:
    """The other arm's token among the candidates but far behind: its margin is the sim's clear gap."""

    async def main():
        base = SimServer(load_profile("demo"))
        async with TestServer(base.app(), host="127.0.0.1", port=0) as b:
            rs = RequestSpec(url=str(b.make_url("")), backend="openai")
            async with aiohttp.ClientSession() as session:
                rec = await send_request(session, rs, PROMPTS[0], RequestRecord(0, 0, 12, 8))
                text = rec.output_text
                words = text.split(" ")
                # the 4th word swapped for the server's second choice there
                prefix = " ".join(words[:4])
                cands = await next_tokens(session, rs, PROMPTS[0], prefix)
                other = prefix + cands[1][0] + " tail"
                return text, other, await refer(session, rs, PROMPTS[0], text, other), cands

    text, other, x, cands = asyncio.run(main())
    assert x.error is None and x.other_token == cands[1][0]
    assert x.margin_nats == pytest.approx(cands[0][1] - cands[1][1])
    assert x.margin_nats in (pytest.approx(CLEAR_NATS), pytest.approx(TIE_NATS))


def test_an_unreachable_server_is_an_error_not_a_figure() -> None:
    async def main():
        async with aiohttp.ClientSession() as session:
            rs = RequestSpec(url="http://127.0.0.1:9", backend="openai", request_timeout_s=2)
            return await refer(session, rs, "p", " a b c", " a b d")

    x = asyncio.run(main())
    assert x.error and x.margin_nats is None and x.reference_token is None


def test_the_forced_prefix_ends_at_a_whitespace_before_the_difference() -> None:
    assert forced_start(" w1 w22 w3", 6) == 3
    assert forced_start(" w1", 2) == 0
    assert forced_start("x" * 100, 90) == 90  # no whitespace within reach: the difference itself
