"""The fabric's gRPC servicer: authenticate, check the fields, call the parts, build the answer.

It holds the parts it needs (flow book, simulator driver, auth, clock, config) and touches no
private attribute of any of them; message building is :mod:`gigacluster.wire.fabric`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np

from gigacluster.errors import InvalidArgument, ResourceExhausted
from gigacluster.fabric.service import checks
from gigacluster.fabric.service.book import FlowBook, FlowRecord
from gigacluster.fabric.service.driver import SimDriver
from gigacluster.fabric.service.windows import PatternCollective
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.model.cadence import cadence
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, Principal, bearer_token
from gigacluster.runtime.clock import VirtualClock
from gigacluster.runtime.config import FabricConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.waits import first_of
from gigacluster.security.capability import DeviceSet
from gigacluster.wire import fabric as wire


@grpc_errors(fabric_pb2_grpc.FabricServiceServicer)
class FabricServicer(fabric_pb2_grpc.FabricServiceServicer):
    def __init__(self, *, book: FlowBook, driver: SimDriver, auth: BrokerAuth, clock: VirtualClock,
                 config: FabricConfig, charge_bytes: Callable[[str, float], None],
                 publish: Callable[[str, dict[str, Any]], None], save_links: Callable[[], None] = lambda: None) -> None:
        self.book, self.driver, self.auth, self.clock, self.config = book, driver, auth, clock, config
        self.topo, self.sim = driver.topo, driver.sim
        self.charge_bytes = charge_bytes
        self.publish = publish
        self.save_links = save_links  # persists the link faults (before a fault call answers)

    async def _reader(self, context: grpc.aio.ServicerContext) -> Principal:
        """Privileged callers (API key) or any valid capability (its tenant's flows only)."""
        if bearer_token(context):
            return await self.auth.principal(context)
        cap = await self.auth.capability(context, "fabric.send")
        return Principal("tenant", f"tenants/{cap.tenant}")

    def _start_s(self, not_before_s: float) -> float:
        return checks.start_s(not_before_s, now=self.clock.now(), horizon=self.config.not_before_horizon_s,
                              sim_now=self.sim.now_s)

    def _flow_msg(self, rec: FlowRecord) -> fabric_pb2.Flow:
        st = self.book.status(rec)
        return wire.flow_msg(rec.name, st.state, algorithm=rec.algorithm, start_s=rec.start_s,
                             predicted_end_s=st.predicted_end_s, end_s=st.end_s, bytes_=rec.bytes_, error=st.error,
                             tag=rec.tag, algbw_gbps=st.algbw_GBps, busbw_gbps=st.busbw_GBps)

    async def GetTopology(self, request: fabric_pb2.GetTopologyRequest,
                          context: grpc.aio.ServicerContext) -> fabric_pb2.GetTopologyResponse:
        await self._reader(context)
        return wire.topology_msg(self.topo.summary(), now_s=self.clock.now(), nic=self.config.nic)

    async def ListLinks(self, request: fabric_pb2.ListLinksRequest,
                        context: grpc.aio.ServicerContext) -> fabric_pb2.ListLinksResponse:
        await self._reader(context)
        ids = checks.link_ids(self.topo, request.tier)
        page, token = convert.page(ids, request.page_size, request.page_token)
        return fabric_pb2.ListLinksResponse(links=wire.link_msgs(self.topo, self.sim.link_stats(), page),
                                            next_page_token=token)

    async def StartTransfer(self, request: fabric_pb2.StartTransferRequest,
                            context: grpc.aio.ServicerContext) -> fabric_pb2.StartTransferResponse:
        cap = await self.auth.capability(context, "fabric.send")
        src = checks.device("src_device", request.src_device, self.topo.n_chips)
        dst = checks.device("dst_device", request.dst_device, self.topo.n_chips)
        if src == dst:
            raise InvalidArgument("dst_device", "must differ from src_device")
        bytes_ = checks.flow_bytes(request.bytes, self.config.max_flow_bytes)
        cls = wire.traffic_class(request.traffic_class)
        start = self._start_s(request.not_before_s)
        cap.require("fabric.send", DeviceSet.from_ids([src, dst]))
        self.driver.check_capacity(1)
        self.charge_bytes(cap.tenant, bytes_)
        h = self.sim.start_transfer(src, dst, bytes_, start_s=start, traffic_class=cls, tag=request.tag)
        name = self.book.new_name()
        self.driver.add(FlowRecord(name, f"tenants/{cap.tenant}", [h.id], h.algorithm, start, bytes_, request.tag,
                                   "send_recv", 2, instance=cap.instance))
        return fabric_pb2.StartTransferResponse(name=name, start_s=start, predicted_end_s=h.predicted_end_s)

    async def StartCollective(self, request: fabric_pb2.StartCollectiveRequest,
                              context: grpc.aio.ServicerContext) -> fabric_pb2.StartCollectiveResponse:
        cap = await self.auth.capability(context, "fabric.send")
        op = wire.op_name(request.op)
        ranks, groups, stride = checks.collective_ranks(convert.ranges(request.ranks), request.groups,
                                                        request.group_stride, self.config, self.topo.n_chips)
        bytes_ = checks.flow_bytes(request.bytes, self.config.max_flow_bytes)
        cls = wire.traffic_class(request.traffic_class)
        start = self._start_s(request.not_before_s)
        all_ranks = (ranks[None, :] + stride * np.arange(groups)[:, None]).ravel()
        cap.require("fabric.send", DeviceSet.from_ids(all_ranks))
        self.driver.check_capacity(groups)
        self.charge_bytes(cap.tenant, bytes_ * groups * int(ranks.size))
        handles = await self.driver.start_collectives(op, ranks, stride, groups, bytes_, algo=request.algorithm or None,
                                                      start_s=start, traffic_class=cls, tag=request.tag,
                                                      repeats=checks.repeats(request.repeats))
        rec = FlowRecord(self.book.new_name(), f"tenants/{cap.tenant}", [h.id for h in handles],
                         handles[0].algorithm, start, bytes_, request.tag, op, int(ranks.size), instance=cap.instance)
        self.driver.add(rec)
        return fabric_pb2.StartCollectiveResponse(name=rec.name, algorithm=rec.algorithm, start_s=start,
                                                  predicted_end_s=max(h.predicted_end_s for h in handles))

    async def GetFlow(self, request: fabric_pb2.GetFlowRequest,
                      context: grpc.aio.ServicerContext) -> fabric_pb2.GetFlowResponse:
        p = await self._reader(context)
        rec = self.book.visible(p, request.name)
        self.driver.settle(rec)
        return fabric_pb2.GetFlowResponse(flow=self._flow_msg(rec))

    async def WatchFlows(self, request: fabric_pb2.WatchFlowsRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[fabric_pb2.WatchFlowsResponse]:
        p = await self._reader(context)
        names = checks.watch_names(request.names)
        recs = {n: self.book.visible(p, n) for n in names}
        with self.book.watch() as q:
            pending = set(recs)
            for n, rec in recs.items():
                self.driver.settle(rec)
                msg = self._flow_msg(rec)
                yield fabric_pb2.WatchFlowsResponse(flow=msg)
                if not wire.running(msg):
                    pending.discard(n)
            while pending or not names:
                name = await q.get()
                rec2 = self.book.get(name)
                if rec2 is None or (names and name not in pending):
                    continue
                if not names and not self.book.may_see(p, rec2):
                    continue
                msg = self._flow_msg(rec2)
                if wire.running(msg):
                    continue
                pending.discard(name)
                yield fabric_pb2.WatchFlowsResponse(flow=msg)

    async def GetLinkStats(self, request: fabric_pb2.GetLinkStatsRequest,
                           context: grpc.aio.ServicerContext) -> fabric_pb2.GetLinkStatsResponse:
        await self._reader(context)
        if request.cut_off_only:  # two gathers over the chips, not the per-link statistics
            return wire.cut_off_msg(self.sim.cut_off_chips(), now_s=self.clock.now())
        tiers, active, as_of_s = self.driver.tier_stats()
        return wire.link_stats_msg(tiers, active, now_s=self.clock.now(), cut_off=self.sim.cut_off_chips(),
                                   stats_time_s=as_of_s)

    async def InjectLinkFault(self, request: fabric_pb2.InjectLinkFaultRequest,
                              context: grpc.aio.ServicerContext) -> fabric_pb2.InjectLinkFaultResponse:
        await self.auth.require_privileged(context)
        target = checks.target(self.topo, request.target)
        events, failed = self.driver.inject_fault(target, wire.fault_kind(request.kind), request.capacity_factor)
        self.save_links()
        self.publish("events", {"event": "fault", "target": request.target, "t_s": self.clock.now(),
                                "kind": wire.fault_kind_label(request.kind)})
        return fabric_pb2.InjectLinkFaultResponse(
            links_affected=self.driver.links_affected(target),
            flows_rerouted=sum(1 for e in events if e.kind == "rerouted"), flows_failed=len(failed))

    async def ClearLinkFault(self, request: fabric_pb2.ClearLinkFaultRequest,
                             context: grpc.aio.ServicerContext) -> fabric_pb2.ClearLinkFaultResponse:
        await self.auth.require_privileged(context)
        target = checks.target(self.topo, request.target)
        self.driver.clear_fault(target)
        self.save_links()
        self.publish("events", {"event": "fault_cleared", "target": request.target, "t_s": self.clock.now()})
        return fabric_pb2.ClearLinkFaultResponse(links_affected=self.driver.links_affected(target))

    def _pattern(self, request: fabric_pb2.ReserveWindowRequest) -> tuple[list[PatternCollective], np.ndarray]:
        """The window's step pattern, every field checked as StartCollective checks it; and all its ranks."""
        cfg = self.config
        if len(request.collectives) > cfg.max_window_collectives:
            raise ResourceExhausted(f"collectives: at most {cfg.max_window_collectives} per window "
                                    f"(max_window_collectives), got {len(request.collectives)}", field="collectives")
        if request.repeat < 1:
            raise InvalidArgument("repeat", f"must be >= 1, got {request.repeat}")
        if request.repeat > cfg.max_window_steps:
            raise ResourceExhausted(f"repeat: 1..{cfg.max_window_steps} steps per window (max_window_steps), "
                                    f"got {request.repeat}", field="repeat")
        if not (np.isfinite(request.period_s) and request.period_s > 0):
            raise InvalidArgument("period_s", f"must be a finite number > 0, got {request.period_s}")
        out, ranks_all = [], []
        for i, wc in enumerate(request.collectives):
            c = wc.collective
            ranks, groups, stride = checks.collective_ranks(convert.ranges(c.ranks), c.groups, c.group_stride,
                                                            cfg, self.topo.n_chips)
            for field, v in (("offset_s", wc.offset_s), ("expected_s", wc.expected_s)):
                if not (np.isfinite(v) and 0 <= v <= request.period_s):
                    raise InvalidArgument(f"collectives[{i}].{field}", f"must be in [0, period_s], got {v}")
            out.append(PatternCollective(wire.op_name(c.op), ranks, stride, groups,
                                         checks.flow_bytes(c.bytes, cfg.max_flow_bytes), c.algorithm or None,
                                         wire.traffic_class(c.traffic_class), c.tag, wc.offset_s, wc.expected_s,
                                         checks.repeats(c.repeats)))
            ranks_all.append((ranks[None, :] + stride * np.arange(groups)[:, None]).ravel())
        return out, (np.concatenate(ranks_all) if ranks_all else np.empty(0, np.int64))

    async def ReserveWindow(self, request: fabric_pb2.ReserveWindowRequest,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[fabric_pb2.ReserveWindowResponse]:
        cap = await self.auth.capability(context, "fabric.send")
        pattern, ranks = self._pattern(request)
        cad = cadence(self._start_s(request.start_s), request.period_s, int(request.repeat), request.pause_after,
                      request.pause_s, max_pauses=int(request.repeat))
        if ranks.size:
            cap.require("fabric.send", DeviceSet.from_ids(ranks))
        self.driver.catch_up()
        windows = self.driver.windows
        iso, ls = await self.driver.isolated(pattern)
        refused = windows.refusal(pattern, iso, request.period_s)
        if refused:  # with the durations alone when those differ: the caller may ask again with them
            alone = iso.durations_s if windows.mismatch(pattern, iso) is not None else ()
            yield fabric_pb2.ReserveWindowResponse(granted=False, refused=refused, final=True, alone_s=alone)
            return
        self.charge_bytes(cap.tenant, float(sum(c.bytes_ * c.groups * c.ranks.size for c in pattern)) * request.repeat)
        win = windows.grant(tenant=f"tenants/{cap.tenant}", instance=cap.instance, tag=request.tag, pattern=pattern,
                            iso=iso, cadence=cad, link_state=ls)
        wake = self.driver.open_window(win)
        try:
            yield fabric_pb2.ReserveWindowResponse(name=win.name, granted=True, steps=win.repeat, end_s=win.end_s)
            while not win.final and self.clock.now() < win.end_s:
                await first_of(wake.wait(), self.clock.sleep_until(win.end_s))
                wake.clear()
        finally:
            self.driver.end_window(win)
        flows = [fabric_pb2.WindowFlow(index=f.index, start_s=f.start_s, end_s=f.end_s,
                                       flow=win.flow_names.get(f.index, "")) for f in win.step_flows]
        yield fabric_pb2.ReserveWindowResponse(name=win.name, granted=True, steps=win.repeat, end_s=win.end_s,
                                               final=True, cause=win.cause, cut_s=win.cut_s, step_flows=flows)

    async def CutWindow(self, request: fabric_pb2.CutWindowRequest,
                        context: grpc.aio.ServicerContext) -> fabric_pb2.CutWindowResponse:
        cap = await self.auth.capability(context, "fabric.send")
        if not (np.isfinite(request.at_s) and request.at_s >= 0):
            raise InvalidArgument("at_s", f"must be a finite number >= 0, got {request.at_s}")
        win = self.driver.windows.get(request.name, f"tenants/{cap.tenant}")
        return fabric_pb2.CutWindowResponse(steps=self.driver.shorten_window(win, request.at_s))
