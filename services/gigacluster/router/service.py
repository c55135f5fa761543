"""The router's gRPC layer: deployments (replicas held through the broker) and Generate.

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
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc
import numpy as np
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2
from prometheus_client.core import HistogramMetricFamily

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import (
    AlreadyExists,
    DomainError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from gigacluster.hw.catalog import chip_names, default_system, get_system
from gigacluster.inference.engine import ReplicaConfig, Request, RequestSummary
from gigacluster.inference.errors import AdmissionError
from gigacluster.inference.outputs import MAX_STOP_SEQUENCES, eos_after, find_stop
from gigacluster.inference.policies import POLICIES, make_policy
from gigacluster.inference.tokenizer import Tokenizer
from gigacluster.model import DoesNotFitError
from gigacluster.model.arch import ARCH_FIELDS, arch_from_dict
from gigacluster.router.deployment import (
    Binding,
    KvTransport,
    Lease,
    LiveDeployment,
    ReacquireFn,
    Replica,
    ReplicaFailed,
    Stream,
)
from gigacluster.router.http import OpenAIServer  # http imports this module only to type-check
from gigacluster.router.placement import place_disaggregated
from gigacluster.router.store import DeploymentStore, StoredDeployment
from gigacluster.router.v1 import router_pb2, router_pb2_grpc
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, Principal, call_metadata, rate_limiter
from gigacluster.runtime.config import RouterConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.metrics import FunctionCollector, counter, gauge
from gigacluster.runtime.server import Service
from gigacluster.security.ratelimit import TenantRateLimiter

log = structlog.get_logger()
DEPLOYMENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
MAX_NAME_CHARS = 64  # preset and chip names: refused before lookup, so no error echoes a long one
STATES = {"deploying": 1, "ready": 2, "failed": 3, "deleting": 4, "degraded": 5}
# Purposes of the broker instances this router allocates (and may release when no deployment owns them).
ROUTER_PURPOSE_RE = re.compile(r"^(tenants/[^/]+/)?deployments/")
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


@dataclasses.dataclass(frozen=True)
class DeploySpec:
    """A validated DeployModelRequest: replica config, routing policy and replica counts."""

    cfg: ReplicaConfig
    policy: str
    replicas: int
    n_pre: int
    n_dec: int


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Tokens of one request produced together (one GenerateResponse, one SSE event)."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    time_s: float
    replica: str
    finish_reason: str = ""
    summary: RequestSummary | None = None
    prefill_replica: str = ""
    kv_transfer_bytes: float = 0.0


class Generation:
    """A routed request: iterate :meth:`chunks` for its tokens. Used by gRPC Generate and the HTTP API.

    ``stop_chars`` (when a stop string ends the output) cuts the text there: the tokens that make
    up the stop string are generated and counted, their text is not returned (as OpenAI's).
    """

    def __init__(self, dep: LiveDeployment, stream: Stream, tok: Tokenizer, prompt_tokens: int,
                 stop_chars: int | None = None) -> None:
        self.dep = dep
        self.stream = stream
        self.tok = tok
        self.request_id = stream.req.id
        self.prompt_tokens = prompt_tokens
        self.stop_chars = stop_chars
        self.done = False
        self._chars = 0  # characters of text returned so far
        self.generated = 0  # tokens returned so far

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Token chunks until the last; raises ResourceExhausted (shed) or Unavailable (chips failed)."""
        st, dep, done = self.stream, self.dep, False
        try:
            while not done:
                batch = [await st.queue.get()]
                while not st.queue.empty():
                    batch.append(st.queue.get_nowait())
                errs = [e for e in batch if isinstance(e, Exception)]
                if errs:
                    if isinstance(errs[0], AdmissionError):
                        raise ResourceExhausted(f"shed by a higher-priority request: {errs[0]}",
                                                retry_after_s=errs[0].retry_after_s)
                    raise Unavailable(str(errs[0]))
                toks = [e for e in batch if not isinstance(e, Exception)]
                last = toks[-1]
                done = self.done = last.finished
                ids = [t.token_id for t in toks]
                text = self.tok.decode(ids)
                if self.stop_chars is not None:
                    text = text[: max(0, self.stop_chars - self._chars)]
                self._chars += len(text)
                self.generated += len(ids)
                yield Chunk(
                    request_id=self.request_id, index=toks[0].index, token_ids=ids, text=text,
                    time_s=last.time_s, replica=f"{dep.name}/replicas/{st.owner.index}",
                    finish_reason=(last.finish_reason or "length") if done else "",
                    summary=last.summary if done else None,
                    prefill_replica=f"{dep.name}/replicas/{st.prefill_replica}" if st.prefill_replica >= 0 else "",
                    kv_transfer_bytes=st.kv_transfer_bytes)
        finally:
            if not done:
                st.close()

    def close(self) -> None:
        """Drop the request if it has not finished (the client went away)."""
        if not self.done:
            self.stream.close()


class RouterService(Service[RouterConfig]):
    name = "router"

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self.auth = BrokerAuth(config.broker, cluster=config.cluster, service_key=config.service_key,
                               limiter=rate_limiter(config.rate_ops_per_s, config.rate_ops_burst))
        self.deployments: dict[str, LiveDeployment] = {}  # by DeploymentStore.key(tenant, id)
        self._deleting: dict[str, asyncio.Future[None]] = {}  # deletions under way, by the same key
        self.store = DeploymentStore(pathlib.Path(config.state_dir) / "router.db" if config.state_dir else None)
        self.reconciled = asyncio.Event()
        self._restoring: dict[str, tuple[DeploySpec, tuple[str, ...]]] = {}
        self._kept: set[str] = set()  # instances of stored deployments that could not be rebuilt
        self._alerts: dict[str, str] = {}
        self._loss_events: dict[str, int] = {}
        self.registry.register(FunctionCollector(self.metrics))
        self._tokenizers: dict[int, Tokenizer] = {}
        self._lock = asyncio.Lock()
        self.http: Any = None

    def rpc_limiter(self) -> TenantRateLimiter | None:
        return self.auth.limiter

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(self), server)
        return [router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name]

    async def start(self) -> None:
        await super().start()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)  # until the deployments are back
        self.spawn(self._reconcile(), "reconcile")
        self.every(self.config.telemetry_interval_s, self._publish, "stats")
        if self.config.http_port >= 0:
            self.http = OpenAIServer(self)
            port = await self.http.start(self.config.host, self.config.http_port)
            log.info("openai endpoint", url=f"http://{self.config.host}:{port}/v1")

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.stop()
        for d in self.deployments.values():
            await d.close()
        await super().stop()
        await self.auth.close()
        self.store.close()

    def tokenizer(self, vocab: int) -> Tokenizer:
        if vocab not in self._tokenizers:
            self._tokenizers[vocab] = Tokenizer(vocab)
        return self._tokenizers[vocab]

    def _smd(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(api_key=self.config.service_key)

    @property
    def broker(self) -> broker_pb2_grpc.BrokerServiceStub:
        return self.auth.stub

    def metrics(self) -> list[Any]:
        """vLLM-named metrics per deployment (label model_name), plus deployment slowdown vs the model."""
        hist = {k: HistogramMetricFamily(n, doc, labels=["model_name", "tenant"]) for k, n, doc in (
            ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
            ("itl", "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."),
            ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds."),
            ("queue", "vllm:request_queue_time_seconds", "Histogram of time spent waiting in the queue."))}
        itl_alias = HistogramMetricFamily("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.",
                                          labels=["model_name", "tenant"])
        # model_name as vLLM names it; tenant too, since deployment ids are per tenant.
        lbl = ["model_name", "tenant"]
        g = {n: gauge(n, doc, lbl) for n, doc in (
            ("vllm:num_requests_running", "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
            ("vllm:gpu_prefix_cache_hit_rate", "Prefix cache hit rate (tokens)."),
            ("gigacluster_deployment_slowdown", "How much slower than its model the deployment runs (0 = on model)."),
        )}
        # Totals only grow: counters, as vLLM types them (rate() needs it).
        c = {n: counter(n, doc, lbl) for n, doc in (
            ("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
            ("vllm:generation_tokens_total", "Number of generation tokens processed."),
            ("vllm:request_success_total", "Count of successfully processed requests."),
        )}
        for d in list(self.deployments.values()):
            if d.health()[0] not in ("ready", "degraded"):
                continue
            m = [d.deployment_id, d.tenant]
            for k, fam in hist.items():
                d.prom[k].family("", "", [], m, into=fam)
            d.prom["itl"].family("", "", [], m, into=itl_alias)
            stats = [r.engine.stats() for r in d.replicas]
            mt = d.metrics
            g["vllm:num_requests_running"].add_metric(m, float(sum(s.running for s in stats)))
            g["vllm:num_requests_waiting"].add_metric(m, float(sum(s.queue_depth for s in stats)))
            g["vllm:gpu_cache_usage_perc"].add_metric(m, float(np.mean([s.kv_used_frac for s in stats]))
                                                      if stats else 0.0)
            hit = sum(s.prefix_hit_tokens for s in stats)
            look = sum(s.prefix_lookup_tokens for s in stats)
            g["vllm:gpu_prefix_cache_hit_rate"].add_metric(m, hit / look if look else 0.0)
            c["vllm:prompt_tokens_total"].add_metric(m, float(mt.prompt_tokens))
            c["vllm:generation_tokens_total"].add_metric(m, float(mt.output_tokens))
            c["vllm:request_success_total"].add_metric(m, float(mt.requests))
            perf = d.performance()
            g["gigacluster_deployment_slowdown"].add_metric(m, perf[0] if perf else 0.0)
        loss = counter("gigacluster_deployment_performance_loss_events_total",
                       "Deployment slowdowns flagged, by cause.", ["cause"])
        for cause, n in sorted(self._loss_events.items()):
            loss.add_metric([cause], float(n))
        return [*hist.values(), itl_alias, *g.values(), *c.values(), loss]

    def check_performance(self, d: LiveDeployment) -> None:
        """Publish an alert when a deployment starts running slower than its model (or recovers)."""
        perf = d.performance()
        key = perf[1] if perf else ""
        if key == self._alerts.get(d.qualified_name, ""):
            return
        self._alerts[d.qualified_name] = key
        tenant = d.tenant.removeprefix("tenants/")
        if perf is None:
            self.telemetry.publish(f"tenants/{tenant}/deployments/{d.deployment_id}/alerts", {
                "deployment": d.name, "event": "performance_recovered", "t_s": self.clock.now()})
            return
        slowdown, cause, detail = perf
        self._loss_events[cause] = self._loss_events.get(cause, 0) + 1
        log.warning("deployment performance loss", deployment=d.name, cause=cause, slowdown=slowdown)
        self.telemetry.publish(f"tenants/{tenant}/deployments/{d.deployment_id}/alerts", {
            "deployment": d.name, "event": "performance_loss", "cause": cause, "detail": detail,
            "slowdown": slowdown, "t_s": self.clock.now()})

    async def _publish(self) -> None:
        for d in list(self.deployments.values()):
            if d.state != "ready":
                continue
            self.check_performance(d)
            s = d.stats_snapshot()
            tenant = d.tenant.removeprefix("tenants/")
            self.telemetry.publish(f"tenants/{tenant}/deployments/{d.deployment_id}/stats", {
                "deployment": d.name, "t_s": self.clock.now(), "queue_depth": s["queue_depth"],
                "running": s["running"], "kv_cache_usage": s["kv_used_now"], "requests": s["requests"],
                "rejected": s["rejected"], "ttft_s": s["ttft_s"], "itl_s": s["itl_s"],
                "tokens_per_s": s["output_tokens_per_s"], "prefix_hit_rate": s["prefix_hit_rate"],
                "kv_transfers": s["kv_transfers"], "kv_transfer_bytes": s["kv_transfer_bytes"],
            })

    def _spec(self, request: Any) -> DeploySpec:
        """Validate a DeployModelRequest against the configured bounds (no work, no broker call)."""
        c = self.config
        if not request.HasField("model"):
            raise InvalidArgument("model", "required: a preset (e.g. llama3-8b) or an architecture")
        m = request.model
        if len(m.preset) > MAX_NAME_CHARS or len(request.chip) > MAX_NAME_CHARS:
            raise InvalidArgument("model.preset" if len(m.preset) > MAX_NAME_CHARS else "chip",
                                  f"at most {MAX_NAME_CHARS} characters")
        arch = arch_from_dict({"preset": m.preset, **{k: int(getattr(m, k)) for k in ARCH_FIELDS if getattr(m, k)}}
                              if m.preset else {k: int(getattr(m, k)) for k in ARCH_FIELDS if getattr(m, k)})
        if request.chip not in chip_names():
            raise InvalidArgument("chip", f"allowed: {', '.join(chip_names())}; got {request.chip[:64]!r}")
        tp = int(request.tp) or 1
        dom = get_system(default_system(request.chip)).chips
        if tp > dom:
            raise InvalidArgument("tp", f"must be <= {dom} (one {request.chip} scale-up domain), got {tp}")
        n_pre, n_dec = int(request.prefill_replicas), int(request.decode_replicas)
        if (n_pre > 0) != (n_dec > 0):
            raise InvalidArgument("decode_replicas" if n_pre else "prefill_replicas",
                                  "a disaggregated deployment needs both prefill_replicas and decode_replicas > 0")
        if n_pre and request.replicas not in (0, n_pre + n_dec):
            raise InvalidArgument("replicas", f"leave 0 (or {n_pre + n_dec}) with prefill/decode replicas, "
                                              f"got {request.replicas}")
        replicas = n_pre + n_dec or int(request.replicas) or 1
        if replicas > c.max_replicas:
            raise InvalidArgument("replicas", f"must be <= {c.max_replicas} (router max_replicas), got {replicas}")
        for field, value, limit in (("max_queue", int(request.max_queue), c.max_queue_limit),
                                    ("max_batch", int(request.max_batch), c.max_batch_limit)):
            if value > limit:
                raise InvalidArgument(field, f"must be <= {limit} (router {field}_limit), got {value}")
        policy_name = request.policy or "least_outstanding"
        if policy_name not in POLICIES:
            raise InvalidArgument("policy", f"allowed: {', '.join(sorted(POLICIES))}; got {policy_name[:64]!r}")
        kv = request.kv_fraction or 0.9
        if not 0 < kv <= 1:  # also refuses NaN
            raise InvalidArgument("kv_fraction", f"must be in (0, 1], got {kv}")
        cfg = ReplicaConfig(arch=arch, chip=request.chip, tp=tp,
                            precision=convert.precision_name(request.precision),
                            max_batch=int(request.max_batch) or 256, kv_fraction=kv,
                            max_queue=int(request.max_queue) or 1024, chunked_prefill=bool(request.chunked_prefill))
        return DeploySpec(cfg, policy_name, replicas, n_pre, n_dec)

    async def deploy(self, p: Principal, request: Any) -> LiveDeployment:
        did = request.deployment_id
        if not DEPLOYMENT_ID_RE.match(did or ""):
            raise InvalidArgument("deployment_id", f"must be 1-63 of a-z, 0-9, '-', '.', got {did[:64]!r}")
        if not self.reconciled.is_set():
            raise Unavailable("the router is restoring its deployments after a restart; retry in a moment")
        key = DeploymentStore.key(p.tenant, did)
        spec = self._spec(request)
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
                raise ResourceExhausted(f"cannot place {spec.replicas} replicas of {spec.cfg.tp} {request.chip}: "
                                        f"{err.details()}") from err
            raise Unavailable(f"broker refused the replicas ({err.code().name}): {err.details()}") from err
        dep.state = "ready"
        log.info("deployed", deployment=dep.qualified_name, seq=dep.seq, replicas=spec.replicas, chip=request.chip,
                 tp=spec.cfg.tp, kv_cache_bytes=spec.cfg.kv_cache_bytes)
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
                chip_type=spec.cfg.chip, count=spec.cfg.tp, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN,
                purpose=dep.purpose, tenant=dep.tenant), metadata=self._smd(), timeout=30)
            await self._unless_deleted(dep, resp.instance.name)
            lease = dep.lease(resp.instance.name, resp.capability, resp.capability_expires_s, self._refresh)
            self._persist(dep)
            self._add_replica(dep, i, spec.cfg, resp.instance.name, convert.ranges(resp.instance.devices), inv,
                              lease)

    def _add_replica(self, dep: LiveDeployment, i: int, cfg: ReplicaConfig, instance: str,
                     devs: list[tuple[int, int]], inv: Any, lease: Lease) -> None:
        rep = Replica(i, cfg, instance=instance, devices=devs, endpoint=_shard_endpoint(inv, devs), lease=lease,
                      clock=self.clock, heal_backoff_max_s=self.config.heal_backoff_max_s)
        if cfg.role == "both":  # a colocated replica owns its instance alone, so it can move to a new one
            rep.reacquire = self._reacquirer(dep)
        dep.add(rep)

    def _reacquirer(self, dep: LiveDeployment) -> ReacquireFn:
        async def reacquire(rep: Replica) -> Binding:
            """A new instance for ``rep`` when the broker no longer knows its own."""
            inv = await self.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=self._smd(), timeout=10)
            resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type=dep.cfg.chip, count=dep.cfg.tp, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN,
                purpose=dep.purpose, tenant=dep.tenant), metadata=self._smd(), timeout=30)
            await self._unless_deleted(dep, resp.instance.name)
            old = dep.leases.pop(rep.instance, None)
            if old is not None:
                await old.close()
            lease = dep.lease(resp.instance.name, resp.capability, resp.capability_expires_s, self._refresh)
            self._persist(dep)
            devs = convert.ranges(resp.instance.devices)
            return Binding(resp.instance.name, devs, _shard_endpoint(inv, devs), lease)
        return reacquire

    async def _deploy_disaggregated(self, dep: LiveDeployment, chip: str, inv: Any, n_pre: int, n_dec: int) -> None:
        """One instance of exact devices for all replicas, so one capability covers every KV transfer."""
        tp = dep.cfg.tp
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
            self._add_replica(dep, i, pcfg if i < n_pre else dcfg, instance, [(g, g + cfg.tp)], inv, lease)

    async def _refresh(self, instance: str) -> tuple[str, float]:
        r = await self.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=instance),
                                                metadata=self._smd(), timeout=10)
        return str(r.capability), float(r.capability_expires_s)

    # ----- restart: reload the store, reconcile with the broker and the chips, then serve -----

    async def _reconcile(self) -> None:
        """Restore every stored deployment and release every router instance none of them owns.

        Deployments are visible (DEPLOYING, with a reason) from the first moment; the broker is
        retried with backoff until it answers; health says SERVING only once this is done.
        """
        for sd in self.store.load():
            try:
                req = router_pb2.DeployModelRequest.FromString(sd.request)
                spec = self._spec(req)
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
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
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
                starts = [g for a, b in devs for g in range(a, b, dep.cfg.tp)]  # prefill groups sit lowest
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
        """The deployment ``name`` names for ``p``: NOT_FOUND for another tenant's (never a hint it exists).

        ``deployments/<id>`` (or ``<id>``) is the caller's own; the admin may also name any deployment
        as ``tenants/<t>/deployments/<id>`` (needed when two tenants use the same id).
        """
        if not name:
            raise InvalidArgument("model", "required: a deployment name (e.g. deployments/llama3-8b)")
        short = name[:80]
        if name.startswith("tenants/"):
            tenant, sep, did = name.partition("/deployments/")
            dep = self.deployments.get(DeploymentStore.key(tenant, did)) if sep else None
            if dep is None or (not p.privileged and dep.tenant != p.tenant):
                raise NotFound(short)
            return dep
        did = name.removeprefix("deployments/")
        if not p.privileged:
            dep = self.deployments.get(DeploymentStore.key(p.tenant, did))
            if dep is None:
                raise NotFound(f"deployments/{did[:64]}")
            return dep
        found = [d for d in self.deployments.values() if d.deployment_id == did]
        if not found:
            raise NotFound(f"deployments/{did[:64]}")
        if len(found) > 1:
            raise InvalidArgument("model", f"deployments/{did} exists for several tenants: name one as "
                                           f"{found[0].qualified_name}")
        return found[0]

    def owned_by(self, p: Principal) -> list[LiveDeployment]:
        return [d for d in self.deployments.values() if p.privileged or d.tenant == p.tenant]

    def generate(self, p: Principal, model: str, *, text: str | None = None, token_ids: Sequence[int] | None = None,
                 max_tokens: int | None = None, priority: int = 0, request_id: str = "",
                 stop: Sequence[str] = (), ignore_eos: bool = False, open_to_context: bool = False) -> Generation:
        """Bound, validate, route and admit one request (raises domain errors); the caller iterates its chunks.

        Every size is checked before any work: the prompt's bytes before it is tokenised (or its ids
        scanned), ``max_tokens`` against ``max_tokens_limit``. ``max_tokens`` None means the client
        set no limit: the output ends at an end-of-sequence drawn by :func:`outputs.eos_after`
        (unless ``ignore_eos``), capped by ``default_max_tokens`` or, with ``open_to_context``
        (chat, as vLLM), by the context left after the prompt (at most ``max_tokens_limit``).
        A ``stop`` string found in the output's text ends it there (finish_reason "stop").
        """
        c = self.config
        dep = self.visible(p, model)
        state, reason = dep.health()
        if state not in ("ready", "degraded"):
            raise Unavailable(f"{dep.name} is {state}{': ' + reason if reason else ''}; retry")
        arch = dep.cfg.arch
        if text is not None:
            # len(text) <= bytes <= 4 * len(text): the exact count only when it can matter.
            n_bytes = len(text) if len(text) > c.max_prompt_bytes else len(text.encode("utf-8", "surrogatepass"))
            if n_bytes > c.max_prompt_bytes:
                raise InvalidArgument("prompt", f"{n_bytes:,}+ bytes exceeds the router's max_prompt_bytes "
                                                f"({c.max_prompt_bytes:,})", limit="max_prompt_bytes")
            if not text:
                raise InvalidArgument("text", "must not be empty")
        elif token_ids is not None:
            if 4 * len(token_ids) > c.max_prompt_bytes or len(token_ids) > arch.seq_len:
                raise InvalidArgument("token_ids", f"{len(token_ids):,} ids exceed the model's context "
                                                   f"({arch.seq_len}) or max_prompt_bytes ({c.max_prompt_bytes:,} "
                                                   "at 4 bytes an id)", limit="max_prompt_bytes")
            if not token_ids:
                raise InvalidArgument("token_ids", "must hold at least one token")
        else:
            raise InvalidArgument("prompt", "give text or token_ids")
        open_ended = max_tokens is None
        if max_tokens is None:
            max_tokens = c.default_max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 < max_tokens <= c.max_tokens_limit:
            raise InvalidArgument("max_tokens", f"must be an integer in [1, {c.max_tokens_limit}], "
                                                f"got {str(max_tokens)[:32]}")
        if abs(priority) > 1000:
            raise InvalidArgument("priority", f"must be in [-1000, 1000], got {priority}")
        rid = request_id or uuid.uuid4().hex[:16]
        if len(rid) > 128:
            raise InvalidArgument("request_id", "at most 128 characters")
        if len(stop) > MAX_STOP_SEQUENCES or not all(isinstance(x, str) and x for x in stop):
            raise InvalidArgument("stop", f"must be up to {MAX_STOP_SEQUENCES} non-empty strings")
        tok = self.tokenizer(arch.vocab)
        if text is not None:
            prompt = np.asarray(tok.encode(text), dtype=np.int64)
        else:
            try:
                prompt = np.asarray(token_ids, dtype=np.int64)
            except (OverflowError, TypeError, ValueError) as exc:
                raise InvalidArgument("token_ids", f"ids must be integers in [0, {arch.vocab}) (the vocab)") from exc
            bad = (prompt < 0) | (prompt >= arch.vocab)
            if bad.any():
                raise InvalidArgument("token_ids", f"ids must be in [0, {arch.vocab}) (the vocab), "
                                                   f"got {int(prompt[bad][0])}")
        if open_ended and open_to_context:
            max_tokens = max(1, min(c.max_tokens_limit, arch.seq_len - len(prompt)))
        if len(prompt) + max_tokens > arch.seq_len:
            raise InvalidArgument("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) "
                                                f"exceeds the model's context of {arch.seq_len}")
        structlog.contextvars.bind_contextvars(request_id=rid)
        now = self.clock.now()
        # The prefix cache is salted with the CALLER, not the owner: the admin (or a service)
        # sending a tenant's prompt to its deployment never hits the tenant's cached blocks.
        salt = p.tenant if p.kind == "tenant" else f"principal:{p.kind}"
        eos = eos_after(rid) if open_ended and not ignore_eos else 0
        cut = find_stop(tok, rid, min(max_tokens, eos or max_tokens), stop)
        if cut is not None:
            eos = cut.tokens
        req = Request(id=rid, prompt_tokens=prompt, max_tokens=int(max_tokens), priority=int(priority),
                      arrival_s=now, tenant=dep.tenant, cache_salt=salt, eos_after=eos)
        try:
            _, stream = dep.route(req, now)
        except AdmissionError as exc:
            raise ResourceExhausted(f"{dep.name} is saturated: {exc}", retry_after_s=exc.retry_after_s) from exc
        except ReplicaFailed as exc:
            raise Unavailable(str(exc)) from exc
        return Generation(dep, stream, tok, len(prompt), cut.chars if cut is not None else None)


