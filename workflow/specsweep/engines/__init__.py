"""Engines by name. Each engine module defines ENGINE, an object following engines.base.Engine."""

from __future__ import annotations

import importlib
from typing import Any

ENGINES = ("sim", "sglang", "vllm")


def get_engine(name: str) -> Any:
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; known engines: {', '.join(ENGINES)}")
    return importlib.import_module(f"specsweep.engines.{name}").ENGINE
