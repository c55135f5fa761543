"""A client process as a participant of the event clock: its waits are virtual-time events of the mesh.

A load generator (``gigacluster loadtest``, the demo's inference burst, a trace replay) that must
send at exact virtual times joins the coordinator as one more process: its arrivals are wake-ups
the coordinator knows (time never moves past one), and its calls to the mesh are counted open
from before they leave (the interceptors of ``runtime/clock_wire.py``, on every channel opened
while it participates), so time never moves while a request is in transit. A trace therefore
replays at any speed: as fast as the mesh can serve it, with every arrival at its virtual time.

The coordinator takes the service key or the admin key from a participant: holding the mesh's time
is an operator's power, never a tenant's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gigacluster.runtime import clock
from gigacluster.runtime.clock import EventClock
from gigacluster.runtime.coordinator_client import ClockAgent

DRAIN_POLL_S = 0.05  # wall seconds between looks at the calls still open when a participant leaves


@contextlib.asynccontextmanager
async def participate(endpoint: str, name: str, *, key: str = "",
                      connect_timeout_s: float = 10.0) -> AsyncIterator[EventClock]:
    """Join the event clock at ``endpoint`` as ``name`` for the block; yields the process's clock, already
    told the mesh's time. Open the channels that must count (a :class:`~gigacluster.client.Client`) inside; at
    the end the process stays in the clock until the calls it made inside have ended."""
    if clock.active() is not None:
        raise RuntimeError("this process already takes part in an event clock")
    ck = EventClock(sign_key=key)
    agent = ClockAgent(ck, endpoint, name, connect_timeout_s=connect_timeout_s, service_key=key)
    await agent.connect()
    clock.install(ck)
    task = asyncio.ensure_future(agent.run())
    try:
        synced = asyncio.ensure_future(agent.synced.wait())
        await asyncio.wait({synced, task}, timeout=connect_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if not synced.done():
            synced.cancel()
            raise TimeoutError(f"the clock coordinator at {endpoint[:80]} did not tell the time within "
                               f"{connect_timeout_s:g} s (is the key the admin or service key?)")
        yield ck
    finally:
        clock.install(None)  # channels and calls from now on are from outside the mesh
        ck.left = True
        await _drain(ck, task)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await agent.close()


async def _drain(ck: EventClock, agent: asyncio.Future[None]) -> None:
    """Stay in the clock until the calls made as a participant have ended (a stream opened inside the block
    may outlive it): its servers count them open, and the coordinator would wait for ever on a left process."""
    while (ck.calls_out > 0 or ck.msgs_received > 0) and not agent.done():
        await asyncio.sleep(DRAIN_POLL_S)


__all__ = ["participate"]
