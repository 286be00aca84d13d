"""Engines by name. Each engine module defines ENGINE, an object following engines.base.Engine."""

from __future__ import annotations

import importlib
from typing import Any

ENGINES = ("sim", "sglang", "vllm")


def get_engine(name: str, api_key_env: str | None = None) -> Any:
    """The engine object; with api_key_env it sends the key on its own requests (server facts, counters)."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; known engines: {', '.join(ENGINES)}")
    default = importlib.import_module(f"specsweep.engines.{name}").ENGINE
    return type(default)(api_key_env=api_key_env) if api_key_env else default
