"""Hand-made crossover entries (crossover.json's `crossover` block) for the verdict and policy tests."""

from __future__ import annotations

from typing import Any


def crossover_block(
    est: float | None,
    lo: float | None,
    hi: float | None,
    states: tuple[str, str, str],
    max_level: float = 30.0,
) -> dict[str, Any]:
    """A crossover block over levels 1..max_level with the given estimate, interval and their states."""
    return {
        "estimate": est,
        "lo": lo,
        "hi": hi,
        "min_level": 1.0,
        "max_level": max_level,
        "states": dict(zip(("estimate", "lo", "hi"), states, strict=True)),
    }
