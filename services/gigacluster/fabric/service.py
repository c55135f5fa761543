"""The fabric's gRPC layer: one :class:`FlowSim` for the cluster, driven by the virtual clock.

The simulator lags the clock by a small window so a call that arrives a few milliseconds after
its ``not_before_s`` still starts its flows at that exact time (RPC latency does not leak into
results). Asking for a flow whose predicted end has passed advances the simulator to that end,
so a caller that waited for its collective sees it done at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import structlog

from gigacluster.errors import InvalidArgument, NotFound, ResourceExhausted
from gigacluster.fabric.sim import ClassPolicy, FlowEvent, FlowSim
from gigacluster.fabric.topology import TIER_NAMES, TopologyConfig, build_topology
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, Principal, bearer_token, rate_limiter
from gigacluster.runtime.config import FabricConfig
from gigacluster.runtime.errors import grpc_errors, preview
from gigacluster.runtime.metrics import FunctionCollector, gauge
from gigacluster.runtime.server import Service
from gigacluster.security.capability import MAX_DEVICE_ID, DeviceSet
from gigacluster.security.ratelimit import TenantRateLimiter

log = structlog.get_logger()
OPS = convert.OP_NAMES
CLASSES = {
    fabric_pb2.TRAFFIC_CLASS_UNSPECIFIED: "training",
    fabric_pb2.TRAFFIC_CLASS_TRAINING: "training",
    fabric_pb2.TRAFFIC_CLASS_INFERENCE: "inference",
    fabric_pb2.TRAFFIC_CLASS_STORAGE: "storage",
}
BACKDATE_WALL_S = 0.25
MAX_ACTIVE_GROUPS = 200_000
KEEP_FINISHED = 20_000


@dataclasses.dataclass
class FlowRecord:
    """One API-level flow group: a transfer, or a collective and its identical copies."""

    name: str
    tenant: str
    handles: list[str]
    algorithm: str
    start_s: float
    bytes_: float
    tag: str
    op: str
    n_ranks: int
    instance: str = ""  # the broker instance whose capability started it: released, its flows end


class FabricService(Service[FabricConfig]):
    name = "fabric"

    def __init__(self, config: FabricConfig) -> None:
        super().__init__(config)
        self.topo = build_topology(TopologyConfig(
            chip=config.chip, count=config.count, system=config.system or None, nic=config.nic,
            switch=config.switch, tiers=config.tiers, oversubscription=config.oversubscription,
            routing=config.routing,
        ))
        classes = {
            "training": ClassPolicy(priority=0, weight=1.0),
            "storage": ClassPolicy(priority=0, weight=1.0),
            "inference": (ClassPolicy(priority=1, weight=1.0) if config.inference_priority == "strict"
                          else ClassPolicy(priority=0, weight=config.inference_weight)),
        }
        self.sim = FlowSim(self.topo, classes=classes)
        self.sim.advance(max(0.0, self.clock.now()))
        self.flows: OrderedDict[str, FlowRecord] = OrderedDict()
        self._by_handle: dict[str, str] = {}
        self._by_instance: dict[str, set[str]] = {}  # instance -> its flow records' names
        self._ids = itertools.count(1)
        self._watchers: set[asyncio.Queue[str]] = set()
        self._wake = asyncio.Event()
        self.auth = BrokerAuth(config.broker, cluster=config.cluster, service_key=config.service_key,
                               limiter=rate_limiter(config.rate_ops_per_s, config.rate_ops_burst))
        # Fabric bandwidth per tenant, in bytes per VIRTUAL second (flows live in virtual time).
        self.bandwidth = rate_limiter(0.0, 0.0, config.rate_bytes_per_s)
        self.registry.register(FunctionCollector(self.metrics))

    def metrics(self) -> list[Any]:
        """Link utilisation per switch tier, link states and active flows."""
        stats = self.sim.link_stats()
        mean = gauge("gigacluster_link_utilization", "Mean link utilisation of the tier (0-1).", ["tier"])
        peak = gauge("gigacluster_link_utilization_max", "Highest link utilisation of the tier (0-1).", ["tier"])
        used = gauge("gigacluster_link_used_bytes_per_second", "Traffic carried by the tier.", ["tier"])
        links = gauge("gigacluster_links", "Links of the tier by state.", ["tier", "state"])
        for t in stats.tiers:
            mean.add_metric([t.tier], t.mean_utilization)
            peak.add_metric([t.tier], t.max_utilization)
            used.add_metric([t.tier], t.used_Bps)
            links.add_metric([t.tier, "down"], float(t.links_down))
            links.add_metric([t.tier, "degraded"], float(t.links_degraded))
            links.add_metric([t.tier, "up"], float(t.links - t.links_down - t.links_degraded))
        flows = gauge("gigacluster_active_flows", "Flows sharing the fabric now.")
        flows.add_metric([], float(stats.active_flows_total))
        return [mean, peak, used, links, flows]

    def rpc_limiter(self) -> TenantRateLimiter | None:
        return self.auth.limiter

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        fabric_pb2_grpc.add_FabricServiceServicer_to_server(FabricServicer(self), server)
        return [fabric_pb2.DESCRIPTOR.services_by_name["FabricService"].full_name]

    async def start(self) -> None:
        await super().start()
        self.spawn(self._drive(), "drive")
        self.spawn(self.auth.run_refresh(), "auth-refresh")
        self.every(self.auth.refresh_s, self._end_released_tick, "end-released-flows")
        self.every(self.config.telemetry_interval_s, self._publish, "link-stats")

    async def stop(self) -> None:
        await super().stop()
        await self.auth.close()

    # -- time -------------------------------------------------------------------------------------
    @property
    def lag_s(self) -> float:
        return BACKDATE_WALL_S * self.config.speedup

    def advance(self, until_s: float) -> None:
        if until_s > self.sim.now_s:
            self._events(self.sim.advance(until_s))

    def _events(self, events: list[FlowEvent]) -> None:
        for ev in events:
            name = self._by_handle.get(ev.group_id, "")
            if ev.kind in ("completed", "failed") and name:
                self._notify(name)
            elif ev.kind not in ("completed", "failed", "rerouted"):
                self.telemetry.publish("events", {"event": ev.kind, "t_s": ev.time_s, "message": ev.message,
                                                  "link": self.topo.link_name(ev.link_id) if ev.link_id >= 0 else ""})
        self._trim()

    def _notify(self, name: str) -> None:
        for q in self._watchers:
            if q.qsize() < 10_000:
                q.put_nowait(name)

    def _trim(self) -> None:
        """Forget the oldest finished flow groups beyond KEEP_FINISHED (bounded memory)."""
        excess = len(self.flows) - KEEP_FINISHED
        if excess <= 0:
            return
        for name in list(self.flows)[: excess * 2]:
            rec = self.flows[name]
            if self.state(rec)[0] in (fabric_pb2.Flow.STATE_DONE, fabric_pb2.Flow.STATE_FAILED):
                for h in rec.handles:
                    self.sim.forget(h)
                    self._by_handle.pop(h, None)
                names = self._by_instance.get(rec.instance)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._by_instance[rec.instance]
                del self.flows[name]
                excess -= 1
                if excess <= 0:
                    return

    async def _drive(self) -> None:
        """Keep the simulator ``lag_s`` behind the clock and deliver completions on time."""
        while True:
            self.advance(self.clock.now() - self.lag_s)
            nxt = self.sim.next_event_s()
            delay = 0.05 if nxt is None else min(0.05, max(self.clock.wall_s(nxt + self.lag_s - self.clock.now()),
                                                            0.001))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    def settle(self, rec: FlowRecord) -> None:
        """If ``rec`` should have ended by now, advance the simulator to its end."""
        end = max(self.sim.predicted_end_s(h) for h in rec.handles)
        if self.sim.now_s < end <= self.clock.now():
            self.advance(end)

    # -- records ----------------------------------------------------------------------------------
    def state(self, rec: FlowRecord) -> tuple[int, float, float, str]:
        """(state, predicted end, end, error) of a flow group from its simulator handles."""
        hs = [self.sim.get(h) for h in rec.handles]
        failed = [h for h in hs if h.state == "failed"]
        if failed:
            return fabric_pb2.Flow.STATE_FAILED, float(failed[0].end_s), float(failed[0].end_s), str(failed[0].error)
        pred = max(self.sim.predicted_end_s(h.id) for h in hs)
        if all(h.state == "done" for h in hs):
            return fabric_pb2.Flow.STATE_DONE, pred, max(float(h.end_s) for h in hs), ""
        return fabric_pb2.Flow.STATE_RUNNING, pred, 0.0, ""

    def flow_msg(self, rec: FlowRecord) -> fabric_pb2.Flow:
        st, pred, end, err = self.state(rec)
        algbw = busbw = 0.0
        if st == fabric_pb2.Flow.STATE_DONE:
            h = self.sim.get(rec.handles[0])
            algbw, busbw = h.algbw_GBps, h.busbw_GBps
        return fabric_pb2.Flow(name=rec.name, state=st, algorithm=rec.algorithm, start_s=rec.start_s,  # type: ignore[arg-type]  # protobuf enums are int NewTypes
                               predicted_end_s=pred, end_s=end, bytes=rec.bytes_, error=err, tag=rec.tag,
                               algbw_gbps=algbw, busbw_gbps=busbw)

    def add(self, rec: FlowRecord) -> None:
        self.flows[rec.name] = rec
        for h in rec.handles:
            self._by_handle[h] = rec.name
        if rec.instance:
            self._by_instance.setdefault(rec.instance, set()).add(rec.name)
        self._wake.set()

    async def _end_released_tick(self) -> None:
        self.end_released()

    def end_released(self) -> int:
        """End the pending and running flows of instances the broker has released (revoked): a tenant cannot
        leave traffic booked ahead on links the next tenant shares. Returns how many groups it ended."""
        ended = 0
        for instance in [i for i in self._by_instance if self.auth.is_revoked(i)]:
            for name in self._by_instance.pop(instance):
                rec = self.flows.get(name)
                for h in rec.handles if rec is not None else ():
                    events = self.sim.cancel(h, f"cancelled: instances/{instance} was released")
                    ended += len(events)
                    self._events(events)
        return ended

    def check_capacity(self, n: int) -> None:
        active = sum(1 for _ in self.sim.groups(active_only=True)) if len(self.flows) > MAX_ACTIVE_GROUPS else 0
        if active + n > MAX_ACTIVE_GROUPS:
            raise ResourceExhausted(f"fabric holds at most {MAX_ACTIVE_GROUPS} active flow groups", retry_after_s=1.0)

    def charge_bytes(self, tenant: str, bytes_: float) -> None:
        """Take a transfer's bytes from the tenant's fabric bucket (RESOURCE_EXHAUSTED when empty)."""
        if self.bandwidth is not None:
            self.bandwidth.check(f"tenants/{tenant}", self.clock.now(), ops=0.0, bytes_=bytes_)

    async def _publish(self) -> None:
        stats = self.sim.link_stats()
        self.telemetry.publish("links/tiers", {
            "t_s": self.clock.now(), "active_flows": stats.active_flows_total,
            "tiers": {t.tier: {"links": t.links, "mean_utilization": t.mean_utilization,
                               "max_utilization": t.max_utilization, "used_Bps": t.used_Bps,
                               "links_down": t.links_down, "links_degraded": t.links_degraded}
                      for t in stats.tiers},
        })


@grpc_errors(fabric_pb2_grpc.FabricServiceServicer)
class FabricServicer(fabric_pb2_grpc.FabricServiceServicer):
    def __init__(self, svc: FabricService) -> None:
        self.svc = svc

    async def _reader(self, context: grpc.aio.ServicerContext) -> Principal:
        """Privileged callers (API key) or any valid capability (its tenant's flows only)."""
        if bearer_token(context):
            return await self.svc.auth.principal(context)
        cap = await self.svc.auth.capability(context, "fabric.send")
        return Principal("tenant", f"tenants/{cap.tenant}")

    def _visible(self, p: Principal, name: str) -> FlowRecord:
        if not name.startswith("flows/") or len(name) <= 6:
            raise InvalidArgument("name", f"must look like 'flows/<id>', got {preview(name, 64)!r}")
        rec = self.svc.flows.get(name)
        if rec is None or (not p.privileged and rec.tenant != p.tenant):
            raise NotFound(preview(name, 64))
        return rec

    def _start_s(self, not_before_s: float) -> float:
        now = self.svc.clock.now()
        horizon = self.svc.config.not_before_horizon_s
        if not math.isfinite(not_before_s) or not_before_s < 0:
            raise InvalidArgument("not_before_s", f"must be a finite number >= 0, got {not_before_s}")
        if not_before_s > now + horizon:
            raise InvalidArgument("not_before_s", f"at most {horizon:g} s ahead of now ({now:.3f}; "
                                                  f"not_before_horizon_s), got {not_before_s:g}")
        return max(not_before_s or now, self.svc.sim.now_s)

    def _bytes(self, value: float) -> float:
        cap = self.svc.config.max_flow_bytes
        if not math.isfinite(value) or not 0 < value <= cap:
            raise InvalidArgument("bytes", f"must be in (0, {cap:g}] (max_flow_bytes), got {value}")
        return float(value)

    def _device(self, field: str, value: int) -> int:
        n = self.svc.topo.n_chips
        if value >= MAX_DEVICE_ID:
            raise InvalidArgument(field, f"device ids are below 2^40, got {value}")
        if value >= n:
            raise NotFound(f"devices/{value}", f"{field}: device {value} is not in the topology (0..{n - 1})")
        return int(value)

    async def GetTopology(self, request: fabric_pb2.GetTopologyRequest,
                                context: grpc.aio.ServicerContext) -> fabric_pb2.GetTopologyResponse:
        await self._reader(context)
        s = self.svc.topo.summary()
        return fabric_pb2.GetTopologyResponse(
            chip_type=s["chip"], system=s["system"], chips=s["chips"], switches=s["switches"], links=s["links"],
            chips_per_domain=s["chips_per_domain"], oversubscription=s["oversubscription"],
            bisection_Bps=s["bisection_Bps"], now_s=self.svc.clock.now(), switch=s["switch"],
            nic=self.svc.config.nic, switch_tiers=s["switch_tiers"], routing=s["routing"],
            tiers=[fabric_pb2.TierSummary(tier=t["tier"], links=t["links"], capacity_Bps=t["capacity_Bps"])
                   for t in s["tiers"]],
        )

    async def ListLinks(self, request: fabric_pb2.ListLinksRequest,
                              context: grpc.aio.ServicerContext) -> fabric_pb2.ListLinksResponse:
        await self._reader(context)
        topo = self.svc.topo
        if request.tier and request.tier not in TIER_NAMES:
            raise InvalidArgument("tier", f"allowed: {', '.join(TIER_NAMES)}; got {preview(request.tier, 64)!r}")
        ids = (np.flatnonzero(topo.link_tier == TIER_NAMES.index(request.tier)) if request.tier
               else np.arange(topo.n_links))
        page, token = convert.page(ids, request.page_size, request.page_token)
        stats = self.svc.sim.link_stats()
        state_map = {0: fabric_pb2.Link.STATE_UP, 1: fabric_pb2.Link.STATE_DEGRADED, 2: fabric_pb2.Link.STATE_DOWN}
        links = [fabric_pb2.Link(
            name=f"links/{topo.link_name(int(i))}", tier=TIER_NAMES[int(topo.link_tier[i])],
            state=state_map[int(stats.state[i])], capacity_Bps=float(stats.capacity_Bps[i]),
            utilization=float(stats.utilization[i]), active_flows=int(stats.active_flows[i]),
            bytes_carried=float(stats.bytes_carried[i])) for i in np.asarray(page, dtype=np.int64)]
        return fabric_pb2.ListLinksResponse(links=links, next_page_token=token)

    async def StartTransfer(self, request: fabric_pb2.StartTransferRequest,
                                  context: grpc.aio.ServicerContext) -> fabric_pb2.StartTransferResponse:
        cap = await self.svc.auth.capability(context, "fabric.send")
        src = self._device("src_device", request.src_device)
        dst = self._device("dst_device", request.dst_device)
        if src == dst:
            raise InvalidArgument("dst_device", "must differ from src_device")
        bytes_ = self._bytes(request.bytes)
        if request.traffic_class not in CLASSES:
            raise InvalidArgument("traffic_class", f"unknown traffic class {request.traffic_class}")
        start = self._start_s(request.not_before_s)
        cap.require("fabric.send", DeviceSet.from_ids([src, dst]))
        self.svc.check_capacity(1)
        self.svc.charge_bytes(cap.tenant, bytes_)
        h = self.svc.sim.start_transfer(src, dst, bytes_, start_s=start, traffic_class=CLASSES[request.traffic_class],
                                        tag=request.tag)
        name = f"flows/f-{next(self.svc._ids)}"
        rec = FlowRecord(name, f"tenants/{cap.tenant}", [h.id], h.algorithm, start, bytes_, request.tag, "send_recv", 2,
                         instance=cap.instance)
        self.svc.add(rec)
        return fabric_pb2.StartTransferResponse(name=name, start_s=start, predicted_end_s=h.predicted_end_s)

    def _collective_ranks(self, request: fabric_pb2.StartCollectiveRequest) -> tuple[np.ndarray, int, int]:
        """(ranks of group 0, groups, stride), every size checked against config before expanding."""
        cfg = self.svc.config
        if len(request.ranks) > cfg.max_rank_ranges:
            raise ResourceExhausted(f"ranks: at most {cfg.max_rank_ranges} ranges per collective (max_rank_ranges), "
                                    f"got {len(request.ranks)}", field="ranks")
        rs = convert.ranges(request.ranks)
        if not rs:
            raise InvalidArgument("ranks", "must name at least two ranks")
        for i, (a, b) in enumerate(rs):
            if b <= a:
                raise InvalidArgument(f"ranks[{i}]", f"end ({b}) must be > start ({a})")
            if b > MAX_DEVICE_ID:
                raise InvalidArgument(f"ranks[{i}]", f"device ids are below 2^40, got end {b}")
        groups = int(request.groups) or 1
        stride = int(request.group_stride)
        if groups > 1 and stride < 1:
            raise InvalidArgument("group_stride", "must be >= 1 when groups > 1")
        if groups > 1 and stride >= MAX_DEVICE_ID:
            raise InvalidArgument("group_stride", f"must be below 2^40, got {stride}")
        if groups > cfg.max_collective_groups:
            raise ResourceExhausted(f"groups: at most {cfg.max_collective_groups} per collective "
                                    f"(max_collective_groups), got {groups}", field="groups")
        per_group = sum(b - a for a, b in rs)
        if per_group * groups > cfg.max_collective_ranks:
            raise ResourceExhausted(f"ranks: at most {cfg.max_collective_ranks} ranks per collective over all groups "
                                    f"(max_collective_ranks), got {per_group} x {groups} groups", field="ranks")
        if per_group < 2:
            raise InvalidArgument("ranks", f"a collective needs at least 2 ranks, got {per_group}")
        n = self.svc.topo.n_chips
        top = max(b for _, b in rs) - 1 + stride * (groups - 1)
        if top >= n:
            raise NotFound(f"devices/{top}", f"ranks: device {top} is not in the topology (0..{n - 1})")
        ranks = np.concatenate([np.arange(a, b) for a, b in rs])
        if np.unique(ranks).size != ranks.size:
            raise InvalidArgument("ranks", "ranks must be distinct")
        return ranks, groups, (stride if groups > 1 else 0)

    async def StartCollective(self, request: fabric_pb2.StartCollectiveRequest,
                                    context: grpc.aio.ServicerContext) -> fabric_pb2.StartCollectiveResponse:
        cap = await self.svc.auth.capability(context, "fabric.send")
        op = OPS.get(request.op)
        if op is None:
            raise InvalidArgument("op", "allowed: COLLECTIVE_OP_ALL_REDUCE, _REDUCE_SCATTER, _ALL_GATHER, "
                                        "_ALL_TO_ALL, _BROADCAST, _SEND_RECV")
        ranks, groups, stride = self._collective_ranks(request)
        bytes_ = self._bytes(request.bytes)
        if request.traffic_class not in CLASSES:
            raise InvalidArgument("traffic_class", f"unknown traffic class {request.traffic_class}")
        start = self._start_s(request.not_before_s)
        all_ranks = (ranks[None, :] + stride * np.arange(groups)[:, None]).ravel()
        cap.require("fabric.send", DeviceSet.from_ids(all_ranks))
        self.svc.check_capacity(groups)
        self.svc.charge_bytes(cap.tenant, bytes_ * groups * int(ranks.size))
        handles = [self.svc.sim.start_collective(op, ranks + stride * k, bytes_, start_s=start,
                                                 algo=request.algorithm or None,
                                                 traffic_class=CLASSES[request.traffic_class], tag=request.tag)
                   for k in range(groups)]
        name = f"flows/f-{next(self.svc._ids)}"
        rec = FlowRecord(name, f"tenants/{cap.tenant}", [h.id for h in handles], handles[0].algorithm, start,
                         bytes_, request.tag, op, int(ranks.size), instance=cap.instance)
        self.svc.add(rec)
        return fabric_pb2.StartCollectiveResponse(name=name, algorithm=rec.algorithm, start_s=start,
                                                  predicted_end_s=max(h.predicted_end_s for h in handles))

    async def GetFlow(self, request: fabric_pb2.GetFlowRequest,
                            context: grpc.aio.ServicerContext) -> fabric_pb2.GetFlowResponse:
        p = await self._reader(context)
        rec = self._visible(p, request.name)
        self.svc.settle(rec)
        return fabric_pb2.GetFlowResponse(flow=self.svc.flow_msg(rec))

    async def WatchFlows(self, request: fabric_pb2.WatchFlowsRequest,
                               context: grpc.aio.ServicerContext) -> AsyncIterator[fabric_pb2.WatchFlowsResponse]:
        p = await self._reader(context)
        names = list(request.names)
        if len(names) > 10_000:
            raise InvalidArgument("names", "at most 10000 names per watch")
        recs = {n: self._visible(p, n) for n in names}
        q: asyncio.Queue[str] = asyncio.Queue()
        self.svc._watchers.add(q)
        try:
            pending = set(recs)
            for n, rec in recs.items():
                self.svc.settle(rec)
                msg = self.svc.flow_msg(rec)
                yield fabric_pb2.WatchFlowsResponse(flow=msg)
                if msg.state != fabric_pb2.Flow.STATE_RUNNING:
                    pending.discard(n)
            while pending or not names:
                name = await q.get()
                rec2 = self.svc.flows.get(name)
                if rec2 is None or (names and name not in pending):
                    continue
                if not names and not (p.privileged or rec2.tenant == p.tenant):
                    continue
                msg = self.svc.flow_msg(rec2)
                if msg.state == fabric_pb2.Flow.STATE_RUNNING:
                    continue
                pending.discard(name)
                yield fabric_pb2.WatchFlowsResponse(flow=msg)
        finally:
            self.svc._watchers.discard(q)

    async def GetLinkStats(self, request: fabric_pb2.GetLinkStatsRequest,
                                 context: grpc.aio.ServicerContext) -> fabric_pb2.GetLinkStatsResponse:
        await self._reader(context)
        stats = self.svc.sim.link_stats()
        return fabric_pb2.GetLinkStatsResponse(
            active_flows=stats.active_flows_total, now_s=self.svc.clock.now(),
            tiers=[fabric_pb2.TierStats(tier=t.tier, links=t.links, mean_utilization=t.mean_utilization,
                                        max_utilization=t.max_utilization, links_down=t.links_down,
                                        links_degraded=t.links_degraded) for t in stats.tiers])

    def _target(self, target: str) -> tuple[str, int]:
        topo = self.svc.topo
        if target.startswith("links/"):
            try:
                return "link", topo.link_id_by_name(target.removeprefix("links/"))
            except Exception as exc:
                raise NotFound(preview(target, 64), f"target: no link {preview(target, 64)!r} (see ListLinks)") from exc
        if target.startswith("switches/"):
            try:
                return "switch", topo.node_id_by_name(target.removeprefix("switches/"))
            except Exception as exc:
                raise NotFound(preview(target, 64), f"target: no switch {preview(target, 64)!r}") from exc
        raise InvalidArgument("target", f"must be 'links/<name>' or 'switches/<name>', got {preview(target, 64)!r}")

    async def InjectLinkFault(self, request: fabric_pb2.InjectLinkFaultRequest,
                                    context: grpc.aio.ServicerContext) -> fabric_pb2.InjectLinkFaultResponse:
        await self.svc.auth.require_privileged(context)
        kind, ident = self._target(request.target)
        self.svc.advance(self.svc.clock.now())
        before = {n for n, r in self.svc.flows.items() if self.svc.state(r)[0] == fabric_pb2.Flow.STATE_FAILED}
        if request.kind == fabric_pb2.InjectLinkFaultRequest.KIND_DOWN:
            events = self.svc.sim.fail_link(ident) if kind == "link" else self.svc.sim.fail_switch(ident)
        elif request.kind == fabric_pb2.InjectLinkFaultRequest.KIND_DEGRADED:
            if kind != "link":
                raise InvalidArgument("kind", "only links can be degraded; take a switch down instead")
            if not 0 < request.capacity_factor < 1:  # NaN fails this too
                raise InvalidArgument("capacity_factor", f"must be in (0, 1), got {request.capacity_factor}")
            events = self.svc.sim.degrade_link(ident, request.capacity_factor)
        else:
            raise InvalidArgument("kind", "allowed: KIND_DOWN, KIND_DEGRADED")
        self.svc._events(events)
        failed = {n for n, r in self.svc.flows.items()
                  if self.svc.state(r)[0] == fabric_pb2.Flow.STATE_FAILED} - before
        for n in failed:
            self.svc._notify(n)
        self.svc.telemetry.publish("events", {"event": "fault", "target": request.target, "t_s": self.svc.clock.now(),
                                              "kind": fabric_pb2.InjectLinkFaultRequest.Kind.Name(request.kind)})
        return fabric_pb2.InjectLinkFaultResponse(
            links_affected=1 if kind == "link" else len(self.svc.topo.links_of_node(ident)),
            flows_rerouted=sum(1 for e in events if e.kind == "rerouted"), flows_failed=len(failed))

    async def ClearLinkFault(self, request: fabric_pb2.ClearLinkFaultRequest,
                                   context: grpc.aio.ServicerContext) -> fabric_pb2.ClearLinkFaultResponse:
        await self.svc.auth.require_privileged(context)
        kind, ident = self._target(request.target)
        self.svc.advance(self.svc.clock.now())
        events = self.svc.sim.restore_link(ident) if kind == "link" else self.svc.sim.restore_switch(ident)
        self.svc._events(events)
        self.svc.telemetry.publish("events", {"event": "fault_cleared", "target": request.target,
                                              "t_s": self.svc.clock.now()})
        return fabric_pb2.ClearLinkFaultResponse(
            links_affected=1 if kind == "link" else len(self.svc.topo.links_of_node(ident)))
