"""The broker's gRPC layer: authenticates callers, calls :class:`BrokerCore`, maps results."""

from __future__ import annotations

import asyncio
import pathlib
import time
from typing import Any

import grpc
import numpy as np
import structlog

from gigacluster.broker.core import BrokerCore, InstanceRecord, ShardInfo, TenantRecord, tenant_id_of
from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import InvalidArgument, PermissionDenied
from gigacluster.runtime import convert
from gigacluster.runtime.auth import Principal, bearer_token, call_metadata, rate_limiter
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.config import BrokerConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.metrics import FunctionCollector, gauge
from gigacluster.runtime.server import Service
from gigacluster.security.audit import AuditLog
from gigacluster.security.capability import DeviceSet
from gigacluster.security.mqtt_auth import tenant_user

log = structlog.get_logger()


async def discover_shards(endpoints: list[str], *, service_key: str, timeout_s: float = 60.0) -> list[ShardInfo]:
    """Ask each chip shard for its range, waiting (bounded) for shards still starting."""
    md = call_metadata(api_key=service_key)
    out = []
    for ep in endpoints:
        async with open_channel(ep) as ch:
            stub = chip_pb2_grpc.ChipServiceStub(ch)
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                try:
                    r = await stub.GetShard(chip_pb2.GetShardRequest(), metadata=md, timeout=2, wait_for_ready=True)
                    break
                except grpc.aio.AioRpcError:
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        out.append(ShardInfo(ep, r.chip_type, int(r.devices.start), int(r.devices.end), r.system,
                             int(r.chips_per_domain)))
    return out


class BrokerService(Service[BrokerConfig]):
    name = "broker"

    def __init__(self, config: BrokerConfig) -> None:
        super().__init__(config)
        self.core: BrokerCore | None = None
        self._ready = asyncio.Event()
        self.limiter = rate_limiter(config.rate_ops_per_s, config.rate_ops_burst)
        self.registry.register(FunctionCollector(self.metrics))

    def metrics(self) -> list[Any]:
        """Tenants, instances and devices by state."""
        core = self.core
        if core is None or core.allocator is None:
            return []
        tenants = gauge("gigacluster_tenants", "Tenants of the cluster.")
        tenants.add_metric([], float(len(core.tenants)))
        inst = gauge("gigacluster_instances", "Live instances.")
        inst.add_metric([], float(len(core.instances)))
        devs = gauge("gigacluster_devices", "Devices by allocation state.", ["state"])
        free = float(np.count_nonzero(core.allocator.owner < 0))
        devs.add_metric(["free"], free)
        devs.add_metric(["allocated"], float(core.allocator.n_devices) - free)
        return [tenants, inst, devs]

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(BrokerServicer(self), server)
        return [broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].full_name]

    async def start(self) -> None:
        await super().start()
        self.spawn(self._init(), "discover-shards")

    async def _init(self) -> None:
        shards = await discover_shards(self.config.shard_endpoints, service_key=self.config.service_key)
        audit_path = self.config.audit_log or (
            str(pathlib.Path(self.config.state_dir) / "audit.jsonl") if self.config.state_dir else "")
        mqtt_dir = self.config.mqtt_files or (
            str(pathlib.Path(self.config.state_dir) / "mqtt") if self.config.state_dir else "")
        self.core = BrokerCore(
            cluster=self.config.cluster, shards=shards, admin_key=self.config.admin_key,
            service_key=self.config.service_key, capability_ttl_s=self.config.capability_ttl_s,
            audit=AuditLog(audit_path) if audit_path else None,
            mqtt_dir=pathlib.Path(mqtt_dir) if mqtt_dir else None,
            mqtt_service_password=self.config.mqtt_password if self.config.mqtt_username == "service" else "",
            mqtt_admin_password=self.config.mqtt_admin_password,
        )
        log.info("broker ready", shards=len(shards), devices=sum(s.end - s.start for s in shards))
        self._ready.set()

    async def ready_core(self) -> BrokerCore:
        if self.core is None:
            try:
                await asyncio.wait_for(self._ready.wait(), 30)
            except TimeoutError as exc:
                from gigacluster.errors import Unavailable

                raise Unavailable("broker is still discovering chip shards; retry") from exc
        assert self.core is not None
        return self.core

    async def scrub(self, rec: InstanceRecord) -> float:
        """Ask every shard holding the instance's devices to scrub them (in parallel)."""
        core = await self.ready_core()
        md = call_metadata(api_key=self.config.service_key)

        async def one(shard: ShardInfo) -> float:
            async with open_channel(shard.endpoint) as ch:
                r = await chip_pb2_grpc.ChipServiceStub(ch).ScrubInstance(
                    chip_pb2.ScrubInstanceRequest(instance=rec.alloc.instance), metadata=md, timeout=10)
                return float(r.scrub_s)

        times = await asyncio.gather(*(one(s) for s in core.shards_of(rec)), return_exceptions=True)
        for t in times:
            if isinstance(t, BaseException):
                log.error("scrub failed", instance=rec.name, error=str(t))
        return max((t for t in times if isinstance(t, float)), default=0.0)


def _tenant_msg(core: BrokerCore, t: TenantRecord) -> Any:
    return broker_pb2.Tenant(name=t.name, display_name=t.display_name, created_s=t.created_s, weight=t.weight,
                             devices_held=core.devices_held(t.name))


def _instance_msg(r: InstanceRecord) -> Any:
    d = r.alloc.devices
    return broker_pb2.Instance(
        name=r.name, tenant=f"tenants/{r.alloc.tenant}", chip_type=r.alloc.chip_type,
        devices=convert.range_msgs(zip(d.starts.tolist(), d.stops.tolist(), strict=True)),
        device_count=len(d), nic_share=r.nic_share, created_s=r.created_s, purpose=r.purpose,
    )


