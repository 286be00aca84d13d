"""Prometheus text parsing for the engines' /metrics (the counters are named in engines/common.py)."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


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
