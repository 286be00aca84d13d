"""Several processes opening one fresh MLflow store at the same moment, as the tracking jobs of `snakemake
--cores N` (or several checkouts) do on a new store: each round a new database, the processes released together
by a barrier. Spawned once and reused across rounds, so that MLflow's import (seconds) is paid once a process,
not once a round."""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter
from collections.abc import Callable
from typing import Any


def _open_each(configs: list[dict[str, Any]], barrier: Any, results: Any) -> None:
    from specsweep.tracking.store import Tracker

    for config in configs:
        try:
            barrier.wait(timeout=300)
        except Exception as exc:  # a broken barrier: another process died; say so once per round left
            results.put(f"barrier: {type(exc).__name__}")
            continue
        try:
            Tracker(config)
            results.put("ok")
        except Exception as exc:
            results.put(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def open_at_once(processes: int, rounds: int, config_of: Callable[[int], dict[str, Any]]) -> Counter[str]:
    """What each process said per round (`ok`, or its error's first line), counted; `config_of(round)` names
    the round's fresh store (a tracking config)."""
    ctx = mp.get_context("spawn")
    configs = [config_of(r) for r in range(rounds)]
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_open_each, args=(configs, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    said = Counter(results.get(timeout=600) for _ in range(processes * rounds))
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    return said