def _shard_endpoint(inv: Any, devs: list[tuple[int, int]]) -> str:
    """The endpoint of the chip shard holding the first of ``devs`` (from a GetInventory answer)."""
    for s in inv.shards:
        if s.devices.start <= devs[0][0] < s.devices.end:
            return str(s.endpoint)
    raise Unavailable(f"no chip shard in the inventory holds device {devs[0][0]}; retry")


def _arch_msg(dep: LiveDeployment) -> common_pb2.ModelArchitecture:
    a = dep.cfg.arch
    return common_pb2.ModelArchitecture(preset=a.name, layers=a.layers, hidden=a.hidden, heads=a.heads,
                                        kv_heads=a.kv_heads, ffn_hidden=a.ffn_hidden, vocab=a.vocab, seq_len=a.seq_len)


def deployment_msg(dep: LiveDeployment) -> router_pb2.Deployment:
    c = dep.cfg
    state, reason = dep.health()
    return router_pb2.Deployment(
        name=dep.name, tenant=dep.tenant, model=_arch_msg(dep), chip=c.chip, tp=c.tp, replicas=len(dep.replicas),
        max_batch=c.max_batch, kv_fraction=c.kv_fraction, precision=convert.PRECISION_ENUMS[c.precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
        policy=dep.policy_name, state=STATES[state], reason=reason,  # type: ignore[arg-type]
        instances=list(dict.fromkeys(r.instance for r in dep.replicas)),
        kv_cache_bytes_per_replica=int(c.kv_cache_bytes),
        max_queue=c.max_queue, prefill_replicas=len(dep.pool("prefill")), decode_replicas=len(dep.pool("decode")),
        chunked_prefill=c.chunked_prefill,
    )


def _summary(d: dict[str, float]) -> common_pb2.LatencySummary:
    return common_pb2.LatencySummary(count=int(d["count"]), p50_s=d["p50"], p90_s=d["p90"], p99_s=d["p99"],
                                     p999_s=d["p99.9"], mean_s=d["mean"], max_s=d["max"])


@grpc_errors(router_pb2_grpc.RouterServiceServicer)
class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, svc: RouterService) -> None:
        self.svc = svc

    async def _tenant(self, context: grpc.aio.ServicerContext) -> Principal:
        return await self.svc.auth.principal(context)

    async def DeployModel(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        if p.kind != "tenant":
            raise PermissionDenied("deployments belong to tenants: deploy with a tenant's API key",
                                   reason="TENANT_ONLY")
        dep = await self.svc.deploy(p, request)
        return router_pb2.DeployModelResponse(deployment=deployment_msg(dep))

    async def GetDeployment(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        return router_pb2.GetDeploymentResponse(deployment=deployment_msg(self.svc.visible(p, request.name)))

    async def ListDeployments(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        deps = self.svc.owned_by(p)
        items, token = convert.page(deps, request.page_size, request.page_token)
        return router_pb2.ListDeploymentsResponse(deployments=[deployment_msg(d) for d in items],  # type: ignore[arg-type]
                                                  next_page_token=token)

    async def DeleteDeployment(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        dep = self.svc.visible(p, request.name)
        if not self.svc.reconciled.is_set():
            raise Unavailable(f"{dep.name} is being restored after a router restart; retry")
        msg = deployment_msg(dep)
        await self.svc.undeploy(dep)
        msg.state = router_pb2.Deployment.STATE_DELETING
        return router_pb2.DeleteDeploymentResponse(deployment=msg)

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        which = request.WhichOneof("prompt")
        gen = self.svc.generate(
            p, request.model, text=request.text if which == "text" else None,
            token_ids=list(request.token_ids.ids) if which == "token_ids" else None,
            max_tokens=int(request.max_tokens) or None, priority=int(request.priority), request_id=request.request_id,
            stop=list(request.stop), ignore_eos=bool(request.ignore_eos))
        async for c in gen.chunks():
            resp = router_pb2.GenerateResponse(request_id=c.request_id, index=c.index, token_ids=c.token_ids,
                                               text=c.text, time_s=c.time_s, replica=c.replica,
                                               finish_reason=c.finish_reason)
            s = c.summary
            if s is not None:
                resp.usage.CopyFrom(router_pb2.GenerateUsage(
                    prompt_tokens=s.prompt_tokens, completion_tokens=s.output_tokens,
                    cached_prompt_tokens=s.cached_tokens, queue_s=s.queue_s, ttft_s=s.ttft_s, e2e_s=s.e2e_s,
                    kv_transfer_s=s.kv_transfer_s, kv_transfer_bytes=c.kv_transfer_bytes,
                    prefill_replica=c.prefill_replica, energy_j=s.energy_j))
            yield resp

    async def GetStats(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        deps = ([self.svc.visible(p, request.deployment)] if request.deployment else
                self.svc.owned_by(p))
        out = []
        for d in deps:
            s = d.stats_snapshot()
            out.append(router_pb2.DeploymentStats(
                deployment=d.name, ttft=_summary(s["ttft_s"]), tpot=_summary(s["tpot_s"]),  # type: ignore[arg-type]
                itl=_summary(s["itl_s"]), e2e=_summary(s["e2e_s"]), queue=_summary(s["queue_s"]),  # type: ignore[arg-type]
                tokens_per_s=float(s["output_tokens_per_s"]), kv_cache_usage=float(s["kv_used_now"]),  # type: ignore[arg-type]
                prefix_hit_rate=float(s["prefix_hit_rate"]),  # type: ignore[arg-type]
                queue_depth=int(s["queue_depth"]),  # type: ignore[call-overload]
                running=int(s["running"]), completed=int(s["requests"]),  # type: ignore[call-overload]
                rejected=int(s["rejected"]) + int(s["shed"]),  # type: ignore[call-overload]
                kv_transfers=int(s["kv_transfers"]),  # type: ignore[call-overload]
                kv_transfer_bytes=float(s["kv_transfer_bytes"]),  # type: ignore[arg-type]
            ))
        return router_pb2.GetStatsResponse(deployments=out, now_s=self.svc.clock.now())
