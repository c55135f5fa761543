"""What a telemetry subscriber sees on a live MQTT broker (Mosquitto or amqtt) with our credentials."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

import aiomqtt


async def topics_received(port: int, creds: Mapping[str, str], *, user: str, filters: Sequence[str],
                          topics: Sequence[str], listen_s: float = 1.0) -> list[str]:
    """The topics ``user`` receives on ``filters`` while the ``service`` user publishes each of ``topics``
    once (QoS 1) on the broker at 127.0.0.1:``port``; listening stops ``listen_s`` after the last message."""
    got: list[str] = []
    ready = asyncio.Event()

    async def listen() -> None:
        async with aiomqtt.Client("127.0.0.1", port, username=user, password=creds[user]) as c:
            for f in filters:
                await c.subscribe(f)
            ready.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(listen_s):
                    async for m in c.messages:
                        got.append(str(m.topic))

    task = asyncio.create_task(listen())
    await asyncio.wait_for(ready.wait(), 5)
    async with aiomqtt.Client("127.0.0.1", port, username="service", password=creds["service"]) as c:
        for t in topics:
            await c.publish(t, b"1", qos=1)
    await task
    return got
