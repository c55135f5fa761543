"""The scheduler on a real mesh of its own (64 H100 in 8 HGX domains, two chip shards, speed-up 10):
gangs placed on whole domains, quotas with borrowing and reclaim, preemption with a checkpoint,
a chip fault restarting from the checkpoint on healthy chips, and kill -9 of the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack
from tests.conftest import live_stack, wait_for

pytestmark = pytest.mark.integration
J = scheduler_pb2.Job
# A small model (4 layers, hidden 1024) so steps and checkpoints are short; TP 8 inside a domain.
SMALL: dict[str, Any] = {
    "model": {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
              "seq_len": 1024, "mlp": "swiglu"},
    "batch": {"global_batch": 16}, "parallelism": {"tp": 8, "microbatch_size": 1},
    "hardware": {"chip": "h100-sxm", "count": 16}, "precision": "bf16", "steps": 1_000_000,
}


def small(count: int = 16, steps: int = 1_000_000) -> dict[str, Any]:
    return {**SMALL, "hardware": {"chip": "h100-sxm", "count": count}, "steps": steps,
            "batch": {"global_batch": 2 * count}}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def sched_stack(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """A mesh of its own, so the chips are all free and the scheduler can be killed."""
    async with live_stack("sched", mosquitto, tmp_path_factory.mktemp("sched")) as st:
        yield st


_n = iter(range(1, 1000))


async def new_tenant(st: Stack, weight: float = 1.0) -> tuple[str, Client]:
    tid = f"s{next(_n)}-{os.getpid() % 1000}"
    key = await st.create_tenant(tid, weight=weight)
    return f"tenants/{tid}", Client(st.endpoints, key)


async def job_state(gc: Client, name: str) -> scheduler_pb2.Job:
    return await gc.get_job(name)


async def wait_state(gc: Client, name: str, state: int, timeout_s: float = 30.0,
                     cond: Any = None) -> scheduler_pb2.Job:
    out: list[scheduler_pb2.Job] = []

    async def ok() -> bool:
        j = await gc.get_job(name)
        out[:] = [j]
        return j.state == state and (cond is None or cond(j))

    try:
        await wait_for(ok, timeout_s)
    except TimeoutError:
        raise AssertionError(f"{name} never reached {J.State.Name(state)}: {out[-1] if out else None}") from None
    return out[-1]


async def devices_of(admin: Client, instance: str) -> list[int]:
    r = await admin.broker.GetInstance(broker_pb2.GetInstanceRequest(name=instance), metadata=admin.md)
    return [d for rg in r.instance.devices for d in range(rg.start, rg.end)]


@pytest_asyncio.fixture(loop_scope="session")
async def admin_s(sched_stack: Stack) -> AsyncIterator[Client]:
    async with Client(sched_stack.endpoints, sched_stack.admin_key) as gc:
        yield gc


async def test_gangs_take_whole_domains_and_a_gang_that_does_not_fit_takes_nothing(
        sched_stack: Stack, admin_s: Client) -> None:
    """A 16-chip TP-8 job runs on exactly 2 whole HGX domains in one leaf group; a 64-chip job submitted
    meanwhile holds no chips (all or nothing) and says when it is reserved to start; the tenant's usage
    RPC sums its jobs' energy and cost."""
    tenant, gc = await new_tenant(sched_stack)
    async with gc:
        a = await gc.submit_job(small(16))
        ja = await wait_state(gc, a.name, J.STATE_RUNNING, cond=lambda j: j.step > 5)
        devs = await devices_of(admin_s, ja.instance)
        assert len(devs) == 16 and len({d // 8 for d in devs}) == 2
        assert (ja.placement_domains, ja.placement_leaf_groups, ja.dp_spine_crossings) == (2, 1, 0)
        big = await gc.submit_job(small(64))
        jb = await wait_state(gc, big.name, J.STATE_QUEUED, cond=lambda j: "reserved start" in j.reason)
        assert jb.instance == "" and jb.reserved_start_s > 0
        held = await admin_s.broker.ListInstances(broker_pb2.ListInstancesRequest(), metadata=admin_s.md)
        assert [i.purpose for i in held.instances if i.tenant == tenant] == [a.name]
        await gc.cancel_job(big.name)
        await gc.cancel_job(a.name)
        ja = await gc.get_job(a.name)
        u = await gc.scheduler.GetTenantUsage(scheduler_pb2.GetTenantUsageRequest(), metadata=gc.md)
        assert u.tenant == tenant and u.jobs == 2
        assert u.usage.energy_it_j == pytest.approx(ja.usage.energy_it_j) and u.usage.cost_usd > 0


async def test_borrowed_quota_is_used_when_idle_and_reclaimed_by_its_owner(sched_stack: Stack,
                                                                          admin_s: Client) -> None:
    """Queue A (nominal 16) borrows from B's idle 32 in their cohort to run 32 chips; when B submits 32
    chips within its nominal quota, A's borrowing gang is checkpointed and evicted, and B runs.
    A queue without a cohort holds a job over its quota with a reason."""
    ta, ga = await new_tenant(sched_stack)
    tb, gb = await new_tenant(sched_stack)
    cohort = f"c{os.getpid() % 1000}"
    for t, n in ((ta, 16), (tb, 32)):
        await admin_s.scheduler.UpdateQueue(scheduler_pb2.UpdateQueueRequest(queue=scheduler_pb2.Queue(
            name=f"{t}/queues/main", cohort=cohort, quota={"h100-sxm": n})), metadata=admin_s.md)
    await admin_s.scheduler.UpdateQueue(scheduler_pb2.UpdateQueueRequest(queue=scheduler_pb2.Queue(
        name=f"{ta}/queues/solo", quota={"h100-sxm": 8})), metadata=admin_s.md)
    async with ga, gb:
        solo = await ga.submit_job(small(16), queue="solo")
        a = await ga.submit_job(small(32), queue="main")
        ja = await wait_state(ga, a.name, J.STATE_RUNNING)
        assert ja.borrowing
        js = await wait_state(ga, solo.name, J.STATE_QUEUED, cond=lambda j: "quota" in j.reason)
        assert "nominal 8" in js.reason
        qs = await ga.scheduler.ListQueues(scheduler_pb2.ListQueuesRequest(), metadata=ga.md)
        main = next(q for q in qs.queues if q.name.endswith("/main"))
        assert main.used["h100-sxm"] == 32 and main.borrowed["h100-sxm"] == 32
        b = await gb.submit_job(small(32), queue="main")
        await wait_state(gb, b.name, J.STATE_RUNNING, timeout_s=30)
        ja = await ga.get_job(a.name)
        assert ja.preemptions == 1 and ja.state == J.STATE_QUEUED and "quota" in ja.reason
        for g, n in ((ga, solo.name), (ga, a.name), (gb, b.name)):
            await g.cancel_job(n)


async def test_higher_priority_gang_preempts_after_a_checkpoint_and_the_victim_resumes(sched_stack: Stack) -> None:
    """A priority-0 48-chip job is evicted by a priority-10 32-chip job: it checkpoints (its last
    checkpoint becomes the step it stopped at), goes PREEMPTED and requeues; when the high job ends it
    is placed again and resumes from that step."""
    _, gc = await new_tenant(sched_stack)
    async with gc:
        low = await gc.submit_job(small(48), priority=0)
        await wait_state(gc, low.name, J.STATE_RUNNING, cond=lambda j: j.step > 10)
        states: list[int] = []
        messages: list[str] = []

        async def watch() -> None:
            async for u in gc.watch_job(low.name):
                states.append(u.job.state)
                messages.append(u.message)

        w = asyncio.create_task(watch())
        high = await gc.submit_job(small(32, steps=40), priority=10)
        jl = await wait_state(gc, low.name, J.STATE_QUEUED, cond=lambda j: j.preemptions == 1)
        assert jl.last_checkpoint_step == jl.step > 10
        assert any(f"preempted by {high.name.removeprefix('jobs/')}" in m for m in messages)
        done = await wait_state(gc, high.name, J.STATE_SUCCEEDED, timeout_s=40)
        assert done.step == 40
        jl = await wait_state(gc, low.name, J.STATE_RUNNING, cond=lambda j: j.step > jl.step, timeout_s=40)
        assert jl.restart_s > 0
        w.cancel()
        assert any("writing a checkpoint" in m for m in messages)  # CHECKPOINTING before release
        assert any(m.startswith("requeued after preemption") for m in messages) and J.STATE_QUEUED in states
        await gc.cancel_job(low.name)


async def test_chip_fault_restarts_from_the_checkpoint_on_healthy_chips(sched_stack: Stack, admin_s: Client) -> None:
    """A chip fault injected on one of a running job's devices fails its step; the job restarts from its
    last durable checkpoint (lost steps counted) on devices that exclude the failed one."""
    _, gc = await new_tenant(sched_stack)
    async with gc:
        job = await gc.submit_job(small(16), checkpoint_interval_steps=50, max_restarts=2)
        # A few steps past a durable checkpoint, so the fault costs work: injected on the step right after the
        # checkpoint, nothing would be lost and lost_steps would rightly stay 0.
        j = await wait_state(gc, job.name, J.STATE_RUNNING,
                             cond=lambda j: j.last_checkpoint_step >= 50 and j.step >= j.last_checkpoint_step + 5)
        devs = await devices_of(admin_s, j.instance)
        bad = devs[3]
        ep = next(s.endpoint for s in (await admin_s.broker.GetInventory(broker_pb2.GetInventoryRequest(),
                                                                          metadata=admin_s.md)).shards
                  if s.devices.start <= bad < s.devices.end)
        async with grpc.aio.insecure_channel(ep) as ch:
            stub = chip_pb2_grpc.ChipServiceStub(ch)
            one = [common_pb2.DeviceRange(start=bad, end=bad + 1)]
            await stub.InjectFault(chip_pb2.InjectFaultRequest(devices=one, kind=chip_pb2.FAULT_KIND_FAILED),
                                   metadata=admin_s.md)
            try:
                j2 = await wait_state(gc, job.name, J.STATE_RUNNING, timeout_s=30,
                                      cond=lambda x: x.restarts == 1 and x.instance not in ("", j.instance))
                # Never rolled back past the checkpoint it had; how many steps were lost depends on where the fault
                # landed (0 right after a checkpoint of this small model became durable). That the count is exact
                # is checked in tests/scheduler/test_checkpoint.py and by the chaos kill -9 rows.
                assert j2.failures == 1 and j2.lost_steps >= 0 and j2.step >= j.last_checkpoint_step
                new = await devices_of(admin_s, j2.instance)
                assert bad not in new and len(new) == 16
            finally:
                await stub.ClearFault(chip_pb2.ClearFaultRequest(devices=one), metadata=admin_s.md)
        await gc.cancel_job(job.name)


async def test_weights_2_to_1_share_a_saturated_cluster_2_to_1(sched_stack: Stack) -> None:
    """Two tenants with broker weights 2 and 1 each queue more 8-chip jobs than the 64-chip cluster holds;
    while both still wait, the weight-2 tenant gets about twice the chip-hours (within 25%)."""
    (ta, a), (_, b) = await new_tenant(sched_stack, 2.0), await new_tenant(sched_stack, 1.0)
    async with a, b:
        jobs = []
        for _ in range(30):
            jobs.append(await a.submit_job(small(8, steps=20)))
            jobs.append(await b.submit_job(small(8, steps=20)))

        async def both_waiting() -> bool:
            ua = await a.scheduler.GetTenantUsage(scheduler_pb2.GetTenantUsageRequest(), metadata=a.md)
            done = sum(1 for j in await a.list_jobs() if j.state == J.STATE_SUCCEEDED)
            return done >= 24 and ua.usage.chip_hours > 0

        await wait_for(both_waiting, 60)
        ua = await a.scheduler.GetTenantUsage(scheduler_pb2.GetTenantUsageRequest(), metadata=a.md)
        ub = await b.scheduler.GetTenantUsage(scheduler_pb2.GetTenantUsageRequest(), metadata=b.md)
        queued_b = sum(1 for j in await b.list_jobs() if j.state == J.STATE_QUEUED)
        assert queued_b > 0, "the weight-1 tenant must still be waiting for the share to be meaningful"
        ratio = ua.usage.chip_hours / ub.usage.chip_hours
        print(f"\nfair share live: chip-hours {ua.usage.chip_hours:.4f} : {ub.usage.chip_hours:.4f} = {ratio:.2f}")
        assert 2.0 / 1.25 <= ratio <= 2.0 * 1.25
        for j in jobs:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await (a if j.tenant == ta else b).cancel_job(j.name)


@pytest.mark.slow
async def test_kill_9_of_the_scheduler_loses_no_job_and_running_jobs_resume_from_their_checkpoint(
        sched_stack: Stack) -> None:
    """After SIGKILL of the scheduler process (the stack supervisor restarts it), every accepted job is
    still there, the running one resumes from its last checkpoint and its old chips were released."""
    _, gc = await new_tenant(sched_stack)
    async with gc:
        run = await gc.submit_job(small(16), checkpoint_interval_steps=50)
        queued = await gc.submit_job(small(64))
        j = await wait_state(gc, run.name, J.STATE_RUNNING, cond=lambda j: j.last_checkpoint_step >= 50)
        proc = sched_stack.procs["scheduler"].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        await asyncio.sleep(1.0)
        await sched_stack.wait_healthy(names=["scheduler"])

        async def back() -> bool:
            try:
                jr = await gc.get_job(run.name)
            except grpc.aio.AioRpcError:
                return False
            return jr.state == J.STATE_RUNNING and jr.step > jr.last_checkpoint_step >= j.last_checkpoint_step

        await wait_for(back, 40)
        jr = await gc.get_job(run.name)
        assert jr.restart_s > 0
        assert (await gc.get_job(queued.name)).state == J.STATE_QUEUED
        names = {x.name for x in await gc.list_jobs()}
        assert {run.name, queued.name} <= names
        await gc.cancel_job(queued.name)
        await gc.cancel_job(run.name)


# Runs in CI's slow step (a fresh pytest session): in the full default session it failed in two CI runs (its
# new job stayed RUNNING at step 0 for 60 s) while passing alone and with the integration directory; the
# interaction is not yet understood (see the closing note of issues 11/12/17).
@pytest.mark.slow
async def test_fabric_outage_longer_than_the_old_retry_budget_uses_no_restart(sched_stack: Stack) -> None:
    """The fabric process is stopped for 30 s (the old ~21 s retry budget failed the job with no restart
    used): the job waits, saying why in its reason, and when the fabric is back it resumes its steps
    with restarts and failures unchanged."""
    _, gc = await new_tenant(sched_stack)
    async with gc:
        job = await gc.submit_job(small(16), checkpoint_interval_steps=20, max_restarts=1)
        await wait_state(gc, job.name, J.STATE_RUNNING, timeout_s=60, cond=lambda j: j.step >= 5)
        fabric = sched_stack.procs.pop("fabric")  # out of the supervisor's sight: it stays down
        try:
            await fabric.stop()
            await asyncio.sleep(30.0)
            during = await gc.get_job(job.name)
            assert during.state in (J.STATE_RUNNING, J.STATE_CHECKPOINTING), during.reason
            assert "waiting for an unavailable service" in during.reason and "restarts not charged" in during.reason
            assert during.restarts == 0 and during.failures == 0
        finally:
            await fabric.start()
            sched_stack.procs["fabric"] = fabric
        await sched_stack.wait_healthy(names=["fabric"])
        after = await wait_state(gc, job.name, J.STATE_RUNNING, timeout_s=60,
                                 cond=lambda j: j.step >= during.step + 5 and not j.reason)
        assert after.restarts == 0 and after.failures == 0 and after.max_restarts == 1
        await gc.cancel_job(job.name)
