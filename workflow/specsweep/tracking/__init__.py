"""MLflow logging, fed from the local result files (the source of truth).

By concern: `uri` (where the runs go, the UI's address, why reaching it failed), `store` (the run store over
MlflowClient), `payloads` (what a run holds: params, metrics, curves, tags), `log` (the cell, sweep and crossover
runs, and `track`, what `specsweep track` does), `view` (the experiment's saved view), `notes` (each run's
description).

Layout for the MLflow UI: per variant x arm a *sweep* run whose metrics are logged with step = concurrency (the
chart view draws curves against concurrency, variants side by side), the *cell* runs nested under it, and a
*crossover* run per variant. Logging is idempotent: a cell whose summary.json is unchanged keeps its run; a
re-measured cell gets a new run tagged with its cell key, and the run it replaces is marked superseded and
deleted (restorable in MLflow; the files it came from were overwritten by the rerun anyway).

Only a complete run is kept: `finish` is a run's last write, so the run of a job that an outage cut short
(status still RUNNING) is replaced by the rerun, not reused. Jobs logging the same content at the same time
(two checkouts, a job retried while its first try still runs) settle on one run: after logging, the runs of
the key are read again and every job keeps the complete one with the lowest id (`Tracker.settle`).
"""
