"""Fault injection for the simulated server, so the client's and the workflow's failure paths can be tested.

Each fault fires on a global token count (tokens emitted since start), which makes it reproducible without
knowing request ids; the HTTP-error fault draws from its own seeded stream.
"""

from __future__ import annotations

import argparse
import random
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

    def should_crash(self, tokens_emitted: int) -> bool:
        n = self.config.crash_after_tokens
        return n is not None and tokens_emitted >= n


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("fault injection")
    g.add_argument(
        "--fault-crash-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="exit the whole process abruptly after N tokens emitted in total",
    )
    g.add_argument(
        "--fault-http-error-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="answer this fraction of generation requests with HTTP 500 (seeded)",
    )
    g.add_argument(
        "--fault-stall-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="after N tokens, stop all streams once for --fault-stall-s seconds",
    )
    g.add_argument("--fault-stall-s", type=float, default=0.0, metavar="S")
    g.add_argument(
        "--fault-malformed-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="after N tokens, write one garbage non-JSON data: line on one stream",
    )
    g.add_argument(
        "--fault-truncate-after-tokens",
        type=int,
        default=None,
        metavar="N",
        help="after N tokens, close one stream without finishing or [DONE]",
    )
    g.add_argument(
        "--fault-slow-start-s",
        type=float,
        default=0.0,
        metavar="S",
        help="health endpoints answer 503 for S seconds after start",
    )
    g.add_argument(
        "--fault-corrupt-output-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="replace one output word for this share of prompts (a broken draft path: faster, different text)",
    )


def faults_from_args(args: argparse.Namespace) -> FaultConfig:
    if not 0.0 <= args.fault_http_error_fraction <= 1.0:
        raise SystemExit("--fault-http-error-fraction must be in [0, 1]")
    if not 0.0 <= args.fault_corrupt_output_fraction <= 1.0:
        raise SystemExit("--fault-corrupt-output-fraction must be in [0, 1]")
    return FaultConfig(
        crash_after_tokens=args.fault_crash_after_tokens,
        http_error_fraction=args.fault_http_error_fraction,
        stall_after_tokens=args.fault_stall_after_tokens,
        stall_s=args.fault_stall_s,
        malformed_after_tokens=args.fault_malformed_after_tokens,
        truncate_after_tokens=args.fault_truncate_after_tokens,
        slow_start_s=args.fault_slow_start_s,
        corrupt_output_fraction=args.fault_corrupt_output_fraction,
    )
