"""`specsweep crossover` and `specsweep compare` end to end on synthetic cells; plots without a display."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pytest
import yaml

from specsweep.cli import main
from specsweep.config import defaults
from tests.support.synthetic import write_synthetic_variant

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results") / "exp"
    # low-noise cells (30 turnovers a slot) so that both variants reach a verdict with a threshold
    common = {"tokens": 16, "sigma": 0.1, "requests_per_level": lambda c: 30 * c, "experiment": "exp"}
    write_synthetic_variant(
        root / "cu128",
        [1, 2, 5, 10, 30],
        lambda c: 1.4 - 0.2 * math.log(c),
        invalid=(("eagle3", 30),),
        seed=1,
        variant="cu128",
        **common,
    )
    write_synthetic_variant(
        root / "cu130",
        [1, 2, 5, 10, 30],
        lambda c: 1.6 - 0.2 * math.log(c),
        seed=2,
        variant="cu130",
        **common,
    )
    cfg = {
        "experiment": "exp",
        "concurrency": [1, 2, 5, 10, 30],
        "arms": {
            "baseline": {"speculative": False},
            "eagle3": {
                "speculative": True,
                "server_args": ["--speculative-config", '{"method":"eagle3","num_speculative_tokens":3}'],
            },
        },
        "variants": {
            "cu128": {"engine": "vllm", "server_args": ["--max-num-seqs", "64"]},
            "cu130": {
                "engine": "sglang",
                "arm_server_args": {"eagle3": ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]},
            },
        },
        "analysis": {"bootstrap_samples": 300, "seed": 1},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root


def _crossover(root: Path, variant: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    rc = main(
        [
            "crossover",
            "--variant",
            variant,
            "--cells-root",
            str(root / variant),
            "--config",
            str(root / "config.yaml"),
            "--out-dir",
            str(root / variant),
            *extra,
        ]
    )
    assert rc == 0
    return capsys.readouterr().out


def test_crossover_cli_writes_everything(experiment: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.environ.pop("DISPLAY", None)
    out = _crossover(experiment, "cu128", capsys)
    d = experiment / "cu128"
    res = json.loads((d / "crossover.json").read_text())
    ar = res["arms"]["eagle3"]
    assert res["source"] == "simulated" and res["engine"] == "vllm" and res["experiment"] == "exp"
    assert res["bootstrap"]["replicates"] == 300
    assert ar["levels"] == [1.0, 2.0, 5.0, 10.0]
    assert ar["invalid_cells"][0]["concurrency"] == 30.0
    assert ar["cell_keys"]["spec"][0] == "exp/cu128/eagle3/c1"  # the one key format (summary.cell_key)
    assert {"crossover", "crossings", "monotone", "metrics", "per_level", "winner"} <= set(ar)
    assert "speedup [95% CI]" in out and "crossover" in out and "no (eagle3: client_lag)" in out
    for kind in ("throughput", "speedup", "latency", "accept_length"):
        f = d / "plots" / f"{kind}.png"
        assert f.exists() and f.stat().st_size > 1000
    pol = yaml.safe_load((d / "policy.yaml").read_text())
    e = pol["arms"]["eagle3"]
    sched = e["vllm"]["schedule"]
    assert sched[0] == [1, e["threshold"], 3] and sched[-1] == [e["threshold"] + 1, 64, 0]
    assert e["vllm"]["speculative_config"]["method"] == "eagle3"
    assert e["vllm"]["speculative_config"]["num_speculative_tokens_per_batch_size"] == sched
    assert ar["threshold"] == e["threshold"] == res["policy"]["eagle3"]["threshold"]
    assert ar["verdict"]["kind"] == "crossover" and e["verdict"] == "crossover"
    # the invalid C=30 lies above the level that bounds the crossover (10): noted, not blocking
    assert any("C=30" in n for n in ar["verdict"]["notes"])
    assert ar["crossover_concurrency"] == ar["crossover"]["estimate"]
    assert set(ar["interpolation"]["estimates"]) == {"loglinear", "linear", "pchip_log"}
    assert res["max_crossover_ratio"] == defaults("analysis")["max_crossover_ratio"]
    # one list object in two places of the vLLM entry: written twice, not as a YAML anchor and alias
    text = (d / "policy.yaml").read_text()
    assert "&id" not in text and "*id" not in text
    rows = list(csv.DictReader((d / "crossover_table.csv").open()))
    assert len(rows) == 5 and rows[-1]["used"] == "False"
    assert not list(d.glob(".*.tmp"))  # atomic writes leave no temp files


def test_crossover_cli_explicit_summaries_and_sglang(
    experiment: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    summaries = sorted(str(p) for p in (experiment / "cu130").glob("*/c*/summary.json"))
    rc = main(
        [
            "crossover",
            "--variant",
            "cu130",
            "--summaries",
            *summaries,
            "--config",
            json.dumps(yaml.safe_load((experiment / "config.yaml").read_text())),  # inline, as the rule does
            "--out-dir",
            str(tmp_path),
            "--no-plots",
            "--replicates",
            "200",
        ]
    )
    assert rc == 0
    capsys.readouterr()
    pol = yaml.safe_load((tmp_path / "policy.yaml").read_text())
    sglang = pol["arms"]["eagle3"]["sglang"]  # the adaptive config, written where policy.yaml says
    assert json.loads(Path(sglang["adaptive_config_file"]).read_text()) == sglang["adaptive_config"]
    assert sglang["adaptive_config"]["1"] == {"candidate_steps": [3]}
    assert not (tmp_path / "plots").exists()


def test_compare_cli(experiment: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _crossover(experiment, "cu128", capsys, "--no-plots")
    _crossover(experiment, "cu130", capsys, "--no-plots")
    rc = main(
        [
            "compare",
            "--experiment-dir",
            str(experiment),
            "--config",
            str(experiment / "config.yaml"),
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "reference: cu128" in out
    res = json.loads((tmp_path / "comparison.json").read_text())
    assert set(res["arms"]) == {"baseline", "eagle3"}
    row = res["arms"]["eagle3"]["rows"][0]
    r = row["cells"]["cu130"]["vs_reference"]["aggregate_tok_s"]
    assert r["lo"] <= r["ratio"] <= r["hi"]
    assert "cu128" in res["crossovers"] and "cu130" in res["crossovers"]
    # the invalid reference cell at C=30 gives no ratio
    last = res["arms"]["eagle3"]["rows"][-1]["cells"]["cu130"]
    assert "vs_reference" not in last
    for f in ("comparison_throughput.png", "comparison_speedup.png", "comparison_table.csv"):
        assert (tmp_path / f).stat().st_size > 0


def test_registered_in_console_command() -> None:
    from specsweep.cli import SUBCOMMANDS

    assert SUBCOMMANDS["crossover"][0] == "specsweep.cli.crossover"
    assert SUBCOMMANDS["compare"][0] == "specsweep.cli.compare"
