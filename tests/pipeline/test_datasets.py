"""Each dataset format through the DAG on the simulated engine, and a bad file stopping Snakemake before any
server starts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from specsweep.config import defaults
from specsweep.measure.metrics import aborted
from specsweep.measure.summary import read_judged
from tests.conftest import sim_server_processes
from tests.pipeline.conftest import EXP, server_events, snakemake

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(240)]

GATES = defaults("gates")  # the default gates: a cell of any workload must be valid on a quiet machine
N = 40  # entries per file: enough for disjoint warm-up and measured sets at C=2


def words(n: int, tag: str) -> str:
    return " ".join([tag, *(f"w{j}" for j in range(n - 1))])


def sharegpt(path: Path) -> None:
    rows = [
        {
            "id": str(i),
            "conversations": [
                {"from": "system", "value": words(2, f"sys{i}")},
                {"from": "human", "value": words(3 + i % 4, f"q{i}")},
                {"from": "gpt", "value": words(5, f"a{i}")},
                {"from": "human", "value": words(2 + i % 3, f"f{i}")},
                {"from": "gpt", "value": words(4 + i % 9, f"b{i}")},
            ],
        }
        for i in range(N)
    ]
    path.write_text(json.dumps(rows))


def jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def mtbench(path: Path) -> None:
    jsonl(
        path,
        [
            {
                "question_id": i,
                "category": "c",
                "turns": [words(4 + i % 5, f"q{i}"), "again"],
                "reference": [words(3 + i % 9, "r")],
            }
            for i in range(N)
        ],
    )


def chat_jsonl(path: Path) -> None:
    jsonl(
        path,
        [
            {
                "messages": [
                    {"role": "system", "content": words(2, f"s{i}")},
                    {"role": "user", "content": words(3 + i % 4, f"u{i}")},
                ],
                "reference": words(4 + i % 7, "r"),
            }
            for i in range(N)
        ],
    )


def prompts_jsonl(path: Path) -> None:
    jsonl(path, [{"prompt": words(5 + i % 3, f"p{i}"), **({"output_tokens": 6} if i % 2 else {})} for i in range(N)])


def chat_count(messages: list[dict[str, str]]) -> int:
    """The simulated engine's input count of a chat request: <|role|> and the words per message, <|assistant|>."""
    return sum(1 + len(m["content"].split()) for m in messages) + 1


CASES: dict[str, dict[str, Any]] = {
    "sharegpt": {
        "write": sharegpt,
        "file": "conv.json",
        "dataset": {"format": "sharegpt", "chat": "history", "name": "sg-history"},
        "workload": {"endpoint": "chat", "output_tokens": {"reference": {"min": 4, "max": 12}}},
        # what the sim counts per conversation (the history up to its last human turn)
        "counts": lambda rows: {
            chat_count([{"content": t["value"]} for t in r["conversations"][:4]]) for r in json.loads(rows)
        },
    },
    "mtbench": {  # single-turn: plain text on completions through the sim's native /generate (spec_verify_ct)
        "write": mtbench,
        "file": "mt.jsonl",
        "dataset": {"format": "mtbench"},
        "workload": {"output_tokens": {"reference": {"min": 3, "max": 12}}},
        "counts": lambda rows: {len(json.loads(x)["turns"][0].split()) for x in rows.splitlines()},
    },
    "chat-jsonl": {
        "write": chat_jsonl,
        "file": "chat.jsonl",
        "dataset": {"format": "chat-jsonl"},
        "workload": {"endpoint": "chat", "output_tokens": {"reference": {"min": 4, "max": 12}}},
        "counts": lambda rows: {chat_count(json.loads(x)["messages"]) for x in rows.splitlines()},
    },
    "prompts-jsonl": {  # a plain prompt to a chat endpoint goes as one user message
        "write": prompts_jsonl,
        "file": "p.jsonl",
        "dataset": {"format": "prompts-jsonl"},
        "workload": {"endpoint": "chat", "output_tokens": 10},
        "counts": lambda rows: {chat_count([{"content": json.loads(x)["prompt"]}]) for x in rows.splitlines()},
    },
}


def config(dataset: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """tiny.yaml's shape at one level and one repeat, so that four formats fit in a minute or two."""
    return {
        "experiment": EXP,
        "concurrency": [2],
        "repeats": 1,
        # one round: a precision target builds a prompt set for every round and block size its budget allows
        # (10 rounds of 4x blocks), which these 40-entry files cannot fill without cycling
        "precision": {"target": None},
        "workload": {
            "input_tokens": 16,
            "requests": {"per_concurrency": 4, "floor": 8},
            "warmup_requests": 1,
            "seed": 1,
            "dataset": dataset,
            **workload,
        },
        "analysis": {"bootstrap_samples": 200},
        "policy": {"measure": False},
        "mlflow": {"enabled": False},
        "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
        "variants": {"sim": {"engine": "sim", "profile": "demo"}},
    }


@pytest.mark.parametrize("fmt", list(CASES))
def test_each_format_runs_end_to_end(tmp_path: Path, fmt: str) -> None:
    case = CASES[fmt]
    data = tmp_path / case["file"]
    case["write"](data)
    cfg = config({"path": case["file"], **case["dataset"]}, case["workload"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(tmp_path, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = tmp_path / "results" / EXP / "sim"
    assert json.loads((res / "crossover.json").read_text())["variant"] == "sim"
    chat = case["workload"].get("endpoint") == "chat"
    expected_counts = case["counts"](data.read_text())
    hashes = set()
    for arm in ("baseline", "eagle3"):
        summary, records = read_judged(res / arm / "c2", GATES)
        assert summary["validity"]["valid"], summary["validity"]
        w = summary["workload"]
        assert (
            w["dataset"] == case["dataset"].get("name", data.stem) and w["dataset_format"] == case["dataset"]["format"]
        )
        assert w["dataset_sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
        assert w["prompts_unique"] and w["endpoint"] == ("chat" if chat else "generate")
        assert summary["client_backend"] == ("openai" if chat else "sglang")  # chat on the sim: its OpenAI server
        assert isinstance(records, pd.DataFrame)
        records = records[~aborted(records)]  # fillers stopped at the last measured end: not failures
        assert records["ok"].all()
        assert (records["output_tokens"] == records["expected_output_tokens"]).all()  # ignore_eos, exact lengths
        assert set(records["input_tokens"]) <= expected_counts  # the server's count (its template, for chat)
        if chat:
            assert w["input_tokens_counted_by"] == "server"
            assert w["input_tokens_recorded_mean"] > w["input_tokens_mean"]  # the template's tokens: not the client's
        if arm == "eagle3":  # accept length: counter deltas on the OpenAI path, spec_verify_ct on /generate
            assert summary["metrics"]["accept_length"] is not None and summary["metrics"]["accept_length"] > 1
        hashes.add(w["prompt_set_sha256"])
    assert len(hashes) == 1  # both arms sent the same requests
    assert not sim_server_processes(tmp_path)


def test_a_bad_dataset_stops_snakemake_before_any_server(tmp_path: Path) -> None:
    jsonl(
        tmp_path / "bad.jsonl",
        [{"question_id": 1, "turns": ["fine"]}, {"question_id": 2, "turns": ["ok"]}, {"question_id": 3}],
    )
    cfg = config({"path": "bad.jsonl", "format": "mtbench"}, {})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(tmp_path, "crossover", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "bad.jsonl:3: missing field 'turns'" in out and "workload/dataset" in out, out[-2000:]
    assert not server_events(tmp_path) and not (tmp_path / "results" / EXP / "logs" / "servers").exists()
    assert not sim_server_processes(tmp_path)
