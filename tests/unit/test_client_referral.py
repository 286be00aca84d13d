"""A difference between two arms' outputs, referred to the reference server over HTTP (client/referral.py):
near-ties found as near-ties, a wrong word as a clear difference, on every API the load generator speaks.

The simulated server replays a prompt with the top-k log-probabilities of every word (its words follow from
everything before them, `sim.server.next_words`), and its faults make a speculative server part from the baseline
at a near-tie (`near_tie_output_fraction`) or replace a word (`corrupt_output_fraction`)."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from dataclasses import replace as dc_replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from specsweep.analysis.outputs import referral_kind
from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.referral import (
    TOP_K,
    Replay,
    judge,
    read_replay,
    refer,
    request_body,
    self_check,
    tokens_through,
)
from specsweep.measure.referral import baseline_cell_dirs
from specsweep.sim.faults import FaultConfig
from specsweep.sim.profile import ContentProfile, Profile, load_profile
from specsweep.sim.server import TIE_NATS, SimServer

pytestmark = pytest.mark.unit

PROMPTS = [f"prompt number {i} about the weather" for i in range(40)]
TOKENS = 24
FORMS = [("sglang", "completions"), ("openai", "completions"), ("openai", "chat")]


async def _outputs(
    spec: RequestSpec, session: aiohttp.ClientSession, contents: list[str] | None = None
) -> list[RequestRecord]:
    out = []
    for i, p in enumerate(PROMPTS):
        rec = RequestRecord(i, i, TOKENS, 8)
        rec.content = contents[i] if contents else ""
        rec = await send_request(session, spec, p, rec)
        assert rec.ok, rec.error
        out.append(rec)
    return out


def _refer_all(
    backend: str,
    endpoint: str,
    faults: FaultConfig,
    stop: str = "fixed",
    profile: Profile | None = None,
    contents: list[str] | None = None,
):
    """Both sim servers' outputs of PROMPTS (each prompt's content class `contents[i]`, as measured), and the
    differences referred to the baseline's server, as `measure/referral.py` sends them."""
    profile = profile or load_profile("demo")

    async def main():
        base, spec = SimServer(profile), SimServer(profile, speculative=True, faults=faults)
        async with (
            TestServer(base.app(), host="127.0.0.1", port=0) as b,
            TestServer(spec.app(), host="127.0.0.1", port=0) as s,
        ):
            rs = RequestSpec(url=str(b.make_url("")), backend=backend, endpoint=endpoint, stop=stop)
            async with aiohttp.ClientSession() as session:
                refs = await _outputs(rs, session, contents)
                others = await _outputs(dc_replace(rs, url=str(s.make_url(""))), session, contents)
                ref, other = [r.output_text for r in refs], [r.output_text for r in others]
                found = [
                    (i, await refer(session, rs, PROMPTS[i], ref[i], other[i], refs[i].output_tokens, refs[i].content))
                    for i in range(len(PROMPTS))
                    if ref[i] != other[i]
                ]
                r0 = refs[0]
                check = await self_check(session, rs, PROMPTS[0], ref[0], r0.output_tokens, r0.content)
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
        # outside the top k, bounded by the last candidate, far below: clear, not merely unmatched
        assert x.bound_rank == TOP_K and x.margin_at_least_nats > 1.0, (i, x)
        assert referral_kind(asdict(x), 0.1, TOP_K) == ("clear", None)


@pytest.mark.parametrize(("backend", "endpoint"), FORMS)
def test_a_natural_stop_is_replayed_as_measured(backend: str, endpoint: str) -> None:
    """A natural stop: the replay asks no ignore_eos and sends the prompt's content class, so the sim ends it
    where the measured answer ended (its class's answers run to the cap here, the default's end after a few
    tokens); the replaced word is still found, clear."""
    demo = load_profile("demo")
    profile = dc_replace(demo, contents={"default": ContentProfile(answer_tokens=3), "long": ContentProfile()})
    contents = ["long" if i % 2 else "" for i in range(len(PROMPTS))]
    ref, other, found = _refer_all(
        backend, endpoint, FaultConfig(corrupt_output_fraction=0.4), "natural", profile, contents
    )
    assert any(len(t.split()) < TOKENS for t in ref[::2]) and all(len(t.split()) == TOKENS for t in ref[1::2])
    assert 4 <= len(found), len(found)
    for i, x in found:
        assert x.error is None and x.other_head.startswith(" CORRUPTED"), (i, x)
        assert referral_kind(asdict(x), 0.1, TOP_K) == ("clear", None), (i, x)


