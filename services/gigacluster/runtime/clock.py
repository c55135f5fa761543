"""The mesh's one virtual clock.

Virtual time is ``(wall_time - epoch) * speedup`` seconds. Every process of a cluster gets the
same ``epoch`` (``gigacluster up`` passes its own start time) and ``speedup``, so their clocks
agree without messages: 1x is real time, 100x-1000x compresses what-if runs. Wall time is
``time.time()`` so processes on different hosts agree as far as NTP does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class VirtualClock:
    epoch_unix_s: float
    speedup: float = 1.0

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup must be > 0, got {self.speedup}")

    @classmethod
    def starting_now(cls, speedup: float = 1.0) -> VirtualClock:
        return cls(time.time(), speedup)

    def now(self) -> float:
        """Virtual seconds since the epoch."""
        return (time.time() - self.epoch_unix_s) * self.speedup

    def wall_s(self, virtual_s: float) -> float:
        """Wall seconds that ``virtual_s`` virtual seconds take."""
        return virtual_s / self.speedup

    async def sleep_until(self, t_s: float) -> None:
        """Wait until virtual time ``t_s`` (returns at once if it has passed)."""
        delay = (t_s - self.now()) / self.speedup
        if delay > 0:
            await asyncio.sleep(delay)

    async def sleep(self, virtual_s: float) -> None:
        if virtual_s > 0:
            await asyncio.sleep(virtual_s / self.speedup)
