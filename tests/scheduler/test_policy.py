"""Dispatcher decisions: quota and borrowing, fair share by weight, preemption, EASY backfill."""

from __future__ import annotations

import numpy as np

from gigacluster.scheduler.placement import Layout, get_policy
from gigacluster.scheduler.policy import Pending, QueueSpec, Running, decide

LAY = {"h100-sxm": Layout.uniform(64, 8, 4)}
TOPO = get_policy("topology")


def pend(job_id: str, tenant: str = "tenants/a", count: int = 8, *, queue: str = "default", priority: int = 0,
         seq: int = 0, duration_s: float = 100.0) -> Pending:
    return Pending(job_id, tenant, queue, priority, seq, "h100-sxm", count, 8, duration_s)


def run(job_id: str, devices: range, tenant: str = "tenants/b", *, priority: int = 0, end_s: float = 1000.0,
        queue: str = "default", borrowing: bool = False) -> Running:
    return Running(job_id, tenant, queue, priority, "h100-sxm", np.arange(devices.start, devices.stop), end_s, 0.0,
                   borrowing, False, 30.0)


def free_except(*held: range) -> dict[str, np.ndarray]:
    m = np.ones(64, dtype=bool)
    for r in held:
        m[r.start:r.stop] = False
    return {"h100-sxm": m}


def go(pending: list[Pending], running: list[Running], **kw: object):  # type: ignore[no-untyped-def]
    args: dict = {"layouts": LAY, "policy": TOPO, "queues": {}, "weights": {}, "usage": {}}
    args.update(kw)
    held = [range(int(r.devices[0]), int(r.devices[-1]) + 1) for r in running]
    args.setdefault("free", free_except(*held))
    return decide(0.0, pending, running, **args)


def test_quota_holds_a_job_and_cohort_lends_idle_quota() -> None:
    """Queue a (16 nominal) can't run 24 chips alone; in a cohort with idle queue b (32) it borrows."""
    qa = QueueSpec("tenants/a", "default", "", (("h100-sxm", 16),))
    d = go([pend("j1", count=24)], [], queues={("tenants/a", "default"): qa})
    assert d.place == [] and "nominal 16" in d.reasons["j1"]
    qs = {("tenants/a", "default"): QueueSpec("tenants/a", "default", "c", (("h100-sxm", 16),)),
          ("tenants/b", "default"): QueueSpec("tenants/b", "default", "c", (("h100-sxm", 32),))}
    d = go([pend("j1", count=24)], [], queues=qs)
    assert [(j, b) for j, _, b in d.place] == [("j1", True)]
    # the cohort's total (48) is never exceeded, whatever is free
    d = go([pend("j2", count=32)], [run("r1", range(0, 24), "tenants/a", borrowing=True)], queues=qs)
    assert d.place == [] and "cohort c has 24 idle" in d.reasons["j2"]


def test_lender_reclaims_borrowed_quota_by_evicting_borrowers() -> None:
    """Queue b within its nominal 32 evicts a's borrowing gang when the cohort is full."""
    qs = {("tenants/a", "default"): QueueSpec("tenants/a", "default", "c", (("h100-sxm", 16),)),
          ("tenants/b", "default"): QueueSpec("tenants/b", "default", "c", (("h100-sxm", 32),))}
    running = [run("a-own", range(0, 16), "tenants/a"), run("a-borrow", range(16, 48), "tenants/a", borrowing=True)]
    d = go([pend("b1", "tenants/b", count=32)], running, queues=qs)
    assert [v for v, _ in d.preempt] == ["a-borrow"] and "reclaimed" in d.preempt[0][1]
    assert d.place == []


