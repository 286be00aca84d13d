"""Every SGLang command line specsweep generates, parsed by SGLang's own parser (the pinned release).

The golden files' commands and the Kimi example's (fixed arms, draft-length sub-arms, the policy arm with its
adaptive config file written out) go through `tests/engine_args/sglang_check.py` in the parser environment: an
unknown, misspelled or deprecated flag, a value SGLang refuses, or an adaptive set-up SGLang would turn off fails
the test with SGLang's own words. The newest release is checked by `benchmarks/sglang_args_newest.py` (an early
warning, not a gate: a new release may deprecate a flag the pinned one needs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from specsweep import config as ssconfig
from specsweep.analysis.policy import engine_policy
from specsweep.client.backends import RequestSpec
from specsweep.client.referral import TOP_K, read_replay, request_body
from specsweep.io import atomic_write_json
from tests.conftest import REPO
from tests.engine_args.conftest import CHECK_TIMEOUT_S, HERE, SGLANG_RECIPE, run_check
from tests.support.commands import commands_for_config, example_path

pytestmark = [pytest.mark.engine_args, pytest.mark.timeout(900)]

GOLDEN = REPO / "tests" / "golden"
LAUNCHER = ["-m", "sglang.launch_server"]
PIN = re.compile(r"^sglang==(\S+)", re.MULTILINE)


def pinned(recipe: Path) -> str:
    m = PIN.search(recipe.read_text())
    assert m, f"{recipe} pins no sglang release"
    return m.group(1)


def engine_argv(argv: list[str]) -> list[str]:
    """The flags after `<python> -m sglang.launch_server`."""
    assert argv[1:3] == LAUNCHER, argv[:3]
    return argv[3:]


def with_adaptive_files(commands: dict[str, dict], folder: Path) -> dict[str, list[str]]:
    """{name: flags}, each policy arm's adaptive config written to `folder` and its path put in the flags."""
    out = {}
    for name, cmd in commands.items():
        if "argv" not in cmd:
            continue
        argv = engine_argv(cmd["argv"])
        content = commands.get(f"{name}.adaptive_config", {}).get("content")
        if "--speculative-adaptive-config" in argv:
            assert content, f"{name}: an adaptive config flag without the file's content"
            path = folder / (name.replace("/", ".") + ".json")
            path.write_text(json.dumps(content))
            i = argv.index("--speculative-adaptive-config")
            argv = [*argv[: i + 1], str(path), *argv[i + 2 :]]
        out[name] = argv
    return out


def kimi_with_sub_arms() -> dict:
    """The Kimi example with draft-length sub-arms (K = 1, 3, 7) as well as its arms."""
    raw = ssconfig.load_yaml(example_path("kimi-k25-8gpu"))
    raw["arms"]["eagle3"]["draft_lengths"] = [1, 3, 7]
    return ssconfig.validate(raw)


def sglang_commands(tmp: Path) -> dict[str, list[str]]:
    golden = json.loads((GOLDEN / "kimi-k25-8gpu.commands.json").read_text())
    cmds = {f"golden:{k}": v for k, v in with_adaptive_files(golden, tmp).items()}
    live = commands_for_config(kimi_with_sub_arms())
    cmds.update({f"sub-arms:{k}": v for k, v in with_adaptive_files(live, tmp).items()})
    mixed = commands_for_config(kimi_with_sub_arms(), schedule=[[1, 4, 7], [5, 30, 3], [31, 256, 1]])
    cmds.update({f"schedule:{k}": v for k, v in with_adaptive_files(mixed, tmp).items() if k.endswith("-policy")})
    cmds.update(policy_yaml_commands(tmp))
    return cmds


