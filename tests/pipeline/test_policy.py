"""The policy loop through the DAG on the simulated engine: draft-length sub-arms, the schedule checkpoint, the
policy arm measured at every level, and the proof (policy regret) in the table, crossover.json and MLflow.

First a deliberately wrong schedule (`policy.schedules`: speculate with K=3 at C=2 and at C=100) on the demo
profile, where speculation with K=3 loses under load: the proof must fail at C=100 (where plain decoding or
K=1 is the best fixed arm) and hold at C=2. Then the derived schedule (a smaller K than 3 at C=100): only the
schedule, the policy arm and the analysis rerun, the fixed arms are not measured again, and the policy holds
at every level.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.pipeline.conftest import mlflow_runs, server_events, snakemake, starts

pytestmark = pytest.mark.pipeline

EXP = "tiny"
# K=3 at C=2 and at C=100, K=1 between (no level measured there; well below 100, where a closed loop's running
# requests dip as requests end): wrong at C=100, and a schedule that switches K, so a policy arm serves it (one K
# at every load would be the K=3 arm itself, served by its static flag)
WRONG = [[1, 40, 3], [41, 60, 1], [61, 1024, 3]]
CONFIG = {
    "experiment": EXP,
    "precision": {"target": None},  # fixed rounds (repeats): the rule has its own tests
    "concurrency": [2, 100],
    "workload": {
        "input_tokens": 16,
        "output_tokens": 32,
        "requests": {"per_concurrency": 8, "floor": 16},  # narrow enough intervals at C=100 to tell 0.8 from 1
        "warmup_requests": 0,  # the simulated engine has nothing to warm (C=100's warm-up was 100 requests a block)
    },
    "client": {"idle_probe_s": 0.0},  # kernel-stamped chunks: the host's idle lag is a flag's baseline, no gate's
    "analysis": {"bootstrap_samples": 300},
    "policy": {"schedules": {"eagle3": WRONG}},
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True, "draft_lengths": [1, 3]}},
    "variants": {"sim": {"engine": "sim", "profile": "demo"}},
}


@pytest.fixture(scope="module")
def wrong_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("policy")
    (workdir / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    proc = snakemake(workdir, "crossover")
    (workdir / "wrong.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir


def _variant(workdir: Path) -> Path:
    return workdir / "results" / EXP / "sim"


def test_sub_arms_and_the_policy_arm_are_measured(wrong_run: Path) -> None:
    d = _variant(wrong_run)
    for arm in ("baseline", "eagle3-k1", "eagle3-k3", "eagle3-policy"):
        for c in (2, 100):
            assert (d / arm / f"c{c}" / "summary.json").is_file(), (arm, c)
    served = json.loads((d / "eagle3-policy" / "c2" / "summary.json").read_text())
    argv = served["server"]["argv"]
    assert json.loads(argv[argv.index("--spec-schedule") + 1]) == WRONG
    k1 = json.loads((d / "eagle3-k1" / "c2" / "summary.json").read_text())["server"]["argv"]
    assert k1[k1.index("--draft-tokens") + 1] == "1"


def test_a_wrong_schedule_fails_the_proof_where_speculation_loses(wrong_run: Path) -> None:
    result = json.loads((_variant(wrong_run) / "crossover.json").read_text())
    proof = result["policy_proof"]["eagle3"]
    assert proof["schedule"] == WRONG and result["schedules"]["eagle3"]["derived"] != WRONG
    rows = {r["concurrency"]: r for r in proof["per_level"]}
    assert rows[100]["best_fixed_arm"] != "eagle3-k3" and rows[100]["status"] == "fails"
    # C=2 serves the best fixed arm's K: never a failure (not decided where the interval straddles 1 - margin)
    assert rows[2]["best_fixed_arm"] != "baseline" and rows[2]["status"] in ("holds", "better", "not decided")
    assert proof["failing_levels"] == [100] and proof["holds"] is False
    # what each row measures: C=100 serves K=3 where the baseline was best (the schedule's choice); C=2 serves K=3,
    # the mechanism where the best fixed arm is K=3 itself
    assert rows[100]["compares"] == "schedule"
    k2 = {"eagle3-k3": "mechanism, K=3 as the static flag", "eagle3-k1": "schedule"}[rows[2]["best_fixed_arm"]]
    assert rows[2]["compares"] == k2
    if k2.startswith("mechanism"):
        m = proof["mechanism"][k2]
        assert m["levels"] == [2] and m["ratio_lo"] <= m["ratio"] <= m["ratio_hi"]
    assert all(r["output_match"]["share"] == 1.0 for r in proof["per_level"])  # same text, only the speed differs
    log = (wrong_run / "wrong.log").read_text()
    assert "eagle3-policy: policy POLICY FAILS at C=100" in log
    assert (_variant(wrong_run) / "plots" / "policy_eagle3.png").is_file()
    runs = mlflow_runs(wrong_run)
    crossover = runs[runs["tags.specsweep.kind"] == "crossover"].iloc[0]
    assert crossover["tags.specsweep.policy.eagle3"] == "fails"
    assert crossover["metrics.eagle3-policy.failing_levels"] == 1.0


def test_the_derived_schedule_reruns_only_the_policy_arm_and_holds(wrong_run: Path) -> None:
    before = starts(server_events(wrong_run))
    fixed = {
        p: p.stat().st_mtime_ns
        for arm in ("baseline", "eagle3-k1", "eagle3-k3")
        for p in (_variant(wrong_run) / arm).glob("c*/summary.json")
    }
    cfg = {**CONFIG, "policy": {"schedules": {}}}
    (wrong_run / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(wrong_run, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in fixed} == fixed  # the fixed arms were not measured again
    new = starts(server_events(wrong_run))[len(before) :]
    result = json.loads((_variant(wrong_run) / "crossover.json").read_text())
    derived = result["schedules"]["eagle3"]
    if derived["served_by"]:  # one K everywhere (K=1 is within K=3's noise at C=2): that arm itself, no server
        assert new == [], new
    else:
        # the policy arm, and the fixed arms it is paired with at its levels (their servers ended with the last
        # run; their re-measurements go beside the policy cells, not into the fixed arms' cells)
        assert new and any("eagle3-policy" in e for e in new), new
        assert all(
            e.split("label=sim/")[1].split()[0] in ("eagle3-policy", "baseline", "eagle3-k1", "eagle3-k3") for e in new
        )
    chosen = {x["concurrency"]: x["k"] for x in derived["per_level"]}
    assert chosen[100] < 3  # K=3 loses at C=100: plain decoding or K=1 there, whichever the noise cannot separate
    covering = next(k for first, last, k in derived["schedule"] if first <= 100 <= last)
    assert covering == chosen[100] and derived["schedule"][0][0] == 1
    proof = result["policy_proof"]["eagle3"]
    assert proof["schedule"] == derived["schedule"]
    # holds, or not decided where an interval straddles 1 - margin: never a failure
    assert not proof["failing_levels"] and proof["holds"] is not False, proof["verdict"]
    policy = yaml.safe_load((_variant(wrong_run) / "policy.yaml").read_text())
    assert policy["schedules"]["eagle3"]["schedule"] == derived["schedule"]
    if derived.get("served_by"):  # one K at every load: the fixed arm's static flag, its cells the measurement
        assert policy["schedules"]["eagle3"]["sim"]["static"] and "no policy server" in proof["verdict"]
    else:
        assert policy["schedules"]["eagle3"]["sim"]["server_args"][0] == "--spec-schedule"


def test_one_k_at_every_load_is_the_fixed_arm_itself_and_starts_no_server(wrong_run: Path) -> None:
    """A schedule of one K over the whole range is what the fixed arm of that K serves with its static flag:
    policy.yaml recommends that flag, the proof is the arm's own cells, and no policy server is started (a
    server start saved: ~75 s on vLLM's CPU build, minutes on a GPU box)."""
    before = starts(server_events(wrong_run))
    cfg = {**CONFIG, "policy": {"schedules": {"eagle3": [[1, 1024, 1]]}}}
    (wrong_run / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(wrong_run, "crossover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert starts(server_events(wrong_run))[len(before) :] == []  # nothing measured
    result = json.loads((_variant(wrong_run) / "crossover.json").read_text())
    assert result["schedules"]["eagle3"]["served_by"] == "eagle3-k1"
    proof = result["policy_proof"]["eagle3"]
    assert proof["served_by"] == "eagle3-k1" and proof["holds"] is None and "no policy server" in proof["verdict"]
    sim = yaml.safe_load((_variant(wrong_run) / "policy.yaml").read_text())["schedules"]["eagle3"]["sim"]
    assert sim["static"] and sim["draft_length"] == 1 and sim["server_args"] == ["--draft-tokens", "1"]
