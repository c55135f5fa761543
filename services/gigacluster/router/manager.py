"""The router's deployments: create, place through the broker, persist, restore after a restart, delete.

Deployments are named per tenant (two tenants may both run ``deployments/llama3-8b``; the admin
names one as ``tenants/<t>/deployments/<id>``) and persisted in ``<state_dir>/router.db`` with the
broker instances backing them. On start the router reloads them, re-acquires each instance's
capability, rebuilds the replicas (replacing instances the broker lost), releases every router
instance no deployment owns, and only then reports SERVING.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

import grpc
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.errors import AlreadyExists, DomainError, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from gigacluster.hw.catalog import default_system, get_system
from gigacluster.inference.engine import ReplicaConfig
from gigacluster.inference.policies import make_policy
from gigacluster.model import DoesNotFitError
from gigacluster.router.deployment import Binding, KvTransport, Lease, LiveDeployment, ReacquireFn, Replica
from gigacluster.router.messages import DeploySpec, deploy_spec, shard_endpoint, shard_ranges
from gigacluster.router.moe_traffic import A2aTraffic
from gigacluster.router.placement import place_disaggregated
from gigacluster.router.store import DeploymentStore, StoredDeployment
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, Principal, call_metadata
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.config import RouterConfig

log = structlog.get_logger()
DEPLOYMENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
# Purposes of the broker instances this router allocates (and may release when no deployment owns them).
ROUTER_PURPOSE_RE = re.compile(r"^(tenants/[^/]+/)?deployments/")
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
HealthSetter = Callable[[Any], Awaitable[None]]


class Named(Protocol):
    """What :func:`find_visible` needs of a deployment (the core's, or a front end's view of one)."""

    @property
    def tenant(self) -> str: ...
    @property
    def deployment_id(self) -> str: ...
    @property
    def qualified_name(self) -> str: ...


D = TypeVar("D", bound=Named)


def _topology(cfg: ReplicaConfig) -> broker_pb2.TopologyConstraint:
    """One scale-up domain for a replica that fits in one; a wide-EP replica spans several (its
    all-to-all then crosses the scale-out network, priced in the iteration time)."""
    if cfg.chips <= get_system(default_system(cfg.chip)).chips:
        return broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN
    return broker_pb2.TOPOLOGY_CONSTRAINT_CONTIGUOUS


def find_visible(deployments: Mapping[str, D], p: Principal, name: str) -> D:
    """The deployment of ``deployments`` (by ``DeploymentStore.key``) that ``name`` names for ``p``: NOT_FOUND
    for another tenant's (never a hint it exists).

    ``deployments/<id>`` (or ``<id>``) is the caller's own; the admin may also name any deployment
    as ``tenants/<t>/deployments/<id>`` (needed when two tenants use the same id).
    """
    if not name:
        raise InvalidArgument("model", "required: a deployment name (e.g. deployments/llama3-8b)")
    short = name[:80]
    if name.startswith("tenants/"):
        tenant, sep, did = name.partition("/deployments/")
        dep = deployments.get(DeploymentStore.key(tenant, did)) if sep else None
        if dep is None or (not p.privileged and dep.tenant != p.tenant):
            raise NotFound(short)
        return dep
    did = name.removeprefix("deployments/")
    if not p.privileged:
        dep = deployments.get(DeploymentStore.key(p.tenant, did))
        if dep is None:
            raise NotFound(f"deployments/{did[:64]}")
        return dep
    found = [d for d in deployments.values() if d.deployment_id == did]
    if not found:
        raise NotFound(f"deployments/{did[:64]}")
    if len(found) > 1:
        raise InvalidArgument("model", f"deployments/{did} exists for several tenants: name one as "
                                       f"{found[0].qualified_name}")
    return found[0]


class DeploymentManager:
    """Every deployment of the router, by ``DeploymentStore.key(tenant, id)``, and the broker calls behind them."""

    def __init__(self, config: RouterConfig, auth: BrokerAuth, clock: VirtualClock, set_health: HealthSetter) -> None:
        self.config = config
        self.auth = auth
        self.clock = clock
        self.set_health = set_health
        self.deployments: dict[str, LiveDeployment] = {}
        self._deleting: dict[str, asyncio.Future[None]] = {}  # deletions under way, by the same key
        self.store = DeploymentStore(pathlib.Path(config.state_dir) / "router.db" if config.state_dir else None)
        self.reconciled = asyncio.Event()
        self._restoring: dict[str, tuple[DeploySpec, tuple[str, ...]]] = {}
        self._kept: set[str] = set()  # instances of stored deployments that could not be rebuilt
        self.on_lag: Callable[[float], None] = lambda lag_s: None  # given to every replica (router-wide admission)

    def _smd(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(api_key=self.config.service_key)

    @property
    def broker(self) -> broker_pb2_grpc.BrokerServiceStub:
        return self.auth.stub

    async def close(self) -> None:
        for d in self.deployments.values():
            await d.close()
        self.store.close()

    async def deploy(self, p: Principal, request: router_pb2.DeployModelRequest) -> LiveDeployment:
        did = request.deployment_id
        if not DEPLOYMENT_ID_RE.match(did or ""):
            raise InvalidArgument("deployment_id", f"must be 1-63 of a-z, 0-9, '-', '.', got {did[:64]!r}")
        if not self.reconciled.is_set():
            raise Unavailable("the router is restoring its deployments after a restart; retry in a moment")
        key = DeploymentStore.key(p.tenant, did)
        spec = deploy_spec(request, self.config)
        existing = self.deployments.get(key)
        if existing is not None:
            # The same request again (a client retrying after a lost answer, or `up` after a restart)
            # gets the deployment it created; a failed one is placed afresh. A different one is refused.
            if router_pb2.DeployModelRequest.FromString(existing.request) != request:
                raise AlreadyExists(f"deployments/{did} already exists with a different spec")
            if existing.state != "failed":
                return existing
            await self.undeploy(existing)
            if key in self.deployments:  # another call re-created it meanwhile
                return self.deployments[key]
        dep = LiveDeployment(did, p.tenant, spec.cfg, make_policy(spec.policy), spec.policy,
                             seq=self.store.next_seq(), created_s=time.time())
        dep.request = request.SerializeToString()
        self.deployments[key] = dep
        self._persist(dep)  # before any allocation: a crash from here on leaks nothing (reconcile releases)
        try:
            inv = await self.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=self._smd(), timeout=10)
            await self._place(dep, spec, inv, range(0 if spec.n_pre else spec.replicas))
        except (ResourceExhausted, DoesNotFitError):
            await self.undeploy(dep)
            raise
        except grpc.aio.AioRpcError as err:
            await self.undeploy(dep)
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise ResourceExhausted(f"cannot place {spec.replicas} replicas of {spec.cfg.chips} {request.chip}: "
                                        f"{err.details()}") from err
            raise Unavailable(f"broker refused the replicas ({err.code().name}): {err.details()}") from err
        dep.state = "ready"
        log.info("deployed", deployment=dep.qualified_name, seq=dep.seq, replicas=spec.replicas, chip=request.chip,
                 tp=spec.cfg.tp, ep=spec.cfg.ep, kv_cache_bytes=spec.cfg.kv_cache_bytes)
        return dep

    def _persist(self, dep: LiveDeployment) -> None:
        self.store.save(StoredDeployment(dep.seq, dep.tenant, dep.deployment_id, dep.request,
                                         tuple(dep.leases), dep.created_s))

    async def _place(self, dep: LiveDeployment, spec: DeploySpec, inv: Any, indices: Iterable[int]) -> None:
        """Allocate instances for the colocated replicas ``indices`` (or the whole disaggregated set)."""
        if spec.n_pre:
            await self._deploy_disaggregated(dep, spec.cfg.chip, inv, spec.n_pre, spec.n_dec)
            return
        for i in indices:
            resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type=spec.cfg.chip, count=spec.cfg.chips, topology=_topology(spec.cfg),
                purpose=dep.purpose, tenant=dep.tenant), metadata=self._smd(), timeout=30)
            await self._unless_deleted(dep, resp.instance.name)
            lease = dep.lease(resp.instance.name, resp.capability, resp.capability_expires_s, self._refresh)
            self._persist(dep)
            self._add_replica(dep, i, spec.cfg, resp.instance.name, convert.ranges(resp.instance.devices), inv,
                              lease)

    def _add_replica(self, dep: LiveDeployment, i: int, cfg: ReplicaConfig, instance: str,
                     devs: list[tuple[int, int]], inv: Any, lease: Lease) -> None:
        rep = Replica(i, cfg, instance=instance, devices=devs, endpoint=shard_endpoint(inv, devs), lease=lease,
                      clock=self.clock, heal_backoff_max_s=self.config.heal_backoff_max_s,
                      report_max_iterations=self.config.report_max_iterations, shards=shard_ranges(inv, devs),
                      # On the event clock a report is part of the mesh's work at its virtual time: never deferred.
                      report_interval_s=0.0 if isinstance(self.clock, EventClock) else self.config.report_interval_s,
                      run_ahead_max=self.config.run_ahead_iterations if isinstance(self.clock, EventClock) else 0)
        if cfg.role == "both":  # a colocated replica owns its instance alone, so it can move to a new one
            rep.reacquire = self._reacquirer(dep)
        rep.on_lag = self.on_lag
        if cfg.ep > 1:
            rep.a2a = A2aTraffic(cfg, KvTransport(inv.fabric_endpoint, lambda: rep.lease(), self.clock),
                                 lambda: rep.devices, tag=f"a2a:{dep.name}:{i}")
        dep.add(rep)

    def _reacquirer(self, dep: LiveDeployment) -> ReacquireFn:
        async def reacquire(rep: Replica) -> Binding:
            """A new instance for ``rep`` when the broker no longer knows its own."""
            inv = await self.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=self._smd(), timeout=10)
            resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type=dep.cfg.chip, count=dep.cfg.chips, topology=_topology(dep.cfg),
                purpose=dep.purpose, tenant=dep.tenant), metadata=self._smd(), timeout=30)
            await self._unless_deleted(dep, resp.instance.name)
            old = dep.leases.pop(rep.instance, None)
            if old is not None:
                await old.close()
            lease = dep.lease(resp.instance.name, resp.capability, resp.capability_expires_s, self._refresh)
            self._persist(dep)
            devs = convert.ranges(resp.instance.devices)
            return Binding(resp.instance.name, devs, shard_endpoint(inv, devs), lease, tuple(shard_ranges(inv, devs)))
        return reacquire

    async def _deploy_disaggregated(self, dep: LiveDeployment, chip: str, inv: Any, n_pre: int, n_dec: int) -> None:
        """One instance of exact devices for all replicas, so one capability covers every KV transfer."""
        tp = dep.cfg.chips  # a replica's chips (tp, or ep for an expert-parallel MoE replica)
        shards = [s for s in inv.shards if s.chip_type == chip]
        domain = shards[0].chips_per_domain if shards else get_system(default_system(chip)).chips
        in_chip = [(max(a, s.devices.start), min(b, s.devices.end)) for a, b in convert.ranges(inv.free)
                   for s in shards if a < s.devices.end and b > s.devices.start]
        prefill, decode = place_disaggregated(in_chip, domain, tp, n_pre, n_dec)
        resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
            chip_type=chip, count=(n_pre + n_dec) * tp, topology=broker_pb2.TOPOLOGY_CONSTRAINT_NONE,
            purpose=dep.purpose, tenant=dep.tenant,
            devices=convert.range_msgs([(g, g + tp) for g in prefill + decode])), metadata=self._smd(), timeout=30)
        await self._unless_deleted(dep, resp.instance.name)
        lease = dep.lease(resp.instance.name, resp.capability, resp.capability_expires_s, self._refresh)
        self._persist(dep)
        self._add_disaggregated(dep, resp.instance.name, prefill + decode, n_pre, inv, lease)

    def _add_disaggregated(self, dep: LiveDeployment, instance: str, starts: list[int], n_pre: int, inv: Any,
                           lease: Lease) -> None:
        cfg = dep.cfg
        pcfg = dataclasses.replace(cfg, role="prefill")
        dcfg = dataclasses.replace(cfg, role="decode")
        dep.transport = KvTransport(inv.fabric_endpoint, lease, self.clock)
        for i, g in enumerate(starts):
            self._add_replica(dep, i, pcfg if i < n_pre else dcfg, instance, [(g, g + cfg.chips)], inv, lease)

    async def _refresh(self, instance: str) -> tuple[str, float]:
        r = await self.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=instance),
                                                metadata=self._smd(), timeout=10)
        return str(r.capability), float(r.capability_expires_s)

    # ----- restart: reload the store, reconcile with the broker and the chips, then serve -----

    async def reconcile(self) -> None:
        """Restore every stored deployment and release every router instance none of them owns.

        Deployments are visible (DEPLOYING, with a reason) from the first moment; the broker is
        retried with backoff until it answers; health says SERVING only once this is done.
        """
        for sd in self.store.load():
            try:
                req = router_pb2.DeployModelRequest.FromString(sd.request)
                spec = deploy_spec(req, self.config)
            except (DecodeError, DomainError) as exc:
                # Written under other bounds or by another version: keep its instances (never release
                # what a client was told about), and say why it is not served.
                log.error("stored deployment unreadable; its instances stay held", deployment=sd.deployment_id,
                          instances=list(sd.instances), error=str(exc)[:200])
                self._kept.update(sd.instances)
                continue
            # A row from before creation times were kept gets the restore time (then persisted by _restore).
            dep = LiveDeployment(sd.deployment_id, sd.tenant, spec.cfg, make_policy(spec.policy), spec.policy,
                                 seq=sd.seq, created_s=sd.created_s or time.time())
            dep.request = sd.request
            dep.reason = "restoring after a router restart"
            self.deployments[DeploymentStore.key(sd.tenant, sd.deployment_id)] = dep
            self._restoring[dep.qualified_name] = (spec, sd.instances)
        delay = 0.2
        while True:
            try:
                await self._reconcile_once()
                break
            except grpc.aio.AioRpcError as err:
                log.warning("reconcile: broker unavailable; retrying", code=err.code().name, retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.reconciled.set()
        await self.set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("reconciled", deployments=len(self.deployments))

    async def _set_health(self, status: Any) -> None:
        health = getattr(self, "health", None)  # set by create_server; absent in unit tests
        if health is not None:
            for name in ("", router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name):
                await health.set(name, status)

    async def _reconcile_once(self) -> None:
        inv = await self.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=self._smd(), timeout=10)
        for qname, (spec, instances) in list(self._restoring.items()):
            dep = next(d for d in self.deployments.values() if d.qualified_name == qname)
            try:
                await self._restore(dep, spec, instances, inv)
            except (DomainError, grpc.aio.AioRpcError) as exc:
                if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in RETRYABLE:
                    # Start this deployment over on the next attempt, from every instance it holds now.
                    self._restoring[qname] = (spec, tuple(dict.fromkeys([*instances, *dep.leases])))
                    await dep.close()
                    dep.replicas.clear()
                    dep.leases.clear()
                    dep.transport = None
                    raise
                dep.state, dep.reason = "failed", f"could not be restored after a router restart: {exc}"[:300]
                log.error("restore failed", deployment=qname, error=dep.reason)
            del self._restoring[qname]
        owned = self._kept | {i for d in self.deployments.values() for i in d.leases}
        token = ""
        orphans = []
        while True:
            r = await self.broker.ListInstances(broker_pb2.ListInstancesRequest(page_size=1000, page_token=token),
                                                metadata=self._smd(), timeout=10)
            orphans += [i.name for i in r.instances if ROUTER_PURPOSE_RE.match(i.purpose) and i.name not in owned]
            token = r.next_page_token
            if not token:
                break
        for name in orphans:
            await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=name), metadata=self._smd(),
                                              timeout=30)
            log.warning("released an instance no deployment owns", instance=name)

    async def _restore(self, dep: LiveDeployment, spec: DeploySpec, instances: tuple[str, ...], inv: Any) -> None:
        """Re-acquire each stored instance's capability and rebuild its replicas; replace lost instances."""
        alive: list[tuple[str, list[tuple[int, int]], str, float]] = []
        for name in instances:
            try:
                got = await self.broker.GetInstance(broker_pb2.GetInstanceRequest(name=name), metadata=self._smd(),
                                                    timeout=10)
                if got.instance.purpose != dep.purpose:
                    # Same name, someone else's instance (a broker that reused ids): never touch it.
                    log.warning("stored instance now belongs to something else; replacing it",
                                deployment=dep.qualified_name, instance=name, purpose=got.instance.purpose[:100])
                    continue
                cap = await self.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=name),
                                                          metadata=self._smd(), timeout=10)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                log.warning("stored instance is gone; replacing it", deployment=dep.qualified_name, instance=name)
                continue
            alive.append((name, convert.ranges(got.instance.devices), cap.capability, cap.capability_expires_s))
        if spec.n_pre:
            if alive:
                name, devs, token, exp = alive[0]
                starts = [g for a, b in devs for g in range(a, b, dep.cfg.chips)]  # prefill groups sit lowest
                self._add_disaggregated(dep, name, starts, spec.n_pre, inv,
                                        dep.lease(name, token, exp, self._refresh))
            else:
                await self._place(dep, spec, inv, ())
        else:
            for i, (name, devs, token, exp) in enumerate(alive[: spec.replicas]):
                self._add_replica(dep, i, spec.cfg, name, devs, inv, dep.lease(name, token, exp, self._refresh))
            await self._place(dep, spec, inv, range(len(dep.replicas), spec.replicas))
        self._persist(dep)  # instances lost and replaced, or surplus ones left to the orphan sweep
        dep.state, dep.reason = "ready", ""
        log.info("deployment restored", deployment=dep.qualified_name, replicas=len(dep.replicas),
                 replaced=len(dep.leases) - len(alive))

    async def undeploy(self, dep: LiveDeployment) -> None:
        """Delete ``dep``; a second delete while one is under way waits for it (deleting is idempotent), and a
        caller that goes away does not cut the deletion short."""
        key = DeploymentStore.key(dep.tenant, dep.deployment_id)
        fut = self._deleting.get(key)
        if fut is None:
            fut = self._deleting[key] = asyncio.ensure_future(self._undeploy(dep))
            fut.add_done_callback(lambda _f: self._deleting.pop(key, None))
        await asyncio.shield(fut)

    async def _undeploy(self, dep: LiveDeployment) -> None:
        dep.state = "deleting"
        await dep.close()
        self.store.delete(dep.tenant, dep.deployment_id)  # first: an instance left behind is an orphan now
        for inst in list(dep.leases):
            await self._release(inst)
        self.deployments.pop(DeploymentStore.key(dep.tenant, dep.deployment_id), None)

    async def _unless_deleted(self, dep: LiveDeployment, instance: str) -> None:
        """Release a just-allocated instance of a deployment deleted while the allocation was in flight."""
        if dep.state == "deleting":
            await self._release(instance)
            raise Unavailable(f"{dep.name} was deleted while it deployed")

    async def _release(self, instance: str) -> None:
        try:
            await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=instance),
                                              metadata=self._smd(), timeout=30)
        except grpc.aio.AioRpcError as err:
            log.warning("release failed; the next reconcile releases it", instance=instance, error=err.details())

    def visible(self, p: Principal, name: str) -> LiveDeployment:
        """The deployment ``name`` names for ``p`` (:func:`find_visible`)."""
        return find_visible(self.deployments, p, name)

    def owned_by(self, p: Principal) -> list[LiveDeployment]:
        return [d for d in self.deployments.values() if p.privileged or d.tenant == p.tenant]
