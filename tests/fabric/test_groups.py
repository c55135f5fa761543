"""Collectives over many groups: planned once per shape, started together, planned off the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from gigacluster.fabric.groups import shapes
from gigacluster.fabric.service import driver as driver_module
from gigacluster.fabric.service.book import FlowBook
from gigacluster.fabric.service.driver import SimDriver
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import Topology
from gigacluster.model import SpecError
from gigacluster.runtime.clock import VirtualClock


def test_copies_in_whole_domains_are_one_shape_and_straddling_copies_another(two_groups: Topology) -> None:
    """TP groups of 8 in 8-chip domains share one shape; groups of 8 at stride 4 alternate between two shapes."""
    ranks = np.arange(8)[None, :] + 8 * np.arange(100)[:, None]
    reps, shape_of, _ = shapes(two_groups, ranks)
    assert reps.tolist() == [0] and (shape_of == 0).all()
    half = np.arange(8)[None, :] + 4 * np.arange(100)[:, None]
    reps, shape_of, _ = shapes(two_groups, half)
    assert reps.tolist() == [0, 1] and shape_of.tolist() == [0, 1] * 50


@pytest.mark.parametrize("op,size,stride,algo", [("all_reduce", 8, 8, None), ("all_reduce", 16, 1, "ring"),
                                                  ("all_gather", 16, 1, "ring")])
def test_groups_started_together_end_as_when_started_one_by_one(two_groups: Topology, op: str, size: int,
                                                                stride: int, algo: str | None) -> None:
    """One call for 32 copies ends when the last of 32 separate calls ends (same routes, same labels, same rates)."""
    # size 16 at stride 64 chips... placed one rank per node: the copies cross the leaves and share spines
    r0 = np.arange(size) * (64 if size == 16 else 1)
    together = FlowSim(two_groups)
    hs = together.start_collectives(op, r0, stride, 32, 3e8, start_s=0.0, algo=algo)
    together.run_until_idle()
    alone = FlowSim(two_groups)
    singles = [alone.start_collective(op, r0 + stride * k, 3e8, start_s=0.0, algo=algo) for k in range(32)]
    alone.run_until_idle()
    assert {h.algorithm for h in hs} == {h.algorithm for h in singles}
    assert max(h.end_s for h in hs) == pytest.approx(max(h.end_s for h in singles), rel=1e-9)


def test_a_shape_is_planned_once_and_reused_from_the_cache(two_groups: Topology) -> None:
    """The second identical request plans nothing new; a fault (network version) makes a fresh plan."""
    sim = FlowSim(two_groups)
    sim.start_collectives("all_reduce", np.arange(8), 8, 100, 1e6, start_s=0.0)
    sim.start_collectives("all_reduce", np.arange(8), 8, 100, 1e6, start_s=0.0)
    assert sim.planner.n_cached == 1
    sim.fail_link(int(two_groups.nic_up[1000]))
    sim.start_collectives("all_reduce", np.arange(8), 8, 100, 1e6, start_s=0.0)
    assert sim.planner.n_cached == 2


def test_a_copy_past_the_topology_is_refused_before_planning(two_groups: Topology) -> None:
    """The last copy must fit: ranks 0-7 x 200 copies at stride 8 name chip 1,599 of 1,024."""
    with pytest.raises(SpecError) as exc:
        FlowSim(two_groups).start_collectives("all_reduce", np.arange(8), 8, 200, 1e6, start_s=0.0)
    assert exc.value.field == "ranks"


def test_a_group_naming_a_chip_twice_is_refused(two_groups: Topology) -> None:
    """Ranks 0-7 with chip 5 twice: the fabric refuses the group (its check sorts the ranks: gigacluster.arrays)."""
    with pytest.raises(SpecError, match="distinct") as exc:
        FlowSim(two_groups).start_collectives("all_reduce", np.array([0, 1, 2, 3, 4, 5, 6, 5]), 8, 4, 1e6,
                                              start_s=0.0)
    assert exc.value.field == "ranks"


def _driver(topo: Topology, monkeypatch: pytest.MonkeyPatch) -> SimDriver:
    monkeypatch.setattr(driver_module, "INLINE_PLAN_MAX_RANKS", 0)  # these small requests go to the thread too
    sim = FlowSim(topo)
    return SimDriver(sim, topo, FlowBook(sim), VirtualClock(epoch_unix_s=0.0), lag_s=0.0, publish=lambda *_: None)


async def test_planning_runs_off_the_event_loop(two_groups: Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan waits for an event only the loop sets: if planning ran on the loop this would never finish."""
    driver = _driver(two_groups, monkeypatch)
    gate = threading.Event()
    orig = driver.sim.plan_collectives

    def gated(*args: Any, **kw: Any) -> Any:
        assert gate.wait(10), "the event loop was blocked while planning"
        return orig(*args, **kw)

    driver.sim.plan_collectives = gated  # type: ignore[method-assign]
    task = asyncio.ensure_future(driver.start_collectives("all_reduce", np.arange(8), 8, 64, 1e6, algo=None,
                                                          start_s=0.0, traffic_class="training", tag=""))
    await asyncio.sleep(0.01)
    gate.set()
    handles = await asyncio.wait_for(task, 10)
    assert len(handles) == 1 and handles[0].n_ranks == 8
    driver.close()


