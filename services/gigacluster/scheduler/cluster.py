"""The scheduler's view of the cluster, read from its peers: the broker's inventory and free devices,
where devices sit (scale-up domains and the fabric's leaf groups), tenants' fair-share weights,
quarantined devices and their health, and the release of instances (retried until the broker takes
them back: an instance is never leaked)."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import structlog

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import Unavailable
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, call_metadata
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.clock import busy as clock_busy
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.scheduler.book import JobBook
from gigacluster.scheduler.core import JobRecord
from gigacluster.scheduler.placement import Layout
from gigacluster.scheduler.runner import _ranges

log = structlog.get_logger()


class ClusterView:
    """What the broker, the chip shards and the fabric say about the cluster, cached where it is fixed."""

    def __init__(self, config: SchedulerConfig, auth: BrokerAuth, book: JobBook) -> None:
        self.config = config
        self.auth = auth
        self.book = book
        self._inventory: broker_pb2.GetInventoryResponse | None = None
        self._layouts: dict[str, Layout] | None = None
        self._weights: dict[str, tuple[float, float]] = {}  # tenant -> (weight, fetched at wall time)
        self.orphans: list[str] = []  # instances held by jobs when the scheduler died: released on start
        # quarantined devices: id -> virtual time it is back (None: until the chip service says healthy)
        self.bad: dict[int, float | None] = {}
        self._health_checked = 0.0
        # Chips the fabric reports cut off from the scale-out network (their NIC link down: a NIC, cable or leaf
        # fault), as [start, end) ranges: kept out of placement until the link is repaired.
        self.cut_off: list[tuple[int, int]] = []

    @property
    def broker(self) -> broker_pb2_grpc.BrokerServiceStub:
        return self.auth.stub

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The scheduler's own credentials for a call to a peer."""
        return call_metadata(api_key=self.config.service_key)

    async def inventory(self, fresh: bool = False) -> broker_pb2.GetInventoryResponse:
        if self._inventory is None or fresh:
            try:
                self._inventory = await self.broker.GetInventory(broker_pb2.GetInventoryRequest(),
                                                                 metadata=self.metadata(), timeout=10)
            except grpc.aio.AioRpcError as err:
                raise Unavailable(f"isolation broker unavailable ({err.code().name}); retry") from err
        return self._inventory

    async def cluster_chips(self) -> dict[str, int]:
        inv = await self.inventory()
        out: dict[str, int] = {}
        for s in inv.shards:
            out[s.chip_type] = out.get(s.chip_type, 0) + int(s.devices.end - s.devices.start)
        return out

    async def layouts(self) -> dict[str, Layout]:
        """Per chip type, where its devices sit: domains and the fabric's leaf groups."""
        if self._layouts is not None:
            return self._layouts
        inv = await self.inventory()
        spans: dict[str, list[tuple[int, int, int]]] = {}
        for s in inv.shards:
            spans.setdefault(s.chip_type, []).append((int(s.devices.start), int(s.devices.end),
                                                      int(s.chips_per_domain) or 1))
        topo_resp = None
        try:
            async with open_channel(inv.fabric_endpoint) as ch:
                topo_resp = await fabric_pb2_grpc.FabricServiceStub(ch).GetTopology(
                    fabric_pb2.GetTopologyRequest(), metadata=self.metadata(), timeout=10)
        except grpc.aio.AioRpcError as err:
            log.warning("fabric topology unavailable; placing by scale-up domains only", error=err.details())
        out: dict[str, Layout] = {}
        for chip, ss in spans.items():
            start, end, dom = min(s[0] for s in ss), max(s[1] for s in ss), ss[0][2]
            n = end - start
            lay = Layout.uniform(n, dom, 1, offset=start)
            if topo_resp is not None and topo_resp.chip_type == chip and int(topo_resp.chips) == n:
                tiers = topo_resp.switch_tiers or (3 if any(tr.tier == "spine-core" for tr in topo_resp.tiers) else 2)
                # Off the event loop: a million-chip tree takes seconds to build (the service keeps answering).
                with clock_busy():  # the event clock holds time while the thread works
                    topo = await asyncio.to_thread(build_topology, TopologyConfig(
                        chip=chip, count=n, system=topo_resp.system or None, tiers=tiers,
                        oversubscription=topo_resp.oversubscription or 1.0, switch=topo_resp.switch or "tomahawk5",
                        nic=topo_resp.nic or None, routing=topo_resp.routing or "ecmp"))
                lay = Layout.from_topology(topo, offset=start)
            out[chip] = lay
        self._layouts = out
        return out

    async def weight(self, tenant: str) -> float:
        w = self._weights.get(tenant)
        if w is None or time.monotonic() - w[1] > 30:
            try:
                r = await self.broker.GetTenant(broker_pb2.GetTenantRequest(name=tenant), metadata=self.metadata(),
                                                timeout=10)
                self._weights[tenant] = w = (float(r.tenant.weight) or 1.0, time.monotonic())
            except grpc.aio.AioRpcError:
                return w[0] if w is not None else 1.0
        return w[0]

    # -- devices ----------------------------------------------------------------------------------
    def free_devices(self, inv: broker_pb2.GetInventoryResponse, layouts: dict[str, Layout],
                     now: float) -> dict[str, np.ndarray]:
        """Per chip type, which devices are free now: the broker's free ranges less quarantined devices
        (a quarantine that has ended is lifted here) and less the chips cut off from the scale-out network."""
        free = {c: np.zeros(lay.n_devices, dtype=bool) for c, lay in layouts.items()}
        for r in inv.free:
            for c, lay in layouts.items():
                a, b = max(int(r.start), lay.offset), min(int(r.end), lay.offset + lay.n_devices)
                if a < b:
                    free[c][a - lay.offset:b - lay.offset] = True
        for dev, until in list(self.bad.items()):
            if until is not None and until <= now:
                del self.bad[dev]
                continue
            for c, lay in layouts.items():
                if lay.offset <= dev < lay.offset + lay.n_devices:
                    free[c][dev - lay.offset] = False
        for a, b in self.cut_off:
            for c, lay in layouts.items():
                lo, hi = max(a, lay.offset), min(b, lay.offset + lay.n_devices)
                if lo < hi:
                    free[c][lo - lay.offset:hi - lay.offset] = False
        return free

    async def check_links(self) -> None:
        """Read which chips the fabric reports cut off from the scale-out network: one call per dispatch pass
        (ranges back, computed from the fabric's link-state arrays), so a pass never places a gang on a chip
        whose link went down since the last one, and sees a repair at once (in event mode a wall-time rate
        limit would be hours of virtual time)."""
        inv = await self.inventory()
        try:
            async with open_channel(inv.fabric_endpoint) as ch:
                r = await fabric_pb2_grpc.FabricServiceStub(ch).GetLinkStats(
                    fabric_pb2.GetLinkStatsRequest(cut_off_only=True), metadata=self.metadata(), timeout=10)
        except grpc.aio.AioRpcError as err:  # keep the last known set; the next pass asks again
            log.warning("link state check failed", fabric=inv.fabric_endpoint, error=err.details())
            return
        cut = convert.ranges(r.cut_off_chips)
        if cut != self.cut_off:
            log.info("chips cut off from the scale-out network", ranges=cut[:8], chips=sum(b - a for a, b in cut))
        self.cut_off = cut

    async def check_health(self) -> None:
        """Give quarantined devices of real faults back once their chip shard reports them healthy; and see
        which chips are cut off from the network (:meth:`check_links`)."""
        await self.check_links()
        real = sorted(d for d, u in self.bad.items() if u is None)
        if not real or time.monotonic() - self._health_checked < 1.0:
            return
        self._health_checked = time.monotonic()
        inv = await self.inventory()
        for s in inv.shards:
            mine = [d for d in real if s.devices.start <= d < s.devices.end]
            if not mine:
                continue
            try:
                async with open_channel(s.endpoint) as ch:
                    r = await chip_pb2_grpc.ChipServiceStub(ch).ListDevices(chip_pb2.ListDevicesRequest(
                        devices=convert.range_msgs(_ranges(np.array(mine))), page_size=len(mine)),
                        metadata=self.metadata(), timeout=10)
            except grpc.aio.AioRpcError as err:
                log.warning("device health check failed", shard=s.endpoint, error=err.details())
                continue
            for dev in r.devices:
                if dev.state != chip_pb2.Device.STATE_FAILED:
                    self.bad.pop(int(dev.id), None)

    async def failed_devices(self, devices: np.ndarray) -> list[int]:
        """Which of a gang's devices the chip service reports failed now."""
        inv = await self.inventory()
        out: list[int] = []
        for s in inv.shards:
            mine = devices[(devices >= s.devices.start) & (devices < s.devices.end)]
            if not mine.size:
                continue
            try:
                async with open_channel(s.endpoint) as ch:
                    r = await chip_pb2_grpc.ChipServiceStub(ch).ListDevices(chip_pb2.ListDevicesRequest(
                        devices=convert.range_msgs(_ranges(mine)), page_size=int(mine.size)),
                        metadata=self.metadata(), timeout=10)
            except grpc.aio.AioRpcError:
                continue
            out += [int(d.id) for d in r.devices if d.state == chip_pb2.Device.STATE_FAILED]
        return out

    # -- instances --------------------------------------------------------------------------------
    async def release_orphans(self) -> None:
        """Release the instances a previous run held (UNAVAILABLE until the broker takes them all)."""
        while self.orphans:
            inst = self.orphans[0]
            try:
                await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=inst),
                                                  metadata=self.metadata(), timeout=30)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise Unavailable(f"cannot release {inst} of the previous run yet: {err.details()}") from err
            self.orphans.pop(0)
            log.info("released an instance held before the restart", instance=inst)

    async def release(self, job: JobRecord, instance: str | None = None) -> None:
        """Release ``instance`` (default: the job's current one). A runner that ends after its job was
        already placed again must release only its own instance, never the new one."""
        name = job.instance if instance is None else instance
        if not name:
            return
        try:
            await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=name),
                                              metadata=self.metadata(), timeout=30)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                log.warning("release failed; retried by the dispatcher", job=job.name, instance=name,
                            error=err.details())
                self.orphans.append(name)  # released once the broker is back, never leaked
        if job.instance == name:
            job.instance = ""
            job.borrowing = False
            self.book.save(job)
        self.book.kick.set()
