"""A deployment's replicas in the live mesh: each drives a :class:`ReplicaEngine` in virtual time,
executing every batch iteration on its chips through the chip service (so inference shows up in
chip power and utilisation, and a slowed or failed chip slows or fails the replica).

A disaggregated deployment has prefill replicas and decode replicas. When a prefill replica has
computed a prompt, :meth:`LiveDeployment._handoff` picks a decode replica, sends the prompt's KV
cache between their chips over the fabric service (one flow per TP shard, inference traffic
class, so it shares links max-min with training traffic), waits for the flow to finish, frees the
prefill replica's blocks and admits the request to the decode replica, which continues from the
second token. The first token reaches the client when its KV cache has landed.

The replica itself, its capability lease and its request streams live in :mod:`.replica`, which
also says how replicas heal themselves; while one heals, the deployment reports DEGRADED.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import grpc
import numpy as np
import structlog

from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.inference.engine import Handoff, ReplicaConfig, Request, TokenEvent
from gigacluster.inference.errors import AdmissionError
from gigacluster.inference.metrics import ServingMetrics
from gigacluster.inference.policies import RoutingPolicy
from gigacluster.router.pacing import TokenBox
from gigacluster.router.replica import (  # noqa: F401  (re-exported: the deployment's parts)
    HEAL_FIRST_PROBE_S,
    REFRESH_FRACTION,
    REFRESH_MARGIN_MAX_S,
    SLOW_EWMA,
    SLOW_THRESHOLD,
    SLOW_WINDOW,
    TOKEN_REFUSED,
    Binding,
    Lease,
    ReacquireFn,
    RefreshFn,
    Replica,
    ReplicaFailed,
    Stream,
    replica_memory_bytes,
)
from gigacluster.runtime import convert
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.clock import VirtualClock
from gigacluster.runtime.metrics import BucketHistogram

log = structlog.get_logger()

FLOW_POLL_S = 0.01  # wall seconds between asks for a flow the fabric has not settled at its end (wall clock)


class KvTransport:
    """Sends KV caches between a deployment's chips through the fabric service, and waits for them."""

    def __init__(self, endpoint: str, capability: Callable[[], str], clock: VirtualClock) -> None:
        self.channel = open_channel(endpoint)
        self.stub = fabric_pb2_grpc.FabricServiceStub(self.channel)
        self.capability = capability
        self.clock = clock
        # Live / predicted-when-started time of the flows (EWMA): above 1 under contention.
        self.slow_ratio = 1.0

    async def send(self, src: int, dst: int, tp: int, bytes_per_shard: float, not_before_s: float,
                   tag: str) -> tuple[float, float]:
        """Move ``bytes_per_shard`` from each of ``tp`` devices at ``src`` to those at ``dst``; (start, end)."""
        if tp == 1:
            r = await self.stub.StartTransfer(fabric_pb2.StartTransferRequest(
                src_device=src, dst_device=dst, bytes=bytes_per_shard, traffic_class=fabric_pb2.TRAFFIC_CLASS_INFERENCE,
                not_before_s=not_before_s, tag=tag), metadata=call_metadata(capability=self.capability()), timeout=10)
            return await self._settle(r.name, r.start_s, r.predicted_end_s)
        # one call for all shards: shard k sends to shard k (groups of one send/recv pair)
        return await self.collective(fabric_pb2.COLLECTIVE_OP_SEND_RECV, [(src, src + 1), (dst, dst + 1)],
                                     bytes_per_shard, not_before_s, tag, groups=tp)

    async def collective(self, op: fabric_pb2.CollectiveOp, ranks: list[tuple[int, int]], bytes_: float,
                         not_before_s: float, tag: str, *, groups: int = 1) -> tuple[float, float]:
        """One inference-class collective of ``bytes_`` per rank over ``ranks``, waited for; (start, end)."""
        r = await self.stub.StartCollective(fabric_pb2.StartCollectiveRequest(
            op=op, ranks=convert.range_msgs(ranks), bytes=bytes_, traffic_class=fabric_pb2.TRAFFIC_CLASS_INFERENCE,
            not_before_s=not_before_s, tag=tag, groups=groups, group_stride=1),
            metadata=call_metadata(capability=self.capability()), timeout=10)
        return await self._settle(r.name, r.start_s, r.predicted_end_s)

    async def _settle(self, name: str, start_s: float, predicted_end_s: float) -> tuple[float, float]:
        end = await self.wait(name, predicted_end_s)
        alone = predicted_end_s - start_s
        if alone > 0:
            self.slow_ratio += SLOW_EWMA * ((end - start_s) / alone - self.slow_ratio)
        return start_s, end

    async def wait(self, name: str, predicted_end_s: float) -> float:
        """The flow's end: sleep to its predicted end, then ask (the fabric settles it, or gives a later end)."""
        pred = predicted_end_s
        for _ in range(10_000):
            await self.clock.sleep_until(pred)
            f = (await self.stub.GetFlow(fabric_pb2.GetFlowRequest(name=name),
                                         metadata=call_metadata(capability=self.capability()), timeout=10)).flow
            if f.state == fabric_pb2.Flow.STATE_DONE:
                return float(f.end_s)
            if f.state == fabric_pb2.Flow.STATE_FAILED:
                raise ReplicaFailed(f"KV transfer {name} failed: {f.error}")
            if f.predicted_end_s <= pred:
                await self.clock.wait_past(pred, FLOW_POLL_S)  # the simulator has not settled it yet
            pred = max(pred, float(f.predicted_end_s))
        raise ReplicaFailed(f"KV transfer {name} did not finish")

    async def close(self) -> None:
        await self.channel.close()


