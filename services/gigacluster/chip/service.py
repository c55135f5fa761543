"""The chip emulator's gRPC layer: maps requests to :class:`ChipShard` calls and back."""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np

from gigacluster.arrays import distinct
from gigacluster.chip.faultstore import FaultStore
from gigacluster.chip.shard import ChipShard
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import InvalidArgument, PermissionDenied, ResourceExhausted
from gigacluster.hw.catalog import default_system, get_chip, get_system
from gigacluster.runtime import convert
from gigacluster.runtime.auth import bearer_token
from gigacluster.runtime.config import ChipConfig
from gigacluster.runtime.errors import grpc_errors, preview
from gigacluster.runtime.metrics import FunctionCollector, counter, gauge
from gigacluster.runtime.server import Service
from gigacluster.runtime.waits import first_of
from gigacluster.security.capability import Capability, DeviceSet
from gigacluster.security.memory import DeviceMemory
from gigacluster.security.overhead import VirtualizationOverhead
from gigacluster.wire import chip as chip_wire

PER_DEVICE_SERIES_MAX = 1024  # beyond this, a shard exports aggregates only (scrapes stay small)
DCGM_LABELS = ["gpu", "Hostname", "model_name"]  # dcgm-exporter's, modelName in snake_case


class ChipService(Service[ChipConfig]):
    name = "chip"

    def __init__(self, config: ChipConfig) -> None:
        super().__init__(config)
        chip = get_chip(config.chip)
        system = get_system(config.system or default_system(config.chip))
        overhead = VirtualizationOverhead() if config.virtualization == "nitro" else VirtualizationOverhead.none()
        self.shard = ChipShard(chip, system, offset=config.device_offset, count=config.device_count,
                               start_s=self.clock.now(), overhead=overhead)
        self.shard_name = f"shards/{chip.name}-{config.device_offset}"
        # Injected faults survive a restart (kill -9 included): re-applied before the first call is served.
        self.faults = FaultStore.for_shard(config.state_dir, chip.name, config.device_offset)
        self.shard.restore_faults(self.faults.load())
        self.memory = DeviceMemory.for_chip(chip, config.device_count)
        self.auth = self.broker_auth()
        self.registry.register(FunctionCollector(self.metrics))

    def memory_used_bytes(self) -> np.ndarray:
        """HBM in use per device: explicit allocations plus what instances report holding."""
        return self.memory.used_bytes + self.shard.held_bytes

    def metrics(self) -> list[Any]:
        """dcgm-exporter-named series per device (up to PER_DEVICE_SERIES_MAX) plus shard aggregates.

        Energy only grows, so it is a counter (``..._total``); dcgm-exporter's own
        ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` is a counter without the suffix, which
        ``promtool check metrics`` refuses. Its ``modelName`` label is ``model_name`` here for the
        same reason (label names in snake_case).
        """
        s = self.shard
        self.heal()
        now = self.clock.now()
        energy = s.energy_j(now)
        used = self.memory_used_bytes()
        fams: dict[str, Any] = {
            "DCGM_FI_DEV_POWER_USAGE": gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", DCGM_LABELS),
            "DCGM_FI_DEV_GPU_UTIL": gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", DCGM_LABELS),
            "DCGM_FI_DEV_FB_USED": gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", DCGM_LABELS),
            "DCGM_FI_DEV_FB_FREE": gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", DCGM_LABELS),
            "DCGM_FI_DEV_GPU_TEMP": gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", DCGM_LABELS),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total": counter(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total", "Total energy consumption since boot (in mJ).",
                DCGM_LABELS),
        }
        n = min(s.count, PER_DEVICE_SERIES_MAX)
        mib = 2**20
        free = np.clip(s.chip.hbm_bytes - used, 0, None)
        for i in range(n):
            labels = [str(s.offset + i), self.shard_name, s.chip.name]
            fams["DCGM_FI_DEV_POWER_USAGE"].add_metric(labels, float(s.power_w[i]))
            fams["DCGM_FI_DEV_GPU_UTIL"].add_metric(labels, float(s.utilization[i] * 100.0))
            fams["DCGM_FI_DEV_FB_USED"].add_metric(labels, float(used[i]) / mib)
            fams["DCGM_FI_DEV_FB_FREE"].add_metric(labels, float(free[i]) / mib)
            fams["DCGM_FI_DEV_GPU_TEMP"].add_metric(labels, float(s.temp_c[i]))
            fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"].add_metric(labels, float(energy[i] * 1e3))
        out: list[Any] = list(fams.values())
        for make, name, doc, value in (
            (gauge, "gigacluster_shard_power_watts", "Power of all devices of the shard.", float(s.power_w.sum())),
            (gauge, "gigacluster_shard_utilization", "Mean busy fraction of the devices.",
             float(s.utilization.mean())),
            (counter, "gigacluster_shard_energy_joules_total", "Energy drawn by the shard since start.",
             float(energy.sum())),
            (gauge, "gigacluster_shard_memory_used_bytes", "HBM in use on the shard (allocations and what "
             "jobs and replicas hold).", float(used.sum())),
            (gauge, "gigacluster_shard_max_temperature_celsius", "Hottest device of the shard.", float(s.temp_c.max())),
        ):
            fam = make(name, doc, ["shard", "chip"])
            fam.add_metric([self.shard_name, s.chip.name], value)
            out.append(fam)
        states = gauge("gigacluster_shard_devices", "Devices of the shard by state.", ["shard", "state"])
        st = s.state()
        for code, label in ((1, "healthy"), (2, "throttled"), (3, "failed")):
            states.add_metric([self.shard_name, label], float(np.count_nonzero(st == code)))
        out.append(states)
        return out

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        chip_pb2_grpc.add_ChipServiceServicer_to_server(ChipServicer(self), server)
        return [chip_pb2.DESCRIPTOR.services_by_name["ChipService"].full_name]

    async def start(self) -> None:
        await super().start()
        self.spawn(self.auth.run_refresh(), "auth-refresh")
        self.every(min(self.config.telemetry_interval_s, 0.5), self.tick, "tick")

    async def stop(self) -> None:
        await super().stop()
        await self.auth.close()

    def heal(self) -> None:
        """Apply the repairs that are due (one comparison when none is), and say so on MQTT."""
        now = self.clock.now()
        done = self.shard.repair_due(now)
        if done.size:
            self.telemetry.publish("events", {"event": "fault_repaired", "devices": int(done.size), "t_s": now,
                                              "first_device": int(done[0]) + self.shard.offset})

    async def tick(self) -> None:
        self.heal()
        snap = self.shard.tick(self.clock.now())
        self.telemetry.publish(
            f"shards/{self.shard.chip.name}-{self.shard.offset}/stats",
            {
                "shard": self.shard_name,
                "chip": self.shard.chip.name,
                "t_s": snap.now_s,
                "devices": snap.devices,
                "healthy": snap.healthy,
                "throttled": snap.throttled,
                "failed": snap.failed,
                "utilization": snap.mean_utilization,
                "power_w": snap.power_w,
                "energy_j": snap.energy_j,
                "busy_s": snap.busy_s,
                "memory_used_bytes": int(self.memory_used_bytes().sum()),
                "max_temperature_c": snap.max_temperature_c,
                "mean_clock_factor": snap.mean_clock_factor,
            },
        )


