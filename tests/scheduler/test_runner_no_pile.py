"""A step attempt that fails leaves none of its mesh calls running: the retry never piles on them."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from gigacluster.scheduler.runner import gather_or_cancel


class FakeCall:
    """An awaitable RPC call that ends after ``delay_s`` with ``result`` or ``error``, and can be cancelled."""

    def __init__(self, delay_s: float, result: Any = None, error: BaseException | None = None) -> None:
        self.delay_s, self.result, self.error = delay_s, result, error
        self.cancelled = False

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __await__(self) -> Generator[Any, None, Any]:
        yield from asyncio.sleep(self.delay_s).__await__()
        if self.error is not None:
            raise self.error
        return self.result


async def test_results_come_back_in_order() -> None:
    """All calls succeed: their results, in the order of the calls."""
    assert await gather_or_cancel([FakeCall(0.02, "a"), FakeCall(0.0, "b")]) == ["a", "b"]


async def test_first_failure_cancels_the_calls_still_running() -> None:
    """One StartCollective times out: the attempt's other calls are cancelled before the error reaches the retry."""
    slow, failing, done = FakeCall(10.0), FakeCall(0.0, error=TimeoutError("deadline")), FakeCall(0.0, "ok")
    with pytest.raises(TimeoutError):
        await gather_or_cancel([slow, failing, done])
    assert slow.cancelled and failing.cancelled and done.cancelled
