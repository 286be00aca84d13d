"""A difference between two arms' outputs, referred to the reference server over HTTP (client/referral.py):
near-ties found as near-ties, a wrong word as a clear difference, on every API the load generator speaks.

The simulated server replays a prompt with the top-k log-probabilities of every word (its words follow from
everything before them, `sim.server.next_words`), and its faults make a speculative server part from the baseline
at a near-tie (`near_tie_output_fraction`) or replace a word (`corrupt_output_fraction`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.referral import Replay, judge, refer, self_check, tokens_through
from specsweep.measure.referral import baseline_cell_dirs
from specsweep.sim.faults import FaultConfig
from specsweep.sim.profile import load_profile
from specsweep.sim.server import TIE_NATS, SimServer

pytestmark = pytest.mark.unit

PROMPTS = [f"prompt number {i} about the weather" for i in range(40)]
TOKENS = 24
FORMS = [("sglang", "completions"), ("openai", "completions"), ("openai", "chat")]


async def _outputs(spec: RequestSpec, session: aiohttp.ClientSession) -> list[str]:
    out = []
    for i, p in enumerate(PROMPTS):
        rec = await send_request(session, spec, p, RequestRecord(i, i, TOKENS, 8))
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
                    (i, await refer(session, rs, PROMPTS[i], ref[i], other[i], TOKENS))
                    for i in range(len(PROMPTS))
                    if ref[i] != other[i]
                ]
                check = await self_check(session, rs, PROMPTS[0], ref[0], TOKENS)
        assert check.agrees and check.reproduces and check.error is None and check.char == len(ref[0]), check
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


def test_a_difference_past_a_replay_that_parts_first_is_not_referred() -> None:
    """The reference's own replay parts from its recorded output before the difference (its batch numerics):
    nothing is judged there, and the error says where and by how much."""
    r = Replay([" a", " b", " x"], [[(" a", -0.1)], [(" b", -0.1)], [(" x", -0.1), (" c", -0.103)]], " a b x")
    x = judge(r, " a b c d", " a b c e")
    assert x.margin_nats is None and x.error and "char 4" in x.error and "0.003" in x.error, x
    y = judge(r, " a b x d", " a b y e")  # the replay follows the reference: judged at its third token
    assert y.token_char == 4 and y.char == 5 and y.reference_token == " x" and y.other_token is None, y
    z = judge(Replay([" a"], [[(" a", -0.1)]], " a"), " a b", " a c")
    assert z.error and "ended" in z.error


def test_the_replay_covers_the_difference_and_stops_soon_after() -> None:
    text = " w1" * 100  # 300 characters of 100 tokens
    assert tokens_through(text, 30, 100) == int(31 * 100 / 300 * 1.25) + 8
    assert tokens_through(text, 299, 100) == 100 and tokens_through("", 0, 64) == 64


def test_an_unreachable_server_is_an_error_not_a_figure() -> None:
    async def main():
        async with aiohttp.ClientSession() as session:
            rs = RequestSpec(url="http://127.0.0.1:9", backend="openai", request_timeout_s=2)
            return await refer(session, rs, "p", " a b c", " a b d", 3)

    x = asyncio.run(main())
    assert x.error and x.margin_nats is None and x.reference_token is None


def test_a_sequential_cell_finds_the_baseline_cells_of_its_level(tmp_path: Path) -> None:
    """Its own instance's first, then the baseline's other instances, then the merged cell; only measured ones."""
    root = tmp_path / "exp" / "gpu"
    for d in ("baseline/c10/instances/i1", "baseline/c10/instances/i2", "baseline/c10"):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "requests.parquet").write_bytes(b"")
    own = root / "eagle3" / "c10" / "instances" / "i2"
    assert baseline_cell_dirs(own, "eagle3", "baseline") == [
        root / "baseline/c10/instances/i2",
        root / "baseline/c10/instances/i1",
        root / "baseline/c10",
    ]
    assert baseline_cell_dirs(root / "eagle3" / "c10", "eagle3", "baseline")[0] == root / "baseline/c10"
    assert baseline_cell_dirs(root / "eagle3" / "c2", "eagle3", "baseline") == []  # not measured (yet)