class LiveDeployment:
    """Replicas of one model behind one routing policy (colocated, or prefill + decode pools)."""

    def __init__(self, deployment_id: str, tenant: str, cfg: ReplicaConfig, policy: RoutingPolicy,
                 policy_name: str, *, seq: int = 0, created_s: float = 0.0) -> None:
        self.deployment_id = deployment_id
        self.tenant = tenant
        self.created_s = created_s or time.time()  # Unix time it was created (kept across router restarts)
        self.seq = seq  # never repeats across router restarts (DeploymentStore.next_seq)
        self.leases: dict[str, Lease] = {}
        self.request = b""  # the serialised DeployModelRequest, persisted to rebuild it after a restart
        self.cfg = cfg
        self.policy = policy
        self.policy_name = policy_name
        self.replicas: list[Replica] = []
        self.metrics = ServingMetrics()
        self.rng = np.random.default_rng(0)
        self.state = "deploying"
        self.reason = ""
        self.transport: KvTransport | None = None
        self._handoffs: set[asyncio.Task[None]] = set()
        self.kv_transfers = 0
        self.kv_transfer_bytes = 0.0
        # vLLM's histogram buckets (vllm/engine/metrics.py), so existing dashboards' queries work.
        self.prom = {
            "ttft": BucketHistogram([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                                     7.5, 10.0]),
            "itl": BucketHistogram([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]),
            "e2e": BucketHistogram([0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]),
            "queue": BucketHistogram([0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                      60.0]),
        }

    @property
    def name(self) -> str:
        return f"deployments/{self.deployment_id}"

    @property
    def qualified_name(self) -> str:
        """Unique across tenants: ``tenants/<t>/deployments/<id>``."""
        return f"{self.tenant}/deployments/{self.deployment_id}"

    @property
    def purpose(self) -> str:
        """What the router stamps on the broker instances it allocates for this deployment."""
        return f"{self.qualified_name}/d-{self.seq}"

    def health(self) -> tuple[str, str]:
        """(state, reason) as clients should see them: DEGRADED while any replica cannot serve."""
        if self.state != "ready":
            return self.state, self.reason
        down = [r.failed for r in self.replicas if r.failed]
        if not down:
            return "ready", self.reason
        live = len(self.replicas) - len(down)
        return "degraded", f"{live} of {len(self.replicas)} replicas serving; {down[0]}"

    def lease(self, instance: str, token: str, expires_s: float, refresh: RefreshFn) -> Lease:
        """The (started) lease of one of this deployment's instances."""
        lease = self.leases[instance] = Lease(instance, token, expires_s, refresh)
        lease.start()
        return lease

    @property
    def disaggregated(self) -> bool:
        return any(r.role == "prefill" for r in self.replicas)

    def pool(self, role: str) -> list[Replica]:
        return [r for r in self.replicas if r.role == role]

    def add(self, replica: Replica) -> None:
        self.replicas.append(replica)
        if replica.role == "prefill":
            replica.on_prefilled = self._on_prefilled
        replica.on_dropped = self._on_dropped
        replica.task = asyncio.ensure_future(replica.run(self.on_finish))

    def route(self, req: Request, now_s: float) -> tuple[Replica, Stream]:
        """Pick a live replica, admit the request there and open its stream."""
        front = self.pool("prefill") if self.disaggregated else self.replicas
        live = [r for r in front if not r.failed]
        if not live:
            raise ReplicaFailed(f"{self.name} has no healthy replica right now (its chips are restarting): retry")
        if self.disaggregated:
            self._check_decode_capacity()
        views = [r.view() for r in live]
        pick = live[self.policy.pick(req, views, self.rng)]
        try:
            pick.engine.admit(req, now_s)
        except AdmissionError:
            self.metrics.record_rejected()
            raise
        self.policy.on_routed(req, pick.index)
        stream = Stream(TokenBox(), req, pick, prefill_replica=pick.index if self.disaggregated else -1)
        pick.streams[req.id] = stream
        for shed_req, err in pick.engine.drain_shed():
            self.metrics.record_rejected(shed=True)
            s = pick.streams.pop(shed_req.id, None)
            if s is not None:
                s.queue.put_nowait(err)
        pick.wake.set()
        return pick, stream

    def _check_decode_capacity(self) -> None:
        """Refuse at the door while every decode replica's queue is full (handed-off work is never refused)."""
        live = [r for r in self.pool("decode") if not r.failed]
        if not live:
            raise ReplicaFailed(f"{self.name} has no healthy decode replica")
        depth = [r.engine.stats().queue_depth for r in live]
        if min(depth) >= self.cfg.max_queue:
            self.metrics.record_rejected()
            best = live[int(np.argmin(depth))]
            raise AdmissionError(best.engine.retry_after_s(), reason="queue_full",
                                 detail=f"decode queues hold {min(depth)} of {self.cfg.max_queue}")

    def _on_dropped(self, replica: Replica, stream: Stream) -> None:
        if replica.role != "decode":  # a decode replica's requests were released by the prefill side
            self.policy.on_finished(stream.req.id, replica.index)

    def _on_prefilled(self, src: Replica, ev: TokenEvent, stream: Stream) -> None:
        self.policy.on_finished(ev.request_id, src.index)
        task = asyncio.ensure_future(self._handoff(src, ev, stream))
        self._handoffs.add(task)
        task.add_done_callback(self._handoffs.discard)

    async def _handoff(self, src: Replica, ev: TokenEvent, stream: Stream) -> None:
        rid = ev.request_id
        try:
            live = [r for r in self.pool("decode") if not r.failed]
            if not live:
                raise ReplicaFailed(f"{self.name} has no healthy decode replica")
            dst = min(live, key=lambda r: (r.engine.stats().outstanding_requests, r.index))
            assert self.transport is not None and ev.summary is not None
            bytes_ = src.engine.cfg.shard.kv_bytes_for(len(stream.req.prompt_tokens))
            _, end = await self.transport.send(src.first_device, dst.first_device, self.cfg.tp, bytes_,
                                               ev.time_s, tag=f"kv:{self.name}:{rid}")
            self.kv_transfers += 1
            self.kv_transfer_bytes += bytes_ * self.cfg.tp
        except (grpc.aio.AioRpcError, ReplicaFailed) as exc:
            src.engine.release_kv(rid)
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning("kv transfer failed", request_id=rid, error=detail)
            stream.queue.put_nowait(ReplicaFailed(f"KV transfer failed: {str(detail)[:200]}; retry"))
            return
        src.engine.release_kv(rid)
        if stream.closed:
            return
        s = ev.summary
        stream.kv_transfer_bytes = bytes_ * self.cfg.tp
        req = dataclasses.replace(stream.req, handoff=Handoff(
            first_token_id=ev.token_id, first_scheduled_s=s.first_scheduled_s, first_token_s=end,
            cached_tokens=s.cached_tokens, kv_transfer_s=end - ev.time_s, energy_j=s.energy_j))
        stream.req = req
        dst.engine.admit(req, end)
        dst.hand_over(stream)
        first = dataclasses.replace(ev, time_s=end, finished=False, finish_reason="", summary=None)
        stream.last_token_s = end
        stream.queue.put_nowait(first)

    def on_finish(self, ev: TokenEvent, stream: Stream) -> None:
        if ev.summary is not None:
            self.metrics.record_request(ev.summary, np.asarray(stream.itl))
            self.prom["ttft"].observe(ev.summary.ttft_s)
            self.prom["itl"].observe(stream.itl)
            self.prom["e2e"].observe(ev.summary.e2e_s)
            self.prom["queue"].observe(ev.summary.queue_s)
        if stream.owner.role != "decode":  # a decode replica's requests were released by the prefill side
            self.policy.on_finished(ev.request_id, stream.owner.index)

    def performance(self) -> tuple[float, str, str] | None:
        """(slowdown, cause, detail) while this deployment runs slower than its model, else None.

        Batch iterations slower than their roofline point at the replica's chips (throttled or a slow
        fault); KV transfers slower than predicted when they started point at the fabric.
        """
        worst = max(self.replicas, key=lambda r: r.slow_ratio, default=None)
        if worst is not None and worst.slow_ratio > 1 + SLOW_THRESHOLD:
            return (worst.slow_ratio - 1, "throttled_or_faulty_chip",
                    f"replica {worst.index} batch iterations {100 * (worst.slow_ratio - 1):.0f}% slower than the "
                    f"roofline of its chips (devices {worst.devices[0][0]}..{worst.devices[-1][1] - 1})")
        kv = self.transport.slow_ratio if self.transport is not None else 1.0
        if kv > 1 + SLOW_THRESHOLD:
            return (kv - 1, "fabric_contention",
                    f"KV cache transfers {100 * (kv - 1):.0f}% slower than predicted when they started: "
                    "other traffic (or a degraded link) on their path")
        return None

    def stats_snapshot(self) -> dict[str, object]:
        stats = [r.engine.stats() for r in self.replicas]
        self.metrics.observe(stats)
        snap = self.metrics.snapshot()
        snap["queue_depth"] = sum(s.queue_depth for s in stats)
        snap["running"] = sum(s.running for s in stats)
        snap["kv_used_now"] = float(np.mean([s.kv_used_frac for s in stats])) if stats else 0.0
        snap["kv_transfers"] = self.kv_transfers
        snap["kv_transfer_bytes"] = self.kv_transfer_bytes
        snap["held_kv"] = sum(r.engine.held_kv_requests for r in self.replicas)
        a2a = [r.a2a for r in self.replicas if r.a2a is not None]
        snap["a2a_flows"] = sum(a.flows for a in a2a)
        snap["a2a_bytes"] = sum(a.booked_bytes for a in a2a)
        return snap

    async def close(self) -> None:
        for t in list(self._handoffs):
            t.cancel()
        for r in self.replicas:
            await r.close()
        if self.transport is not None:
            await self.transport.close()
        for lease in self.leases.values():
            await lease.close()
