"""The fabric service: one :class:`FlowSim` for the cluster, composed with its book, driver and servicer.

Parts (this package): ``book`` (flow records, watchers, bounded memory), ``driver`` (the simulator
kept in step with the virtual clock; faults, releases), ``checks`` (request fields against the
topology and the config), ``servicer`` (the thin gRPC layer); messages are :mod:`gigacluster.wire.fabric`.
"""

from __future__ import annotations

from typing import Any

import grpc
import structlog

from gigacluster.fabric import maxmin_incr
from gigacluster.fabric.service.book import FlowBook
from gigacluster.fabric.service.driver import SimDriver
from gigacluster.fabric.service.linkstore import LinkStore
from gigacluster.fabric.service.servicer import FabricServicer
from gigacluster.fabric.sim import ClassPolicy, FlowSim
from gigacluster.fabric.sizing import choose_scaleout
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.runtime.auth import rate_limiter
from gigacluster.runtime.config import FabricConfig
from gigacluster.runtime.metrics import FunctionCollector, gauge
from gigacluster.runtime.server import Service

log = structlog.get_logger()


class FabricService(Service[FabricConfig]):
    name = "fabric"

    def __init__(self, config: FabricConfig) -> None:
        super().__init__(config)
        # The flags where given, else the smallest tree that holds count (a size no tree holds fails the start).
        tree = choose_scaleout(config.chip, config.count, system=config.system, nic=config.nic, tiers=config.tiers,
                               switch=config.switch, oversubscription=config.oversubscription)
        self.topo = build_topology(TopologyConfig(
            chip=config.chip, count=config.count, system=config.system or None, nic=tree.nic or None,
            switch=tree.switch, tiers=tree.tiers, oversubscription=config.oversubscription,
            routing=config.routing,
        ))
        classes = {
            "training": ClassPolicy(priority=0, weight=1.0),
            "storage": ClassPolicy(priority=0, weight=1.0),
            "inference": (ClassPolicy(priority=1, weight=1.0) if config.inference_priority == "strict"
                          else ClassPolicy(priority=0, weight=config.inference_weight)),
        }
        self.sim = FlowSim(self.topo, classes=classes)
        maxmin_incr.warm_up()  # the solver's compiled kernels, before the first step needs them
        self.sim.advance(max(0.0, self.clock.now()))
        # Injected link faults survive a restart (kill -9 included): taken down again before the first call.
        self.links = LinkStore.for_state_dir(config.state_dir)
        if restored := self.links.restore(self.sim):
            log.info("link faults restored", links=restored)
        self.book = FlowBook(self.sim)
        # The event clock never runs ahead of a call in flight, so nothing arrives late to backdate.
        lag_s = 0.0 if config.clock == "event" else config.backdate_s * config.speedup
        self.driver = SimDriver(self.sim, self.topo, self.book, self.clock, lag_s=lag_s,
                                publish=self.telemetry.publish)
        self.auth = self.broker_auth()
        # Fabric bandwidth per tenant, in bytes per VIRTUAL second (flows live in virtual time).
        self.bandwidth = rate_limiter(0.0, 0.0, config.rate_bytes_per_s)
        self.registry.register(FunctionCollector(self.metrics))

    def metrics(self) -> list[Any]:
        """Link utilisation per switch tier, link states and active flows."""
        tiers, active = self.sim.tier_stats()
        mean = gauge("gigacluster_link_utilization", "Mean link utilisation of the tier (0-1).", ["tier"])
        peak = gauge("gigacluster_link_utilization_max", "Highest link utilisation of the tier (0-1).", ["tier"])
        used = gauge("gigacluster_link_used_bytes_per_second", "Traffic carried by the tier.", ["tier"])
        links = gauge("gigacluster_links", "Links of the tier by state.", ["tier", "state"])
        for t in tiers:
            mean.add_metric([t.tier], t.mean_utilization)
            peak.add_metric([t.tier], t.max_utilization)
            used.add_metric([t.tier], t.used_Bps)
            links.add_metric([t.tier, "down"], float(t.links_down))
            links.add_metric([t.tier, "degraded"], float(t.links_degraded))
            links.add_metric([t.tier, "up"], float(t.links - t.links_down - t.links_degraded))
        flows = gauge("gigacluster_active_flows", "Flows sharing the fabric now.")
        flows.add_metric([], float(active))
        return [mean, peak, used, links, flows]

    def servicer(self) -> FabricServicer:
        return FabricServicer(book=self.book, driver=self.driver, auth=self.auth, clock=self.clock,
                              config=self.config, charge_bytes=self.charge_bytes, publish=self.telemetry.publish,
                              save_links=lambda: self.links.save(self.sim))

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        fabric_pb2_grpc.add_FabricServiceServicer_to_server(self.servicer(), server)
        return [fabric_pb2.DESCRIPTOR.services_by_name["FabricService"].full_name]

    async def start(self) -> None:
        await super().start()
        self.spawn(self.driver.run(), "drive")
        self.spawn(self.auth.run_refresh(), "auth-refresh")
        self.every(self.auth.refresh_s, self._end_released_tick, "end-released-flows")
        self.every(self.config.telemetry_interval_s, self._publish, "link-stats")

    async def stop(self) -> None:
        await super().stop()
        self.driver.close()
        await self.auth.close()

    async def _end_released_tick(self) -> None:
        self.end_released()

    def end_released(self) -> int:
        """End the flows of instances the broker has released; returns how many groups it ended."""
        return self.driver.end_released(self.auth.is_revoked)

    def charge_bytes(self, tenant: str, bytes_: float) -> None:
        """Take a transfer's bytes from the tenant's fabric bucket (RESOURCE_EXHAUSTED when empty)."""
        if self.bandwidth is not None:
            self.bandwidth.check(f"tenants/{tenant}", self.clock.now(), ops=0.0, bytes_=bytes_)

    async def _publish(self) -> None:
        tiers, active = self.sim.tier_stats()
        self.telemetry.publish("links/tiers", {
            "t_s": self.clock.now(), "active_flows": active,
            "tiers": {t.tier: {"links": t.links, "mean_utilization": t.mean_utilization,
                               "max_utilization": t.max_utilization, "used_Bps": t.used_Bps,
                               "links_down": t.links_down, "links_degraded": t.links_degraded}
                      for t in tiers},
        })
