"""The run store against a real MLflow store (SQLite in a temporary folder): a write that lost an insert race to
another job (a dataset input, the saved view's tag) is made again and keeps the other job's row, and any other
refusal is raised at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specsweep.tracking.payloads import prompt_dataset
from specsweep.tracking.store import RACE_TRIES, Tracker
from specsweep.tracking.view import view_arms, view_tag

pytestmark = pytest.mark.unit

# what a PostgreSQL-backed server answered a tracking job in CI, when a teammate's job logged the same prompt set
RACE = (
    '(psycopg2.errors.UniqueViolation) duplicate key value violates unique constraint "dataset_pk"\n'
    "DETAIL:  Key (experiment_id, name, digest)=(2, words-16in-12out, 1f0c3a) already exists."
)
SUMMARY = {
    "workload": {
        "prompt_set_sha256": "1f0c3a" + "0" * 58,
        "prompt_source": "words",
        "input_tokens": 16,
        "output_tokens": 12,
        "prompt_seed": 1,
        "prompt_count": 8,
        "prompt_tokens_exact": True,
    }
}


@pytest.fixture
def tracker(tmp_path: Path) -> Tracker:
    return Tracker(
        {
            "experiment": "store",
            "results_dir": str(tmp_path / "results"),
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
            "view_arms": {"speculative": ["eagle3"], "policy": []},
        }
    )


def refusing_once(
    tracker: Tracker, method: str, message: str, monkeypatch: pytest.MonkeyPatch, before: Any = None
) -> list[int]:
    """Make the client's `method` refuse its first call with `message` (after `before()`, the other job's
    write), then pass calls to the real store; returns the list the calls are counted in."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import BAD_REQUEST

    real = getattr(tracker.client, method)
    calls: list[int] = []

    def refused_once(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            if before is not None:
                before()
            raise MlflowException(message, error_code=BAD_REQUEST)
        real(*args, **kwargs)

    monkeypatch.setattr(tracker.client, method, refused_once)
    return calls


def test_a_dataset_that_lost_a_race_is_linked_by_the_next_try(
    tracker: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tracker.new_run("mine", {}, {}, {})
    theirs = tracker.new_run("theirs", {}, {}, {})
    dataset = prompt_dataset(SUMMARY)
    real = tracker.client.log_inputs
    calls = refusing_once(tracker, "log_inputs", RACE, monkeypatch, before=lambda: real(theirs, datasets=[dataset]))
    tracker.log_inputs(mine, [dataset])
    assert len(calls) == 2
    logged = {r: tracker.client.get_run(r).inputs.dataset_inputs for r in (mine, theirs)}
    assert [(d.dataset.name, d.dataset.digest) for d in logged[mine]] == [
        (dataset.dataset.name, dataset.dataset.digest)
    ]
    assert [d.dataset.digest for d in logged[theirs]] == [dataset.dataset.digest]


def test_another_refusal_is_raised_at_once(tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.exceptions import MlflowException

    run = tracker.new_run("mine", {}, {}, {})
    calls = refusing_once(
        tracker, "log_inputs", "Param value 'x' had length 9000, which exceeded length limit", monkeypatch
    )
    with pytest.raises(MlflowException, match="exceeded length limit"):
        tracker.log_inputs(run, [prompt_dataset(SUMMARY)])
    assert len(calls) == 1


def test_a_race_lost_every_time_is_raised_after_the_last_try(tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.exceptions import MlflowException

    run = tracker.new_run("mine", {}, {}, {})
    calls: list[int] = []

    def always_refused(run_id: str, datasets: list[Any]) -> None:
        calls.append(1)
        raise MlflowException(RACE)

    monkeypatch.setattr(tracker.client, "log_inputs", always_refused)
    monkeypatch.setattr("specsweep.tracking.store.time.sleep", lambda s: None)
    with pytest.raises(MlflowException, match="dataset_pk"):
        tracker.log_inputs(run, [prompt_dataset(SUMMARY)])
    assert len(calls) == RACE_TRIES


# what SQLite answered one of four processes setting one new tag of one experiment at once (6 of 20 plain
# set_experiment_tag calls were refused so, in 5 rounds)
TAG_RACE = "(sqlite3.IntegrityError) UNIQUE constraint failed: experiment_tags.key, experiment_tags.experiment_id"


def saved_view(tracker: Tracker) -> tuple[list[str], list[str]]:
    key, _ = view_tag([], [])
    return view_arms(tracker.client.get_experiment(tracker.experiment_id).tags[key])


def test_a_view_that_lost_a_race_is_read_again_and_keeps_the_other_jobs_arms(
    tracker: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tracker.client.set_experiment_tag
    theirs = view_tag(["eagle3", "medusa"], [])  # a teammate's job wrote its arms between our read and our write
    calls = refusing_once(
        tracker, "set_experiment_tag", TAG_RACE, monkeypatch, before=lambda: real(tracker.experiment_id, *theirs)
    )
    tracker.config["view_arms"] = {"speculative": ["eagle3", "mtp"], "policy": ["eagle3-policy"]}
    tracker.save_view()
    assert len(calls) == 2
    assert saved_view(tracker) == (["eagle3", "medusa", "mtp"], ["eagle3-policy"])


def test_another_refusal_of_the_view_is_raised_at_once(tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.exceptions import MlflowException

    calls = refusing_once(
        tracker, "set_experiment_tag", "PERMISSION_DENIED: Permission denied for experiment", monkeypatch
    )
    tracker.config["view_arms"] = {"speculative": ["eagle3", "mtp"], "policy": []}
    with pytest.raises(MlflowException, match="Permission denied"):
        tracker.save_view()
    assert len(calls) == 1
    assert saved_view(tracker) == (["eagle3"], [])


def test_fresh_store_opened_by_many_jobs_at_once(tmp_path: Path) -> None:
    """Eight tracking jobs opening one new SQLite store at the same moment, ten rounds: every one opens it.
    Without the schema lock MLflow 3.17 fails most of them inside its own schema set-up (`table experiments
    already exists`, `duplicate column name: step`: 24 of 24 in three rounds; docs/mlflow-schema-race.md)."""
    from tests.support.store_race import open_at_once

    def config_of(round_: int) -> dict[str, Any]:
        return {
            "experiment": "fresh",
            "results_dir": str(tmp_path / f"r{round_}" / "results"),
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / f'r{round_}' / 'mlflow.db'}"},
            "view_arms": {"speculative": ["eagle3"], "policy": []},
        }

    said = open_at_once(8, 10, config_of)
    assert said == {"ok": 80}, said
