"""The broker's gRPC layer: authenticates callers, calls :class:`BrokerCore`, maps results.

Every RPC authenticates first (``_caller``), then validates, then works; refused calls
(UNAUTHENTICATED, PERMISSION_DENIED) are written to the audit log by :func:`audit_denials`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import pathlib
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import numpy as np
import structlog
from google.protobuf.message import Message

from gigacluster.broker.core import BrokerCore, BrokerLimits, InstanceRecord, ShardInfo, TenantRecord, tenant_id_of
from gigacluster.broker.store import BrokerStore
from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import InvalidArgument, PermissionDenied, Unauthenticated, Unavailable
from gigacluster.runtime import convert
from gigacluster.runtime.auth import Principal, bearer_token, call_metadata, rate_limiter
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.config import BrokerConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.metrics import FunctionCollector, gauge
from gigacluster.runtime.server import Service
from gigacluster.security.audit import append_anchor
from gigacluster.security.capability import DeviceSet
from gigacluster.security.mqtt_auth import tenant_user
from gigacluster.wire import broker as wire

log = structlog.get_logger()
C = TypeVar("C", bound=type)
#: The authenticated caller of the current RPC (None until ``_caller`` succeeds).
_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("broker_principal", default=None)
#: Set when the handler already audited its refusal (Authenticate audits the key it was asked about).
_audited: contextvars.ContextVar[bool] = contextvars.ContextVar("broker_audited", default=False)
DENIED_CODES = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def audit_denials(base: type) -> Callable[[C], C]:
    """Class decorator: every RPC of ``base`` that ends UNAUTHENTICATED or PERMISSION_DENIED is
    audited as ``broker.<rpc>`` with the caller (or its key's public id) and the reason."""
    rpcs = {n for n, v in vars(base).items() if callable(v) and not n.startswith("_")}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        action = f"broker.{_snake(name)}"

        @functools.wraps(fn)
        async def inner(self: Any, request: Message, context: grpc.aio.ServicerContext) -> Any:
            _principal.set(None)
            _audited.set(False)
            try:
                return await fn(self, request, context)
            except Exception as exc:
                if getattr(exc, "code", "") in DENIED_CODES and not _audited.get():
                    core = self.svc.core
                    if core is not None:
                        try:
                            core.audit_denied(_principal.get(), bearer_token(context), action,
                                              str(getattr(exc, "reason", "")), time.time())
                        except Exception:
                            log.exception("cannot audit a denied call", rpc=name)
                raise

        return inner

    def deco(cls: C) -> C:
        for name in rpcs:
            fn = cls.__dict__.get(name)
            if fn is not None:
                setattr(cls, name, wrap(name, fn))
        return cls

    return deco


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
        self.anchor_path: pathlib.Path | None = None
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

    def _state_path(self, explicit: str, default_name: str) -> pathlib.Path | None:
        if explicit:
            return pathlib.Path(explicit)
        return pathlib.Path(self.config.state_dir) / default_name if self.config.state_dir else None

    async def _init(self) -> None:
        cfg = self.config
        shards = await discover_shards(cfg.shard_endpoints, service_key=cfg.service_key)
        db_path = self._state_path(cfg.db_path, "broker.db")
        audit_path = self._state_path(cfg.audit_log, "audit.jsonl")
        self.anchor_path = audit_path.with_name(audit_path.name + ".anchors") if audit_path else None
        mqtt_dir = self._state_path(cfg.mqtt_files, "mqtt")
        self.core = BrokerCore(
            cluster=cfg.cluster, shards=shards, admin_key=cfg.admin_key,
            service_key=cfg.service_key, capability_ttl_s=cfg.capability_ttl_s,
            store=BrokerStore(db_path), audit_path=audit_path, mqtt_dir=mqtt_dir,
            mqtt_service_password=cfg.mqtt_password if cfg.mqtt_username == "service" else "",
            mqtt_admin_password=cfg.mqtt_admin_password,
            limits=BrokerLimits(max_instance_devices=cfg.max_instance_devices,
                                max_device_ranges=cfg.max_device_ranges, max_text_chars=cfg.max_text_chars,
                                audit_denied_per_s=cfg.audit_denied_per_s),
        )
        if audit_path is not None:
            (audit_path.parent / "audit.pub").write_bytes(self.core.issuer.public_key_pem())
        # Instances released before a crash but not yet scrubbed: scrub them before their devices
        # go back to the pool (they stay held until then).
        await self.finish_releases()
        self.every(max(1.0, cfg.audit_anchor_interval_s / 2), self.finish_releases, "finish-releases")
        self.every(cfg.audit_anchor_interval_s, self.anchor_audit, "audit-anchor")
        await self.anchor_audit()
        log.info("broker ready", shards=len(shards), devices=sum(s.end - s.start for s in shards),
                 tenants=len(self.core.tenants), instances=len(self.core.instances))
        self._ready.set()

    async def anchor_audit(self) -> None:
        """Sign the audit head; append it to the anchors file and publish it (retained) on MQTT."""
        core = self.core
        if core is None:
            return
        now = time.time()
        core.prune_revocations(now)
        a = core.anchor_audit(now)
        if a is None:
            return
        if self.anchor_path is not None:
            append_anchor(self.anchor_path, a)
        self.telemetry.publish("audit/anchor", a.to_json(), retain=True)

    async def finish_releases(self) -> None:
        """Scrub every released instance still holding devices, then free them."""
        core = self.core
        if core is None:
            return
        for rec in list(core.releasing.values()):
            _, ok = await self.scrub(rec)
            if ok:
                core.finish_release(rec.alloc.instance)

    async def stop(self) -> None:
        if self.core is not None:
            await self.anchor_audit()  # the last head, while telemetry is still open
        await super().stop()
        if self.core is not None:
            self.core.store.close()

    async def ready_core(self) -> BrokerCore:
        if self.core is None:
            try:
                await asyncio.wait_for(self._ready.wait(), 30)
            except TimeoutError as exc:
                raise Unavailable("broker is still discovering chip shards; retry") from exc
        assert self.core is not None
        return self.core

    async def scrub(self, rec: InstanceRecord) -> tuple[float, bool]:
        """Ask every shard holding the instance's devices to scrub them (in parallel); returns the
        longest scrub time and whether every shard confirmed."""
        core = await self.ready_core()
        md = call_metadata(api_key=self.config.service_key)

        async def one(shard: ShardInfo) -> float:
            async with open_channel(shard.endpoint) as ch:
                r = await chip_pb2_grpc.ChipServiceStub(ch).ScrubInstance(
                    chip_pb2.ScrubInstanceRequest(instance=rec.alloc.instance), metadata=md, timeout=10)
                return float(r.scrub_s)

        times = await asyncio.gather(*(one(s) for s in core.shards_of(rec)), return_exceptions=True)
        ok = True
        for t in times:
            if isinstance(t, BaseException):
                ok = False
                log.error("scrub failed; devices stay held until a retry succeeds", instance=rec.name, error=str(t))
        return max((t for t in times if isinstance(t, float)), default=0.0), ok


def _tenant_msg(core: BrokerCore, t: TenantRecord) -> broker_pb2.Tenant:
    return wire.tenant_msg(t.name, t.display_name, t.created_s, t.weight, core.devices_held(t.name))


def _instance_msg(r: InstanceRecord) -> broker_pb2.Instance:
    return wire.instance_msg(r.name, r.alloc.tenant, r.alloc.chip_type, r.alloc.devices, nic_share=r.nic_share,
                             created_s=r.created_s, purpose=r.purpose)


@grpc_errors(broker_pb2_grpc.BrokerServiceServicer)
@audit_denials(broker_pb2_grpc.BrokerServiceServicer)
class BrokerServicer(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self, svc: BrokerService) -> None:
        self.svc = svc

    async def _caller(self, context: grpc.aio.ServicerContext) -> tuple[BrokerCore, Principal]:
        core = await self.svc.ready_core()
        p = core.authenticate(bearer_token(context))
        _principal.set(p)
        structlog.contextvars.bind_contextvars(principal=p.tenant or p.kind)
        if self.svc.limiter is not None and p.kind == "tenant":
            self.svc.limiter.check(p.tenant, time.monotonic(), ops=1.0)
        return core, p

    async def CreateTenant(self, request: broker_pb2.CreateTenantRequest,
                           context: grpc.aio.ServicerContext) -> broker_pb2.CreateTenantResponse:
        core, p = await self._caller(context)
        rec, key, mqtt_password = core.create_tenant(p, request.tenant_id, request.display_name, request.weight)
        return broker_pb2.CreateTenantResponse(tenant=_tenant_msg(core, rec), api_key=key,
                                               mqtt_username=tenant_user(rec.tenant_id), mqtt_password=mqtt_password)

    async def GetTenant(self, request: broker_pb2.GetTenantRequest,
                        context: grpc.aio.ServicerContext) -> broker_pb2.GetTenantResponse:
        core, p = await self._caller(context)
        return broker_pb2.GetTenantResponse(tenant=_tenant_msg(core, core.get_tenant(p, request.name)))

    async def ListTenants(self, request: broker_pb2.ListTenantsRequest,
                          context: grpc.aio.ServicerContext) -> broker_pb2.ListTenantsResponse:
        core, p = await self._caller(context)
        if not p.privileged:
            raise PermissionDenied("only the admin lists tenants", reason="ADMIN_ONLY")
        tenants: list[TenantRecord] = sorted(core.tenants.values(), key=lambda t: t.tenant_id)
        items, token = convert.page(tenants, request.page_size, request.page_token)
        return broker_pb2.ListTenantsResponse(tenants=[_tenant_msg(core, t) for t in items],  # type: ignore[arg-type]
                                              next_page_token=token)

    async def Authenticate(self, request: broker_pb2.AuthenticateRequest,
                           context: grpc.aio.ServicerContext) -> broker_pb2.AuthenticateResponse:
        core, p = await self._caller(context)
        if not p.privileged:
            raise PermissionDenied("only gigacluster services authenticate other keys", reason="SERVICE_ONLY")
        if not request.api_key:
            raise InvalidArgument("api_key", "required")
        try:
            q = core.authenticate(request.api_key)
        except Unauthenticated as exc:
            # The refused key is the end user's, checked on its behalf by a service: audit it as such.
            core.audit_denied(None, request.api_key, "auth.api_key", exc.reason, time.time())
            _audited.set(True)
            raise
        return wire.authenticate_msg(q)

    async def GetInventory(self, request: broker_pb2.GetInventoryRequest,
                           context: grpc.aio.ServicerContext) -> broker_pb2.GetInventoryResponse:
        core, p = await self._caller(context)
        free_mask = core.allocator.owner < 0 if core.allocator is not None else None
        free = int(free_mask.sum()) if free_mask is not None else 0
        free_ranges = []
        if p.privileged and free_mask is not None:
            free_ranges = wire.device_ranges(DeviceSet.from_mask(free_mask))
        return broker_pb2.GetInventoryResponse(
            free=free_ranges,
            cluster=core.cluster, fabric_endpoint=self.svc.config.fabric, free_devices=free,
            shards=[wire.shard_msg(s.endpoint, s.chip_type, s.start, s.end, s.system, s.chips_per_domain)
                    for s in core.shards],
        )

    async def AllocateInstance(self, request: broker_pb2.AllocateInstanceRequest,
                               context: grpc.aio.ServicerContext) -> broker_pb2.AllocateInstanceResponse:
        core, p = await self._caller(context)
        if request.tenant:
            tenant_id_of(request.tenant, "tenant")
        devices = None
        if request.devices:
            if len(request.devices) > core.limits.max_device_ranges:
                raise InvalidArgument("devices", f"at most {core.limits.max_device_ranges} ranges, "
                                                 f"got {len(request.devices)}")
            devices = core.device_set(p, [(int(r.start), int(r.end)) for r in request.devices])
        rec, token, exp = core.allocate(p, chip_type=request.chip_type, count=int(request.count),
                                        topology=int(request.topology), purpose=request.purpose,
                                        on_behalf=request.tenant, devices=devices)
        self.svc.telemetry.publish("events", {"event": "instance_allocated", "instance": rec.name,
                                              "tenant": f"tenants/{rec.alloc.tenant}",
                                              "devices": len(rec.alloc.devices)})
        return broker_pb2.AllocateInstanceResponse(instance=_instance_msg(rec), capability=token,
                                                   capability_expires_s=exp)

    async def GetInstance(self, request: broker_pb2.GetInstanceRequest,
                          context: grpc.aio.ServicerContext) -> broker_pb2.GetInstanceResponse:
        core, p = await self._caller(context)
        return broker_pb2.GetInstanceResponse(instance=_instance_msg(core.get_instance(p, request.name)))

    async def ListInstances(self, request: broker_pb2.ListInstancesRequest,
                            context: grpc.aio.ServicerContext) -> broker_pb2.ListInstancesResponse:
        core, p = await self._caller(context)
        items, token = convert.page(core.list_instances(p), request.page_size, request.page_token)
        return broker_pb2.ListInstancesResponse(instances=[_instance_msg(r) for r in items],  # type: ignore[arg-type]
                                                next_page_token=token)

    async def ReleaseInstance(self, request: broker_pb2.ReleaseInstanceRequest,
                              context: grpc.aio.ServicerContext) -> broker_pb2.ReleaseInstanceResponse:
        core, p = await self._caller(context)
        rec = core.release(p, request.name)
        scrub_s, ok = await self.svc.scrub(rec)
        if ok:
            core.finish_release(rec.alloc.instance)
        self.svc.telemetry.publish("events", {"event": "instance_released", "instance": rec.name,
                                              "tenant": f"tenants/{rec.alloc.tenant}", "scrub_s": scrub_s})
        return broker_pb2.ReleaseInstanceResponse(scrub_s=scrub_s)

    async def RefreshCapability(self, request: broker_pb2.RefreshCapabilityRequest,
                                context: grpc.aio.ServicerContext) -> broker_pb2.RefreshCapabilityResponse:
        core, p = await self._caller(context)
        if p.kind == "admin":
            # A capability opens the instance's memory; the admin operates instances, never reads them.
            raise PermissionDenied("the admin cannot take capabilities of a tenant's instance", reason="NO_DATA_ACCESS")
        rec = core.get_instance(p, request.instance)
        token, exp = core.capability(rec)
        return broker_pb2.RefreshCapabilityResponse(capability=token, capability_expires_s=exp)

    async def GetVerificationKeys(self, request: broker_pb2.GetVerificationKeysRequest,
                                  context: grpc.aio.ServicerContext) -> broker_pb2.GetVerificationKeysResponse:
        core, _ = await self._caller(context)
        return wire.verification_keys_msg(core.cluster, {core.issuer.key_id: core.issuer.public_key_pem().decode()},
                                          core.verifier.revocations())
