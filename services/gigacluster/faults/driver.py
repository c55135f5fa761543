"""The fault injector: a process that breaks the mesh's chips and links at the virtual times of a seeded draw.

It reads the mesh from the broker (chip shards, scale-up domain size, the fabric) and the fabric's NIC
links, draws failures from a rate table (:mod:`faults.draw`) over every chip of the mesh, and at each
failure's virtual time injects it through the services' own admin RPCs, exactly as an operator would:

* ``gpu`` / ``hbm``: ``ChipService.InjectFault`` (FAILED / HBM) on the chip;
* ``host``: ``InjectFault`` FAILED on every chip of its scale-up domain;
* ``switch_cable`` / ``nic``: ``FabricService.InjectLinkFault`` DOWN on the chip's NIC-leaf links, both ways
  (a mesh without scale-out links takes a transient chip fault instead);
* ``software``: a transient ``InjectFault`` FAILED on the chip, cleared after its repair time: the step
  running on it fails, the job restarts, and the hardware is healthy again (a crash of the training
  process is a job fault on healthy chips).

Each fault is cleared (``ClearFault`` / ``ClearLinkFault``) when its repair time has passed; a chip fault
carries its repair time too (``repair_after_s``), which the shard keeps durably with the fault. Jobs learn of
a fault the way they do of a hand-injected one: their next step fails (``StepFailed``). In event mode
(``--clock event``) the injector is one more process of the event clock: its next failure or repair is
its wake-up, so the mesh never jumps past a failure. Its progress is durable (:mod:`faults.journal`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import re
import time
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.faults.draw import Fault, Target, draw, target
from gigacluster.faults.journal import Active, Journal
from gigacluster.faults.table import RateTable, load_table
from gigacluster.runtime import clock as clock_mod
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import ChannelPool, open_channel
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.config import CommonConfig, ConfigError, _f
from gigacluster.runtime.coordinator_client import ClockAgent

log = structlog.get_logger()
RPC_TIMEOUT_S = 30.0
_NIC_LINK = re.compile(r"^(?:links/)?chip(\d+)-leaf\d+$|^(?:links/)?leaf\d+-chip(\d+)$")


@dataclasses.dataclass(frozen=True)
class FaultsConfig(CommonConfig):
    """The injector's settings (flags, ``GIGACLUSTER_FAULTS_*`` / ``GIGACLUSTER_*`` variables, YAML)."""

    service: typing.ClassVar[str] = "faults"

    table: str = _f("llama3", "failure table: a built-in name (llama3) or a YAML file of rows (cause, component, "
                              "rate_per_chip_hour, repair_s)")
    scale: float = _f(1.0, "multiplier on every rate of the table")
    seed: int = _f(0, "random seed of the draw (the same seed gives the same failures)")
    start_s: float = _f(-1.0, "virtual time the draw starts from (-1: the mesh's time when the injector first starts)")
    duration_s: float = _f(0.0, "virtual seconds after start_s to inject failures for (0: until stopped)")
    peer_wait_s: float = _f(600.0, "wall seconds an injection or repair retries a service that is unavailable")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.scale < math.inf:
            raise ConfigError(f"scale must be a finite number >= 0, got {self.scale!r}")
        if not 0 <= self.duration_s < math.inf or not 0 < self.peer_wait_s < math.inf:
            raise ConfigError("duration_s must be finite and >= 0, peer_wait_s finite and > 0")
        try:
            self.rate_table()
        except InvalidArgument as exc:
            raise ConfigError(str(exc) if exc.field == "table" else f"table: {exc}") from None

    def rate_table(self) -> RateTable:
        return load_table(self.table).scaled(self.scale)


@dataclasses.dataclass
class MeshMap:
    """Where the chips are: shards ``(start, end, endpoint, domain size)``, the fabric and each chip's NIC links."""

    shards: list[tuple[int, int, str, int]]
    fabric: str
    nic_links: dict[int, list[str]]

    @property
    def n_chips(self) -> int:
        return max(s[1] for s in self.shards)

    def shard(self, device: int) -> tuple[str, int]:
        """(endpoint, domain size) of the shard holding ``device``."""
        for start, end, ep, dom in self.shards:
            if start <= device < end:
                return ep, dom
        raise InvalidArgument("device", f"device {device} is in no shard")


