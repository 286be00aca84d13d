"""The run's budget (measure/budget.py): each level's share of what is left, the ledger, and attempts it stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep import config as ssconfig
from specsweep.analysis.precision import LevelRule, PrecisionSettings
from specsweep.measure import heal
from specsweep.measure.budget import (
    BUDGET_ENV,
    RunBudget,
    allowance,
    done_levels,
    record_level,
    room_for,
    spent_text,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def budget(tmp_path: Path, run_s: float = 1000.0, levels: float = 10, started: float = 0.0) -> RunBudget:
    return RunBudget(run_s, started, levels, str(tmp_path / "budget" / "run-0.jsonl"))


def test_a_level_gets_an_even_share_of_what_is_left_after_the_levels_done(tmp_path: Path) -> None:
    b = budget(tmp_path)
    # 15% kept for the jobs after measuring: 850 s to measure, 100 s passed, 10 levels to go
    a = allowance(b, now=100.0)
    assert (a.left_s, a.remaining, a.seconds) == (750.0, 10, 75.0)
    record_level(b, "sim/c1", 40.0, 4)
    record_level(b, "sim/c2", 30.0, 4)
    assert [d["level"] for d in done_levels(b)] == ["sim/c1", "sim/c2"]
    a = allowance(b, now=170.0)
    assert (a.left_s, a.remaining) == (680.0, 8) and a.seconds == pytest.approx(85.0)  # early stops leave seconds
    # a policy level takes half a share: 680 s over 8 shares, its half 42.5 s
    assert allowance(b, 0.5, now=170.0).seconds == pytest.approx(42.5)
    record_level(b, "sim/eagle3-policy/c1", 20.0, 3, share=0.5)
    assert allowance(b, now=170.0).remaining == 7.5
    # more levels done than planned (added levels beyond the estimate): the last takes what is left
    for i in range(9):
        record_level(b, f"sim/c{10 + i}", 1.0, 4)
    assert allowance(b, now=800.0).remaining == 1 and allowance(b, now=800.0).seconds == pytest.approx(50.0)
    assert allowance(b, now=900.0).seconds < 0  # spent: the level measures its min_rounds only


def test_a_retry_past_the_levels_share_starts_where_the_run_has_room_for_it(tmp_path: Path) -> None:
    """Measuring spoiled rounds again past a level's share: only where those seconds and the levels after it,
    projected at what the levels done took per share, fit in the run's measuring seconds."""
    b = budget(tmp_path, levels=10)
    assert not room_for(b, 1.0, now=100.0)  # no level done: nothing to project with, no room past the share
    for i in range(6):
        record_level(b, f"sim/c{i}", 20.0, 4)  # 20 s a share
    # 850 - 400 = 450 s left; this level and 3 after it: 3 x 20 = 60 s projected
    assert room_for(b, 390.0, now=400.0) and not room_for(b, 391.0, now=400.0)
    assert room_for(b, 10.0, share=0.5, now=400.0) and not room_for(b, 10.0, now=830.0)


def test_the_rule_bounds_the_levels_rounds_by_its_share() -> None:
    """The share bounds the level's rounds (its max_level_s, where less than its own), not its servers' start:
    that is the run's cost, off the run's clock and so off every later level's share."""
    settings = PrecisionSettings.from_config(
        {"target": 0.05, "min_rounds": 3, "max_rounds": 40, "max_level_s": 420, "max_block_growth": 8}
    )
    st = LevelRule(settings, share_s=140.0).settings_now()
    assert (st.max_level_s, st.level_s_from) == (140.0, "run budget")
    assert LevelRule(settings, share_s=-30.0).settings_now().max_level_s == 0.0  # spent: its min_rounds only
    assert LevelRule(settings, share_s=5000.0).settings_now() is settings  # the level's own budget binds first
    assert LevelRule(settings).settings_now() is settings


def test_the_run_says_how_it_spent_its_budget(tmp_path: Path) -> None:
    b = budget(tmp_path, run_s=200.0)
    record_level(b, "sim/c1", 120.0, 4)
    assert "the run took 180 s, within it; 1 levels measured in 120 s" in spent_text(b, now=180.0)
    assert "over it by 20 s (10%)" in spent_text(b, now=220.0)


def test_the_budget_travels_through_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = budget(tmp_path)
    monkeypatch.setenv(BUDGET_ENV, b.to_env())
    assert RunBudget.from_env() == b
    monkeypatch.delenv(BUDGET_ENV)
    assert RunBudget.from_env() is None  # a job run by hand: no run budget


def test_no_attempt_starts_once_the_run_budget_is_spent() -> None:
    transient = {"valid": False, "reasons": ["machine busy: other work took 40% of the measured CPUs"]}
    made: list[int] = []

    def once(n: int) -> int:
        made.append(n)
        return n

    done = heal.measure_until_valid(once, lambda _: transient, 3, may_retry=lambda: False)
    assert made == [1] and done.counted == 1
    assert (
        done.log[-1]["counts"]
        and "share of the run's budget is spent, and the levels after it need the rest" in (done.log[-1]["not_again"])
    )
    assert done.as_dict()["why"].startswith("still invalid, and not measured again: the level's share")
    made.clear()
    heal.measure_until_valid(once, lambda _: transient, 3, may_retry=lambda: True)
    assert made == [1, 2, 3]


def test_a_budget_below_the_servers_starts_is_refused_naming_the_key_and_the_least() -> None:
    cfg = ssconfig.load(ROOT / "config" / "examples" / "kimi-k25-8gpu.yaml")
    raw = json.loads(json.dumps(cfg))
    raw["budget"] = {"run_s": 600}
    with pytest.raises(ssconfig.ConfigError, match=r"budget/run_s.*servers' starts alone"):
        ssconfig.validate(raw)
    raw["budget"] = {"run_s": 8 * 3600}
    assert ssconfig.validate(raw)["budget"]["run_s"] == 8 * 3600
