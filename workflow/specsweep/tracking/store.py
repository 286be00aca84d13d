"""The run store: a thin layer over MlflowClient for specsweep's run layout. Idempotent logging rests here: a run
of unchanged content is reused (`reusable`), and jobs logging the same content at once settle on one (`settle`)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specsweep.io import file_lock
from specsweep.tracking.uri import (
    credentials_to_env,
    http_env,
    is_postgresql_uri,
    is_server_uri,
    resolve_tracking_uri,
)
from specsweep.tracking.view import view_arms, view_tag

TAG = "specsweep"
NOTE = "mlflow.note.content"  # the run's description on its page
# bumped when the run layout changes, so unchanged results are re-logged once in the new layout
LAYOUT = "layout-3"
# What a store says when an insert meets a row another job inserted since its own lookup (PostgreSQL, SQLite, MySQL)
UNIQUE_RACE = ("UniqueViolation", "duplicate key value", "UNIQUE constraint failed", "Duplicate entry")
RACE_TRIES = 3  # calls of a write that may lose an insert race: the first and two after a lost race
SCHEMA_LOCK_S = 600  # how long a PostgreSQL job waits for another's schema set-up (MLflow's migrations take seconds)
SCHEMA_LOCK_KEY = 0x5BEC5EE9  # specsweep's PostgreSQL advisory lock around a fresh database's schema set-up


def lost_insert_race(exc: Exception) -> bool:
    """Whether the store refused a write because another job inserted the same row since the store's own lookup.
    MLflow's store looks a row up, then inserts it if missing, with nothing between the two (datasets,
    experiment tags): jobs of one experiment writing at once can meet a unique-key violation, which a server
    answers as BAD_REQUEST. The failed transaction wrote nothing; the write can be made again."""
    return any(s in str(exc) for s in UNIQUE_RACE)


def retry_lost_race(write: Callable[[], None]) -> None:
    """Call `write` again when it lost an insert race (RACE_TRIES calls at most, 0.2 and 0.4 s apart); any other
    refusal, and the last try's, is raised at once."""
    from mlflow.exceptions import MlflowException

    for attempt in range(1, RACE_TRIES + 1):
        try:
            write()
            return
        except MlflowException as exc:
            if attempt == RACE_TRIES or not lost_insert_race(exc):
                raise
            time.sleep(0.2 * attempt)


@contextlib.contextmanager
def schema_lock(uri: str) -> Iterator[None]:
    """Held while a process opens a database store for the first time, so that a fresh database gets MLflow's
    schema from one process. Why: MLflow's tracking store creates the tables and runs every migration in each
    process that finds them missing, with no lock (its jobs and workspace stores take one, the tracking store
    does not), and jobs that start at once on a new store fail inside it (`table experiments already exists`,
    `duplicate column name: step`; docs/mlflow-schema-race.md). SQLite: a file lock beside the database (every
    checkout and job that opens the file takes the same one); PostgreSQL: an advisory lock in the database
    itself, which holds across hosts. A tracking server creates its schema itself, before it answers."""
    if uri.startswith("sqlite:///"):
        with file_lock(uri.removeprefix("sqlite:///") + ".lock"):
            yield
    elif is_postgresql_uri(uri):
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text(f"SET lock_timeout = '{SCHEMA_LOCK_S}s'"))
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY})
                    conn.commit()
        finally:
            engine.dispose()
    else:
        yield


def _unsynced(dbapi_connection: Any, _record: Any) -> None:
    """A local SQLite store's connection that hands its writes to the OS without waiting for the disk (`PRAGMA
    synchronous=OFF`). Why: every MLflow call is a transaction of its own, and a fresh database's migrations are
    hundreds more; each commit's fsync took 5-30 ms on a 2-core VM whose disk other jobs used, seconds a
    tracking job. What it gives up is the last writes on an OS crash or power loss: the store is rebuilt from the
    results (the source of truth) by rerunning the tracking jobs. An application crash loses nothing."""
    import sqlite3

    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=OFF")


