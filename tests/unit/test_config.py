"""The config schema is the one home of keys and defaults: validation errors name the key and the fix, the
generated config/README.md matches it, and the conda environment of the rules lists the package's needs."""

from __future__ import annotations

import copy
import re
import tomllib

import pytest
import yaml

from specsweep import config as ssconfig
from specsweep.configdoc import README_PATH, render
from tests.conftest import REPO

pytestmark = pytest.mark.unit

GOOD = {
    "experiment": "t",
    "arms": {"baseline": {"speculative": False}, "eagle3": {"speculative": True}},
    "variants": {"sim": {"engine": "sim"}},
}


def bad(**change: object) -> str:
    cfg = copy.deepcopy(GOOD)
    cfg.update(change)
    with pytest.raises(ssconfig.ConfigError) as e:
        ssconfig.validate(cfg)
    return str(e.value)


def test_defaults_come_from_the_schema() -> None:
    cfg = ssconfig.validate(GOOD)
    assert cfg["gates"] == ssconfig.defaults("gates")
    assert cfg["workload"]["requests"] == ssconfig.defaults("workload", "requests")
    assert cfg["client"]["cpus"] == "auto" and cfg["variants"]["sim"]["cpus"] == "auto"


def test_unknown_key_names_it_and_the_allowed_ones() -> None:
    msg = bad(gates={"max_loop_lag_p99_ms": 5})  # the old gate's name
    assert "config error at 'gates'" in msg and "max_loop_lag_p99_ms" in msg
    assert "allowed keys here:" in msg and "max_loop_lag_excess_ms" in msg


def test_missing_baseline_arm_and_no_speculative_arm() -> None:
    assert "arm 'baseline' is not defined; known arms: a, b" in bad(
        arms={"a": {"speculative": False}, "b": {"speculative": True}}
    )
    assert "define at least one arm with speculative: true" in bad(
        arms={"baseline": {"speculative": False}, "b": {"speculative": False}}
    )


def test_bad_enum_lists_the_allowed_values() -> None:
    msg = bad(variants={"x": {"engine": "trt"}})
    assert "config error at 'variants/x/engine'" in msg and "allowed values: sim, sglang, vllm" in msg


def test_output_length_is_fixed_or_a_uniform_range() -> None:
    assert ssconfig.validate({**GOOD, "workload": {"output_tokens": {"uniform": [16, 64]}}})
    assert "workload/output_tokens" in bad(workload={"output_tokens": {"normal": [16, 4]}})


def test_config_readme_is_generated_from_the_schema() -> None:
    assert README_PATH.read_text() == render(), "config/README.md is stale: run `specsweep config-doc --write`"
    assert "| `gates.max_client_wait_share` |" in render()


def test_rules_conda_environment_lists_the_packages_dependencies() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "workflow" / "envs" / "specsweep.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~ ]", r, maxsplit=1)[0].lower() for r in reqs}

    assert names(pip) == names(deps)


def test_a_request_cap_below_two_turnovers_of_the_top_level_is_refused() -> None:
    """`requests.max` under 2 x the largest C would leave that level's steady window empty (every cell there
    invalid after it ran): refused before anything runs, naming the fix."""
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["workload"]["requests"]["max"] = 200
    with pytest.raises(ssconfig.ConfigError, match=r"requests/max'.*C=250.*raise max to 500"):
        ssconfig.validate(raw)


def test_numbers_that_arrive_as_text_name_the_fix() -> None:
    """Snakemake's `--config concurrency=[1,2]` passes the items as strings: the error says so and names the fix."""
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["concurrency"] = ["1", "2"]
    with pytest.raises(ssconfig.ConfigError, match=r"concurrency/0.*arrived as text.*--configfile"):
        ssconfig.validate(raw)


OPEN = {"load": {"mode": "open", "rates": [0.5, 2]}, "analysis": {"primary_metric": "e2e_p50_s"}}


def test_open_loop_levels_and_what_only_closed_loops_have() -> None:
    cfg = ssconfig.validate({**GOOD, **OPEN, "policy": {"measure": False}})
    assert ssconfig.levels(cfg) == [0.5, 2] and ssconfig.level_name("open", 0.5) == "r0.5"
    assert ssconfig.parse_level("r0.5") == ("open", 0.5) and ssconfig.parse_level("c10") == ("closed", 10)
    spec = ssconfig.cell_spec(cfg, "sim", "baseline", 2)
    assert spec["level"] == 2 and spec["n_requests"] == 60 and spec["load"]["mode"] == "open"  # 2/s x 30 s
    assert "trace" not in spec["load"] and "rates" not in spec["load"]  # another level's rate reruns nothing
    assert "set policy.measure: false" in bad(**OPEN)
    assert "set adaptive.enabled: false" in bad(**OPEN, policy={"measure": False}, adaptive={"enabled": True})
    msg = bad(load=OPEN["load"], policy={"measure": False})
    assert "config error at 'analysis/primary_metric'" in msg and "e2e_p50_s" in msg


