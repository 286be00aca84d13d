"""Workload files: each format read, each bad file named by file, line and field, reference lengths, paired and
disjoint sets, the dataset's hash, and chat requests against the simulated engine."""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import sys
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from aiohttp.test_utils import TestServer

from specsweep.cli import bench as bench_cli
from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.datasets import Dataset, DatasetError, _speed_bench_entry, load_dataset
from specsweep.client.fasthttp import FastPool
from specsweep.client.loadgen import measure_level
from specsweep.client.prompts import (
    ChatTemplateUnavailable,
    hf_chat_template,
    level_prompts,
    prompt_set_hash,
    reference_lengths,
    templated,
)
from specsweep.config import ConfigError, cell_spec, validate
from specsweep.engines.sim import SimEngine
from specsweep.measure import bench
from specsweep.measure.cell import CellError, chat_render, client_variant, run_cell
from specsweep.measure.summary import level_summary
from specsweep.sim.profile import load_profile
from specsweep.sim.server import SimServer
from tests.conftest import REPO

pytestmark = pytest.mark.unit

SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "alpha question"},
            {"from": "gpt", "value": "alpha answer has five words"},
            {"from": "human", "value": "alpha follow up"},
            {"from": "gpt", "value": "second answer"},
        ],
    },
    {"conversations": [{"from": "human", "value": "beta question"}, {"from": "gpt", "value": "beta answer"}]},
]


def write(path: Path, rows: list[Any], jsonl: bool = True) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n" if jsonl else json.dumps(rows))
    return path


def many(tmp_path: Path, n: int) -> Path:
    """A chat-jsonl file of n distinct two-message conversations with references."""
    rows = [
        {
            "messages": [{"role": "system", "content": f"s{i} short"}, {"role": "user", "content": f"q{i} what now"}],
            "reference": " ".join(f"r{i}" for _ in range(3 + i % 5)),
        }
        for i in range(n)
    ]
    return write(tmp_path / "chat.jsonl", rows)


def test_sharegpt_first_turn_and_history(tmp_path: Path) -> None:
    f = write(tmp_path / "sg.json", SHAREGPT, jsonl=False)
    first = load_dataset(f, "sharegpt")
    assert first.chat == "first_turn" and first.name == "sg" and not first.conversational
    assert first.entries[0].messages == ({"role": "user", "content": "alpha question"},)
    assert first.entries[0].reference == "alpha answer has five words"
    hist = load_dataset(f, "sharegpt", name="mine", chat="history")
    assert hist.name == "mine" and hist.conversational
    assert [m["role"] for m in hist.entries[0].messages] == ["system", "user", "assistant", "user"]
    assert hist.entries[0].reference == "second answer"
    assert hist.entries[1].single_turn and hist.entries[1].reference == "beta answer"


