"""Engines by name. Each engine module defines ENGINE, an object following engines.base.Engine."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from specsweep.engines.base import Engine

ENGINES = ("sim", "sglang", "vllm")


def get_engine(name: str, api_key_env: str | None = None) -> Engine:
    """The engine object; with api_key_env it sends the key on its own requests (server facts, counters)."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}'; known engines: {', '.join(ENGINES)}")
    default = importlib.import_module(f"specsweep.engines.{name}").ENGINE
    return type(default)(api_key_env=api_key_env) if api_key_env else default


def served_as_asked(engine: str | None, argv: list[str], info: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(reasons, flags) where a server reports not doing what its command line asked (an engine module's
    `served_as_asked`; none for engines without one). Judged when a cell is read (`summary.judged`)."""
    if engine not in ENGINES:
        return [], []
    check = getattr(importlib.import_module(f"specsweep.engines.{engine}"), "served_as_asked", None)
    return check(list(argv or []), dict(info or {})) if check else ([], [])


def log_facts(engine: str | None, lines: Callable[[], list[str]]) -> dict[str, Any]:
    """Facts a server states only in its log (an engine module's `log_facts` over the current instance's lines,
    `lines()` read only for an engine that has one), stored beside its /server_info facts and judged by
    `served_as_asked`."""
    if engine not in ENGINES:
        return {}
    read = getattr(importlib.import_module(f"specsweep.engines.{engine}"), "log_facts", None)
    return read(lines()) if read else {}
