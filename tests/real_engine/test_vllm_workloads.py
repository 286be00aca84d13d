"""Real workloads on a real engine: vLLM's CPU build, chat requests from a dataset, an open-loop sweep.

One experiment against the tiny local Llama, plain decoding vs ngram speculation (K=3): chat requests
(`/v1/chat/completions`: vLLM applies the model's chat template and counts the prompt) from a chat-jsonl
dataset the test writes (templated text that repeats itself), at request-rate levels (Poisson arrivals), whose
answer is also given in running requests. Asserts the answer: every cell valid and isolated, input lengths as
vLLM counted them, accept length from vLLM's counters and near its ceiling on content that repeats itself,
outputs equal to the baseline's, the open sweep's running requests measured two ways.

Each experiment costs two vLLM server starts (~35 s each) and its model build: the closed-loop run of the same
dataset and the synthetic-words run that this tier also made once (~2 min each in CI) are what
benchmarks/content_acceptance.py runs, and it prints the figures (accept length and crossover per content).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specsweep.measure.summary import read_judged
from tests.conftest import REPO, SNAKEMAKE
from tests.real_engine.test_vllm_cpu import (
    DAG_TIMEOUT_S,
    ENVS_DIR,
    EXAMPLE,
    EXAMPLE_GATES,
    run_snakemake,
    stop_everything,
)

pytestmark = pytest.mark.real_engine

VARIANT = "cpu-tiny"
LEVELS = (1, 4)  # benchmarks/content_acceptance.py's closed-loop levels
RATES = (2, 8)
REPEATS = 3
OUTPUT_TOKENS = 64
INPUT_TOKENS = 192
ARMS = ("baseline", "ngram")


def templated_dataset(path: Path, n: int = 400) -> Path:
    """Chat requests of templated text that repeats itself: one sentence, twelve times, after the request's
    number (unique per entry, so no two prompts share a cached prefix beyond the template's first token)."""
    with path.open("w") as f:
        for i in range(n):
            content = f"#{i} " + "the cat sat on the mat. " * 12
            f.write(json.dumps({"messages": [{"role": "user", "content": content}]}) + "\n")
    return path


def config_for(name: str, dataset: Path | None = None, **overrides: object) -> dict:
    """The vLLM CPU example reduced to two arms (baseline, ngram K=3), chat requests, the templated dataset
    when given, and top-level `overrides`."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config.update(experiment=name, envs_dir=str(ENVS_DIR), concurrency=list(LEVELS), repeats=REPEATS)
    config["variants"][VARIANT]["recipe"] = str(REPO / config["variants"][VARIANT]["recipe"])
    config["arms"] = {
        "baseline": {"speculative": False},
        "ngram": {"speculative": True, "server_args": config["arms"]["ngram"]["server_args"]},
    }
    config["policy"] = {"measure": False}
    config["mlflow"] = {"enabled": False}  # the MLflow view of a real run: tests/real_engine/test_vllm_cpu.py
    # one arm after the other, as this tier measured before interleaving existed: interleaved blocks each warm
    # their server up again, which makes a vLLM CPU sweep too long for CI (the interleaved design on vLLM:
    # tests/real_engine/test_vllm_cpu.py's level test and docs/analysis.md)
    config["pairing"] = {"mode": "sequential"}
    # synthetic prompts as long as the templated ones (~200 tokens with the template): only the content differs
    config["workload"].update(output_tokens=OUTPUT_TOKENS, endpoint="chat", input_tokens=INPUT_TOKENS)
    config["workload"]["requests"]["per_concurrency"] = 4  # the time goes to the two server starts: small cells
    if dataset is not None:
        config["workload"]["dataset"] = {"path": str(dataset), "format": "chat-jsonl", "name": "templated"}
    config.update(overrides)
    return config


def run(workdir: Path, config: dict, unit: str = VARIANT) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--cores", "1", "crossover", "--configfile", "config.yaml"]
    try:
        rc, out = run_snakemake(cmd, workdir, DAG_TIMEOUT_S)
    finally:
        stop_everything(workdir, config["experiment"])
    (workdir / "run.log").write_text(out)
    assert rc == 0, f"snakemake failed (logs under {workdir}/results):\n{out[-6000:]}"
    return workdir / "results" / config["experiment"] / unit


CLASSES = ("words", "templated")  # the seeded synthetic words, and the templated chat set
MIX = {"words": 0.5, "templated": 0.5}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One open-loop sweep of two content classes and their mix (`<variant>@words`, `@templated`, `@mix`), every
    request stopping at the model's own end of text (output_tokens a cap), the same two servers serving all three
    units: the experiment's results folder."""
    root = tmp_path_factory.mktemp("real_workloads")
    data = templated_dataset(root / "templated.jsonl")
    open_load = {"mode": "open", "rates": list(RATES), "duration_s": 6}
    # two repeats (the benchmark's closed-loop runs keep three): what is asserted holds per repeat, and the third
    # cost CI ~30 s of arrivals per unit
    analysis = {"primary_metric": "tpot_p50_s"}
    config = config_for("contents", None, load=open_load, analysis=analysis, repeats=2)
    templated = {"dataset": {"path": str(data), "format": "chat-jsonl", "name": "templated"}}
    config["workload"].update(stop="natural", classes={"words": {"synthetic": True}, "templated": templated}, mix=MIX)
    return run(root / "contents", config).parent


@pytest.fixture(scope="module")
def sweep(experiment: Path) -> Path:
    """The templated class's unit: what this tier measured alone before classes existed."""
    return experiment / f"{VARIANT}@templated"


def cells(variant_dir: Path) -> list[tuple[str, int, dict, pd.DataFrame]]:
    out = []
    for arm in ARMS:
        for rate in RATES:
            s, df = read_judged(variant_dir / arm / f"r{rate}", EXAMPLE_GATES)
            out.append((arm, rate, s, df))
    return out


def test_every_cell_valid_isolated_and_counted_by_the_engine(sweep: Path) -> None:
    for arm, rate, s, df in cells(sweep):
        assert s["validity"]["valid"], (arm, rate, s["validity"]["reasons"])
        # a natural stop: each answer ends at the model's end of text or at its cap, never past it
        assert df["ok"].all() and (df["server_output_tokens"] <= df["expected_output_tokens"]).all()
        assert s["workload"]["stop"] == "natural" and set(df["content"]) == {"templated"}
        assert set(df["finish_reason"]) <= {"stop", "length"}
        assert s["workload"]["endpoint"] == "chat" and s["client_backend"] == "openai"
        assert s["workload"]["input_tokens_counted_by"] == "server", s["workload"]
        assert (df["input_tokens"] > 0).all()  # vLLM's usage.prompt_tokens of the templated prompt
        for rep in s["repeats"]:
            assert rep["metrics"]["prefix_cache"]["hit_rate"] <= 0.01, (arm, rate, rep["metrics"]["prefix_cache"])
        assert s["workload"]["dataset"] == "templated" and s["workload"]["dataset_sha256"]


def test_acceptance_is_near_its_ceiling_on_content_that_repeats_itself(sweep: Path) -> None:
    """Every repeat at every rate: ngram drafts from the context, which holds the same sentence twelve times, so
    nearly every draft token is accepted: accept length (vLLM's counter deltas around the repeat) at least 3.75 of
    K + 1 = 4. The dataset's content is what the engine was sent: the seeded synthetic words of the same length
    read 3.36-3.69 on this machine (3.86-3.88 for this content, closed loop; benchmarks/content_acceptance.py)."""
    for rate in RATES:
        s = read_judged(sweep / "ngram" / f"r{rate}", EXAMPLE_GATES)[0]
        reps = [r["metrics"]["counter_deltas"] for r in s["repeats"]]
        accept = [1 + d["num_accepted_tokens"] / d["num_drafts"] for d in reps]
        assert min(accept) >= 3.75, (rate, accept)


def test_outputs_equal_the_baselines(sweep: Path) -> None:
    """Every rate's outputs equal the baseline's (greedy ngram is lossless); each ngram cell, measured after the
    baseline's (one server at a time), compared its outputs with the baseline cell's and replayed one of its own
    on its server through vLLM's chat API with `logprobs`/`top_logprobs`: the replay's tokens read back."""
    ar = json.loads((sweep / "crossover.json").read_text())["arms"]["ngram"]
    for row in ar["per_level"]:
        assert row["output_match"]["share"] >= 0.9, row
        assert row["output_match"]["referral"]["clear"] == 0, row["output_match"]
    for rate in RATES:
        referral = read_judged(sweep / "ngram" / f"r{rate}", EXAMPLE_GATES)[0]["output_referral"]
        assert referral["against"] == "baseline" and referral["replayed_by"] == "own", referral
        assert referral["compared"] >= 1 and referral["check"]["agrees"], referral
        assert all(x["error"] is None for x in referral["referred"]), referral


def counter_accept(unit_dir: Path, rate: int) -> float:
    """The ngram cell's accept length over its repeats (vLLM's counter deltas summed)."""
    reps = [
        r["metrics"]["counter_deltas"]
        for r in read_judged(unit_dir / "ngram" / f"r{rate}", EXAMPLE_GATES)[0]["repeats"]
    ]
    return 1 + sum(d["num_accepted_tokens"] for d in reps) / sum(d["num_drafts"] for d in reps)


def test_each_content_class_has_its_own_acceptance_and_the_mix_lies_between(experiment: Path) -> None:
    """The same servers, the same rates: the templated class accepts nearly every draft token, the synthetic
    words fewer (3.36-3.69 of 4 on this machine, benchmarks/content_acceptance.py), and the mix, every request's
    class drawn 50/50, between the two at every rate. contents.json says each class's answer beside the mix's."""
    units = {c: experiment / f"{VARIANT}@{c}" for c in (*CLASSES, "mix")}
    for rate in RATES:
        accept = {c: counter_accept(d, rate) for c, d in units.items()}
        assert accept["words"] < accept["mix"] < accept["templated"], (rate, accept)
        mix = pd.read_parquet(units["mix"] / "baseline" / f"r{rate}" / "requests.parquet")
        assert set(mix["content"]) == set(CLASSES), rate
    contents = json.loads((experiment / VARIANT / "contents.json").read_text())
    assert [a["content"] for a in contents["classes"]] == list(CLASSES) and contents["mix_shares"] == MIX
    answers = {a["content"]: a for a in [*contents["classes"], *contents["mix"]]}
    assert answers["words"]["accept_length"] < answers["templated"]["accept_length"], answers
    # each class's answer is its own: a crossover with its interval, or a verdict that says why there is none
    # (the tiny model's TPOT at two rates may not cross): either is what the class measured, not a default
    for a in answers.values():
        assert a["verdict"] and (
            a["crossover"] is None or a["crossover_lo"] is None or a["crossover_lo"] <= a["crossover"]
        )


def test_synthetic_words_on_a_real_engine_carry_the_content_warning(experiment: Path) -> None:
    """A real engine's acceptance on synthetic words is not production's: the words' unit and the mix (half
    words) say so in crossover.json, the table and policy.yaml; the templated class, a dataset with natural
    stops, carries none."""
    for content, warned in (("words", True), ("mix", True), ("templated", False)):
        unit = experiment / f"{VARIANT}@{content}"
        cx = json.loads((unit / "crossover.json").read_text())
        assert cx["source"] == "real" and cx["content"]["stop"] == "natural"
        assert (cx["content_warning"] is not None) == warned, (content, cx["content_warning"])
        policy = (unit / "policy.yaml").read_text()
        assert ("CONTENT:" in policy) == warned and policy.startswith("# measured on: "), policy[:400]


def edge_terms(s: dict, df: pd.DataFrame) -> float:
    """Little's law minus the in-flight mean that the window's edges make, from the records (mean over repeats).

    Over a finite window [start, end] the two differ by (E_end - E_start) / T: E_end, the time past `end` of the
    requests sent inside it (Little's law counts their whole stay); E_start, the time inside it of the requests
    sent before `start` (only the in-flight curve counts it). The window ends at the last send, so E_end holds
    at least that request's whole stay: at 2 req/s here E_start was 0 and E_end / T 0.06-0.28, which no fixed
    tolerance of "the same number" covers."""
    out = []
    for rep in s["repeats"]:
        w = rep["metrics"]["steady_window"]
        start, end = w["start_s"], w["end_s"]
        r = df[df["repeat"] == rep["repeat"]]
        send, stop = r["send_s"].to_numpy(dtype=float), r["end_s"].to_numpy(dtype=float)
        inside = (send >= start) & (send < end)
        before = (send < start) & (stop > start)
        e_end = (stop[inside] - end).clip(min=0).sum()
        e_start = ((stop[before].clip(max=end)) - start).sum()
        out.append((e_end - e_start) / (end - start))
    return sum(out) / len(out)


def test_open_sweep_measures_running_requests_and_answers_in_them(sweep: Path) -> None:
    result = json.loads((sweep / "crossover.json").read_text())
    assert result["load"] == "open" and result["source"] == "real"
    running = result["arms"]["ngram"]["running_requests"]
    by_cell = {(arm, rate): (s, df) for arm, rate, s, df in cells(sweep)}
    for row in running["per_level"]:
        for arm, name in (("baseline", "baseline"), ("spec", "ngram")):
            # one quantity measured two ways (stored at measurement time): Little's law holds on the records'
            # sample path once the window's edges are taken out
            edges = edge_terms(*by_cell[(name, row["level"])])
            assert row[f"{arm}_littles_law"] - edges == pytest.approx(row[f"{arm}_mean"], rel=1e-6), (row, edges)
            assert 1.0 <= row[arm] and row[arm] >= row[f"{arm}_mean"], row  # the batch while busy: at least one
    assert running["per_level"][-1]["baseline"] > running["per_level"][0]["baseline"]  # more load, more running
    policy = yaml.safe_load((sweep / "policy.yaml").read_text())["arms"]["ngram"]
    assert policy["threshold"] is None or policy["threshold"] >= 1, policy  # a batch has at least one request
    for arm, rate, s, _ in cells(sweep):
        assert s["metrics"]["achieved_rate_rps"] == pytest.approx(rate, rel=0.4), (arm, rate)