def open_client(uri: str) -> Any:
    """An MlflowClient whose store is open and at the installed MLflow's schema head (MLflow refuses an older
    schema, naming `mlflow db upgrade`): a fresh database is given its schema here, by one process at a time."""
    from mlflow.tracking import MlflowClient

    if is_server_uri(uri):
        return MlflowClient(tracking_uri=uri)
    if uri.startswith("sqlite:"):
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        if not event.contains(Engine, "connect", _unsynced):
            event.listen(Engine, "connect", _unsynced)
    with schema_lock(uri):  # the client opens its store when made (and a search, when it is made lazily)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    return client


class Tracker:
    """Thin layer over MlflowClient for the specsweep run layout."""

    def __init__(self, config: dict[str, Any]) -> None:
        import mlflow

        self.config = config
        self.uri = credentials_to_env(resolve_tracking_uri(config["mlflow"]["tracking_uri"]))
        http_env(config["mlflow"])
        mlflow.set_tracking_uri(self.uri)
        self.client = open_client(self.uri)
        self.experiment_id = self._experiment()
        self.save_view()

    def _experiment(self) -> str:
        """The experiment's id: found, restored when deleted, or created. Jobs of one experiment start together
        (every arm's sweep, other checkouts logging to the same server), so each step may find that another
        job got there first: a create answered RESOURCE_ALREADY_EXISTS, a restore of one already restored."""
        from mlflow.exceptions import MlflowException

        name = self.config["experiment"]
        # A server keeps artifacts where it was told (--artifacts-destination, proxied: every client reaches
        # them); a local store keeps them next to the results.
        artifacts = None
        if not is_server_uri(self.uri):
            artifacts = (Path(self.config["results_dir"]) / "mlartifacts" / name).resolve().as_uri()
        # The UI opens on the runs table (not the GenAI overview) for model-development experiments.
        tags = {"mlflow.experimentKind": "custom_model_development", f"{TAG}.experiment": name}
        for _ in range(3):
            exp = self.client.get_experiment_by_name(name)
            if exp is not None and exp.lifecycle_stage == "deleted":
                with contextlib.suppress(MlflowException):  # restored meanwhile by another job: checked below
                    self.client.restore_experiment(exp.experiment_id)
                exp = self.client.get_experiment(exp.experiment_id)
            if exp is not None and exp.lifecycle_stage == "active":
                return exp.experiment_id
            if exp is None:
                try:
                    return self.client.create_experiment(name, artifact_location=artifacts, tags=tags)
                except MlflowException as exc:
                    if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                        raise
        raise RuntimeError(f"MLflow experiment {name!r} could not be found, restored or created (deleted again?)")

    def log_inputs(self, run_id: str, datasets: list[Any]) -> None:
        """`MlflowClient.log_inputs`, repeated when it lost an insert race (`lost_insert_race`): jobs logging the
        same prompt set to one experiment at once (two checkouts, one server; seen in CI: `duplicate key value
        violates unique constraint "dataset_pk"`). The next call finds the other job's row and links it."""
        retry_lost_race(lambda: self.client.log_inputs(run_id, datasets=datasets))

    def save_view(self) -> None:
        """The experiment's saved view (`mlflow_view`) with this config's arms joined to those already in it,
        rewritten only when its charts change. Why joined: two checkouts logging variants of one experiment
        with different arms would otherwise take each other's charts away, the last job winning. A write
        that races another (both read the old view) can still lose an arm: `run` calls this again when a
        job ends, seconds later, which puts it back. A write that lost the tag's first insert to another job's
        reads the view again (`retry_lost_race`)."""
        arms = self.config.get("view_arms") or {}
        mine = (list(arms.get("speculative") or []), list(arms.get("policy") or []))

        def write() -> None:
            key, _ = view_tag([], [])
            current = self.client.get_experiment(self.experiment_id).tags.get(key)
            have = view_arms(current) if current else ([], [])
            want = [h + [a for a in m if a not in h] for h, m in zip(have, mine, strict=True)]
            key, value = view_tag(*want)
            if current is None or _view_state(current) != json.loads(value)["state"]:
                self.client.set_experiment_tag(self.experiment_id, key, value)

        retry_lost_race(write)

    def active_runs(self, **tags: str) -> list[Any]:
        flt = " and ".join(f"tags.`{TAG}.{k}` = '{v}'" for k, v in tags.items())
        return self.client.search_runs([self.experiment_id], filter_string=flt, max_results=1000)

    def retire(self, runs: list[Any], keep: str, why: str) -> None:
        """Mark every run but `keep` superseded and delete it (restorable in MLflow). A run another job
        retired meanwhile is skipped."""
        from mlflow.exceptions import MlflowException

        for run in runs:
            if run.info.run_id == keep:
                continue
            try:
                self.client.set_tag(run.info.run_id, f"{TAG}.superseded_by", keep)
                self.client.set_tag(run.info.run_id, f"{TAG}.superseded_reason", why)
                self.client.delete_run(run.info.run_id)
            except MlflowException as exc:
                if not self._deleted(run.info.run_id, exc):
                    raise

    def _deleted(self, run_id: str, exc: Exception) -> bool:
        """Whether a write into `run_id` failed because another job retired the run; when even asking fails
        (the server is down), the write's own error is the one to tell."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "deleted"
        except MlflowException:
            raise exc from None

    @staticmethod
    def reusable(runs: list[Any], digest_tag: str, digest: str) -> str | None:
        """The run of this content that every job agrees to keep: among the complete ones (FINISHED), the
        lowest id. A run an interrupted job left RUNNING never counts."""
        done = sorted(
            r.info.run_id
            for r in runs
            if r.info.status == "FINISHED" and r.data.tags.get(f"{TAG}.{digest_tag}") == digest
        )
        return done[0] if done else None

    @contextlib.contextmanager
    def writing(self, run_id: str) -> Iterator[None]:
        """The writes into a new run. A concurrent job logging the same content may retire this run once its own
        copy is complete (`settle`); the remaining writes then fail and are moot: `settle` keeps that copy."""
        from mlflow.exceptions import MlflowException

        try:
            yield
        except MlflowException as exc:
            if not self._deleted(run_id, exc):
                raise

    def settle(self, key: dict[str, str], digest_tag: str, digest: str, why: str) -> str:
        """After logging a run: the one run of its key to keep (`reusable`), every other retired, among them
        the run of an interrupted job and the copy of a job logging the same content at the same time. The
        runs are read again, not taken from before: such a job may have finished its copy meanwhile."""
        runs = self.active_runs(**key)
        keep = self.reusable(runs, digest_tag, digest)
        if keep is not None:
            self.retire(runs, keep=keep, why=why)
        if keep is None or self.client.get_run(keep).info.lifecycle_stage != "active":
            raise RuntimeError(
                f"the MLflow run of {key} was retired by another job logging it at the same time; rerun to log it once"
            )
        return keep

    def new_run(
        self,
        name: str,
        tags: dict[str, str],
        params: dict[str, Any],
        metrics: dict[str, float],
        steps: list[tuple[int, dict[str, float]]] | None = None,
        start_time_ms: int | None = None,
    ) -> str:
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags, start_time=start_time_ms)
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        metric_objs = [Metric(k, v, now, 0) for k, v in metrics.items()]
        for step, values in steps or []:
            metric_objs += [Metric(k, v, now, step) for k, v in values.items()]
        param_objs = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, max(len(metric_objs), len(param_objs), 1), 500):
            self.client.log_batch(
                run_id,
                metrics=metric_objs[i : i + 500],
                params=param_objs[i : i + 100],
                tags=[RunTag(f"{TAG}.logged", "true")] if i == 0 else [],
            )
        for j in range(100, len(param_objs), 100):
            self.client.log_batch(run_id, params=param_objs[j : j + 100])
        return run_id

    def finish(self, run_id: str, status: str = "FINISHED", end_time_ms: int | None = None) -> None:
        """A run's last write: from here on it is complete (`reusable`)."""
        self.client.set_terminated(run_id, status=status, end_time=end_time_ms)


def _view_state(tag_value: str) -> str | None:
    """The UI state inside a saved view's tag value (None for one that is not such JSON)."""
    try:
        return json.loads(tag_value).get("state")
    except (ValueError, AttributeError):
        return None
