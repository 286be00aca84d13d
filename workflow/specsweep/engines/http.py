"""Small tolerant HTTP getters for server facts: a fact that cannot be read is absent, never fatal."""

from __future__ import annotations

from typing import Any

import aiohttp

TIMEOUT = aiohttp.ClientTimeout(total=10)


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """GET url as JSON; None on 404, errors or non-JSON bodies."""
    try:
        async with session.get(url, timeout=TIMEOUT) as resp:
            if resp.status != 200:
                return None
            data = await resp.json(content_type=None)
            return data if isinstance(data, dict) else {"value": data}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def get_text(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url, timeout=TIMEOUT) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
