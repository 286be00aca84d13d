"""Load generator: streaming backends, closed loop, loop-lag monitor, prompts, and the `bench` command.

The pipeline's cell runner needs only the names below (docs/metrics.md says what the numbers mean). They are
imported lazily so that `python -m specsweep.client.bench` runs its module exactly once.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RequestRecord": "backends",
    "RequestSpec": "backends",
    "send_request": "backends",
    "level_summary": "bench",
    "requests_for": "bench",
    "write_cell": "bench",
    "LevelResult": "loadgen",
    "RepeatResult": "loadgen",
    "flush_cache": "loadgen",
    "measure_level": "loadgen",
    "records_frame": "loadgen",
    "PromptSet": "prompts",
    "load_prompts_file": "prompts",
    "make_prompts": "prompts",
    "make_prompts_auto": "prompts",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"specsweep.client.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'specsweep.client' has no attribute {name!r}")
