"""The recorded key contract of summary.json and crossover.json (tests/support/contract.py) catches a lost key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.contract import common_paths, key_paths, missing

pytestmark = pytest.mark.unit


def test_a_key_lost_at_any_recorded_depth_is_named(tmp_path: Path) -> None:
    full = {"cell": {"arm": "a", "key": "k"}, "per_level": [{"speedup": 1.0, "lo": 0.9}, {"speedup": 1.1, "lo": 1}]}
    recorded = tmp_path / "keys.json"
    recorded.write_text(json.dumps({"paths": sorted(key_paths(full))}))
    same = tmp_path / "same.json"
    same.write_text(json.dumps(full))
    assert missing(recorded, [same]) == []
    lost = tmp_path / "lost.json"
    lost.write_text(json.dumps({"cell": {"arm": "a"}, "per_level": [{"speedup": 1.0, "lo": 0.9}, {"speedup": 1.2}]}))
    assert missing(recorded, [same, lost]) == ["cell.key", "per_level.[].lo"]


def test_optional_keys_and_deep_keys_are_not_in_the_contract(tmp_path: Path) -> None:
    """A key only some files have (an `attempts` block) and keys below three levels are left out, so data
    that differs run to run cannot fail the contract."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"m": {"x": {"p50": {"deep": 1}}}, "attempts": {"n": 2}, "flags": ["f"]}))
    b.write_text(json.dumps({"m": {"x": {"p50": {"deep": 1}}}, "flags": []}))
    assert common_paths([a, b]) == {"m", "m.x", "m.x.p50", "flags"}
