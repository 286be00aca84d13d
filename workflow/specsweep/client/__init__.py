"""Load generator: streaming backends, closed loop, loop-lag monitor, CPU accounting, prompts, datasets.

What `specsweep bench` measures is `specsweep.measure.bench`, beside the client (it builds on the config and the
engines, which import the client); summaries are written by `specsweep.measure.summary`.
"""

from __future__ import annotations

from specsweep.client.backends import RequestRecord, RequestSpec, send_request
from specsweep.client.datasets import Dataset, DatasetError, load_dataset
from specsweep.client.loadgen import LevelResult, RepeatResult, measure_level, records_frame, run_closed_loop
from specsweep.client.prompts import (
    LevelPrompts,
    PromptSet,
    level_prompts,
    make_prompts,
    make_prompts_auto,
)

__all__ = [
    "Dataset",
    "DatasetError",
    "LevelPrompts",
    "LevelResult",
    "PromptSet",
    "RepeatResult",
    "RequestRecord",
    "RequestSpec",
    "level_prompts",
    "load_dataset",
    "make_prompts",
    "make_prompts_auto",
    "measure_level",
    "records_frame",
    "run_closed_loop",
    "send_request",
]
