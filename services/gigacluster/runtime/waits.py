"""Small asyncio waiting helpers shared by the services (no gRPC)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first_of(*aws: Awaitable[Any]) -> None:
    """Wait until the first of ``aws`` finishes, then cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