def policy_yaml_commands(tmp: Path) -> dict[str, list[str]]:
    """What policy.yaml tells a user to paste for SGLang (an arm's "speculate while running requests <= N" at the
    K it was measured at, `analysis.policy.engine_policy`), on the K=3 sub-arm's command, with the adaptive
    config file written where and as the analysis writes it (analysis/report.py): a threshold inside the range
    (adaptive, a 0-step slot above N), one K everywhere (the static flags) and N = 0 (the baseline's flags)."""
    live = commands_for_config(kimi_with_sub_arms())
    out = {}
    for name, cmd in live.items():
        if not name.endswith("/eagle3-k3"):
            continue
        arm = {"server_args": engine_argv(cmd["argv"]), "draft_length": 3}
        for n in (16, 100_000, 0):
            file = tmp / f"{name.replace('/', '.')}.threshold-{n}.json"
            form = engine_policy("sglang", n, arm, {}, 250, schedule_file=str(file))
            if form.get("adaptive_config") is not None:
                atomic_write_json(form["adaptive_config_file"], form["adaptive_config"])
            out[f"policy.yaml:{name}:N={n}"] = form["server_args"]
    return out


def problems(result: dict) -> list[str]:
    return [*result["errors"], *(f"deprecated: {d}" for d in result["deprecated"])]


def test_the_parser_env_pins_the_stacks_release() -> None:
    stacks = {p.name: pinned(p) for p in sorted((REPO / "envs").glob("sglang-*.txt"))}
    assert stacks, "no SGLang recipe under envs/"
    assert set(stacks.values()) == {pinned(SGLANG_RECIPE)}, (stacks, pinned(SGLANG_RECIPE))


def test_every_generated_sglang_command_parses(sglang_python: str, tmp_path: Path) -> None:
    cmds = sglang_commands(tmp_path)
    assert sum(k.startswith("golden:") for k in cmds) == 9  # 3 variants x (baseline, eagle3, eagle3-policy)
    assert any("-k7" in k for k in cmds) and any("schedule:" in k for k in cmds)
    assert sum(k.startswith("policy.yaml:") for k in cmds) == 9  # 3 variants x (N=16, N=100000, N=0)
    out = run_check(sglang_python, "sglang_check.py", cmds)
    assert out["version"] == pinned(SGLANG_RECIPE)
    bad = {k: problems(r) for k, r in out["results"].items() if problems(r)}
    assert not bad, "SGLang " + out["version"] + " refuses or deprecates:\n" + json.dumps(bad, indent=1)
    # the stand-in's /server_info payload (tests/support) has every field of this release's ServerArgs
    payload = json.loads((REPO / "tests" / "support" / "sglang_server_info.json").read_text())
    assert set(out["server_args_fields"]) <= set(payload), set(out["server_args_fields"]) - set(payload)
    extra = set(payload) - set(out["server_args_fields"])
    assert extra == {"max_total_num_tokens", "startup_time", "internal_states", "version", "kv_events"} | {
        "launch_command"  # 0.5.23's
    }
    fields = {k: r["fields"] for k, r in out["results"].items()}
    # what SGLang makes of them: the fusion variant asks for fusion in the current field, the others do not
    for k, f in fields.items():
        fused = "cu130-fusion/" in k
        assert (f["flashinfer_allreduce_fusion_backend"] == "auto") == fused, (k, f)
        if k.endswith("-policy") or k.endswith("N=16"):
            assert f["speculative_adaptive"] is True and f["speculative_eagle_topk"] == 1, (k, f)
        if k.startswith("policy.yaml:"):  # the threshold's forms: adaptive with a 0-step slot, static K=3, plain
            n = k.rsplit("N=", 1)[1]
            assert f["speculative_adaptive"] is (n == "16"), (k, f)
            assert f["speculative_algorithm"] == (None if n == "0" else "EAGLE3"), (k, f)
            assert n == "0" or f["speculative_num_steps"] == 3, (k, f)
            continue
        if "-k" in k.rsplit("/", 1)[1]:
            k_value = int(k.rsplit("-k", 1)[1])
            assert f["speculative_num_steps"] == k_value and f["speculative_num_draft_tokens"] == k_value + 1


