"""Profiles: packaged files load, bad files fail with an error that names the field."""

from __future__ import annotations

import pytest
import yaml

from specsweep.sim.profile import (
    ProfileError,
    available_profiles,
    dump_profile,
    load_profile,
    profile_from_dict,
)

pytestmark = pytest.mark.unit


def _demo_dict() -> dict:
    return load_profile("demo").to_dict()


def test_packaged_profiles_load():
    names = available_profiles()
    for required in ("demo", "kimi-k25-cu130-fusion", "kimi-k25-cu130", "kimi-k25-cu128", "bench-fast"):
        assert required in names
    for n in names:
        p = load_profile(n)
        assert p.name == n
    assert load_profile("demo").illustrative is True
    assert load_profile("kimi-k25-cu130-fusion").illustrative is False
    assert load_profile("kimi-k25-cu130-fusion").running_cap(True) == 48


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["step"].update(fixd_s=0.1), "step.fixd_s"),
        (lambda d: d["step"].update(fixed_s=-1.0), "step.fixed_s"),
        (lambda d: d["step"].update(per_seq_s="fast"), "step.per_seq_s"),
        (lambda d: d["speculative"].update(accept_prob=1.5), "speculative.accept_prob"),
        (lambda d: d["speculative"].update(draft_tokens=0), "speculative.draft_tokens"),
        (lambda d: d["batching"].update(max_running_requests=2.5), "batching.max_running_requests"),
        (lambda d: d["speculative"].update(step={"bogus_s": 1.0}), "speculative.step.bogus_s"),
        (lambda d: d.update(colour="red"), "colour"),
        (lambda d: d.update(name=""), "name"),
        (lambda d: d.update(model=[1, 2]), "model"),
    ],
)
def test_bad_profile_names_the_field(mutate, field):
    d = _demo_dict()
    mutate(d)
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        profile_from_dict(d)


def test_unknown_profile_and_bad_yaml(tmp_path):
    with pytest.raises(ProfileError, match="unknown profile"):
        load_profile("no-such-profile")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="not found"):
        load_profile(tmp_path / "missing.yaml")


def test_dump_and_reload_roundtrip(tmp_path):
    p = load_profile("kimi-k25-cu128")
    out = tmp_path / "x.yaml"
    dump_profile(p, out, header="# test")
    q = load_profile(out)
    assert q == p
    assert yaml.safe_load(out.read_text())["speculative"]["step"] == {"allreduce_s": p.speculative.step["allreduce_s"]}
    assert q.hardware.kv_bytes_per_token == 70272 and q.reference["uncertainty"] == p.reference["uncertainty"]


def test_with_params_and_speculative_overrides():
    p = load_profile("kimi-k25-cu128")
    verify = p.speculative.step["allreduce_s"]  # cu128: verify all-reduces off the custom path, ~4x the others
    assert p.step_costs(True).allreduce_s == verify > 2 * p.step.allreduce_s
    assert p.step_costs(False).allreduce_s == p.step.allreduce_s
    q = p.with_params({"speculative.step.allreduce_s": 0.0003, "step.fixed_s": 0.01})
    assert q.get("speculative.step.allreduce_s") == 0.0003 and q.get("step.fixed_s") == 0.01
    assert load_profile("demo").get("speculative.step.fixed_s") == load_profile("demo").step.fixed_s