async def test_a_cancelled_caller_starts_nothing_and_stops_its_plan(two_groups: Topology,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelling StartCollective while it plans sets the plan's stop flag; no group reaches the simulator."""
    driver = _driver(two_groups, monkeypatch)
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, threading.Event] = {}

    def blocked(*args: Any, stop: threading.Event, **kw: Any) -> Any:
        seen["stop"] = stop
        entered.set()
        release.wait(10)
        raise RuntimeError("not reached by the caller")

    driver.sim.plan_collectives = blocked  # type: ignore[method-assign]
    task = asyncio.ensure_future(driver.start_collectives("all_reduce", np.arange(8), 8, 64, 1e6, algo=None,
                                                          start_s=0.0, traffic_class="training", tag=""))
    while not entered.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert seen["stop"].is_set() and driver.sim.groups() == []
    driver.close()


async def test_time_spent_planning_never_delays_the_flows_in_virtual_time(two_groups: Topology,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """While a collective is planned off the loop the simulator is held at its start time: the clock moves on
    (here 10 virtual seconds, as a loaded fabric planning a 100k-chip step's collectives did), the groups still
    start at the time asked, and the simulator resumes once they are committed. Without the hold, a 102,400-chip
    Llama 3 405B job's parameter all-gather came out 3.9-9.3 s instead of 0.28 s."""
    driver = _driver(two_groups, monkeypatch)
    entered, release = threading.Event(), threading.Event()
    orig = driver.sim.plan_collectives

    def slow(*args: Any, **kw: Any) -> Any:
        entered.set()
        assert release.wait(10)
        return orig(*args, **kw)

    driver.sim.plan_collectives = slow  # type: ignore[method-assign]
    task = asyncio.ensure_future(driver.start_collectives("all_reduce", np.arange(8), 8, 64, 1e6, algo=None,
                                                          start_s=1.0, traffic_class="training", tag=""))
    while not entered.is_set():
        await asyncio.sleep(0.001)
    driver.advance(11.0)  # the clock ran on while the plan was being made
    assert driver.sim.now_s == 1.0
    release.set()
    handles = await asyncio.wait_for(task, 10)
    assert handles[0].start_s == 1.0
    alone = FlowSim(two_groups).start_collectives("all_reduce", np.arange(8), 8, 64, 1e6, start_s=1.0)
    assert handles[0].predicted_end_s == pytest.approx(alone[0].predicted_end_s)
    driver.advance(11.0)
    assert driver.sim.now_s == 11.0
    driver.close()


async def test_in_event_mode_the_simulators_next_event_is_a_wake_up_of_the_clock(two_groups: Topology) -> None:
    """With the event clock the driver waits on the clock, not on wall time: the mesh's next wake-up is the
    simulator's next event (so time stops where a flow ends, however contention stretched it), and moving time
    there ends the flow."""
    from gigacluster.runtime.clock import EventClock

    clock = EventClock(0.0)
    sim = FlowSim(two_groups)
    driver = SimDriver(sim, two_groups, FlowBook(sim), clock, lag_s=0.0, publish=lambda *_: None)
    h = sim.start_collectives("all_reduce", np.arange(8), 8, 4, 1e9, start_s=0.0)[0]
    task = asyncio.ensure_future(driver.run())
    for _ in range(100):
        await asyncio.sleep(0)
    wakes = []
    while h.state != "done" and len(wakes) < 50:
        nxt = clock.next_wake_s()
        assert nxt is not None and nxt == pytest.approx(sim.next_event_s())
        wakes.append(nxt)
        clock.advance(nxt)
        for _ in range(100):
            await asyncio.sleep(0)
    assert h.state == "done" and wakes[-1] == pytest.approx(h.end_s) and sim.now_s == pytest.approx(h.end_s)
    task.cancel()
    driver.close()
