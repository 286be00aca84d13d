"""Fault injection for the simulated server, so the client's and the workflow's failure paths can be tested.

Each fault fires on a global token count (tokens emitted since start), which makes it reproducible without
knowing request ids; the HTTP-error fault draws from its own seeded stream.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass


@dataclass
class FaultConfig:
    crash_after_tokens: int | None = None  # os._exit once this many tokens were emitted
    http_error_fraction: float = 0.0  # fraction of generation requests answered with HTTP 500
    stall_after_tokens: int | None = None  # pause every stream once, for stall_s seconds
    stall_s: float = 0.0
    malformed_after_tokens: int | None = None  # write one non-JSON `data:` line on one stream
    truncate_after_tokens: int | None = None  # end one stream without finish_reason / [DONE]
    slow_start_s: float = 0.0  # health answers 503 this long after start
    corrupt_output_fraction: float = 0.0  # this share of prompts (chosen by prompt hash) get one wrong output word
    near_tie_output_fraction: float = 0.0  # this share of prompts take the second word at their first near-tie

    def active(self) -> dict[str, float | int]:
        return {k: v for k, v in asdict(self).items() if v not in (None, 0, 0.0)}


class FaultState:
    """Which one-shot faults have fired; the seeded draw for HTTP errors."""

    def __init__(self, config: FaultConfig, seed: int) -> None:
        self.config = config
        self._rng = random.Random(seed * 7919 + 17)
        self.stalled = False
        self.malformed_done = False
        self.truncate_done = False

    def http_error(self) -> bool:
        f = self.config.http_error_fraction
        return f > 0 and self._rng.random() < f

    def take_malformed(self, tokens_emitted: int) -> bool:
        n = self.config.malformed_after_tokens
        if n is None or self.malformed_done or tokens_emitted < n:
            return False
        self.malformed_done = True
        return True

    def take_truncate(self, tokens_emitted: int) -> bool:
        n = self.config.truncate_after_tokens
        if n is None or self.truncate_done or tokens_emitted < n:
            return False
        self.truncate_done = True
        return True

    def take_stall(self, tokens_emitted: int) -> float:
        n = self.config.stall_after_tokens
        if n is None or self.stalled or tokens_emitted < n or self.config.stall_s <= 0:
            return 0.0
        self.stalled = True
        return self.config.stall_s

    def corrupts(self, prompt_hash: int) -> bool:
        """Whether this prompt's output is corrupted: by its hash, so the same prompts in every run."""
        f = self.config.corrupt_output_fraction
        return f > 0 and (prompt_hash % 10_000) < f * 10_000

    def flips_tie(self, prompt_hash: int) -> bool:
        """Whether this prompt's output parts from plain decoding at its first near-tie (other batch numerics):
        by its hash, chosen apart from `corrupts`."""
        f = self.config.near_tie_output_fraction
        return f > 0 and (prompt_hash // 10_000) % 10_000 < f * 10_000

    def should_crash(self, tokens_emitted: int) -> bool:
        n = self.config.crash_after_tokens
        return n is not None and tokens_emitted >= n


DRIFT_ENV = "SPECSWEEP_SIM_DRIFT_FILE"
DRIFT_RECHECK_S = 0.05  # how often a server looks at the drift file again (a stat call)
INSTANCE_ENV = "SPECSWEEP_ARM_INSTANCE"  # the server instance's own identity (specsweep.config.AA_INSTANCE_ENV)


class HostDrift:
    """A host that slows down for a while: every simulated server on the machine reads the same file.

    The file (named by $SPECSWEEP_SIM_DRIFT_FILE, read again when it changes) holds
    `{"factor": 1.3, "start_unix": T0, "end_unix": T1}`: between those wall-clock times every step takes `factor`
    times as long. It stands for what a real host does between measurements (another tenant, a frequency or
    vCPU speed switch), so tests can show what such drift does to each measuring design. An optional
    `"instances": {"<identity>": 1.25}` slows a server instance throughout, by the identity in its
    $SPECSWEEP_ARM_INSTANCE (an A/A arm's name, or `<arm>.i<k>` with pairing.instances): the instance effect
    a real engine shows (a vLLM CPU A/A pair read 12-15% apart, one instance each).
    """

    def __init__(self, path: str | None, instance: str | None = None) -> None:
        self.path = path
        self.instance = instance
        self._checked = -1.0
        self._mtime: float | None = None
        self._window: tuple[float, float, float] | None = None
        self._own = 1.0  # this instance's factor, at all times

    @classmethod
    def from_env(cls) -> HostDrift:
        return cls(os.environ.get(DRIFT_ENV) or None, os.environ.get(INSTANCE_ENV) or None)

    def _reload(self, now_mono: float) -> None:
        self._checked = now_mono
        try:
            mtime = os.stat(self.path).st_mtime if self.path else None
        except OSError:
            mtime = None
        if mtime == self._mtime:
            return
        self._mtime, self._window, self._own = mtime, None, 1.0
        if mtime is None or self.path is None:
            return
        try:
            d = json.loads(open(self.path).read())
            if "factor" in d:
                self._window = (float(d["factor"]), float(d["start_unix"]), float(d["end_unix"]))
            self._own = float((d.get("instances") or {}).get(self.instance or "", 1.0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"drift file {self.path} unreadable ({e}); no drift applied", file=sys.stderr)

    def factor(self) -> float:
        """The slow-down that applies now (1.0 outside the window or without a file)."""
        if self.path is None:
            return 1.0
        now_mono = time.monotonic()
        if now_mono - self._checked >= DRIFT_RECHECK_S:
            self._reload(now_mono)
        if self._window is None:
            return self._own
        f, start, end = self._window
        return self._own * (f if start <= time.time() < end else 1.0)

    def active(self) -> dict[str, float] | None:
        if self._window is None and self._own == 1.0:
            return None
        out = {"instance_factor": self._own} if self._own != 1.0 else {}
        if self._window is not None:
            f, start, end = self._window
            out.update({"factor": f, "start_unix": start, "end_unix": end})
        return out
