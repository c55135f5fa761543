"""The clock coordinator service: one ``Sync`` stream per service process, and ``GetTime``.

A process of its own (``python -m gigacluster.clock``), so it runs anywhere the services can reach
it over gRPC (another host, a compose or Kubernetes pod) and survives the loss of any service. It
keeps no durable state: the processes re-register with their own time after it restarts, and it
starts from the latest (time never goes backwards).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
from collections.abc import AsyncIterator

import grpc
import structlog

from gigacluster.clock.core import Coordinator, Report, Step
from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
from gigacluster.errors import Unauthenticated
from gigacluster.runtime.auth import bearer_token
from gigacluster.runtime.config import ClockConfig
from gigacluster.runtime.errors import to_status
from gigacluster.runtime.server import Service

log = structlog.get_logger()


def report_of(msg: clock_pb2.SyncRequest) -> Report:
    return Report(process=msg.process, idle=msg.idle,
                  next_wake_s=msg.next_wake_s if msg.HasField("next_wake_s") else None,
                  calls_out=msg.calls_out, calls_in=msg.calls_in, activity=msg.activity, round=msg.round,
                  now_s=msg.now_s, msgs_sent=msg.stream_messages_sent, msgs_received=msg.stream_messages_received,
                  dormant=msg.dormant, wake=msg.wake)


class ClockServicer(clock_pb2_grpc.ClockServiceServicer):
    """Thin: the advance rule is :class:`Coordinator`; this fans its decisions out to the streams."""

    def __init__(self, core: Coordinator, service_key: str, admin_key: str = "") -> None:
        self.core = core
        self.service_key = service_key
        self.admin_key = admin_key  # a client participant's (runtime/participant.py): an operator's load generator
        self.outboxes: dict[str, asyncio.Queue[clock_pb2.SyncResponse]] = {}
        self.probes = 0

    def apply(self, step: Step) -> None:
        for name, wake in step.woken.items():  # first: the woken process's call waits for it
            if (q := self.outboxes.get(name)) is not None:
                q.put_nowait(clock_pb2.SyncResponse(now_s=self.core.now_s, woken=wake))
        if step.probe_round is not None:
            self.probes += 1
            self.broadcast(clock_pb2.SyncResponse(now_s=self.core.now_s, probe_round=step.probe_round), step.targets)
        if step.advance_to_s is not None:
            for name, q in self.outboxes.items():
                if step.targets is None or name in step.targets:
                    q.put_nowait(clock_pb2.SyncResponse(now_s=step.advance_to_s,
                                                        horizon_s=step.horizons.get(name, step.advance_to_s)))

    def authenticated(self, key: str | None) -> bool:
        """No keys configured (a bare test mesh) admits anyone; else the service key or the admin key."""
        if not self.service_key and not self.admin_key:
            return True
        if not key:
            return False
        return any(k and hmac.compare_digest(key.encode(), k.encode()) for k in (self.service_key, self.admin_key))

    def broadcast(self, msg: clock_pb2.SyncResponse, targets: frozenset[str] | None = None) -> None:
        for name, q in self.outboxes.items():
            if targets is None or name in targets:
                q.put_nowait(msg)

    async def Sync(self, request_iterator: AsyncIterator[clock_pb2.SyncRequest],
                   context: grpc.aio.ServicerContext) -> None:
        if not self.authenticated(bearer_token(context)):
            await context.abort_with_status(to_status(Unauthenticated(
                "the clock coordinator takes the service key (or the admin key, for a client participant)")))
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        name = first.process
        queue: asyncio.Queue[clock_pb2.SyncResponse] = asyncio.Queue()
        self.outboxes[name] = queue
        self.core.register(name, first.now_s)
        queue.put_nowait(clock_pb2.SyncResponse(now_s=self.core.now_s))
        log.info("clock process registered", process=name, now_s=self.core.now_s,
                 processes=len(self.core.registered))
        self.apply(self.core.report(report_of(first)))
        writer = asyncio.ensure_future(self._write(queue, context))
        try:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    break
                self.apply(self.core.report(report_of(msg)))
        finally:
            writer.cancel()
            if self.outboxes.get(name) is queue:
                del self.outboxes[name]
                self.apply(self.core.leave(name))
                log.info("clock process left", process=name, processes=len(self.core.registered))

    @staticmethod
    async def _write(queue: asyncio.Queue[clock_pb2.SyncResponse], context: grpc.aio.ServicerContext) -> None:
        while True:
            await context.write(await queue.get())

    async def GetTime(self, request: clock_pb2.GetTimeRequest,
                      context: grpc.aio.ServicerContext) -> clock_pb2.GetTimeResponse:
        return clock_pb2.GetTimeResponse(now_s=self.core.now_s, processes=len(self.core.registered),
                                         advances=self.core.advances, probes=self.probes,
                                         advances_by_kind=self.core.advances_by_kind)


class ClockService(Service[ClockConfig]):
    name = "clock"

    def __init__(self, config: ClockConfig) -> None:
        # The coordinator holds the time; it never reports to one (it runs with the wall clock), and
        # publishes no telemetry (GetTime is its interface).
        super().__init__(dataclasses.replace(config, clock="wall", mqtt=""))
        self.servicer = ClockServicer(Coordinator(expect=config.expect), config.service_key,
                                      config.admin_key)

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        clock_pb2_grpc.add_ClockServiceServicer_to_server(self.servicer, server)
        return [clock_pb2.DESCRIPTOR.services_by_name["ClockService"].full_name]


__all__ = ["ClockConfig", "ClockService", "ClockServicer", "report_of"]
