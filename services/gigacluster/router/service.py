"""The router's gRPC layer: deployments (replicas held through the broker) and Generate."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import numpy as np
import structlog
from prometheus_client.core import HistogramMetricFamily

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from gigacluster.hw.catalog import chip_names, default_system, get_system
from gigacluster.inference.engine import ReplicaConfig, Request, RequestSummary
from gigacluster.inference.errors import AdmissionError
from gigacluster.inference.policies import POLICIES, make_policy
from gigacluster.inference.tokenizer import Tokenizer
from gigacluster.model import DoesNotFitError
from gigacluster.model.arch import arch_from_dict
from gigacluster.router.deployment import KvTransport, LiveDeployment, Replica, ReplicaFailed, Stream
from gigacluster.router.placement import place_disaggregated
from gigacluster.router.v1 import router_pb2, router_pb2_grpc
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, Principal, call_metadata, rate_limiter
from gigacluster.runtime.config import RouterConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.metrics import FunctionCollector, gauge
from gigacluster.runtime.server import Service
from gigacluster.scheduler.spec import ARCH_FIELDS

log = structlog.get_logger()
DEPLOYMENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
STATES = {"deploying": 1, "ready": 2, "failed": 3, "deleting": 4}


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
    """A routed request: iterate :meth:`chunks` for its tokens. Used by gRPC Generate and the HTTP API."""

    def __init__(self, dep: LiveDeployment, stream: Stream, tok: Tokenizer, prompt_tokens: int) -> None:
        self.dep = dep
        self.stream = stream
        self.tok = tok
        self.request_id = stream.req.id
        self.prompt_tokens = prompt_tokens
        self.done = False

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
                yield Chunk(
                    request_id=self.request_id, index=toks[0].index, token_ids=ids, text=self.tok.decode(ids),
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
        self.deployments: dict[str, LiveDeployment] = {}
        self._alerts: dict[str, str] = {}
        self._loss_events: dict[str, int] = {}
        self.registry.register(FunctionCollector(self.metrics))
        self._ids = itertools.count(1)
        self._tokenizers: dict[int, Tokenizer] = {}
        self._lock = asyncio.Lock()
        self.http: Any = None

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(self), server)
        return [router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name]

    async def start(self) -> None:
        await super().start()
        self.every(self.config.telemetry_interval_s, self._publish, "stats")
        if self.config.http_port >= 0:
            from gigacluster.router.http import OpenAIServer

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
        hist = {k: HistogramMetricFamily(n, doc, labels=["model_name"]) for k, n, doc in (
            ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
            ("itl", "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."),
            ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds."),
            ("queue", "vllm:request_queue_time_seconds", "Histogram of time spent waiting in the queue."))}
        itl_alias = HistogramMetricFamily("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.",
                                          labels=["model_name"])
        g = {n: gauge(n, doc, ["model_name"]) for n, doc in (
            ("vllm:num_requests_running", "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
            ("vllm:gpu_prefix_cache_hit_rate", "Prefix cache hit rate (tokens)."),
            ("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
            ("vllm:generation_tokens_total", "Number of generation tokens processed."),
            ("vllm:request_success_total", "Count of successfully processed requests."),
            ("gigacluster_deployment_slowdown", "How much slower than its model the deployment runs (0 = on model)."),
        )}
        for d in list(self.deployments.values()):
            if d.state != "ready":
                continue
            m = [d.deployment_id]
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
            g["vllm:prompt_tokens_total"].add_metric(m, float(mt.prompt_tokens))
            g["vllm:generation_tokens_total"].add_metric(m, float(mt.output_tokens))
            g["vllm:request_success_total"].add_metric(m, float(mt.requests))
            perf = d.performance()
            g["gigacluster_deployment_slowdown"].add_metric(m, perf[0] if perf else 0.0)
        loss = gauge("gigacluster_deployment_performance_loss_events", "Deployment slowdowns flagged, by cause.",
                     ["cause"])
        for cause, n in sorted(self._loss_events.items()):
            loss.add_metric([cause], float(n))
        return [*hist.values(), itl_alias, *g.values(), loss]

    def check_performance(self, d: LiveDeployment) -> None:
        """Publish an alert when a deployment starts running slower than its model (or recovers)."""
        perf = d.performance()
        key = perf[1] if perf else ""
        if key == self._alerts.get(d.deployment_id, ""):
            return
        self._alerts[d.deployment_id] = key
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

    async def deploy(self, p: Principal, request: Any) -> LiveDeployment:
        did = request.deployment_id
        if not DEPLOYMENT_ID_RE.match(did or ""):
            raise InvalidArgument("deployment_id", f"must be 1-63 of a-z, 0-9, '-', '.', got {did!r}")
        if did in self.deployments:
            raise AlreadyExists(f"deployments/{did} already exists")
        if not request.HasField("model"):
            raise InvalidArgument("model", "required: a preset (e.g. llama3-8b) or an architecture")
        m = request.model
        arch = arch_from_dict({"preset": m.preset, **{k: int(getattr(m, k)) for k in ARCH_FIELDS if getattr(m, k)}}
                              if m.preset else {k: int(getattr(m, k)) for k in ARCH_FIELDS if getattr(m, k)})
        if request.chip not in chip_names():
            raise InvalidArgument("chip", f"allowed: {', '.join(chip_names())}; got {request.chip!r}")
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
        if replicas > 1024:
            raise InvalidArgument("replicas", f"must be <= 1024, got {replicas}")
        policy_name = request.policy or "least_outstanding"
        if policy_name not in POLICIES:
            raise InvalidArgument("policy", f"allowed: {', '.join(sorted(POLICIES))}; got {policy_name!r}")
        kv = request.kv_fraction or 0.9
        if not 0 < kv <= 1:
            raise InvalidArgument("kv_fraction", f"must be in (0, 1], got {kv}")
        cfg = ReplicaConfig(arch=arch, chip=request.chip, tp=tp,
                            precision=convert.precision_name(request.precision),
                            max_batch=int(request.max_batch) or 256, kv_fraction=kv,
                            max_queue=int(request.max_queue) or 1024, chunked_prefill=bool(request.chunked_prefill))
        dep = LiveDeployment(did, p.tenant, cfg, make_policy(policy_name), policy_name)
        self.deployments[did] = dep
        try:
            inv = await self.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=self._smd(), timeout=10)
            if n_pre:
                await self._deploy_disaggregated(dep, p, request.chip, inv, n_pre, n_dec)
            for i in range(0 if n_pre else replicas):
                resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                    chip_type=request.chip, count=tp, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN,
                    purpose=dep.name, tenant=p.tenant), metadata=self._smd(), timeout=30)
                devs = convert.ranges(resp.instance.devices)
                shard = next(s for s in inv.shards if s.devices.start <= devs[0][0] < s.devices.end)
                cap = {"token": resp.capability, "exp": resp.capability_expires_s, "inst": resp.instance.name}
                rep = Replica(i, cfg, instance=resp.instance.name, devices=devs, endpoint=shard.endpoint,
                              capability=self._cap_getter(cap), clock=self.clock)
                dep.add(rep)
        except (ResourceExhausted, DoesNotFitError):
            await self.undeploy(dep)
            raise
        except grpc.aio.AioRpcError as err:
            await self.undeploy(dep)
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise ResourceExhausted(f"cannot place {replicas} replicas of {tp} {request.chip}: "
                                        f"{err.details()}") from err
            raise Unavailable(f"broker refused the replicas ({err.code().name}): {err.details()}") from err
        dep.state = "ready"
        log.info("deployed", deployment=dep.name, replicas=replicas, chip=request.chip, tp=tp,
                 kv_cache_bytes=cfg.kv_cache_bytes)
        return dep

    async def _deploy_disaggregated(self, dep: LiveDeployment, p: Principal, chip: str, inv: Any, n_pre: int,
                                    n_dec: int) -> None:
        """One instance of exact devices for all replicas, so one capability covers every KV transfer."""
        cfg, tp = dep.cfg, dep.cfg.tp
        pcfg = dataclasses.replace(cfg, role="prefill")
        dcfg = dataclasses.replace(cfg, role="decode")
        shards = [s for s in inv.shards if s.chip_type == chip]
        domain = shards[0].chips_per_domain if shards else get_system(default_system(chip)).chips
        in_chip = [(max(a, s.devices.start), min(b, s.devices.end)) for a, b in convert.ranges(inv.free)
                   for s in shards if a < s.devices.end and b > s.devices.start]
        prefill, decode = place_disaggregated(in_chip, domain, tp, n_pre, n_dec)
        starts = prefill + decode
        resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
            chip_type=chip, count=len(starts) * tp, topology=broker_pb2.TOPOLOGY_CONSTRAINT_NONE,
            purpose=dep.name, tenant=p.tenant, devices=convert.range_msgs([(g, g + tp) for g in starts])),
            metadata=self._smd(), timeout=30)
        cap = {"token": resp.capability, "exp": resp.capability_expires_s, "inst": resp.instance.name}
        getter = self._cap_getter(cap)
        dep.transport = KvTransport(inv.fabric_endpoint, getter, self.clock)
        for i, g in enumerate(starts):
            shard = next(s for s in shards if s.devices.start <= g < s.devices.end)
            dep.add(Replica(i, pcfg if i < n_pre else dcfg, instance=resp.instance.name, devices=[(g, g + tp)],
                            endpoint=shard.endpoint, capability=getter, clock=self.clock))

    def _cap_getter(self, cap: dict[str, Any]) -> Any:
        def get() -> str:
            if cap["exp"] - time.time() < 120 and "refresh" not in cap:
                cap["refresh"] = asyncio.ensure_future(self._refresh(cap))
            return str(cap["token"])
        return get

    async def _refresh(self, cap: dict[str, Any]) -> None:
        try:
            r = await self.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=cap["inst"]),
                                                    metadata=self._smd(), timeout=10)
            cap.update(token=r.capability, exp=r.capability_expires_s)
        finally:
            cap.pop("refresh", None)

    async def undeploy(self, dep: LiveDeployment) -> None:
        dep.state = "deleting"
        await dep.close()
        for inst in dict.fromkeys(r.instance for r in dep.replicas):
            try:
                await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=inst),
                                                  metadata=self._smd(), timeout=30)
            except grpc.aio.AioRpcError as err:
                log.warning("release failed", instance=inst, error=err.details())
        self.deployments.pop(dep.deployment_id, None)

    def visible(self, p: Principal, name: str) -> LiveDeployment:
        did = name.removeprefix("deployments/")
        if not did:
            raise InvalidArgument("model", "required: a deployment name (e.g. deployments/llama3-8b)")
        dep = self.deployments.get(did)
        if dep is None or (not p.privileged and dep.tenant != p.tenant):
            raise NotFound(f"deployments/{did}")
        return dep

    def generate(self, p: Principal, model: str, *, text: str | None = None, token_ids: Sequence[int] | None = None,
                 max_tokens: int, priority: int = 0, request_id: str = "") -> Generation:
        """Validate, route and admit one request (raises domain errors); the caller iterates its chunks."""
        dep = self.visible(p, model)
        if dep.state != "ready":
            raise Unavailable(f"{dep.name} is {dep.state}")
        arch = dep.cfg.arch
        tok = self.tokenizer(arch.vocab)
        if text is not None:
            if not text:
                raise InvalidArgument("text", "must not be empty")
            prompt = tok.encode(text)
        elif token_ids is not None:
            prompt = list(token_ids)
            if not prompt:
                raise InvalidArgument("token_ids", "must hold at least one token")
            bad = [t for t in prompt if not 0 <= t < arch.vocab]
            if bad:
                raise InvalidArgument("token_ids", f"ids must be in [0, {arch.vocab}) (the vocab), got {bad[0]}")
        else:
            raise InvalidArgument("prompt", "give text or token_ids")
        if max_tokens <= 0:
            raise InvalidArgument("max_tokens", f"must be > 0, got {max_tokens}")
        if len(prompt) + max_tokens > arch.seq_len:
            raise InvalidArgument("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) "
                                                f"exceeds the model's context of {arch.seq_len}")
        if abs(priority) > 1000:
            raise InvalidArgument("priority", f"must be in [-1000, 1000], got {priority}")
        rid = request_id or uuid.uuid4().hex[:16]
        if len(rid) > 128:
            raise InvalidArgument("request_id", "at most 128 characters")
        structlog.contextvars.bind_contextvars(request_id=rid)
        now = self.clock.now()
        req = Request(id=rid, prompt_tokens=np.asarray(prompt, dtype=np.int64), max_tokens=int(max_tokens),
                      priority=int(priority), arrival_s=now, tenant=dep.tenant)
        try:
            _, stream = dep.route(req, now)
        except AdmissionError as exc:
            raise ResourceExhausted(f"{dep.name} is saturated: {exc}", retry_after_s=exc.retry_after_s) from exc
        except ReplicaFailed as exc:
            raise Unavailable(str(exc)) from exc
        return Generation(dep, stream, tok, len(prompt))


def _arch_msg(dep: LiveDeployment) -> common_pb2.ModelArchitecture:
    a = dep.cfg.arch
    return common_pb2.ModelArchitecture(preset=a.name, layers=a.layers, hidden=a.hidden, heads=a.heads,
                                        kv_heads=a.kv_heads, ffn_hidden=a.ffn_hidden, vocab=a.vocab, seq_len=a.seq_len)


def deployment_msg(dep: LiveDeployment) -> router_pb2.Deployment:
    c = dep.cfg
    return router_pb2.Deployment(
        name=dep.name, tenant=dep.tenant, model=_arch_msg(dep), chip=c.chip, tp=c.tp, replicas=len(dep.replicas),
        max_batch=c.max_batch, kv_fraction=c.kv_fraction, precision=convert.PRECISION_ENUMS[c.precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
        policy=dep.policy_name, state=STATES[dep.state], reason=dep.reason,  # type: ignore[arg-type]
        instances=[r.instance for r in dep.replicas], kv_cache_bytes_per_replica=int(c.kv_cache_bytes),
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
        deps = [d for d in self.svc.deployments.values() if p.privileged or d.tenant == p.tenant]
        items, token = convert.page(deps, request.page_size, request.page_token)
        return router_pb2.ListDeploymentsResponse(deployments=[deployment_msg(d) for d in items],  # type: ignore[arg-type]
                                                  next_page_token=token)

    async def DeleteDeployment(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        dep = self.svc.visible(p, request.name)
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
            max_tokens=int(request.max_tokens), priority=int(request.priority), request_id=request.request_id)
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
                    prefill_replica=c.prefill_replica))
            yield resp

    async def GetStats(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self._tenant(context)
        deps = ([self.svc.visible(p, request.deployment)] if request.deployment else
                [d for d in self.svc.deployments.values() if p.privileged or d.tenant == p.tenant])
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
