"""Event-loop lag monitor: how late a periodic timer wakes up tells whether the client kept up.

Why: every chunk is timestamped when the event loop gets to it. If the loop is busy (too many streams for one
core), timestamps come late and TTFT/ITL inflate with client delay rather than server time. A timer that
should wake every `interval_s` and wakes `lag` seconds late measures exactly that queueing delay.
"""

from __future__ import annotations

import asyncio
from time import monotonic

from specsweep.aio import cancel_and_wait


class LoopLagMonitor:
    """Samples `actual wake - scheduled wake` every `interval_s` while running (seconds, >= 0)."""

    def __init__(self, interval_s: float = 0.010) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        interval = self.interval_s
        append = self.samples.append
        while True:
            due = monotonic() + interval
            await asyncio.sleep(interval)
            append(max(0.0, monotonic() - due))

    def start(self) -> LoopLagMonitor:
        self.samples = []
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> list[float]:
        """Stop sampling and return the samples of this run."""
        await cancel_and_wait(self._task)
        self._task = None
        return self.samples

    async def __aenter__(self) -> LoopLagMonitor:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