class Injector:
    """Injects the drawn failures into the mesh and clears them when repaired."""

    def __init__(self, cfg: FaultsConfig, clock: VirtualClock, journal: Journal) -> None:
        self.cfg = cfg
        self.clock = clock
        self.journal = journal
        self.table = cfg.rate_table()
        self.md = call_metadata(api_key=cfg.admin_key)
        self.mesh: MeshMap | None = None
        self.channels = ChannelPool()
        self.injected = 0
        self.cleared = 0

    def channel(self, ep: str) -> grpc.aio.Channel:
        return self.channels.get(ep)

    async def close(self) -> None:
        await self.channels.close()

    async def discover(self) -> MeshMap:
        """The mesh from the broker's inventory and the fabric's NIC links."""
        inv = await self._retry(lambda: broker_pb2_grpc.BrokerServiceStub(self.channel(self.cfg.broker)).GetInventory(
            broker_pb2.GetInventoryRequest(), metadata=self.md, timeout=RPC_TIMEOUT_S), "GetInventory")
        shards = [(int(s.devices.start), int(s.devices.end), s.endpoint, int(s.chips_per_domain) or 1)
                  for s in inv.shards]
        if not shards:
            raise InvalidArgument("broker", "the broker's inventory lists no chip shards")
        nic: dict[int, list[str]] = {}
        fabric = fabric_pb2_grpc.FabricServiceStub(self.channel(inv.fabric_endpoint))
        token = ""
        while True:
            r = await self._retry(lambda t=token: fabric.ListLinks(  # type: ignore[misc]
                fabric_pb2.ListLinksRequest(tier="nic", page_size=1000, page_token=t), metadata=self.md,
                timeout=RPC_TIMEOUT_S), "ListLinks")
            for link in r.links:
                m = _NIC_LINK.match(link.name)
                if m:
                    nic.setdefault(int(m.group(1) or m.group(2)), []).append(link.name)
            token = r.next_page_token
            if not token:
                break
        self.mesh = MeshMap(shards, inv.fabric_endpoint, nic)
        return self.mesh

    async def run(self) -> None:
        """Inject every failure at its time and clear it at its repair, until ``duration_s`` (for ever if 0)
        and every repair is done."""
        mesh = self.mesh or await self.discover()
        j = self.journal
        if j.start_s is None:
            j.start_s = self.cfg.start_s if self.cfg.start_s >= 0 else self.clock.now()
            j.save()
        end = j.start_s + self.cfg.duration_s if self.cfg.duration_s else math.inf
        faults = itertools.islice(draw(self.table, n_chips=mesh.n_chips, seed=j.seed, start_s=j.start_s),
                                  j.next_index, None)
        nxt = next(faults, None)
        log.info("fault injector running", chips=mesh.n_chips, start_s=j.start_s, end_s=end,
                 failures_per_day=round(self.table.rate_per_chip_s * mesh.n_chips * 86_400, 2),
                 resumed_at=j.next_index, awaiting_repair=len(j.active))
        while True:
            if nxt is not None and nxt.t_s > end:
                nxt = None
            t_fault = nxt.t_s if nxt is not None else math.inf
            due = min(j.active, key=lambda a: a.t_end_s, default=None)
            t_repair = due.t_end_s if due is not None else math.inf
            if math.isinf(t_fault) and math.isinf(t_repair):
                return
            await self.clock.sleep_until(min(t_fault, t_repair))
            if due is not None and t_repair <= t_fault:
                await self.clear(due)
            elif nxt is not None:
                await self.inject(nxt)
                nxt = next(faults, None)

    async def inject(self, f: Fault) -> None:
        """Break what ``f`` breaks, then record it (next index, repair due) durably."""
        assert self.mesh is not None
        tg = target(f, self.mesh.shard(f.device)[1])
        links = self.mesh.nic_links.get(f.device, []) if tg.is_link else []
        if tg.is_link and not links:  # no scale-out links on this mesh: a transient chip fault instead
            tg = Target(devices=(f.device,))
        now = self.clock.now()
        for name in links:
            await self._retry(lambda n=name: fabric_pb2_grpc.FabricServiceStub(  # type: ignore[misc]
                self.channel(self.mesh.fabric)).InjectLinkFault(fabric_pb2.InjectLinkFaultRequest(  # type: ignore[union-attr]
                    target=n, kind=fabric_pb2.InjectLinkFaultRequest.KIND_DOWN), metadata=self.md,
                    timeout=RPC_TIMEOUT_S), "InjectLinkFault")
        if not links:
            kind = chip_pb2.FAULT_KIND_HBM if tg.chip_kind == "hbm" else chip_pb2.FAULT_KIND_FAILED
            # The shard keeps the repair time with the fault (durably): a shard restarted while the fault holds
            # brings it back, and repairs it on time even if the ClearFault below finds it down.
            await self._retry(lambda: self._chip(tg.devices).InjectFault(chip_pb2.InjectFaultRequest(
                devices=_ranges(tg.devices), kind=kind, repair_after_s=f.repair_s), metadata=self.md,
                timeout=RPC_TIMEOUT_S), "InjectFault")
        j = self.journal
        j.next_index = f.index + 1
        j.active.append(Active(f.index, now + f.repair_s, f.cause, f.component, list(tg.devices) if not links else [],
                               links))
        j.save()
        j.log({"action": "inject", "index": f.index, "t_s": now, "drawn_t_s": f.t_s, "cause": f.cause,
               "component": f.component, "device": f.device, "devices": list(tg.devices) if not links else [],
               "links": links, "repair_s": f.repair_s})
        self.injected += 1
        log.info("failure injected", index=f.index, cause=f.cause, component=f.component, device=f.device,
                 t_s=round(now, 3), links=links or None)

    async def clear(self, a: Active) -> None:
        """Repair what ``a`` broke, then drop it from the durable list."""
        assert self.mesh is not None
        for name in a.links:
            await self._retry(lambda n=name: fabric_pb2_grpc.FabricServiceStub(  # type: ignore[misc]
                self.channel(self.mesh.fabric)).ClearLinkFault(fabric_pb2.ClearLinkFaultRequest(  # type: ignore[union-attr]
                    target=n), metadata=self.md, timeout=RPC_TIMEOUT_S), "ClearLinkFault")
        if a.devices:
            await self._retry(lambda: self._chip(a.devices).ClearFault(chip_pb2.ClearFaultRequest(
                devices=_ranges(a.devices)), metadata=self.md, timeout=RPC_TIMEOUT_S), "ClearFault")
        self.journal.active.remove(a)
        self.journal.save()
        self.journal.log({"action": "clear", "index": a.index, "t_s": self.clock.now(), "cause": a.cause})
        self.cleared += 1

    def _chip(self, devices: typing.Sequence[int]) -> chip_pb2_grpc.ChipServiceStub:
        assert self.mesh is not None
        return chip_pb2_grpc.ChipServiceStub(self.channel(self.mesh.shard(devices[0])[0]))

    async def _retry(self, call: Callable[[], Awaitable[Any]], what: str) -> Any:
        """``call()``, retried with backoff while its service is unavailable (up to ``peer_wait_s`` wall seconds).
        The event clock is held meanwhile: the mesh does not move on without the failure."""
        started, delay = time.monotonic(), 0.2
        with clock_mod.busy():
            while True:
                try:
                    return await call()
                except grpc.aio.AioRpcError as err:
                    retry = err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                           grpc.StatusCode.CANCELLED)
                    if not retry or time.monotonic() - started > self.cfg.peer_wait_s:
                        raise
                    log.warning("fault injector waits for a service", call=what, code=err.code().name,
                                retry_in_s=delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)


