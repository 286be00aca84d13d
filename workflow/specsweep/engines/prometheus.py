"""Prometheus text parsing for the engines' /metrics: speculative-decoding counters and load gauges."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Our name -> the metric (sample) names engines use. vLLM V1 exposes counters with a _total suffix.
SPEC_COUNTERS = {
    "num_drafts": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"),
    "num_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens"),
    "num_accepted_tokens": (
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens",
    ),
}
GAUGES = {
    "num_requests_running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "num_requests_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
}


def samples(text: str) -> dict[str, float]:
    """Sum of each sample name over its label sets (NaN samples skipped).

    A malformed line must not cost a cell its counters: on a parse error the text is read line by line and
    the lines the parser refuses are skipped.
    """
    try:
        return _sum(text_string_to_metric_families(text))
    except ValueError:
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                for name, value in _sum(text_string_to_metric_families(line + "\n")).items():
                    out[name] = out.get(name, 0.0) + value
            except ValueError:
                continue
        return out


def _sum(families: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in families:
        for s in family.samples:
            if not math.isnan(s.value):
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def _pick(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def spec_decode_counters(text: str) -> dict[str, float] | None:
    """Cumulative spec-decode counters, or None when the server exposes none (no speculation)."""
    values = samples(text)
    counters = {k: _pick(values, names) for k, names in SPEC_COUNTERS.items()}
    if counters["num_drafts"] is None or counters["num_accepted_tokens"] is None:
        return None
    return {k: float(v or 0.0) for k, v in counters.items()}


def load_gauges(text: str) -> dict[str, float]:
    values = samples(text)
    return {k: v for k, names in GAUGES.items() if (v := _pick(values, names)) is not None}