def test_mtbench_chat_jsonl_and_prompts_jsonl(tmp_path: Path) -> None:
    mt = write(
        tmp_path / "mt.jsonl",
        [
            {"question_id": 81, "category": "writing", "turns": ["write a poem", "shorter"], "reference": ["a poem"]},
            {"question_id": 82, "turns": ["add two numbers"]},
        ],
    )
    d = load_dataset(mt, "mtbench")
    assert d.entries[0].text == "write a poem" and d.entries[0].reference == "a poem"
    assert d.entries[1].reference is None and not d.conversational
    chat = write(
        tmp_path / "c.jsonl",
        [{"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}], "reference": "yo"}],
    )
    c = load_dataset(chat, "chat-jsonl")
    assert c.conversational and c.entries[0].reference == "yo" and c.entries[0].messages[-1]["role"] == "user"
    p = write(tmp_path / "p.jsonl", [{"prompt": "one two", "output_tokens": 4}, {"prompt": "three"}])
    pd_ = load_dataset(p, "prompts-jsonl")
    assert [e.text for e in pd_.entries] == ["one two", "three"] and [e.output_tokens for e in pd_.entries] == [4, None]


@pytest.mark.parametrize(
    ("fmt", "content", "expected"),
    [
        ("prompts-jsonl", '{"prompt": "a"}\n{nope\n', r"bad\.jsonl:2: not JSON"),
        ("prompts-jsonl", '{"prompt": "a"}\n\n[1, 2]\n', r"bad\.jsonl:3: a list, not a JSON object"),
        ("prompts-jsonl", '{"text": "a"}\n', r"bad\.jsonl:1: missing field 'prompt'"),
        ("prompts-jsonl", '{"prompt": 5}\n', r"bad\.jsonl:1: field 'prompt' is a int, not a str"),
        ("prompts-jsonl", '{"prompt": "a", "output_tokens": "9"}\n', r"bad\.jsonl:1: field 'output_tokens' is a str"),
        ("prompts-jsonl", '{"prompt": "a", "output_tokens": 0}\n', r"bad\.jsonl:1: field 'output_tokens' is 0"),
        ("prompts-jsonl", "\n\n", r"bad\.jsonl: no entries"),
        ("mtbench", '{"turns": ["x"]}\n', r"bad\.jsonl:1: missing field 'question_id'"),
        ("mtbench", '{"question_id": 1, "turns": "x"}\n', r"bad\.jsonl:1: field 'turns' is a str, not a list"),
        ("mtbench", '{"question_id": 1, "turns": []}\n', r"bad\.jsonl:1: field 'turns' is empty"),
        ("mtbench", '{"question_id": 1, "turns": [""]}\n', r"bad\.jsonl:1: field 'turns\[0\]' must be a non-empty"),
        ("chat-jsonl", '{"messages": [{"role": "bot", "content": "x"}]}\n', r"messages\[0\]: field 'role' is 'bot'"),
        ("chat-jsonl", '{"messages": [{"role": "user"}]}\n', r"bad\.jsonl:1 messages\[0\]: field 'content'"),
        ("chat-jsonl", '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n',
         r"bad\.jsonl:1: field 'messages' must end with a user message"),
        ("sharegpt", '{"conversations": []}', r"bad\.jsonl: a JSON dict, not an array"),
        ("sharegpt", "[{oops", r"bad\.jsonl: not JSON"),
        ("sharegpt", '[{"conversations": [{"from": "human", "value": "q"}]}, 3]', r"bad\.jsonl\[1\]: a int"),
        ("sharegpt", '[{"id": 1}]', r"bad\.jsonl\[0\]: missing field 'conversations'"),
        ("sharegpt", '[{"conversations": [{"from": "gpt", "value": "a"}]}]',
         r"bad\.jsonl\[0\]: field 'conversations' has no human turn"),
        ("sharegpt", '[{"conversations": [{"from": "robot", "value": "a"}]}]',
         r"bad\.jsonl\[0\] conversations\[0\]: field 'from' is 'robot'"),
    ],
)  # fmt: skip
def test_bad_files_are_named_by_file_line_and_field(tmp_path: Path, fmt: str, content: str, expected: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(DatasetError, match=expected):
        load_dataset(f, fmt)


def test_missing_file_unknown_format_and_misplaced_chat_mode(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist.*fix workload.dataset.path"):
        load_dataset(tmp_path / "none.json", "sharegpt")
    with pytest.raises(DatasetError, match="unknown dataset format"):
        load_dataset(tmp_path / "none.json", "csv")
    with pytest.raises(DatasetError, match="applies to the sharegpt format only"):
        load_dataset(tmp_path / "none.json", "mtbench", chat="history")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DatasetError, match=r"bin\.jsonl: not UTF-8"):
        load_dataset(tmp_path / "bin.jsonl", "prompts-jsonl")


def tiny_config(workload: dict[str, Any]) -> dict[str, Any]:
    config = yaml.safe_load((REPO / "tests" / "pipeline" / "tiny.yaml").read_text())
    return {**config, "workload": {**config["workload"], **workload}}


def test_config_validation_stops_on_a_bad_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative path resolves from the working directory
    (tmp_path / "bad.jsonl").write_text('{"question_id": 1, "turns": ["ok"]}\n{"question_id": 2}\n')
    with pytest.raises(ConfigError, match=r"'workload/dataset': bad\.jsonl:2: missing field 'turns'"):
        validate(tiny_config({"dataset": {"path": "bad.jsonl", "format": "mtbench"}}))
    write(
        tmp_path / "mt.jsonl",
        [{"question_id": 1, "turns": ["q"], "reference": ["a b"]}, {"question_id": 2, "turns": ["q2"]}],
    )
    ref = {"output_tokens": {"reference": {"min": 2, "max": 50}}}
    with pytest.raises(
        ConfigError, match=r"mt\.jsonl:2: workload\.output_tokens is \{reference: \.\.\.\}.*no reference"
    ):
        validate(tiny_config({"dataset": {"path": "mt.jsonl", "format": "mtbench"}, **ref}))
    write(tmp_path / "p.jsonl", [{"prompt": "x"}])
    with pytest.raises(ConfigError, match="this format has no reference answers"):
        validate(tiny_config({"dataset": {"path": "p.jsonl", "format": "prompts-jsonl"}, **ref}))
    with pytest.raises(ConfigError, match="no dataset to take reference answers from"):
        validate(tiny_config(ref))
    many(tmp_path, 2)
    with pytest.raises(ConfigError, match=r"chat\.jsonl:1: a conversation of 2 messages.*workload\.endpoint: chat"):
        validate(tiny_config({"dataset": {"path": "chat.jsonl", "format": "chat-jsonl"}}))
    with pytest.raises(ConfigError, match=r"prompts_file': this key was removed.*format: prompts-jsonl"):
        validate(tiny_config({"prompts_file": "p.jsonl"}))
    ok = validate(tiny_config({"dataset": {"path": "chat.jsonl", "format": "chat-jsonl"}, "endpoint": "chat", **ref}))
    assert ok["workload"]["dataset"] == {"path": "chat.jsonl", "format": "chat-jsonl", "name": None, "chat": None}
    assert validate(ok) == ok  # idempotent


def test_reference_lengths_use_the_tokenizer_less_its_bos() -> None:
    async def bos_counter(text: str) -> int:
        return 1 + len(text.split())  # a tokenizer that adds BOS, as vLLM's /tokenize does

    async def go() -> tuple[list[int], list[int]]:
        refs: list[str | None] = ["one two three", "w " * 100, "x"]
        return (
            await reference_lengths(refs, {"min": 2, "max": 50}, bos_counter),
            await reference_lengths(refs, {"min": 1, "max": 50}, None),
        )

    assert asyncio.run(go()) == ([3, 50, 2], [3, 50, 1])


def level(dataset: Dataset, c: int, n: int, repeats: int, warm: int, **kw: Any) -> Any:
    return asyncio.run(level_prompts(c, n, repeats, warm, 16, seed=3, dataset=dataset, **kw))


def test_sets_are_disjoint_paired_and_take_reference_lengths(tmp_path: Path) -> None:
    ds = load_dataset(many(tmp_path, 40), "chat-jsonl")
    out = {"reference": {"min": 4, "max": 6}}
    a, b = level(ds, 4, 8, 2, 4, output=out), level(ds, 4, 8, 2, 4, output=out)  # two arms, one cell
    assert [s.messages for s in a.repeats] == [s.messages for s in b.repeats] and a.describe() == b.describe()
    sent = [m for s in [a.warmup, *a.repeats] for m in s.messages]
    assert len(sent) == 20 and len({json.dumps(m) for m in sent}) == 20 and a.unique  # warm-up disjoint too
    by_q = {e.messages[-1]["content"]: e for e in ds.entries}
    for s in a.repeats:
        for m, o in zip(s.messages, s.output_tokens, strict=True):
            assert o == min(6, max(4, len(by_q[m[-1]["content"]].reference.split())))
    other = level(ds, 8, 8, 1, 4)
    assert other.repeats[0].sha256 != a.repeats[0].sha256  # another level starts elsewhere in the file
    short = level(ds, 4, 30, 2, 4)
    assert not short.unique and short.describe()["prompts_unique"] is False  # cycled, and said so


def test_summary_facts_name_the_dataset_and_its_hash(tmp_path: Path) -> None:
    f = many(tmp_path, 12)
    lv = level(load_dataset(f, "chat-jsonl", name="demo-chat"), 2, 4, 1, 2)
    d = lv.describe()
    assert d["dataset"] == "demo-chat" and d["dataset_format"] == "chat-jsonl" and d["dataset_chat"] is None
    assert d["dataset_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest() and d["dataset_path"] == str(f)
    rep = lv.repeats[0]
    assert d["prompt_sets"][0]["sha256"] == prompt_set_hash(rep.prompts, rep.output_tokens, rep.messages)
    changed = copy.deepcopy(rep.messages)
    changed[0][0]["content"] = "another system prompt"
    assert prompt_set_hash(rep.prompts, rep.output_tokens, changed) != rep.sha256  # the hash covers messages
    f.write_text(f.read_text().replace("s0 short", "s0 other"))
    assert level(load_dataset(f, "chat-jsonl"), 2, 4, 1, 2).describe()["dataset_sha256"] != d["dataset_sha256"]


def test_templated_sets_keep_their_messages_and_hashes(tmp_path: Path) -> None:
    lv = level(load_dataset(many(tmp_path, 10), "chat-jsonl"), 2, 3, 1, 2)
    t = templated(lv, lambda msgs: " ".join(f"[{m['role']}] {m['content']}" for m in msgs) + " [assistant]")
    assert t.describe()["prompt_set_sha256"] == lv.describe()["prompt_set_sha256"]
    assert t.describe()["chat_template"] == "client"
    assert t.repeats[0].request(0, chat=False).startswith("[system] s")
    assert t.repeats[0].request(0, chat=True) == t.repeats[0].templated[0]  # the text is what goes to /generate


def fake_transformers(monkeypatch: pytest.MonkeyPatch, template: str | None) -> None:
    """A stand-in `transformers` whose tokenizer renders `<s>[role]content...` (the package is optional)."""

    class Tok:
        chat_template = template
        bos_token = "<s>"

        def apply_chat_template(
            self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool
        ) -> str:
            assert not tokenize and add_generation_prompt
            return "<s>" + "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(path: str, local_files_only: bool) -> Tok:
            assert local_files_only
            return Tok()

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=AutoTokenizer))


def test_client_side_chat_template_strips_the_leading_bos_and_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_transformers(monkeypatch, "{{ messages }}")
    render = hf_chat_template("/models/m")
    assert render(({"role": "user", "content": "hi"},)) == "[user]hi[assistant]"
    fake_transformers(monkeypatch, None)
    with pytest.raises(ChatTemplateUnavailable, match="no chat template.*client_backend: openai"):
        hf_chat_template("/models/m")
    with pytest.raises(ChatTemplateUnavailable, match="none is local"):
        hf_chat_template(None)
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    with pytest.raises(ChatTemplateUnavailable, match="need transformers.*or install transformers"):
        hf_chat_template("/models/m")


def with_sim(fn: Callable[[str], Awaitable[Any]], speculative: bool = False) -> Any:
    """Run fn(url) against a simulated engine on 127.0.0.1; always stop it."""

    async def main() -> Any:
        server = TestServer(SimServer(load_profile("demo"), speculative=speculative).app(), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            return await fn(str(server.make_url("")).rstrip("/"))
        finally:
            await server.close()

    return asyncio.run(main())


def test_chat_request_sends_messages_and_records_the_servers_input_count() -> None:
    msgs = ({"role": "system", "content": "be brief"}, {"role": "user", "content": "three word question"})
    spec = RequestSpec(url="", backend="openai", endpoint="chat")
    assert spec.payload(msgs, 5)["messages"] == list(msgs) and spec.sends_messages
    with pytest.raises(ValueError, match="takes text"):
        RequestSpec(url="").payload(msgs, 5)

    async def go(url: str) -> RequestRecord:
        pool = FastPool()
        try:
            return await send_request(
                pool, RequestSpec(url=url, backend="openai", endpoint="chat"), msgs, RequestRecord(0, 0, 7, 5)
            )
        finally:
            pool.close()

    rec = with_sim(go)
    assert rec.ok, rec.error
    assert rec.output_tokens == 7 == rec.server_output_tokens
    assert rec.input_tokens == 2 + 3 + 3  # the sim's template: <|role|> per message, <|assistant|>; 5 words asked


def test_chat_level_on_the_sim_gets_accept_length_from_counters(tmp_path: Path) -> None:
    ds = load_dataset(many(tmp_path, 30), "chat-jsonl")
    spec_kw = {"backend": "openai", "endpoint": "chat"}

    async def go(url: str) -> Any:
        prompts = await level_prompts(2, 2 + 6, 1, 2, 16, seed=0, output=12, dataset=ds, url=url)
        spec = RequestSpec(url=url, **spec_kw)
        lvl = await measure_level(spec, 2, 6, prompts, 12, warmup=2, hooks=SimEngine(), idle_probe_s=0)
        return prompts, level_summary(lvl, prompts, spec, 12), lvl.records

    prompts, summary, df = with_sim(go, speculative=True)
    assert df["ok"].all() and (df["output_tokens"] == df["expected_output_tokens"]).all()  # ramp ones shorter
    words = {m[-1]["content"]: sum(len(x["content"].split()) + 1 for x in m) + 1 for m in prompts.repeats[0].messages}
    assert sorted(df["input_tokens"]) == sorted(words.values())  # the server's count, its template included
    w = summary["workload"]
    assert w["endpoint"] == "chat" and w["input_tokens_counted_by"] == "server" and w["dataset"] == "chat"
    assert summary["metrics"]["accept_length"] is not None and summary["metrics"]["accept_length"] > 1


def test_the_cell_checks_the_dataset_and_the_template_before_any_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "mt.jsonl", [{"question_id": i, "turns": [f"q{i} x"]} for i in range(4)])
    config = validate(tiny_config({"dataset": {"path": "mt.jsonl", "format": "mtbench"}}))
    spec = cell_spec(config, "sim", "baseline", 1)
    (tmp_path / "mt.jsonl").write_text('{"question_id": 1}\n')  # broken after validation: a standalone cell
    (tmp_path / "env.json").write_text("{}")
    with pytest.raises(CellError, match=r"mt\.jsonl:1: missing field 'turns'"):
        run_cell(spec, tmp_path / "env.json", tmp_path / "out", tmp_path / "state", tmp_path / "logs")
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()  # no server was asked for
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(CellError, match="client_backend: openai"):
        chat_render({"endpoint": "chat"}, "sglang", "/models/m")
    assert chat_render({"endpoint": "chat"}, "openai", None) is None
    sim = {"engine": "sim"}
    assert client_variant(sim, {"endpoint": "chat"})["client_backend"] == "openai"
    assert client_variant({**sim, "client_backend": "sglang"}, {"endpoint": "chat"})["client_backend"] == "sglang"
    assert "client_backend" not in client_variant(sim, {"endpoint": "completions"})


def test_bench_takes_the_same_datasets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{**c, "id": f"{i}{c.get('id', '')}"} for i in range(12) for c in copy.deepcopy(SHAREGPT)]
    for i, r in enumerate(rows):
        r["conversations"][-2 if len(r["conversations"]) > 2 else 0]["value"] += f" n{i}"  # distinct asks
    f = write(tmp_path / "sg.json", rows, jsonl=False)
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    common = ["--concurrency", "2", "--warmup", "1", "--output-tokens", "6", "--requests-floor", "4"]
    common += ["--dataset", str(f), "--dataset-format", "sharegpt", "--dataset-chat", "history"]

    async def go(url: str) -> int:
        args = parser.parse_args(
            ["--url", url, *common, "--backend", "openai", "--endpoint", "chat", "--engine", "sim"]
            + ["--out", str(tmp_path / "out"), "--client-cpus", "none"]
        )
        return await bench.bench(bench_cli.options(args))

    assert with_sim(go) in (0, 1)  # 1: some gate failed on a busy machine; the workload is what is checked here
    w = json.loads((tmp_path / "out" / "c2" / "summary.json").read_text())["workload"]
    assert w["dataset"] == "sg" and w["dataset_chat"] == "history" and w["endpoint"] == "chat"
    args = parser.parse_args(["--url", "http://127.0.0.1:9", *common])  # conversations on completions
    assert asyncio.run(bench.bench(bench_cli.options(args))) == 2
    assert "set workload.endpoint: chat" in capsys.readouterr().err


def test_warm_up_keeps_its_short_lengths_over_the_files(tmp_path: Path) -> None:
    f = write(tmp_path / "p.jsonl", [{"prompt": f"p{i} x", "output_tokens": 500} for i in range(12)])
    lv = level(load_dataset(f, "prompts-jsonl"), 2, 4, 1, 4)
    assert lv.warmup.output_tokens == [None] * 4 and lv.repeats[0].output_tokens == [500] * 4


def test_sharegpt_speaker_aliases_of_public_dumps(tmp_path: Path) -> None:
    turns = [{"from": "user", "value": "q1"}, {"from": "chatgpt", "value": "a1"}, {"from": "human", "value": "q2"},
             {"from": "bing", "value": "a2"}]  # fmt: skip
    f = write(tmp_path / "sg.json", [{"conversations": turns}], jsonl=False)
    entry = load_dataset(f, "sharegpt", chat="history").entries[0]
    assert [m["role"] for m in entry.messages] == ["user", "assistant", "user"] and entry.reference == "a2"


SPEED_BENCH = [
    {"question_id": "c-1", "category": " coding ", "sub_category": "python", "turns": ["write a sort", "faster"],
     "source": "x", "difficulty": "easy", "multiturn": True},
    {"question_id": 2, "category": "math", "turns": ["add 2 and 3"], "multiturn": False},
]  # fmt: skip


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_speed_bench_jsonl_and_parquet_read_categories_and_send_the_first_turn(tmp_path: Path) -> None:
    rows = [{**r, "question_id": str(r["question_id"])} for r in SPEED_BENCH]  # one Parquet column, one type
    for f in (write(tmp_path / "sb.jsonl", SPEED_BENCH), write_parquet(tmp_path / "sb.parquet", rows)):
        d = load_dataset(f, "speed-bench")
        assert [e.category for e in d.entries] == ["coding", "math"]
        assert [e.messages for e in d.entries] == [
            ({"role": "user", "content": "write a sort"},),
            ({"role": "user", "content": "add 2 and 3"},),
        ]
        assert all(e.reference is None and e.output_tokens is None for e in d.entries) and not d.conversational
    assert d.entries[1].where.endswith("sb.parquet row 1")
    # a Parquet list column read through pandas arrives as a numpy array
    entry = _speed_bench_entry({"question_id": np.int64(3), "category": "qa", "turns": np.array(["q", "r"])}, "w")
    assert entry.text == "q" and entry.category == "qa"
    mt = write(tmp_path / "mt.jsonl", [{"question_id": 1, "category": " writing\n", "turns": ["q"]},
                                       {"question_id": 2, "turns": ["q"]}])  # fmt: skip
    assert [e.category for e in load_dataset(mt, "mtbench").entries] == ["writing", None]
    assert load_dataset(many(tmp_path, 1), "chat-jsonl").entries[0].category is None


def test_chat_log_takes_the_logged_answer_as_reference_and_the_requests_cap(tmp_path: Path) -> None:
    rows = [
        {"id": "req-1", "ts": 1712.5, "user": "u9", "category": " code ", "max_tokens": 256,
         "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "sort a list"},
                      {"role": "assistant", "content": "use sorted()"}]},
        {"class": "chat", "messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                                     {"type": "text", "text": "part two"}]}]},
        {"request": {"model": "m", "max_completion_tokens": 64, "messages": [
            {"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
            {"role": "assistant", "content": [{"type": "text", "text": "a1"}]}, {"role": "user", "content": "q2"}]},
         "response": {"choices": [{"message": {"role": "assistant", "content": "a2"}}]}},
    ]  # fmt: skip
    d = load_dataset(write(tmp_path / "log.jsonl", rows), "chat-log")
    first, parts, nested = d.entries
    assert first.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "sort a list"})
    assert first.reference == "use sorted()" and first.output_tokens == 256 and first.category == "code"
    assert parts.messages == ({"role": "user", "content": "part one\npart two"},)
    assert parts.category == "chat" and parts.reference is None and parts.output_tokens is None
    assert [m["role"] for m in nested.messages] == ["system", "user", "assistant", "user"]
    assert nested.messages[2]["content"] == "a1" and nested.reference is None and nested.output_tokens == 64
    assert nested.category is None and d.conversational