def test_a_bad_trace_stops_at_config_time_naming_file_and_line(tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 4}\n{"timestamp": 9, "input_length": 8}\n')
    load = {"mode": "trace", "trace": {"path": str(trace)}}
    msg = bad(load=load, policy={"measure": False}, analysis={"primary_metric": "tpot_p50_s"})
    assert f"config error at 'load/trace/path': {trace}:2: missing field 'output_length'" in msg
    assert "name a Mooncake JSONL trace" in bad(
        load={"mode": "trace"}, policy={"measure": False}, analysis={"primary_metric": "tpot_p50_s"}
    )


def test_cluster_resources_per_variant_and_no_cell_depends_on_them() -> None:
    cfg = copy.deepcopy(GOOD)
    tp8 = {"engine": "sglang", "model": "/models/m", "tp": 8, "slurm": {"partition": "gpu", "runtime_min": 30}}
    cfg["variants"]["tp8"] = tp8
    v = ssconfig.validate(cfg)
    assert ssconfig.slurm_resources(v, "tp8")["gpu"] == 8  # GPUs default to tp for SGLang
    assert ssconfig.slurm_resources(v, "tp8")["slurm_partition"] == "gpu"
    assert ssconfig.slurm_resources(v, "tp8")["runtime"] == 30
    sim = ssconfig.slurm_resources(v, "sim")
    assert sim["gpu"] is None and sim["mem_mb"] == 0 and sim["cpus_per_task"] == 4  # 0 - the cluster's default
    moved = copy.deepcopy(v)
    moved["variants"]["sim"]["slurm"]["partition"] = "other"
    assert ssconfig.cell_spec(v, "sim", "eagle3", 4) == ssconfig.cell_spec(moved, "sim", "eagle3", 4)
    assert "bogus" in bad(variants={"sim": {"engine": "sim", "slurm": {"bogus": 1}}})


def test_a_servers_cells_run_back_to_back_from_the_highest_level_down() -> None:
    """Every arm meets its levels in one order, so a server's first minute falls on the same level in each."""
    from specsweep.config import cell_priority

    cfg = {
        "variants": {"a": {}, "b": {}},
        "arms": {"eagle3": {}, "baseline": {}},
        "analysis": {"baseline_arm": "baseline"},
    }
    order = sorted(
        ((v, a, lvl) for v in cfg["variants"] for a in cfg["arms"] for lvl in ("c1", "c2", "c10", "c250", "c9999")),
        key=lambda x: -cell_priority(cfg, *x),
    )
    # the baseline first, though listed second: a speculative cell refers its outputs to the baseline cell's
    assert [x[:2] for x in order[::5]] == [("a", "baseline"), ("a", "eagle3"), ("b", "baseline"), ("b", "eagle3")]
    assert [x[2] for x in order[:5]] == ["c9999", "c250", "c10", "c2", "c1"]
    assert cell_priority(cfg, "a", "baseline", "r2.5") > cell_priority(cfg, "a", "baseline", "r2")
    assert cell_priority(cfg, "a", "baseline", "t1.5") > cell_priority(cfg, "a", "baseline", "t1")


def test_the_segment_rules_budget_starts_at_the_configured_instances() -> None:
    """precision.max_instances is the most instances per arm a sequential level may take: below pairing.instances
    it is refused, naming the fix; it adds nothing where arms interleave or no target is set."""
    seq = {**GOOD, "variants": {"gpu": {"engine": "sim", "gpus": "0"}}, "pairing": {"instances": 2}}
    cfg = copy.deepcopy(seq)
    cfg["pairing"]["instances"] = 3
    cfg["precision"] = {"max_instances": 2}
    with pytest.raises(ssconfig.ConfigError, match=r"precision/max_instances'.*below pairing.instances \(3\)"):
        ssconfig.validate(cfg)
    ok = ssconfig.validate({**copy.deepcopy(seq), "precision": {"max_instances": 4}})
    assert ssconfig.instances(ok, "gpu") == 2 and ssconfig.max_instances(ok, "gpu") == 4
    assert [k for _, k in ssconfig.segments(ok, "gpu")] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert [a for a, _ in ssconfig.segments(ok, "gpu")][4:] == ["baseline", "eagle3", "eagle3", "baseline"]
    fixed = ssconfig.validate({**copy.deepcopy(seq), "precision": {"max_instances": 4, "target": None}})
    assert ssconfig.max_instances(fixed, "gpu") == 2
    cpu = ssconfig.validate({**copy.deepcopy(GOOD), "pairing": {"instances": 2}, "precision": {"max_instances": 4}})
    assert ssconfig.max_instances(cpu, "sim") == 1  # interleaved: its level jobs hold every instance at once
