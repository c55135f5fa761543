"""Offline cluster simulation: N replica engines behind a routing policy, in virtual time.

Each replica runs one iteration at a time; an iteration lasts its ``predicted_s`` (the roofline
of its work, as on the live chips). A request's ``arrival_s`` is when its client sent it; it reaches
the engines when its replica's API server has taken it (:mod:`.frontend`: ``serving.api_request_s`` per request,
one at a time, a burst released together; so TTFT is the client's, as vLLM's benchmark_serving measures
it) and is routed then, using the same :class:`ReplicaView` the live router builds. Requests reaching
an idle engine at the same instant share its first iteration. Nothing sleeps: the loop jumps from event
to event, so thousands of requests over 8 replicas take seconds of wall time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gigacluster.inference.cost import api_intake_s
from gigacluster.inference.engine import Iteration, ReplicaConfig, ReplicaEngine, ReplicaStats, Request, RequestSummary
from gigacluster.inference.errors import AdmissionError
from gigacluster.inference.frontend import ApiServers
from gigacluster.inference.metrics import ServingMetrics
from gigacluster.inference.policies import RoutingPolicy, make_policy
from gigacluster.model import SpecError


@dataclasses.dataclass(frozen=True)
class SimResult:
    """A finished simulation: the metrics snapshot and the replicas' final counters."""

    metrics: dict[str, Any]
    replicas: tuple[ReplicaStats, ...]
    policy: str
    end_s: float
    routed: tuple[int, ...]
    requests: tuple[RequestSummary, ...] = ()  # every finished request, when simulate(keep_requests=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "end_s": self.end_s,
            "routed_per_replica": list(self.routed),
            "preemptions": sum(r.preemptions for r in self.replicas),
            **self.metrics,
        }


def _admit(engine: ReplicaEngine, req: Request, t: float, metrics: ServingMetrics) -> bool:
    """Hand ``req`` to ``engine`` at ``t``; False (counted rejected) if it refuses it."""
    try:
        engine.admit(req, t)
    except AdmissionError:
        metrics.record_rejected()
        return False
    for _shed in engine.drain_shed():
        metrics.record_rejected(shed=True)
    return True


def simulate(
    cfg: ReplicaConfig,
    workload: Sequence[Request],
    *,
    replicas: int = 1,
    policy: str | RoutingPolicy = "round_robin",
    seed: int = 0,
    max_time_s: float = math.inf,
    keep_requests: bool = False,
    api_server: bool = True,
) -> SimResult:
    """Run ``workload`` on ``replicas`` engines until all finish or ``max_time_s`` (requests in flight then are
    not counted); ``keep_requests`` lists every finished request; ``api_server=False`` is vLLM's offline engine
    (``LLM.generate``, as ``benchmark_latency.py`` runs it): requests reach the engines when sent."""
    if not isinstance(replicas, int) or replicas < 1:
        raise SpecError("replicas", f"must be an integer >= 1, got {replicas!r}")
    pol = make_policy(policy) if isinstance(policy, str) else policy
    rng, metrics = np.random.default_rng(seed), ServingMetrics()
    engines = [ReplicaEngine(cfg, model_energy=False) for _ in range(replicas)]  # it reports no energy
    inflight: list[Iteration | None] = [None] * replicas
    done_at, routed = np.full(replicas, math.inf), [0] * replicas
    reqs = sorted(workload, key=lambda r: r.arrival_s)
    arrivals = np.fromiter((r.arrival_s for r in reqs), float, len(reqs))
    api = ApiServers(replicas)
    intake = api_intake_s([len(r.prompt_tokens) for r in reqs], v0=not cfg.chunked_prefill) * api_server
    i, now, last = 0, 0.0, 0.0
    kept: list[RequestSummary] = []

    def release(k: int, t: float) -> None:
        """API server ``k``'s busy period ends at ``t``: its requests reach the engine together."""
        for j in api.pop(k):
            if _admit(engines[k], reqs[j], t, metrics):
                routed[k] += 1
            else:
                pol.on_finished(reqs[j].id, k)
        if inflight[k] is None:
            pending.add(k)  # requests released together (a burst) share the first iteration

    def start(r: int, t: float) -> None:
        it = engines[r].next_iteration(t)
        inflight[r] = it
        done_at[r] = t + it.predicted_s if it is not None else math.inf

    pending: set[int] = set()  # idle replicas given work at ``last``, started once that instant's releases are in
    while True:
        t_arr = float(arrivals[i]) if i < len(reqs) else math.inf
        k_rel, t_rel = api.next_release()
        if pending and min(t_arr, t_rel) > last:
            for k in sorted(pending):
                if inflight[k] is None:
                    start(k, last)
            pending.clear()
        r_next = int(np.argmin(done_at))
        t_done = float(done_at[r_next])
        now = min(t_done, t_arr, t_rel)
        if now == math.inf or now > max_time_s:
            break
        last = now
        if t_arr <= now and t_arr <= t_rel:  # an arrival: routed at once, then its replica's API server takes it
            k = pol.pick(reqs[i], api.views(engines, cfg.block_size), rng)
            pol.on_routed(reqs[i], k)
            api.take(k, i, now, float(intake[i]))
            i += 1
        elif t_rel <= now:
            release(k_rel, t_rel)
        else:
            it = inflight[r_next]
            assert it is not None
            batch = engines[r_next].complete_batch(it, t_done)
            metrics.record_itl(batch.itl_s)
            kept.extend(batch.summaries if keep_requests else ())
            for s in batch.summaries:
                metrics.record_request(s)
                pol.on_finished(s.request_id, r_next)
            metrics.record_kv(engines[r_next].kv_used_frac)
            start(r_next, t_done)

    stats = tuple(e.stats() for e in engines)
    metrics.set_prefix_counts(sum(s.prefix_hit_tokens for s in stats), sum(s.prefix_lookup_tokens for s in stats))
    return SimResult(metrics.snapshot(), stats, pol.name, last, tuple(routed), tuple(kept))
