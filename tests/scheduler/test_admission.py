"""Dispatch at scale and fair-share accounting: the pass orders 10,000 queued jobs in O(n log T),
answers identical shapes that cannot fit from its cache, and counts committed chip-seconds once."""

from __future__ import annotations

import random

import numpy as np

from gigacluster.scheduler import policy as pol
from gigacluster.scheduler.placement import PlacementPolicy
from gigacluster.scheduler.policy import Pending, _order, committed_usage, decide
from tests.scheduler.test_policy import LAY, TOPO, free_except, go, pend, run


def _order_quadratic(pending: list[Pending], usage: dict[str, float], weights: dict[str, float]) -> list[Pending]:
    """The previous O(n^2) ordering, kept as the reference the heap must reproduce."""
    out: list[Pending] = []
    use = dict(usage)
    for prio in sorted({p.priority for p in pending}, reverse=True):
        rest = sorted((p for p in pending if p.priority == prio), key=lambda p: p.seq)
        while rest:
            best = min(rest, key=lambda p: (use.get(p.tenant, 0.0) / max(weights.get(p.tenant, 1.0), 1e-9), p.seq))
            rest.remove(best)
            out.append(best)
            use[best.tenant] = use.get(best.tenant, 0.0) + best.count * best.duration_s
    return out


def test_heap_order_equals_the_reference_order() -> None:
    """The O(n log T) fair-share order is exactly the old minimum-per-pick order on random queues."""
    rng = random.Random(7)
    tenants = [f"tenants/t{i}" for i in range(6)]
    pending = [pend(f"j{i}", rng.choice(tenants), 8 * rng.randint(1, 4), priority=rng.choice([0, 0, 5]), seq=i,
                    duration_s=rng.uniform(10, 500)) for i in range(400)]
    usage = {t: rng.uniform(0, 5000) for t in tenants}
    weights = {t: rng.choice([1.0, 2.0, 0.5]) for t in tenants}
    assert [p.job_id for p in _order(pending, usage, weights)] == \
        [p.job_id for p in _order_quadratic(pending, usage, weights)]


def test_committed_chip_seconds_are_counted_once() -> None:
    """Issue 12: tenant a has run 0 and commits 50 chip-s (1 chip x 50 s); b has run 80. Counted once,
    a (50) goes first; counted twice (100) b would. The service passes run chip-seconds only."""
    running = [run("ra", range(0, 1), "tenants/a", end_s=50.0)]
    assert committed_usage(0.0, {"tenants/b": 80.0}, running) == {"tenants/b": 80.0, "tenants/a": 50.0}
    jobs = [pend("b1", "tenants/b", count=8, seq=1), pend("a1", "tenants/a", count=8, seq=2)]
    d = go(jobs, running, usage={"tenants/b": 80.0}, free=free_except(range(0, 8)))
    assert [j for j, _, _ in d.place] == ["a1", "b1"]


class CountingPolicy(PlacementPolicy):
    """The topology policy, counting how often the layout is searched."""

    def __init__(self) -> None:
        self.calls = 0

    def place(self, layout, free, count, tp=1):  # type: ignore[no-untyped-def]
        self.calls += 1
        return TOPO.place(layout, free, count, tp)


def test_ten_thousand_identical_jobs_that_cannot_fit_cost_a_few_searches() -> None:
    """10,000 queued 32-chip jobs behind a 48-chip gang: the head reserves, the rest are answered from
    the cache (a handful of layout searches, not 10,000), and a small job still backfills now."""
    running = [run("big", range(0, 48), "tenants/x", end_s=1000.0)]
    pending = [pend(f"q{i}", f"tenants/t{i % 4}", 32, seq=i, duration_s=5000.0) for i in range(10_000)]
    pending.append(pend("small", "tenants/z", 8, seq=10_001, duration_s=10.0))
    counting = CountingPolicy()
    d = go(pending, running, policy=counting)
    assert [j for j, _, _ in d.place] == ["small"]
    assert len(d.reserved) == 1 and len(d.reasons) == 10_000
    assert counting.calls < 20


def test_jobs_that_can_never_fit_are_not_searched_again() -> None:
    """Jobs larger than the cluster's healthy chips say so; after the first, no victim or reservation search."""
    counting = CountingPolicy()
    pending = [pend(f"h{i}", count=128, seq=i) for i in range(1000)]
    d = go(pending, [], policy=counting)
    assert d.place == [] and all("needs 128" in r for r in d.reasons.values())
    assert counting.calls < 10


def test_cache_never_changes_a_decision() -> None:
    """On random clusters and queues, the pass with the cache places exactly what the uncached pass did."""
    rng = random.Random(3)

    class Uncached(pol._Fits):
        def place(self, kind, job, lay, mask):  # type: ignore[no-untyped-def]
            return self.policy.place(lay, mask, job.count, job.tp)

    for trial in range(30):
        held = rng.sample(range(8), rng.randint(0, 6))
        running = [run(f"r{d}", range(8 * d, 8 * d + 8), f"tenants/t{d % 3}", priority=rng.choice([0, 1]),
                       end_s=rng.uniform(10, 1000)) for d in held]
        pending = [pend(f"j{i}", f"tenants/t{rng.randint(0, 3)}", 8 * rng.randint(1, 6), seq=i,
                        priority=rng.choice([0, 1, 2]), duration_s=rng.uniform(5, 2000)) for i in range(40)]
        a = go(pending, running)
        orig = pol._Fits
        pol._Fits = Uncached  # type: ignore[misc]
        try:
            b = go(pending, running)
        finally:
            pol._Fits = orig  # type: ignore[misc]
        assert [(j, d.tolist()) for j, d, _ in a.place] == [(j, d.tolist()) for j, d, _ in b.place], trial
        assert a.preempt == b.preempt and a.reserved == b.reserved and a.reasons == b.reasons, trial


def test_decide_does_not_modify_its_inputs() -> None:
    """The pass runs on a snapshot off the event loop: it must leave the free masks as given."""
    free = free_except(range(0, 8))
    before = free["h100-sxm"].copy()
    decide(0.0, [pend("a", count=16)], [], layouts=LAY, free=free, policy=TOPO, queues={}, weights={}, usage={})
    assert np.array_equal(free["h100-sxm"], before)


def test_queued_jobs_per_tenant_are_bounded() -> None:
    """Past max_queued_per_tenant a tenant's submission is RESOURCE_EXHAUSTED; other tenants and the
    tenant itself, once a job leaves the queue, are admitted again."""
    import pytest

    from gigacluster.errors import ResourceExhausted
    from gigacluster.runtime.config import SchedulerConfig
    from gigacluster.scheduler.core import State
    from gigacluster.scheduler.service import SchedulerService
    from tests.scheduler.test_peer_outage import running_job

    svc = SchedulerService(SchedulerConfig(max_queued_per_tenant=1))
    job = running_job(svc)
    job.state = State.QUEUED
    svc.book.index(job, State.RUNNING)
    with pytest.raises(ResourceExhausted) as err:
        svc.book.admit("tenants/a")
    assert err.value.reason == "TOO_MANY_QUEUED_JOBS"
    svc.book.admit("tenants/b")
    svc.book.set_state(job, State.CANCELLED, "test")
    svc.book.admit("tenants/a")
    assert svc.book.queued == {} and svc.book.state_counts[State.CANCELLED] == 1