def _ranges(devices: typing.Sequence[int]) -> list[common_pb2.DeviceRange]:
    """Contiguous runs of sorted device ids as DeviceRange messages."""
    out: list[common_pb2.DeviceRange] = []
    for d in sorted(devices):
        if out and out[-1].end == d:
            out[-1].end = d + 1
        else:
            out.append(common_pb2.DeviceRange(start=d, end=d + 1))
    return out


def event_clock(cfg: FaultsConfig) -> EventClock:
    """The injector's event clock: its calls carry its time signed with the service key, as a service's do.

    A shard takes the time of a call only with its proof (``runtime/clock.py``): unsigned, an InjectFault ran at
    the shard's own time, which is that of the last advance it had heard of when the call overtook the
    coordinator's newer one. The fault then struck the shard's windows at an earlier event's time (a repair's,
    or the window's booking: 0 repetitions kept), thousands of virtual seconds before it was drawn, and the
    job lost every step between (-0.85 and -1.23 points of goodput in 140-hour Llama 3 runs)."""
    return EventClock(sign_key=cfg.service_key)


async def serve(cfg: FaultsConfig) -> Injector:
    """Run the injector until its failures are done (or for ever); in event mode as a process of the clock."""
    clock: VirtualClock
    agent: ClockAgent | None = None
    if cfg.clock == "event":
        ev = event_clock(cfg)
        clock_mod.install(ev)
        agent = ClockAgent(ev, cfg.clock_coordinator, "faults", connect_timeout_s=cfg.clock_connect_timeout_s,
                           service_key=cfg.service_key)
        await agent.connect()
        async with open_channel(cfg.clock_coordinator, metered=False) as ch:
            t = await clock_pb2_grpc.ClockServiceStub(ch).GetTime(clock_pb2.GetTimeRequest(), timeout=RPC_TIMEOUT_S)
        ev.advance(t.now_s)
        clock = ev
    else:
        clock = VirtualClock(cfg.clock_epoch, cfg.speedup) if cfg.clock_epoch > 0 else \
            VirtualClock.starting_now(cfg.speedup)
    journal = Journal.open(cfg.state_dir or None, seed=cfg.seed, table=cfg.table, scale=cfg.scale)
    inj = Injector(cfg, clock, journal)
    sync = asyncio.ensure_future(agent.run()) if agent is not None else None
    try:
        await inj.run()
    finally:
        if sync is not None:
            sync.cancel()
            await asyncio.gather(sync, return_exceptions=True)
        await inj.close()
        if agent is not None:
            await agent.close()
        clock_mod.install(None)
    log.info("fault injector done", injected=inj.injected, cleared=inj.cleared)
    return inj