@pytest.mark.parametrize(("backend", "endpoint"), FORMS)
def test_the_replay_ignores_eos_only_under_a_fixed_stop(backend: str, endpoint: str) -> None:
    """The replay's stop is the measured request's: ignore_eos for a fixed stop, none for a natural one."""
    for stop, ignores in (("fixed", True), ("natural", False)):
        spec = RequestSpec(url="http://127.0.0.1:9", backend=backend, endpoint=endpoint, stop=stop)
        body, measured = request_body(spec, "p", 8, TOP_K), spec.payload("p", 8)
        where, asked = (
            (body["sampling_params"], measured["sampling_params"]) if backend == "sglang" else (body, measured)
        )
        assert where.get("ignore_eos") is (True if ignores else None), (stop, body)
        assert asked.get("ignore_eos") == where.get("ignore_eos"), (stop, body, measured)
        assert body["stream"] is False and "ignore_eos" not in (body if backend == "sglang" else {})


def _parting_at(top: list[tuple[str, float, int | None]]) -> Replay:
    """A replay whose third token (" c", at char 4) is where the outputs part, with candidates `top`."""
    return Replay(
        [" a", " b", " c"], [[(" a", -0.1, None)], [(" b", -0.1, None)], top], " a b c", logprobs=[-0.1, -0.1, -0.6]
    )


def test_a_byte_piece_within_the_tie_margin_is_not_resolved() -> None:
    """The arm's token is a multi-byte character: its byte pieces show alone as U+FFFD, which no output text
    matches, so its text matches no candidate; the likeliest piece lies within the tie margin of the reference's
    token, so the arm's token may be a near-tie: not resolved (with why), never a clear difference."""
    top = [
        (" c", -0.60, None),
        (" \ufffd", -0.62, None),
        ("\ufffd", -0.65, None),
        (" d", -3.0, None),
        (" e", -4.0, None),
    ]
    x = judge(_parting_at(top), " a b c d", " a b \u00e9t\u00e9")
    assert x.error is None and x.reference_token == " c" and x.other_token is None and x.margin_nats is None, x
    assert x.bound_rank == 2 and x.bound_token == " \ufffd" and x.margin_at_least_nats == pytest.approx(0.02), x
    kind, why = referral_kind(asdict(x), 0.1, TOP_K)
    assert kind == "unresolved" and "partial character" in why and "2nd candidate" in why and "0.02 nats" in why
    # the same piece far below the reference's token bounds the arm's from above: a clear difference
    far = [(" c", -0.60, None), (" d", -3.0, None), (" \ufffd", -3.2, None), (" e", -4.0, None), (" f", -5.0, None)]
    y = judge(_parting_at(far), " a b c d", " a b \u00e9t\u00e9")
    assert y.bound_rank == 3 and y.margin_at_least_nats == pytest.approx(2.6), y
    assert referral_kind(asdict(y), 0.1, TOP_K) == ("clear", None)


def test_a_token_outside_the_top_k_near_the_last_candidate_is_not_resolved() -> None:
    """The arm's token is none of the top 5 and the 5th is within the tie margin of the reference's token (a flat
    distribution): the arm's may score up to that, so the margin is not measured."""
    flat = [(" c", -1.60, None), (" d", -1.61, None), (" e", -1.62, None), (" f", -1.63, None), (" g", -1.65, None)]
    x = judge(_parting_at(flat), " a b c d", " a b z d")
    assert x.error is None and x.other_token is None and x.other_head == " z d", x
    assert x.bound_rank == 5 and x.bound_token == " g" and x.margin_at_least_nats == pytest.approx(0.05), x
    kind, why = referral_kind(asdict(x), 0.1, TOP_K)
    assert kind == "unresolved", why
    assert why == (
        "the arm's token is not among the top 5 and the 5th candidate is 0.05 nats from the reference's token: "
        "the margin is not measured"
    )


def test_a_token_outside_the_top_k_far_below_the_last_candidate_is_clear() -> None:
    """The 5th candidate lies more than the tie margin below the reference's token: the arm's token, outside the
    top 5, scores at most that, so the margin is at least that much: a clear difference."""
    steep = [(" c", -0.60, None), (" d", -1.0, None), (" e", -2.0, None), (" f", -2.5, None), (" g", -3.0, None)]
    x = judge(_parting_at(steep), " a b c d", " a b z d")
    assert x.other_token is None and x.bound_rank == 5 and x.margin_at_least_nats == pytest.approx(2.4), x
    assert referral_kind(asdict(x), 0.1, TOP_K) == ("clear", None)
    # a matched token is scored: the margin itself decides
    y = judge(_parting_at(steep), " a b c d", " a b d e")
    assert y.other_token == " d" and y.margin_nats == pytest.approx(0.4) and y.margin_at_least_nats is None, y
    assert referral_kind(asdict(y), 0.1, TOP_K) == ("clear", None)
    assert referral_kind(asdict(y), 0.5, TOP_K) == ("tie", None)


