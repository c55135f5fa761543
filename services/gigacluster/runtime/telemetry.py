"""Telemetry over MQTT: one publisher per process, wrapping one aiomqtt client.

Topics are ``gigacluster/<cluster>/<service>/<subtopic>`` (docs/telemetry.md lists them).
Publishing never blocks the caller: messages go into a bounded queue (oldest dropped and
counted when the broker is slow or away) and a background task sends them, reconnecting with
backoff. Callers publish aggregates (per shard, per tier, per job), never one message per chip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from typing import Any

import aiomqtt
import structlog
from amqtt.broker import Broker
from amqtt.contexts import Action

log = structlog.get_logger()


def topic_root(cluster: str) -> str:
    return f"gigacluster/{cluster}"


class Telemetry:
    """Bounded, non-blocking MQTT publisher (a no-op when ``endpoint`` is empty)."""

    def __init__(
        self,
        *,
        cluster: str,
        service: str,
        endpoint: str = "",
        username: str = "",
        password: str = "",
        max_queue: int = 2000,
    ) -> None:
        self.prefix = f"{topic_root(cluster)}/{service}"
        self.endpoint = endpoint
        self.username = username or None
        self.password = password or None
        self._queue: deque[tuple[str, bytes, bool]] = deque(maxlen=max_queue)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.sent = 0
        self.connected = False

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)

    def publish(self, subtopic: str, payload: dict[str, Any], *, retain: bool = False) -> None:
        """Queue ``payload`` (JSON) for ``<prefix>/<subtopic>``; never blocks."""
        if not self.enabled:
            return
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        data = json.dumps(payload, separators=(",", ":"), default=float).encode()
        self._queue.append((f"{self.prefix}/{subtopic}", data, retain))
        self._wake.set()

    async def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._run(), name="telemetry")

    async def flush(self, timeout_s: float = 2.0) -> None:
        """Wait (bounded) until the queue has been sent."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._queue and self.connected and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self._task is not None:
            await self.flush()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        host, _, port = self.endpoint.rpartition(":")
        backoff = 0.2
        while True:
            try:
                async with aiomqtt.Client(
                    host, int(port), username=self.username, password=self.password, keepalive=30
                ) as client:
                    self.connected = True
                    backoff = 0.2
                    log.info("telemetry connected", mqtt=self.endpoint, topic_prefix=self.prefix)
                    while True:
                        while self._queue:
                            topic, data, retain = self._queue[0]
                            await client.publish(topic, data, qos=0, retain=retain)
                            self._queue.popleft()
                            self.sent += 1
                        self._wake.clear()
                        await self._wake.wait()
            except aiomqtt.MqttError as exc:
                self.connected = False
                log.warning("telemetry disconnected", mqtt=self.endpoint, error=str(exc), retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


class EmbeddedBroker:
    """An in-process MQTT broker (amqtt) for when the user gives none.

    With ``password_file`` it enforces the same credentials and topic ACLs as the generated
    Mosquitto files (the isolation broker writes that file; it is re-read when it changes):
    services write, each tenant reads only its own subtree. Without it, anonymous access.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 1883, *, password_file: str = "",
                 cluster: str = "local") -> None:
        self.host = host
        self.port = port
        self.password_file = password_file
        self.cluster = cluster
        self._broker: Any = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        plugins: dict[str, Any] = (
            {
                "gigacluster.security.amqtt_plugin.GigaclusterAuthPlugin": {"password_file": self.password_file},
                "gigacluster.security.amqtt_plugin.GigaclusterTopicPlugin": {
                    "cluster": self.cluster, "password_file": self.password_file},
            }
            if self.password_file
            else {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}
        )
        config = {"listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}}, "plugins": plugins}
        self._broker = _guarded_broker_class()(config)
        await self._broker.start()

    async def stop(self) -> None:
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None


def _guarded_broker_class() -> Any:
    """amqtt's Broker with retained messages delivered only as MQTT says: to a client's own matching
    subscriptions, and only where the ACL lets it read the topic.

    amqtt 0.12.1 replays, to every client that connects, the retained messages matching EVERY client's
    subscription filters (its ``_subscriptions`` across sessions), without the read ACL: once the admin
    subscribed to ``gigacluster/<cluster>/#``, a tenant connecting with no subscription at all received
    the broker's retained audit anchor (found by running ``mosquitto_sub`` as the tenant).

    It also closes every client's stream when amqtt is done with it: amqtt 0.12.1's ``_client_connected``
    returns without closing the stream of a client whose session it could not start (a connection closed
    before its CONNECT, as a port probe does, or one that sent no MQTT), so each left an open socket behind
    until the garbage collector found it.
    """

    class GuardedBroker(Broker):  # type: ignore[misc]  # amqtt is untyped here
        async def stream_connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                   listener_name: str) -> None:
            try:
                await super().stream_connected(reader, writer, listener_name)
            finally:
                writer.close()

        async def _publish_retained_messages_for_subscription(self, subscription: tuple[str, int],
                                                             session: Any) -> None:
            topic_filter, qos = subscription
            holders = self._subscriptions.get(topic_filter, [])
            if all(s.client_id != session.client_id for s, _ in holders):
                return  # another client's filter: not this session's subscription
            handler = self._get_handler(session)
            if handler is None:
                return
            for topic, retained in list(self._retained_messages.items()):
                if not self._matches(topic, topic_filter):
                    continue
                if not await self._topic_filtering(session, topic=topic, action=Action.RECEIVE):
                    continue
                await handler.mqtt_publish(retained.topic, retained.data, min(qos, retained.qos or qos), retain=True)

    return GuardedBroker
