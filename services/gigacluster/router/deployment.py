"""A deployment's replicas in the live mesh: each drives a :class:`ReplicaEngine` in virtual time,
executing every batch iteration on its chips through the chip service (so inference shows up in
chip power and utilisation, and a slowed or failed chip slows or fails the replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable

import grpc
import numpy as np
import structlog

from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine, Request, TokenEvent
from gigacluster.inference.errors import AdmissionError
from gigacluster.inference.metrics import ServingMetrics
from gigacluster.inference.policies import ReplicaView, RoutingPolicy
from gigacluster.runtime import convert
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.clock import VirtualClock

log = structlog.get_logger()


class ReplicaFailed(Exception):
    """The replica's chips failed under a request."""


@dataclasses.dataclass
class Stream:
    """Where a request's tokens go, and what the router recorded for it."""

    queue: asyncio.Queue[TokenEvent | Exception]
    replica: int
    last_token_s: float = float("nan")
    itl: list[float] = dataclasses.field(default_factory=list)


class Replica:
    def __init__(self, index: int, cfg: ReplicaConfig, *, instance: str, devices: list[tuple[int, int]],
                 endpoint: str, capability: Callable[[], str], clock: VirtualClock) -> None:
        self.index = index
        self.engine = ReplicaEngine(cfg)
        self.instance = instance
        self.devices = devices
        self.endpoint = endpoint
        self.capability = capability
        self.clock = clock
        self.streams: dict[str, Stream] = {}
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.failed = ""
        self.channel = grpc.aio.insecure_channel(endpoint)
        self.stub = chip_pb2_grpc.ChipServiceStub(self.channel)
        self.energy_j = 0.0

    async def run(self, on_finish: Callable[[TokenEvent, Stream], None]) -> None:
        t_free = self.clock.now()
        ranges = convert.range_msgs(self.devices)
        while True:
            it = self.engine.next_iteration(max(self.clock.now(), t_free))
            if it is None:
                self.wake.clear()
                await self.wake.wait()
                continue
            try:
                resp = await self.stub.ExecuteWork(chip_pb2.ExecuteWorkRequest(
                    devices=ranges, items=convert.work_msgs(it.work), not_before_s=it.start_s, tag=self.instance,
                ), metadata=call_metadata(capability=self.capability()), timeout=30)
            except grpc.aio.AioRpcError as err:
                self.failed = f"replica {self.index} chips failed: {err.details()}"
                log.error("replica failed", replica=self.index, error=err.details())
                for s in self.streams.values():
                    s.queue.put_nowait(ReplicaFailed(self.failed))
                self.streams.clear()
                return
            self.energy_j += resp.energy_j
            end = resp.end_s + it.comm_s
            await self.clock.sleep_until(end)
            for ev in self.engine.complete(it, end):
                s = self.streams.get(ev.request_id)
                if s is None:
                    continue
                if s.last_token_s == s.last_token_s:  # not NaN
                    s.itl.append(ev.time_s - s.last_token_s)
                s.last_token_s = ev.time_s
                s.queue.put_nowait(ev)
                if ev.finished:
                    on_finish(ev, s)
                    del self.streams[ev.request_id]
            t_free = end

    def view(self) -> ReplicaView:
        return ReplicaView.from_stats(self.index, self.engine.stats(), self.engine.cfg.block_size)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        for s in self.streams.values():
            s.queue.put_nowait(ReplicaFailed("deployment deleted"))
        await self.channel.close()


class LiveDeployment:
    """Replicas of one model behind one routing policy."""

    def __init__(self, deployment_id: str, tenant: str, cfg: ReplicaConfig, policy: RoutingPolicy,
                 policy_name: str) -> None:
        self.deployment_id = deployment_id
        self.tenant = tenant
        self.cfg = cfg
        self.policy = policy
        self.policy_name = policy_name
        self.replicas: list[Replica] = []
        self.metrics = ServingMetrics()
        self.rng = np.random.default_rng(0)
        self.state = "deploying"
        self.reason = ""

    @property
    def name(self) -> str:
        return f"deployments/{self.deployment_id}"

    def route(self, req: Request, now_s: float) -> tuple[Replica, Stream]:
        """Pick a live replica, admit the request there and open its stream."""
        live = [r for r in self.replicas if not r.failed]
        if not live:
            raise ReplicaFailed(f"{self.name} has no healthy replica")
        views = [r.view() for r in live]
        pick = live[self.policy.pick(req, views, self.rng)]
        try:
            pick.engine.admit(req, now_s)
        except AdmissionError:
            self.metrics.record_rejected()
            raise
        self.policy.on_routed(req, pick.index)
        stream = Stream(asyncio.Queue(), pick.index)
        pick.streams[req.id] = stream
        for shed_req, err in pick.engine.drain_shed():
            self.metrics.record_rejected(shed=True)
            s = pick.streams.pop(shed_req.id, None)
            if s is not None:
                s.queue.put_nowait(err)
        pick.wake.set()
        return pick, stream

    def on_finish(self, ev: TokenEvent, stream: Stream) -> None:
        if ev.summary is not None:
            self.metrics.record_request(ev.summary, np.asarray(stream.itl))
        self.policy.on_finished(ev.request_id, stream.replica)

    def stats_snapshot(self) -> dict[str, object]:
        self.metrics.observe([r.engine.stats() for r in self.replicas])
        snap = self.metrics.snapshot()
        stats = [r.engine.stats() for r in self.replicas]
        snap["queue_depth"] = sum(s.queue_depth for s in stats)
        snap["running"] = sum(s.running for s in stats)
        snap["kv_used_now"] = float(np.mean([s.kv_used_frac for s in stats])) if stats else 0.0
        return snap
