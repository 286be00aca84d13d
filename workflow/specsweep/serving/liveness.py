"""Is a process still the one we started? Shared by the server lifecycle (`servers`) and the SLURM server host
(`serverhost`), which both outlive or watch an owner process; here so neither imports the other back."""

from __future__ import annotations

import psutil


def process_started(pid: int) -> float | None:
    """Start time of a live process (guards against pid reuse), None if it is gone."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except psutil.Error:
        return None


def owner_alive(pid: int, started: float) -> bool:
    """True while `pid` runs and is the process that started at `started` (not a reused pid)."""
    now = process_started(pid)
    return now is not None and abs(now - started) < 1.0