def test_weights_two_to_one_give_two_to_one_chip_hours_under_saturation() -> None:
    """Two saturated tenants with weights 2:1 and 8-chip, 100 s jobs on 64 chips get 2:1 chip-hours
    (within 5%) over a simulated 50 job-lengths, through the same decide() the service runs."""
    weights = {"tenants/a": 2.0, "tenants/b": 1.0}
    used = {"tenants/a": 0.0, "tenants/b": 0.0}
    running: list[Running] = []
    seq, now = 0, 0.0
    while now < 5000.0:
        pending = []  # both tenants always have 8 jobs waiting (unplaced ones are the same jobs again)
        for tenant in weights:
            for _ in range(8):
                seq += 1
                pending.append(pend(f"j{seq}", tenant, seq=seq))
        held = np.ones(64, dtype=bool)
        for r in running:
            held[r.devices] = False
        d = decide(now, pending, running, layouts=LAY, free={"h100-sxm": held}, policy=TOPO, queues={},
                   weights=weights, usage=dict(used))
        for j, devs, _ in d.place:
            tenant = next(p.tenant for p in pending if p.job_id == j)
            running.append(Running(j, tenant, "default", 0, "h100-sxm", devs, now + 100.0, now))
        now = min(r.end_s for r in running)
        for r in [r for r in running if r.end_s <= now]:
            used[r.tenant] += r.devices.size * 100.0
            running.remove(r)
    ratio = used["tenants/a"] / used["tenants/b"]
    assert 1.9 <= ratio <= 2.1, ratio


def test_higher_priority_job_evicts_a_minimal_set_of_lower_priority_gangs() -> None:
    """A priority-10 job of 32 chips on a full cluster evicts the two lowest-priority 16-chip gangs only."""
    running = [run("p0-old", range(0, 16), priority=0), run("p5", range(16, 32), priority=5),
               run("p0-new", range(32, 48), priority=0), run("p20", range(48, 64), priority=20)]
    running[2] = Running("p0-new", "tenants/b", "default", 0, "h100-sxm", np.arange(32, 48), 1000.0, 50.0)
    d = go([pend("hi", count=32, priority=10)], running)
    assert sorted(v for v, _ in d.preempt) == ["p0-new", "p0-old"]
    assert "preempting" in d.reasons["hi"]
    # never evicts equal or higher priority
    d = go([pend("eq", count=32, priority=0)], running)
    assert d.preempt == [] and "reserved start" in d.reasons["eq"]
    d = go([pend("hi", count=32, priority=10)], running, preemption=False)
    assert d.preempt == []


def test_backfill_fills_holes_without_delaying_the_reserved_head_job() -> None:
    """Head needs 64 chips (reserved at t=500, when the 48-chip gang ends); a 16-chip job of 400 s
    backfills (ends before 500), one of 600 s does not; with backfill off neither starts."""
    running = [run("big", range(0, 48), end_s=500.0)]
    pending = [pend("head", count=64, seq=1), pend("short", count=16, seq=2, duration_s=400.0)]
    d = go(pending, running)
    assert d.reserved == {"head": 500.0} and [j for j, _, _ in d.place] == ["short"]
    d = go([pend("head", count=64, seq=1), pend("long", count=16, seq=2, duration_s=600.0)], running)
    assert d.place == [] and "waiting behind head" in d.reasons["long"]
    d = go(pending, running, backfill=False)
    assert d.place == []


def test_backfill_may_use_devices_the_head_job_will_not_need() -> None:
    """Head needs 32 chips, reserved on the devices the 500 s gang frees; a long 16-chip job starts now
    on free devices outside that reservation."""
    running = [run("a", range(0, 32), end_s=500.0), run("b", range(48, 64), end_s=5000.0)]
    d = go([pend("head", count=32, seq=1), pend("long", count=16, seq=2, duration_s=10_000.0)], running)
    assert d.reserved["head"] == 500.0
    (job, devs, _), = d.place
    assert job == "long" and set(devs.tolist()) == set(range(32, 48))


def test_too_big_for_the_healthy_chips_says_so() -> None:
    """With 8 chips quarantined, a 64-chip job waits with a reason naming the healthy count."""
    free = free_except(range(0, 8))
    d = go([pend("j", count=64)], [], free=free)
    assert "56 are healthy" in d.reasons["j"]
