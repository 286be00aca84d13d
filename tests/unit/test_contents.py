"""Content classes, the traffic mix and natural stops, piece by piece: the config's checks and units, the mix's
prompts, the simulated engine's per-class acceptance and answer lengths, the validity gate under a natural stop,
and the per-class answer (contents.json) with its disagreements and the content warning."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from specsweep import config as ssconfig
from specsweep.analysis.contents import contents_summary, format_contents
from specsweep.client.contents import content_warning, labelled, mix_level_prompts
from specsweep.client.prompts import LevelPrompts, make_prompts
from specsweep.config import ConfigError
from specsweep.measure.gates import output_length_reasons
from specsweep.sim.engine import Engine
from specsweep.sim.profile import ContentProfile, ProfileError, load_profile, profile_from_dict
from specsweep.sim.server import answer_length
from tests.conftest import REPO

pytestmark = pytest.mark.unit

BASE = ssconfig.load_yaml(REPO / "config" / "config.yaml")


def speed_bench(path: Path, categories: tuple[str, ...] = ("coding", "writing"), n: int = 20) -> Path:
    rows = [
        {"question_id": f"{c}{i}", "category": c, "turns": [f"{c} question {i} " + "w " * 8]}
        for c in categories
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config_with(**workload: object) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg["workload"].update(workload)
    return cfg


def test_one_content_keeps_every_cell_identity() -> None:
    """A workload without classes and with the default stop: its units are its variants and its cell specs hold
    no stop and no content, so no stored cell is re-measured."""
    cfg = ssconfig.validate(copy.deepcopy(BASE))
    assert ssconfig.sweep_units(cfg) == list(cfg["variants"])
    w = ssconfig.unit_workload(cfg, "sim")
    assert "stop" not in w and "content" not in w and "classes" not in w and "mix" not in w


def test_classes_by_category_makes_one_unit_per_category_and_the_mix(tmp_path: Path) -> None:
    data = speed_bench(tmp_path / "s.jsonl")
    cfg = ssconfig.validate(
        config_with(
            dataset={"path": str(data), "format": "speed-bench"},
            classes_by="category",
            mix={"coding": 0.25, "writing": 0.75},
            stop="natural",
        )
    )
    assert list(cfg["workload"]["classes"]) == ["coding", "writing"]
    assert ssconfig.sweep_units(cfg) == [f"{v}@{c}" for v in cfg["variants"] for c in ("coding", "writing", "mix")]
    assert ssconfig.headline_units(cfg) == [f"{v}@mix" for v in cfg["variants"]]
    w = ssconfig.unit_workload(cfg, "sim@coding")
    assert w["stop"] == "natural" and w["content"]["category"] == "coding"
    assert ssconfig.read_dataset(w).describe()["dataset_entries"] == 20  # the class's entries only
    facts = ssconfig.content_facts(cfg, "sim@mix")
    assert facts["prompts"] == "mix: coding 25%, writing 75%" and not facts["synthetic"]
    assert ssconfig.unit_datasets(cfg, "sim@mix") == [str(data)]


@pytest.mark.parametrize(
    ("workload", "said"),
    [
        ({"classes": {"a@b": {"synthetic": True}}}, "workload/classes/a@b"),
        ({"classes": {"mix": {"synthetic": True}}}, "workload/classes/mix"),
        ({"classes": {"a": {}}}, "no prompts"),
        ({"classes": {"a": {"synthetic": True}}, "mix": {"a": 0.5}}, "sum to 0.5, not 1"),
        ({"classes": {"a": {"synthetic": True}}, "mix": {"b": 1.0}}, "b not among the classes"),
        ({"mix": {"a": 1.0}}, "define workload.classes first"),
        ({"classes_by": "category"}, "set workload.dataset"),
    ],
)
def test_classes_that_cannot_be_swept_stop_at_config_time(workload: dict, said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        ssconfig.validate(config_with(**workload))


def test_a_category_no_entry_has_is_refused_naming_the_ones_there(tmp_path: Path) -> None:
    data = speed_bench(tmp_path / "s.jsonl")
    dataset = {"path": str(data), "format": "speed-bench"}
    with pytest.raises(ConfigError, match="no entry of category 'math'.*coding, writing"):
        ssconfig.validate(config_with(dataset=dataset, classes={"m": {"category": "math"}}))


def test_the_mix_draws_each_request_by_its_share_from_disjoint_class_sets() -> None:
    async def level(name: str, seed: int) -> LevelPrompts:
        warm = await make_prompts(4, 16, seed, tag=f"{name}w")
        sets = [await make_prompts(400, 16, seed + r + 1, tag=f"{name}{r}") for r in range(2)]
        return labelled(LevelPrompts(warm, sets, unique=True), name)

    parts = {"a": asyncio.run(level("a", 10)), "b": asyncio.run(level("b", 20))}
    mix = mix_level_prompts(parts, {"a": 0.2, "b": 0.8}, 0, "8")
    again = mix_level_prompts(parts, {"a": 0.2, "b": 0.8}, 0, "8")
    for s, t in zip(mix.repeats, again.repeats, strict=True):
        assert s.prompts == t.prompts and s.contents == t.contents  # the same in every arm
        assert 0.14 < s.contents.count("a") / len(s) < 0.26
        assert len(set(s.prompts)) == len(s)  # no prompt twice
        assert all(
            p in parts[c].repeats[0].prompts + parts[c].repeats[1].prompts
            for p, c in zip(s.prompts, s.contents, strict=True)
        )


def test_the_simulated_engine_accepts_by_class() -> None:
    """A request's class sets its acceptance: the measured accept length is the truncated geometric's mean."""
    profile = load_profile("demo")
    for name in ("coding", "writing", "unknown"):
        eng = Engine(profile, speculative=True, seed=1)
        for _ in range(200):
            eng.new_request(8, 64, accept_prob=profile.accept_prob(name))
        t = 0.0
        while eng.has_work:
            t += eng.step(t).duration
        assert eng.avg_accept_length() == pytest.approx(profile.expected_accept_length(name), rel=0.04), name
    assert profile.accept_prob("unknown") == profile.speculative.accept_prob  # no default entry: the profile's


def test_natural_answers_end_where_the_prompt_says_within_the_cap() -> None:
    prompt = "some prompt words".split()
    assert answer_length(prompt, 40, 512) == answer_length(prompt, 40, 512)  # every arm, every run
    assert answer_length(prompt, None, 64) == 64  # no natural end: the cap
    lengths = [answer_length([f"p{i}"], 40, 10_000) for i in range(2000)]
    assert 35 < sum(lengths) / len(lengths) < 45
    assert max(answer_length([f"p{i}"], 40, 50) for i in range(2000)) == 50


def test_a_profile_refuses_a_bad_content_entry() -> None:
    raw = load_profile("demo").to_dict()
    with pytest.raises(ProfileError, match="contents.code.accept_prob"):
        profile_from_dict({**raw, "contents": {"code": {"accept_prob": 1.5}}})
    with pytest.raises(ProfileError, match="contents.code.speed: unknown field"):
        profile_from_dict({**raw, "contents": {"code": {"speed": 1}}})
    assert profile_from_dict({**raw, "contents": {"code": {"answer_tokens": 5}}}).contents == {
        "code": ContentProfile(answer_tokens=5)
    }


@pytest.mark.parametrize(
    ("stop", "tokens", "reason"),
    [
        ("fixed", 10, "1 request(s) produced fewer output tokens than asked"),
        ("natural", 10, None),
        ("natural", 20, "1 request(s) produced more output tokens than their cap: the server ignored it"),
    ],
)
def test_a_natural_stop_may_end_short_never_long(stop: str, tokens: int, reason: str | None) -> None:
    df = pd.DataFrame({"output_tokens": [tokens, 16], "expected_output_tokens": [16, 16], "ok": True, "error_kind": ""})
    assert output_length_reasons(df, stop) == ([reason] if reason else [])


def _crossover(unit: str, est: float | None, lo: float | None, hi: float | None, accept: float) -> dict:
    states = {"estimate": "within", "lo": "within" if lo is not None else "below_range", "hi": "within"}
    if hi is None:
        states["hi"] = "above_range"
    return {
        "engine": "vllm",
        "source": "real",
        "content": {"content": unit.split("@")[1], "prompts": "dataset d"},
        "content_warning": None,
        "arms": {
            "ngram": {
                "per_level": [{"used": True, "content": {"accept_length": accept}}],
                "crossover": None if est is None else {"estimate": est, "lo": lo or 0.0, "hi": hi, "states": states},
                "verdict": {"kind": "crossover" if est else "wins_everywhere"},
                "threshold": int(lo) if lo else None,
            }
        },
    }


def test_classes_whose_intervals_do_not_overlap_are_said_first() -> None:
    crossovers = {
        "v@code": _crossover("v@code", 40.0, 30.0, 55.0, 3.4),
        "v@chat": _crossover("v@chat", 8.0, 5.0, 12.0, 2.1),
        "v@qa": _crossover("v@qa", 10.0, None, 60.0, 2.4),  # open below: overlaps both
        "v@mix": _crossover("v@mix", 14.0, 9.0, 20.0, 2.5),
    }
    s = contents_summary("v", crossovers, {"code": 0.2, "chat": 0.5, "qa": 0.3})
    assert len(s["disagreements"]) == 1 and s["disagreements"][0].startswith("ngram: code crosses at 40 [30, 55]")
    assert s["spread"]["ngram"]["crossover_min"] == 8.0 and s["spread"]["ngram"]["accept_length_max"] == 3.4
    assert [a["content"] for a in s["mix"]] == ["mix"]
    text = format_contents(s).splitlines()
    assert text[1].startswith("  DISAGREE  ngram: code")  # before any class's line
    assert any(line.strip().startswith("qa (30%)") and "[open, 60]" in line for line in text)


@pytest.mark.parametrize(
    ("engine", "synthetic", "stop", "warned"),
    [
        ("sglang", True, "natural", "synthetic words"),
        ("vllm", False, "fixed", "fixed stop"),
        ("sglang", False, "natural", None),
        ("sim", True, "fixed", None),  # the profile's acceptance: nothing to warn about
    ],
)
def test_a_real_engine_on_synthetic_words_or_a_fixed_stop_is_warned(
    engine: str, synthetic: bool, stop: str, warned: str | None
) -> None:
    facts = {"engine": engine, "synthetic": synthetic, "stop": stop}
    said = content_warning(facts)
    assert (said is None) == (warned is None) and (warned is None or warned in said), said