def test_sglang_ids_match_the_replays_own_token() -> None:
    """SGLang gives ids: the replay's own token is the candidate of its id, not another of the same text (two
    tokens can decode alike); the other arm's token is matched by its text and carries its id."""
    sg = RequestSpec(url="http://127.0.0.1:9", backend="sglang")
    obj = {
        "text": " a b",
        "meta_info": {
            "output_token_logprobs": [[-0.1, 11, " a"], [-0.40, 22, " b"]],
            "output_top_logprobs": [[[-0.1, 11, " a"]], [[-0.40, 22, " b"], [-0.30, 21, " b"], [-0.35, 23, " x"]]],
        },
    }
    r = read_replay(sg, obj)
    assert r.ids == [11, 22] and r.logprobs == [-0.1, -0.40] and r.top[1][0] == (" b", -0.30, 21), r
    x = judge(r, " a b c", " a x c")
    assert x.reference_token == " b" and x.reference_id == 22 and x.reference_logprob == -0.40, x
    assert x.other_token == " x" and x.other_id == 23 and x.margin_nats == pytest.approx(-0.05), x
    # without ids (an OpenAI-compatible API) the text decides: the likeliest " b"
    y = judge(dc_replace(r, ids=[]), " a b c", " a x c")
    assert y.reference_id == 21 and y.reference_logprob == -0.30 and y.margin_nats == pytest.approx(0.05), y
    # an own token no candidate holds (outside the top k) is scored by its own log-probability
    z = judge(dc_replace(r, ids=[11, 99]), " a b c", " a x c")
    assert z.reference_id == 99 and z.reference_logprob == -0.40 and z.other_id == 23, z


def test_openai_replies_read_as_three_tuples() -> None:
    """Completions and chat give texts, no ids: each candidate is (text, log-probability, None), most likely
    first; a position the server left without candidates reads as none."""
    comp = {
        "choices": [
            {
                "text": " a b",
                "logprobs": {
                    "tokens": [" a", " b"],
                    "token_logprobs": [-0.1, -0.2],
                    "top_logprobs": [{" a": -0.1}, {" c": -0.5, " b": -0.2}],
                },
            }
        ]
    }
    r = read_replay(RequestSpec(url="http://127.0.0.1:9", backend="openai"), comp)
    assert r.top[1] == [(" b", -0.2, None), (" c", -0.5, None)] and r.logprobs == [-0.1, -0.2] and r.ids == []
    comp["choices"][0]["logprobs"]["top_logprobs"][0] = None
    assert read_replay(RequestSpec(url="http://127.0.0.1:9", backend="openai"), comp).top[0] == []
    chat = {
        "choices": [
            {
                "message": {"content": " a"},
                "logprobs": {
                    "content": [
                        {"token": " a", "logprob": -0.1, "top_logprobs": [{"token": " a", "logprob": -0.1}]},
                    ]
                },
            }
        ]
    }
    r = read_replay(RequestSpec(url="http://127.0.0.1:9", backend="openai", endpoint="chat"), chat)
    assert r.tokens == [" a"] and r.top == [[(" a", -0.1, None)]] and r.logprobs == [-0.1]


def test_a_difference_past_a_replay_that_parts_first_is_not_referred() -> None:
    """The reference's own replay parts from its recorded output before the difference (its batch numerics):
    nothing is judged there, and the error says where and by how much."""
    r = Replay(
        [" a", " b", " x"],
        [[(" a", -0.1, None)], [(" b", -0.1, None)], [(" x", -0.1, None), (" c", -0.103, None)]],
        " a b x",
    )
    x = judge(r, " a b c d", " a b c e")
    assert x.margin_nats is None and x.error and "char 4" in x.error and "0.003" in x.error, x
    y = judge(r, " a b x d", " a b y e")  # the replay follows the reference: judged at its third token
    assert y.token_char == 4 and y.char == 5 and y.reference_token == " x" and y.other_token is None, y
    z = judge(Replay([" a"], [[(" a", -0.1, None)]], " a"), " a b", " a c")
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