@grpc_errors(broker_pb2_grpc.BrokerServiceServicer)
class BrokerServicer(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self, svc: BrokerService) -> None:
        self.svc = svc

    async def _caller(self, context: grpc.aio.ServicerContext) -> tuple[BrokerCore, Principal]:
        core = await self.svc.ready_core()
        p = core.authenticate(bearer_token(context))
        structlog.contextvars.bind_contextvars(principal=p.tenant or p.kind)
        if self.svc.limiter is not None and p.kind == "tenant":
            self.svc.limiter.check(p.tenant, time.monotonic(), ops=1.0)
        return core, p

    async def CreateTenant(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        rec, key, mqtt_password = core.create_tenant(p, request.tenant_id, request.display_name, request.weight)
        return broker_pb2.CreateTenantResponse(tenant=_tenant_msg(core, rec), api_key=key,
                                               mqtt_username=tenant_user(rec.tenant_id), mqtt_password=mqtt_password)

    async def GetTenant(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        return broker_pb2.GetTenantResponse(tenant=_tenant_msg(core, core.get_tenant(p, request.name)))

    async def ListTenants(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        if not p.privileged:
            raise PermissionDenied("only the admin lists tenants", reason="ADMIN_ONLY")
        tenants: list[TenantRecord] = sorted(core.tenants.values(), key=lambda t: t.tenant_id)
        items, token = convert.page(tenants, request.page_size, request.page_token)
        return broker_pb2.ListTenantsResponse(tenants=[_tenant_msg(core, t) for t in items],  # type: ignore[arg-type]
                                              next_page_token=token)

    async def Authenticate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        if not p.privileged:
            raise PermissionDenied("only gigacluster services authenticate other keys", reason="SERVICE_ONLY")
        if not request.api_key:
            raise InvalidArgument("api_key", "required")
        q = core.authenticate(request.api_key)
        return broker_pb2.AuthenticateResponse(principal=q.tenant or q.kind, admin=q.kind == "admin")

    async def GetInventory(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        free_mask = core.allocator.owner < 0 if core.allocator is not None else None
        free = int(free_mask.sum()) if free_mask is not None else 0
        free_ranges = []
        if p.privileged and free_mask is not None:
            fs = DeviceSet.from_mask(free_mask)
            free_ranges = convert.range_msgs(zip(fs.starts.tolist(), fs.stops.tolist(), strict=True))
        return broker_pb2.GetInventoryResponse(
            free=free_ranges,
            cluster=core.cluster, fabric_endpoint=self.svc.config.fabric, free_devices=free,
            shards=[broker_pb2.Shard(endpoint=s.endpoint, chip_type=s.chip_type,
                                     devices=convert.range_msgs([(s.start, s.end)])[0], system=s.system,
                                     chips_per_domain=s.chips_per_domain) for s in core.shards],
        )

    async def AllocateInstance(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        if request.tenant:
            tenant_id_of(request.tenant, "tenant")
        devices = None
        if request.devices:
            for i, r in enumerate(request.devices):
                if r.end <= r.start:
                    raise InvalidArgument(f"devices[{i}]", f"end ({r.end}) must be > start ({r.start})")
            devices = DeviceSet.from_ids(np.concatenate([np.arange(r.start, r.end) for r in request.devices]))
        rec, token, exp = core.allocate(p, chip_type=request.chip_type, count=int(request.count),
                                        topology=int(request.topology), purpose=request.purpose,
                                        on_behalf=request.tenant, devices=devices)
        self.svc.telemetry.publish("events", {"event": "instance_allocated", "instance": rec.name,
                                              "tenant": f"tenants/{rec.alloc.tenant}",
                                              "devices": len(rec.alloc.devices)})
        return broker_pb2.AllocateInstanceResponse(instance=_instance_msg(rec), capability=token,
                                                   capability_expires_s=exp)

    async def GetInstance(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        return broker_pb2.GetInstanceResponse(instance=_instance_msg(core.get_instance(p, request.name)))

    async def ListInstances(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        items, token = convert.page(core.list_instances(p), request.page_size, request.page_token)
        return broker_pb2.ListInstancesResponse(instances=[_instance_msg(r) for r in items],  # type: ignore[arg-type]
                                                next_page_token=token)

    async def ReleaseInstance(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        rec = core.release(p, request.name)
        scrub_s = await self.svc.scrub(rec)
        self.svc.telemetry.publish("events", {"event": "instance_released", "instance": rec.name,
                                              "tenant": f"tenants/{rec.alloc.tenant}", "scrub_s": scrub_s})
        return broker_pb2.ReleaseInstanceResponse(scrub_s=scrub_s)

    async def RefreshCapability(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, p = await self._caller(context)
        if p.kind == "admin":
            # A capability opens the instance's memory; the admin operates instances, never reads them.
            raise PermissionDenied("the admin cannot take capabilities of a tenant's instance", reason="NO_DATA_ACCESS")
        rec = core.get_instance(p, request.instance)
        token, exp = core.capability(rec)
        return broker_pb2.RefreshCapabilityResponse(capability=token, capability_expires_s=exp)

    async def GetVerificationKeys(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        core, _ = await self._caller(context)
        return broker_pb2.GetVerificationKeysResponse(
            cluster=core.cluster,
            public_keys={core.issuer.key_id: core.issuer.public_key_pem().decode()},
            revocations=[broker_pb2.Revocation(instance=i, revoked_s=t) for i, t in core.verifier.revocations()],
        )