@pytest.mark.parametrize(
    ("fmt", "content", "expected"),
    [
        ("speed-bench", '{"question_id": 1, "category": "qa", "turns": ["q"]}\n{"question_id": 2, "turns": ["q"]}\n',
         r"bad\.jsonl:2: missing field 'category'; give each row its 'category'"),
        ("speed-bench", '{"question_id": 1, "category": "qa"}\n',
         r"bad\.jsonl:1: missing field 'turns'; give each row \"turns\""),
        ("speed-bench", '{"question_id": 1, "category": " ", "turns": ["q"]}\n',
         r"bad\.jsonl:1: field 'category' is blank; give each row its content class"),
        ("speed-bench", '{"question_id": 1, "category": "qa", "turns": []}\n',
         r"bad\.jsonl:1: field 'turns' is empty; give at least the first user turn"),
        ("chat-log", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, '
                     '{"type": "image_url", "image_url": {"url": "data:..."}}]}]}\n',
         r"bad\.jsonl:1 messages\[0\]: field 'content\[1\]' is a 'image_url' part; only text is supported"),
        ("chat-log", '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null, '
                     '"tool_calls": [{"id": "t"}]}, {"role": "tool", "content": "42"}]}\n',
         r"bad\.jsonl:1 messages\[1\]: a tool message or tool call; drop the logged requests with tool messages"),
        ("chat-log", '{"request": {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "4"}]}}',
         r"bad\.jsonl:1 messages\[1\]: a tool message or tool call; drop the logged requests"),
        ("chat-log", '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, '
                     '{"role": "assistant", "content": "b"}]}\n',
         r"bad\.jsonl:1: field 'messages' must end with a user message .* fix or drop the line"),
        ("chat-log", '{"messages": [{"role": "bot", "content": "x"}]}\n',
         r"bad\.jsonl:1 messages\[0\]: field 'role' is 'bot'; use one of system, developer, user, assistant"),
        ("chat-log", '{"messages": [{"role": "user", "content": "q"}], "max_tokens": 0}\n',
         r"bad\.jsonl:1: field 'max_tokens' is 0; give a positive integer"),
        ("chat-log", '{"messages": [{"role": "user", "content": "q"}], "class": 3}\n',
         r"bad\.jsonl:1: field 'class' is a int, not a str; give 'class' as a string"),
        ("chat-log", '{"request": "POST /v1/chat/completions"}\n',
         r"bad\.jsonl:1: field 'request' is a str, not a dict; nest the logged request"),
    ],
)  # fmt: skip
def test_new_formats_name_file_line_field_and_fix(tmp_path: Path, fmt: str, content: str, expected: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(DatasetError, match=expected):
        load_dataset(f, fmt)


def test_speed_bench_parquet_errors_name_the_row(tmp_path: Path) -> None:
    rows = [{"question_id": 1, "category": "qa", "turns": ["q"]}, {"question_id": 2, "category": None, "turns": ["q"]}]
    with pytest.raises(DatasetError, match=r"sb\.parquet row 1: missing field 'category'; give each row"):
        load_dataset(write_parquet(tmp_path / "sb.parquet", rows), "speed-bench")
    rows = [{"question_id": 1, "category": "qa", "turns": None}]
    with pytest.raises(DatasetError, match=r"sb\.parquet row 0: missing field 'turns'"):
        load_dataset(write_parquet(tmp_path / "sb.parquet", rows), "speed-bench")
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match=r"fake\.parquet: not a readable Parquet file .*give a \.parquet table"):
        load_dataset(tmp_path / "fake.parquet", "speed-bench")
    write(tmp_path / "sb.json", SPEED_BENCH, jsonl=False)
    with pytest.raises(DatasetError, match=r"sb\.json: a speed-bench file must end in \.jsonl or \.parquet"):
        load_dataset(tmp_path / "sb.json", "speed-bench")


def test_reference_lengths_know_the_new_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ref = {"output_tokens": {"reference": {"min": 2, "max": 50}}}
    write(tmp_path / "sb.jsonl", SPEED_BENCH)
    with pytest.raises(ConfigError, match=r"sb\.jsonl:1: .*SPEED-Bench has no reference answers"):
        validate(tiny_config({"dataset": {"path": "sb.jsonl", "format": "speed-bench"}, **ref}))
    log = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b"}]},
           {"messages": [{"role": "user", "content": "q2"}]}]  # fmt: skip
    write(tmp_path / "log.jsonl", log)
    with pytest.raises(ConfigError, match=r"log\.jsonl:2: .*no logged answer"):
        validate(tiny_config({"dataset": {"path": "log.jsonl", "format": "chat-log"}, **ref}))
    write(tmp_path / "log.jsonl", log[:1])
    ok = validate(tiny_config({"dataset": {"path": "log.jsonl", "format": "chat-log"}, **ref}))
    assert ok["workload"]["dataset"]["format"] == "chat-log"
