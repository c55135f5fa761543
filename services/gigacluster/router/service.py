"""The router service: its lifecycle, metrics and telemetry, and the thin gRPC servicer.

The parts: :mod:`.manager` holds the deployments (placement through the broker, persistence,
restore after a restart, deletion), :mod:`.generation` admits requests and streams their chunks,
:mod:`.messages` converts between protos and the domain, :mod:`.deployment` runs the replicas.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import numpy as np
import structlog
from grpc_health.v1 import health_pb2
from prometheus_client.core import HistogramMetricFamily

from gigacluster.errors import PermissionDenied, Unavailable
from gigacluster.router.deployment import LiveDeployment
from gigacluster.router.frontends import FrontendPool, accept_probe, set_router_health
from gigacluster.router.generation import Admission, Chunk, Generation
from gigacluster.router.http import OpenAIServer  # http imports this module only to type-check
from gigacluster.router.link import CoreLink
from gigacluster.router.manager import DeploymentManager
from gigacluster.router.messages import deployment_msg, generate_args, generate_response, stats_msg
from gigacluster.router.store import DeploymentStore
from gigacluster.router.v1 import frontend_pb2, router_pb2, router_pb2_grpc
from gigacluster.runtime import convert
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.config import RouterConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.metrics import FunctionCollector, counter, gauge
from gigacluster.runtime.server import Service

__all__ = ["Chunk", "Generation", "RouterService", "RouterServicer"]
log = structlog.get_logger()


class RouterService(Service[RouterConfig]):
    """The router's parts put together: ``manager`` (deployments) and ``admission`` (requests)."""

    name = "router"
    clock_dormancy = False  # serves HTTP, which the clock's gRPC interceptors do not see

    def __init__(self, config: RouterConfig) -> None:
        # With front ends (.frontends) this process is the core: they hold the public ports, it serves them
        # over the link and its own gRPC server (for the unary calls they forward) on a private Unix socket.
        self.link: CoreLink | None = None
        self.frontends: FrontendPool | None = None
        if config.frontends > 0:
            self.link = CoreLink(secrets.token_hex(16), self.generate, self._link_state)
            self.frontends = FrontendPool(config, self.link)
            config = dataclasses.replace(config, http_port=-1)
        super().__init__(config)
        self.auth = self.broker_auth()
        self.manager = DeploymentManager(config, self.auth, self.clock, self._set_health)
        self.admission = Admission(config, self.clock, self.manager.visible)
        self.manager.on_lag = self.admission.overload.observe_emit_lag
        if self.frontends is None:  # (with front ends, theirs take Generate)
            self.accept_probe = accept_probe(config, self.admission.overload)
        self._alerts: dict[str, str] = {}
        self._loss_events: dict[str, int] = {}
        self.registry.register(FunctionCollector(self.metrics))
        self.http: Any = None

    @property
    def deployments(self) -> dict[str, LiveDeployment]:
        """Every deployment, by ``DeploymentStore.key(tenant, id)``."""
        return self.manager.deployments

    @property
    def store(self) -> DeploymentStore:
        return self.manager.store

    @property
    def reconciled(self) -> Any:
        """Set once the stored deployments are restored after a start."""
        return self.manager.reconciled

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(self), server)
        return [router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name]

    def bind_address(self) -> str:
        if self.frontends is not None:
            return f"unix:{self.frontends.core_path}"
        return super().bind_address()

    def server_options(self) -> list[tuple[str, Any]]:
        # gRPC's core cancels calls it has queued beyond max_pending_requests before the event loop
        # picked them up; the router refuses them itself (RESOURCE_EXHAUSTED, .overload) instead.
        n = self.config.grpc_max_pending_calls
        return [("grpc.server.max_pending_requests", n), ("grpc.server.max_pending_requests_hard_limit", n)]

    async def start(self) -> None:
        await super().start()
        self.spawn(self.admission.overload.watch(), "loop-lag")
        if self.accept_probe is not None:
            self.spawn(self.accept_probe.run(), "accept-probe")
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)  # until the deployments are back
        self.spawn(self.manager.reconcile(), "reconcile")
        self.every(self.config.telemetry_interval_s, self._publish, "stats")
        if self.frontends is not None and self.link is not None:
            await self.frontends.start(f"unix:{self.frontends.core_path}")
            self.spawn(self.link.watch_state(self.config.frontend_link_interval_s), "link-state")
        if self.config.http_port >= 0:
            self.http = OpenAIServer(self)
            port = await self.http.start(self.config.host, self.config.http_port)
            log.info("openai endpoint", url=f"http://{self.config.host}:{port}/v1")

    async def stop(self) -> None:
        if self.frontends is not None:
            await self.frontends.stop()
        if self.http is not None:
            await self.http.stop()
        for d in self.deployments.values():
            await d.close()
        await super().stop()
        await self.auth.close()
        self.store.close()

    async def _set_health(self, status: Any) -> None:
        await set_router_health(self, status)

    def _link_state(self) -> frontend_pb2.LinkDown:
        """What the front ends need besides tokens: whether this router serves, and its deployments."""
        return frontend_pb2.LinkDown(has_state=True, reconciled=self.reconciled.is_set(), deployments=[
            frontend_pb2.LinkDeployment(tenant=d.tenant, deployment_id=d.deployment_id,
                                        qualified_name=d.qualified_name, created_s=d.created_s,
                                        seq_len=d.cfg.arch.seq_len, state=d.health()[0])
            for d in list(self.deployments.values())])

    # The domain calls of the router, as the servicer and the HTTP API use them.

    async def deploy(self, p: Principal, request: router_pb2.DeployModelRequest) -> LiveDeployment:
        try:
            return await self.manager.deploy(p, request)
        finally:
            self._state_changed()

    async def undeploy(self, dep: LiveDeployment) -> None:
        try:
            await self.manager.undeploy(dep)
        finally:
            self._state_changed()

    def _state_changed(self) -> None:
        """Tell the front ends now (before the caller hears back through one of them), not at the next tick."""
        if self.link is not None:
            self.link.publish_state()

    def visible(self, p: Principal, name: str) -> LiveDeployment:
        return self.manager.visible(p, name)

    def owned_by(self, p: Principal) -> list[LiveDeployment]:
        return self.manager.owned_by(p)

    def generate(self, p: Principal, model: str, *, text: str | None = None, token_ids: Sequence[int] | None = None,
                 max_tokens: int | None = None, priority: int = 0, request_id: str = "",
                 stop: Sequence[str] = (), ignore_eos: bool = False, open_to_context: bool = False) -> Generation:
        """See :meth:`Admission.generate`."""
        return self.admission.generate(p, model, text=text, token_ids=token_ids, max_tokens=max_tokens,
                                       priority=priority, request_id=request_id, stop=stop, ignore_eos=ignore_eos,
                                       open_to_context=open_to_context)

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
        ov = self.admission.overload
        refused = counter("gigacluster_router_refused_total", "New requests this router process refused because it "
                          "ran behind (its own overload bound: loop lag, late tokens, calls waiting in gRPC's queue).")
        refused.add_metric([], float(ov.refused))
        wait = gauge("gigacluster_router_accept_wait_seconds", "How long new Generate calls wait in gRPC's core before "
                     "this router process sees them (the accept probe's latest measure).")
        wait.add_metric([], ov.accept_wait_s)
        share = gauge("gigacluster_router_refuse_fraction", "The fraction of new requests refused to hold that wait "
                      "near accept_target_s.")
        share.add_metric([], ov.refuse_p)
        probes = counter("gigacluster_router_accept_probes_total", "Accept probes answered (runtime/accept_probe.py): "
                         "at the probe interval while Generate calls come, once a second while none do.")
        probes.add_metric([], float(self.accept_probe.answered if self.accept_probe is not None else 0))
        loss = counter("gigacluster_deployment_performance_loss_events_total",
                       "Deployment slowdowns flagged, by cause.", ["cause"])
        for cause, n in sorted(self._loss_events.items()):
            loss.add_metric([cause], float(n))
        return [*hist.values(), itl_alias, *g.values(), *c.values(), refused, wait, share, probes, loss]

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