def _devset(idx: np.ndarray, offset: int) -> DeviceSet:
    return DeviceSet.from_ids(idx + offset)


MAX_TRACKED_INSTANCES = 100_000  # instances whose devices a shard remembers for the release reset


@grpc_errors(chip_pb2_grpc.ChipServiceServicer)
class ChipServicer(chip_pb2_grpc.ChipServiceServicer):
    """Every RPC authenticates first, then bounds its request against config, then works."""

    def __init__(self, svc: ChipService) -> None:
        self.svc = svc
        self.shard = svc.shard
        self.cfg = svc.config
        # Devices each instance's capability covered on this shard: a release resets their timing.
        self._instance_devices: OrderedDict[str, DeviceSet] = OrderedDict()
        # Open ExecuteWindow streams: a cut (CutWork, a fault, a release) wakes its stream with the cause.
        self._window_cuts: dict[int, tuple[asyncio.Event, list[str]]] = {}

    async def _cap(self, context: grpc.aio.ServicerContext, action: str) -> Capability:
        """The caller's verified capability for ``action`` (devices are checked once bounded)."""
        cap = await self.svc.auth.capability(context, action)
        self._instance_devices[cap.instance] = cap.devices
        self._instance_devices.move_to_end(cap.instance)
        if len(self._instance_devices) > MAX_TRACKED_INSTANCES:
            self._instance_devices.popitem(last=False)
        return cap

    def _devices(self, msgs: Any, field: str = "devices") -> np.ndarray:
        """Local indices of the requested ranges, bounded before anything is expanded (repairs due applied
        first, so every call that names devices sees them as of now)."""
        if len(msgs) > self.cfg.max_device_ranges:
            raise ResourceExhausted(f"{field}: at most {self.cfg.max_device_ranges} ranges per request "
                                    f"(max_device_ranges), got {len(msgs)}", field=field)
        self.svc.heal()
        return self.shard.local(convert.ranges(msgs), field)

    def _not_before(self, value: float) -> float:
        now = self.svc.clock.now()
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument("not_before_s", f"must be a finite number >= 0, got {value}")
        if value > now + self.cfg.not_before_horizon_s:
            raise InvalidArgument("not_before_s", f"at most {self.cfg.not_before_horizon_s:g} s ahead of now "
                                                  f"({now:.3f}; not_before_horizon_s), got {value:g}")
        return value

    async def _read_access(self, context: grpc.aio.ServicerContext, msgs: Any) -> np.ndarray | None:
        """Privileged callers read any device; a capability reads its own. Returns the named devices."""
        self.svc.heal()
        if bearer_token(context):
            await self.svc.auth.require_privileged(context)
            return self._devices(msgs) if msgs else None
        cap = await self._cap(context, "telemetry.read")
        if not msgs:
            raise PermissionDenied(f"tenant {cap.tenant} must name its devices", reason="DEVICES_REQUIRED")
        idx = self._devices(msgs)
        cap.require("telemetry.read", _devset(idx, self.shard.offset))
        return idx

    async def GetShard(self, request: chip_pb2.GetShardRequest,
                       context: grpc.aio.ServicerContext) -> chip_pb2.GetShardResponse:
        if bearer_token(context):
            await self.svc.auth.principal(context)
        else:
            await self._cap(context, "telemetry.read")
        self.svc.heal()
        return chip_wire.shard_msg(self.shard, name=self.svc.shard_name, now_s=self.svc.clock.now())

    async def ListDevices(self, request: chip_pb2.ListDevicesRequest,
                          context: grpc.aio.ServicerContext) -> chip_pb2.ListDevicesResponse:
        idx = await self._read_access(context, request.devices)
        s = self.shard
        all_idx = idx if idx is not None else np.arange(s.count)
        page_idx, token = convert.page(all_idx, request.page_size, request.page_token)
        out = chip_wire.device_msgs(s, np.asarray(page_idx, dtype=np.int64), now_s=self.svc.clock.now(),
                                    memory_used=self.svc.memory_used_bytes())
        return chip_pb2.ListDevicesResponse(devices=out, next_page_token=token)

    async def ExecuteWork(self, request: chip_pb2.ExecuteWorkRequest,
                          context: grpc.aio.ServicerContext) -> chip_pb2.ExecuteWorkResponse:
        cap = await self._cap(context, "compute.run")
        not_before_s = self._not_before(request.not_before_s)
        idx = self._devices(request.devices)
        works = chip_wire.works(request.items)
        cap.require("compute.run", _devset(idx, self.shard.offset))
        if request.HasField("memory_in_use_bytes"):  # checked (and held) before any work is booked
            cap.require("memory.write", _devset(idx, self.shard.offset))
            self.shard.hold_memory(idx, int(request.memory_in_use_bytes))
        res = self.shard.execute(idx, works, not_before_s=not_before_s, now_s=self.svc.clock.now())
        if request.wait:
            await self.svc.clock.sleep_until(res.end_s)
        return chip_pb2.ExecuteWorkResponse(start_s=res.start_s, end_s=res.end_s, energy_j=res.energy_j,
                                            clock_factor=res.clock_factor)

    async def ExecuteWindow(self, request: chip_pb2.ExecuteWindowRequest,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[chip_pb2.ExecuteWindowResponse]:
        cap = await self._cap(context, "compute.run")
        if request.repeat < 1:
            raise InvalidArgument("repeat", f"must be >= 1, got {request.repeat}")
        if request.repeat > self.cfg.max_window_repeat:
            raise ResourceExhausted(f"repeat: 1..{self.cfg.max_window_repeat} repetitions per window "
                                    f"(max_window_repeat), got {request.repeat}", field="repeat")
        w = request.work
        not_before_s = self._not_before(w.not_before_s)
        idx = self._devices(w.devices)
        works = chip_wire.works(w.items)
        cap.require("compute.run", _devset(idx, self.shard.offset))
        if w.HasField("memory_in_use_bytes"):
            cap.require("memory.write", _devset(idx, self.shard.offset))
            self.shard.hold_memory(idx, int(w.memory_in_use_bytes))
        wid, res = self.shard.execute_window(idx, works, not_before_s=not_before_s, now_s=self.svc.clock.now(),
                                             period_s=request.period_s, repeat=int(request.repeat),
                                             pause_after=list(request.pause_after), pause_s=request.pause_s)
        first = chip_pb2.ExecuteWorkResponse(start_s=res.start_s, end_s=res.end_s, energy_j=res.energy_j,
                                             clock_factor=res.clock_factor)
        win = self.shard.windows[wid]
        yield chip_pb2.ExecuteWindowResponse(first=first, repeats=win.repeat, end_s=win.rep_end_s(win.repeat))
        cut, cause = asyncio.Event(), [""]
        self._window_cuts[wid] = (cut, cause)
        try:
            while not cut.is_set() and win.repeat and self.svc.clock.now() < win.rep_end_s(win.repeat):
                # A chip heating past its throttle point ends the window where its clock would move (ChipShard).
                until = min(win.rep_end_s(win.repeat), win.throttle_at_s)
                await first_of(cut.wait(), self.svc.clock.sleep_until(until))
                if not cut.is_set() and self.svc.clock.now() >= win.throttle_at_s:
                    self._cut(win.idx, win.throttle_at_s, "the chips' temperature changed their clock")
        finally:
            self._window_cuts.pop(wid, None)
        yield chip_pb2.ExecuteWindowResponse(first=first, repeats=win.repeat, end_s=win.rep_end_s(win.repeat),
                                             final=True, cause=cause[0])

    def _cut(self, idx: np.ndarray, at_s: float, cause: str) -> dict[int, int]:
        """Cut the windows on ``idx`` at ``at_s`` and wake their streams."""
        cut = self.shard.cut_windows(idx, at_s)
        for wid in cut:
            if wid in self._window_cuts:
                ev, why = self._window_cuts[wid]
                why[0] = why[0] or cause
                ev.set()
        return cut

    async def CutWork(self, request: chip_pb2.CutWorkRequest,
                      context: grpc.aio.ServicerContext) -> chip_pb2.CutWorkResponse:
        cap = await self._cap(context, "compute.run")
        if not math.isfinite(request.at_s) or request.at_s < 0:
            raise InvalidArgument("at_s", f"must be a finite number >= 0, got {request.at_s}")
        idx = self._devices(request.devices)
        cap.require("compute.run", _devset(idx, self.shard.offset))
        before = {wid: w.repeat for wid, w in self.shard.windows.items()}
        cut = self._cut(idx, request.at_s, "cut by the caller")
        return chip_pb2.CutWorkResponse(windows=len(cut), repeats_removed=sum(before[w] - k for w, k in cut.items()))

    async def ReportWork(self, request: chip_pb2.ReportWorkRequest,
                         context: grpc.aio.ServicerContext) -> chip_pb2.ReportWorkResponse:
        cap = await self._cap(context, "compute.run")
        n = len(request.iterations)
        if n > self.cfg.max_report_iterations:
            raise ResourceExhausted(f"{n} iterations exceed the shard's max_report_iterations "
                                    f"({self.cfg.max_report_iterations}); send them in several calls")
        idx = self._devices(request.devices)
        cap.require("compute.run", _devset(idx, self.shard.offset))
        # Every iteration is validated (items, not_before_s) before any is booked.
        plan = [(chip_wire.works(i.items, f"iterations[{k}].items"), self._not_before(i.not_before_s))
                for k, i in enumerate(request.iterations)]
        if request.HasField("memory_in_use_bytes"):
            cap.require("memory.write", _devset(idx, self.shard.offset))
            self.shard.hold_memory(idx, int(request.memory_in_use_bytes))
        results = self.shard.execute_many(idx, plan, now_s=self.svc.clock.now()) if plan else []
        return chip_pb2.ReportWorkResponse(results=[
            chip_pb2.ExecuteWorkResponse(start_s=r.start_s, end_s=r.end_s, energy_j=r.energy_j,
                                         clock_factor=r.clock_factor) for r in results])

    async def AllocateMemory(self, request: chip_pb2.AllocateMemoryRequest,
                             context: grpc.aio.ServicerContext) -> chip_pb2.AllocateMemoryResponse:
        cap = await self._cap(context, "memory.write")
        idx = self.shard.local([(request.device, request.device + 1)], "device")
        if request.size_bytes <= 0:
            raise InvalidArgument("size_bytes", "must be > 0")
        cap.require("memory.write", _devset(idx, self.shard.offset))
        alloc = self.svc.memory.allocate(int(idx[0]), cap.tenant, cap.instance, int(request.size_bytes))
        return chip_pb2.AllocateMemoryResponse(name=f"allocations/{alloc}", device=request.device,
                                               size_bytes=request.size_bytes)

    async def SetMemoryInUse(self, request: chip_pb2.SetMemoryInUseRequest,
                             context: grpc.aio.ServicerContext) -> chip_pb2.SetMemoryInUseResponse:
        cap = await self._cap(context, "memory.write")
        idx = self._devices(request.devices)
        cap.require("memory.write", _devset(idx, self.shard.offset))
        self.shard.hold_memory(idx, int(request.bytes_per_device), "bytes_per_device")
        return chip_pb2.SetMemoryInUseResponse(devices=int(idx.size))

    def _alloc_id(self, name: str) -> int:
        rest = name.removeprefix("allocations/")
        if not name.startswith("allocations/") or not rest.isdigit() or len(rest) > 18:
            raise InvalidArgument("name", f"must look like 'allocations/<number>', got {preview(name, 64)!r}")
        return int(rest)

    def _io_bound(self, field: str, n: int) -> None:
        if n > self.cfg.max_io_bytes:
            raise ResourceExhausted(f"{field}: at most {self.cfg.max_io_bytes} bytes per call (max_io_bytes), "
                                    f"got {n}", field=field)

    async def FreeMemory(self, request: chip_pb2.FreeMemoryRequest,
                         context: grpc.aio.ServicerContext) -> chip_pb2.FreeMemoryResponse:
        cap = await self._cap(context, "memory.write")
        alloc = self._alloc_id(request.name)
        scrub_s = self.svc.memory.free(alloc, cap.tenant)
        return chip_pb2.FreeMemoryResponse(scrub_s=scrub_s)

    async def WriteMemory(self, request: chip_pb2.WriteMemoryRequest,
                          context: grpc.aio.ServicerContext) -> chip_pb2.WriteMemoryResponse:
        cap = await self._cap(context, "memory.write")
        alloc = self._alloc_id(request.name)
        self._io_bound("data", len(request.data))
        self.svc.memory.write(alloc, cap.tenant, int(request.offset), bytes(request.data))
        return chip_pb2.WriteMemoryResponse(written_bytes=len(request.data))

    async def ReadMemory(self, request: chip_pb2.ReadMemoryRequest,
                         context: grpc.aio.ServicerContext) -> chip_pb2.ReadMemoryResponse:
        cap = await self._cap(context, "memory.read")
        alloc = self._alloc_id(request.name)
        self._io_bound("length", int(request.length))
        data = self.svc.memory.read(alloc, cap.tenant, int(request.offset), int(request.length))
        return chip_pb2.ReadMemoryResponse(data=data)

    def _local_of(self, devices: DeviceSet) -> np.ndarray:
        """Local indices of the part of ``devices`` on this shard."""
        s = self.shard
        parts = [np.arange(max(int(a), s.offset) - s.offset, min(int(b), s.end) - s.offset)
                 for a, b in zip(devices.starts, devices.stops, strict=True) if a < s.end and b > s.offset]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    async def ScrubInstance(self, request: chip_pb2.ScrubInstanceRequest,
                            context: grpc.aio.ServicerContext) -> chip_pb2.ScrubInstanceResponse:
        await self.svc.auth.require_privileged(context)
        if not request.instance:
            raise InvalidArgument("instance", "required")
        iid = request.instance.removeprefix("instances/")
        named = self._devices(request.devices) if request.devices else np.empty(0, np.int64)
        # Revoke at once (the periodic pull from the broker would take up to a second).
        self.svc.auth.revoke(iid)
        mem = self.svc.memory
        with_memory = np.asarray(sorted({a.device for a in mem.allocations(instance=iid)}), dtype=np.int64)
        before = int(mem.used_bytes.sum())
        scrub_s = mem.release_instance(iid)
        # The instance's devices go back with no timing state: whatever its tenant booked ahead
        # (however far) is cancelled, and the scrub runs before the next tenant's work (modelled time).
        seen = self._instance_devices.pop(iid, None)
        held = self._local_of(seen) if seen is not None else np.empty(0, np.int64)
        idx = distinct(np.concatenate([named, with_memory, held]))
        self._cut(idx, self.svc.clock.now(), "the instance was released")
        self.shard.reset_timing(idx, self.svc.clock.now(), scrub_s)
        self.shard.release_memory(idx)
        return chip_pb2.ScrubInstanceResponse(scrub_s=scrub_s, scrubbed_bytes=before - int(mem.used_bytes.sum()))

    async def InjectFault(self, request: chip_pb2.InjectFaultRequest,
                          context: grpc.aio.ServicerContext) -> chip_pb2.InjectFaultResponse:
        await self.svc.auth.require_privileged(context)
        idx = self._devices(request.devices)
        for field in ("clock_factor", "repair_after_s"):
            v = getattr(request, field)
            if not math.isfinite(v) or v < 0:
                raise InvalidArgument(field, f"must be a finite number >= 0, got {v}")
        now = self.svc.clock.now()
        repair_at = now + request.repair_after_s if request.repair_after_s > 0 else math.inf
        n = self.shard.inject_fault(idx, int(request.kind), request.clock_factor or 0.5, repair_at)
        self.svc.faults.save(self.shard.fault_runs())  # durable before the caller is told
        # A window on a faulted device keeps the repetitions that started before now; the next one fails
        # (or runs slower) through the per-step path, as after a fault injected between two steps.
        self._cut(idx, now, f"fault {chip_wire.fault_name(request.kind)} injected")
        self.svc.telemetry.publish("events", {"event": "fault", "kind": chip_wire.fault_name(request.kind),
                                              "devices": convert.ranges(request.devices), "t_s": now,
                                              "repair_at_s": None if math.isinf(repair_at) else repair_at})
        return chip_pb2.InjectFaultResponse(affected=n)

    async def ClearFault(self, request: chip_pb2.ClearFaultRequest,
                         context: grpc.aio.ServicerContext) -> chip_pb2.ClearFaultResponse:
        await self.svc.auth.require_privileged(context)
        idx = self._devices(request.devices)
        n = self.shard.clear_fault(idx)
        self.svc.faults.save(self.shard.fault_runs())
        self.svc.telemetry.publish("events", {"event": "fault_cleared", "devices": convert.ranges(request.devices),
                                              "t_s": self.svc.clock.now()})
        return chip_pb2.ClearFaultResponse(affected=n)

    async def GetStats(self, request: chip_pb2.GetStatsRequest,
                       context: grpc.aio.ServicerContext) -> chip_pb2.GetStatsResponse:
        idx = await self._read_access(context, request.devices)
        s = self.shard
        sel = idx if idx is not None else np.arange(s.count)
        return chip_wire.stats_msg(s, sel, now_s=self.svc.clock.now(), memory_used=self.svc.memory_used_bytes())