def test_misspelled_unknown_and_deprecated_flags_fail(sglang_python: str, tmp_path: Path) -> None:
    """The check can fail: SGLang's parser names each bad flag, and its deprecation handling is caught."""
    base = ["--model-path", "/m", "--tp-size", "8"]
    bad_config = tmp_path / "adaptive.json"
    bad_config.write_text(json.dumps({"1": {"candidate_steps": [1]}}))
    eagle = ["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1"]
    out = run_check(
        sglang_python,
        "sglang_check.py",
        {
            "misspelled": [*base, "--speculativ-num-steps", "3"],
            "unknown": [*base, "--enable-all-the-speed"],
            "abbreviated": [*base, "--max-running", "8"],
            "bad value": [*base, "--flashinfer-allreduce-fusion-backend", "nccl"],
            "deprecated switch": [*base, "--enable-flashinfer-allreduce-fusion"],
            "deprecated alias": [*base, "--cuda-graph-max-bs", "64"],
            "steps not a candidate": [
                *base,
                *eagle,
                "--speculative-num-steps",
                "3",
                "--speculative-adaptive",
                "--speculative-adaptive-config",
                str(bad_config),
            ],
            "adaptive with topk 4": [*base, "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4"]
            + ["--speculative-adaptive"],
            "fine": [*base, "--flashinfer-allreduce-fusion-backend", "auto", "--cuda-graph-max-bs-decode", "64"],
        },
    )
    r = out["results"]
    assert "--speculativ-num-steps" in r["misspelled"]["errors"][0]
    assert "--enable-all-the-speed" in r["unknown"]["errors"][0]
    assert "--max-running is not an SGLang flag" in r["abbreviated"]["errors"][0]  # argparse alone would take it
    assert "nccl" in r["bad value"]["errors"][0]
    assert any("flashinfer-allreduce-fusion-backend" in d for d in r["deprecated switch"]["deprecated"])
    assert r["deprecated switch"]["fields"]["resolved.flashinfer_allreduce_fusion_backend"] == "auto"
    assert any("--cuda-graph-max-bs-decode" in d for d in r["deprecated alias"]["deprecated"])
    assert r["deprecated alias"]["fields"]["cuda_graph_max_bs_decode"] == 64  # the alias's real field
    assert "not in the adaptive config's candidate_steps" in r["steps not a candidate"]["errors"][0]
    assert "topk=1" in r["adaptive with topk 4"]["errors"][0]
    assert not problems(r["fine"])


def test_the_referral_request_and_its_answer_as_sglang_reads_and_writes_them(sglang_python: str) -> None:
    """An output difference is referred to an SGLang baseline by a replay through /generate
    (client/referral.py): SGLang's own GenerateReqInput has every field of the body and SamplingParams takes its
    sampling parameters; meta_info's `output_token_logprobs` and `output_top_logprobs` as SGLang's
    TokenizerManager builds them (its methods' own source, run) are what the referral reads (each token's text,
    its candidates most likely first)."""
    spec = RequestSpec(url="http://127.0.0.1:1", backend="sglang")
    body = request_body(spec, "The prompt", 2, TOP_K)
    values, ids = (
        [[-0.4, -0.9, -2.0, -3.1, -4.5], [-0.1, -2.5, -3.0, -3.5, -4.0]],
        [[17, 4, 99, 3, 8], [5, 6, 7, 9, 10]],
    )
    given = {"payload": body, "token_values": [-0.4, -0.1], "token_ids": [17, 5], "values": values, "ids": ids}
    proc = subprocess.run(
        [sglang_python, str(HERE / "sglang_referral_check.py")],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        cwd=HERE,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONWARNINGS": "ignore"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["unknown"] == [] and out["unknown_sampling"] == [], out
    assert body["return_logprob"] is True and body["top_logprobs_num"] == TOP_K and body["return_text_in_logprobs"]
    meta = {"output_token_logprobs": out["output_token_logprobs"], "output_top_logprobs": out["output_top_logprobs"]}
    replayed = read_replay(spec, json.loads(json.dumps({"text": "<17><5>", "meta_info": meta})))
    assert replayed.tokens == ["<17>", "<5>"] and replayed.text == "<17><5>"
    assert replayed.ids == [17, 5] and replayed.logprobs == [-0.4, -0.1]
    # each candidate: its text, its log-probability and its token id (the referral matches ids, not texts)
    assert replayed.top[0] == [
        ("<17>", -0.4, 17),
        ("<4>", -0.9, 4),
        ("<99>", -2.0, 99),
        ("<3>", -3.1, 3),
        ("<8>", -4.5, 8),
    ]
    assert replayed.top[1][:2] == [("<5>", -0.1, 5), ("<6>", -2.5, 6)]