@grpc_errors(router_pb2_grpc.RouterServiceServicer)
class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    """Thin: authenticates, calls the service's public methods, converts with :mod:`.messages`."""

    def __init__(self, svc: RouterService) -> None:
        self.svc = svc

    async def _tenant(self, context: grpc.aio.ServicerContext) -> Principal:
        return await self.svc.auth.principal(context)

    async def DeployModel(self, request: router_pb2.DeployModelRequest,
                          context: grpc.aio.ServicerContext) -> router_pb2.DeployModelResponse:
        p = await self._tenant(context)
        if p.kind != "tenant":
            raise PermissionDenied("deployments belong to tenants: deploy with a tenant's API key",
                                   reason="TENANT_ONLY")
        dep = await self.svc.deploy(p, request)
        return router_pb2.DeployModelResponse(deployment=deployment_msg(dep))

    async def GetDeployment(self, request: router_pb2.GetDeploymentRequest,
                            context: grpc.aio.ServicerContext) -> router_pb2.GetDeploymentResponse:
        p = await self._tenant(context)
        return router_pb2.GetDeploymentResponse(deployment=deployment_msg(self.svc.visible(p, request.name)))

    async def ListDeployments(self, request: router_pb2.ListDeploymentsRequest,
                              context: grpc.aio.ServicerContext) -> router_pb2.ListDeploymentsResponse:
        p = await self._tenant(context)
        deps = self.svc.owned_by(p)
        items, token = convert.page(deps, request.page_size, request.page_token)
        return router_pb2.ListDeploymentsResponse(deployments=[deployment_msg(d) for d in items],
                                                  next_page_token=token)

    async def DeleteDeployment(self, request: router_pb2.DeleteDeploymentRequest,
                               context: grpc.aio.ServicerContext) -> router_pb2.DeleteDeploymentResponse:
        p = await self._tenant(context)
        dep = self.svc.visible(p, request.name)
        if not self.svc.reconciled.is_set():
            raise Unavailable(f"{dep.name} is being restored after a router restart; retry")
        msg = deployment_msg(dep)
        await self.svc.undeploy(dep)
        msg.state = router_pb2.Deployment.STATE_DELETING
        return router_pb2.DeleteDeploymentResponse(deployment=msg)

    async def Generate(self, request: router_pb2.GenerateRequest,  # type: ignore[override]
                       context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.GenerateResponse]:
        p = await self._tenant(context)
        gen = self.svc.generate(p, request.model, **generate_args(request))
        async for c in gen.chunks():
            yield generate_response(c)

    async def GetStats(self, request: router_pb2.GetStatsRequest,
                       context: grpc.aio.ServicerContext) -> router_pb2.GetStatsResponse:
        p = await self._tenant(context)
        deps = ([self.svc.visible(p, request.deployment)] if request.deployment else
                self.svc.owned_by(p))
        return router_pb2.GetStatsResponse(deployments=[stats_msg(d) for d in deps], now_s=self.svc.clock.now())
