"""The event clock's advance rule (gigacluster.clock.core) and the process side (EventClock), no sockets."""

from __future__ import annotations

import asyncio
import math

import pytest

from gigacluster.clock.core import Coordinator, Report, Step, horizons, quiet
from gigacluster.runtime.clock import EventClock


def rep(p: str, *, idle: bool = True, wake: float | None = None, out: int = 0, inn: int = 0, act: int = 0,
        rnd: int = 0) -> Report:
    return Report(process=p, idle=idle, next_wake_s=wake, calls_out=out, calls_in=inn, activity=act, round=rnd)


def two(c: Coordinator, a: Report, b: Report) -> Step:
    c.register("a")
    c.register("b")
    c.report(a)
    return c.report(b)


def test_quiet_needs_every_process_idle_and_balanced_calls() -> None:
    """Quiet means all idle and as many calls open at clients as at servers."""
    assert quiet({"a": rep("a"), "b": rep("b")})
    assert not quiet({"a": rep("a", idle=False), "b": rep("b")})
    assert not quiet({"a": rep("a", out=1), "b": rep("b")})  # a call in transit to b
    assert quiet({"a": rep("a", out=1), "b": rep("b", inn=1)})  # b is serving it (e.g. sleeping on the clock)
    assert not quiet({})


def test_a_streamed_message_in_transit_keeps_the_mesh_from_quiet() -> None:
    """A message a server stream sent and its client has not received yet blocks the advance."""
    server = Report("f", idle=True, next_wake_s=None, calls_out=0, calls_in=1, activity=5, msgs_sent=2)
    client = Report("s", idle=True, next_wake_s=3.0, calls_out=1, calls_in=0, activity=5, msgs_received=1)
    assert not quiet({"f": server, "s": client})
    assert quiet({"f": server, "s": Report("s", idle=True, next_wake_s=3.0, calls_out=1, calls_in=0, activity=6,
                                           msgs_received=2)})


def test_advances_only_after_a_probe_round_confirms_nothing_changed() -> None:
    """Quiet latest reports start a probe; identical answers advance time to the earliest wake-up."""
    c = Coordinator()
    step = two(c, rep("a", wake=5.0, act=3), rep("b", wake=2.0, act=7))
    assert step.probe_round == 1 and step.advance_to_s is None and c.now_s == 0.0
    assert c.report(rep("a", wake=5.0, act=3, rnd=1)) == Step()
    step = c.report(rep("b", wake=2.0, act=7, rnd=1))
    assert step.advance_to_s == 2.0 and c.now_s == 2.0 and c.advances == 1
    assert step.horizons == {"b": 5.0, "a": 2.0}  # b, woken, may run ahead until a's wake-up


def test_advances_are_counted_by_the_kind_of_process_whose_wake_up_they_were() -> None:
    """Each advance counts for the kind (name up to its first '-') of the process holding the earliest wake-up."""
    c = Coordinator()
    wakes = {"router-1-aa": 3.0, "chip-2-bb": 1.0, "chip-3-cc": 2.0}
    for p in wakes:
        c.register(p)
    for k in range(1, 4):
        steps = [c.report(rep(p, wake=w, act=k)) for p, w in wakes.items()]
        rnd = steps[-1].probe_round
        assert rnd is not None
        steps = [c.report(rep(p, wake=w, act=k, rnd=rnd)) for p, w in wakes.items()]
        assert steps[-1].advance_to_s == min(wakes.values())
        first = min(wakes, key=wakes.__getitem__)
        wakes[first] += 10.0  # the woken process now waits for later
    assert c.advances == 3 and c.advances_by_kind == {"chip": 2, "router": 1}


def test_each_process_horizon_is_the_earliest_wake_up_of_the_others() -> None:
    """The process holding the earliest wake-up sees the second; the rest see the first; none waiting is inf;
    a tie leaves no lookahead to either."""
    h = horizons({"a": rep("a", wake=3.0), "b": rep("b", wake=1.0), "c": rep("c"), "d": rep("d", wake=7.0)})
    assert h == {"a": 1.0, "b": 3.0, "c": 1.0, "d": 1.0}
    assert horizons({"a": rep("a", wake=1.0), "b": rep("b")}) == {"a": math.inf, "b": 1.0}
    assert horizons({"a": rep("a", wake=2.0), "b": rep("b", wake=2.0)}) == {"a": 2.0, "b": 2.0}


def test_the_event_clock_keeps_its_horizon_until_time_moves_without_one() -> None:
    """A process's horizon comes with the advance; a probe (same time, no horizon) keeps it; time moved without
    one (a registration) leaves no lookahead; it never falls below now."""
    ck = EventClock(0.0)
    assert ck.horizon_s() == 0.0
    ck.advance(2.0, horizon_s=5.0)
    assert ck.now() == 2.0 and ck.horizon_s() == 5.0
    ck.advance(2.0)  # a probe's message
    assert ck.horizon_s() == 5.0
    ck.advance(3.0)
    assert ck.horizon_s() == 3.0


async def test_a_task_waiting_for_time_to_move_is_no_wake_up_and_returns_when_it_moves() -> None:
    """EventClock.moved_past: not a wake-up the coordinator sees (next_wake_s stays None), not ended by a probe at
    the same time, ended by the first advance past it; a cancelled wait leaves nothing behind."""
    ck = EventClock(4.0)
    t = asyncio.ensure_future(ck.moved_past(4.0))
    await asyncio.sleep(0)
    assert ck.next_wake_s() is None and not t.done()
    ck.advance(4.0)  # a probe
    await asyncio.sleep(0)
    assert not t.done()
    ck.advance(4.5)
    await asyncio.wait_for(t, 1.0)
    gone = asyncio.ensure_future(ck.moved_past(4.5))
    await asyncio.sleep(0)
    gone.cancel()
    again = asyncio.ensure_future(ck.moved_past(4.5))
    await asyncio.sleep(0)
    assert len(ck._watchers) == 1
    ck.advance(5.0)
    await asyncio.wait_for(again, 1.0)


def test_a_call_in_transit_between_reports_is_never_missed() -> None:
    """a reported idle, then called b, which had already reported: the probe sees the changed activity."""
    c = Coordinator()
    step = two(c, rep("a", wake=9.0, act=1), rep("b", wake=1.0, act=1))
    assert step.probe_round == 1
    # Answers: a sent a call (activity moved), b has not received it yet: totals unbalanced.
    c.report(rep("a", wake=9.0, out=1, act=2, rnd=1))
    step = c.report(rep("b", wake=1.0, act=1, rnd=1))
    assert step.advance_to_s is None and c.now_s == 0.0


def test_changed_activity_with_balanced_calls_probes_again_before_advancing() -> None:
    """Answers that are quiet but show activity since the snapshot start a new round instead of advancing."""
    c = Coordinator()
    two(c, rep("a", wake=3.0, act=1), rep("b", act=1))
    c.report(rep("a", wake=3.0, act=4, rnd=1))
    step = c.report(rep("b", act=1, rnd=1))
    assert step == Step(probe_round=2) and c.now_s == 0.0
    c.report(rep("a", wake=3.0, act=4, rnd=2))
    assert c.report(rep("b", act=1, rnd=2)).advance_to_s == 3.0


def test_a_state_change_during_a_probe_cancels_it() -> None:
    """A spontaneous report in the middle of a round voids the round; late answers to it never conclude a round
    (the latest of them, quiet, starts a new one)."""
    c = Coordinator()
    two(c, rep("a", wake=3.0), rep("b"))
    c.report(rep("a", wake=3.0, rnd=1))
    step = c.report(rep("b", idle=False, act=1))  # b got busy
    assert step == Step() and c.active is None
    step = c.report(rep("b", act=1, rnd=1))  # a late answer: b's latest state (idle again), never a conclusion
    assert step.probe_round == 2 and step.advance_to_s is None and c.now_s == 0.0
    assert c.report(rep("a", wake=3.0, rnd=1)) == Step()  # answers to round 1 no longer count
    assert c.now_s == 0.0


def test_busy_or_unreported_process_blocks_the_advance() -> None:
    """No probe while a process is busy or has not reported yet."""
    c = Coordinator()
    c.register("a")
    c.register("b")
    assert c.report(rep("a", wake=1.0)) == Step()  # b never reported
    assert c.report(rep("b", idle=False)) == Step()
    assert c.now_s == 0.0


def test_idle_mesh_with_nothing_pending_keeps_time() -> None:
    """With no wake-up pending anywhere, a confirmed idle mesh stays at its time."""
    c = Coordinator(now_s=4.0)
    two(c, rep("a"), rep("b"))
    c.report(rep("a", rnd=1))
    assert c.report(rep("b", rnd=1)) == Step() and c.now_s == 4.0


def test_time_never_goes_backwards() -> None:
    """A wake-up in the past is answered with the current time; a rejoining process cannot pull time back,
    and a fresh coordinator starts from the latest time a process knew."""
    c = Coordinator(now_s=10.0)
    two(c, rep("a", wake=4.0), rep("b"))
    c.report(rep("a", wake=4.0, rnd=1))
    assert c.report(rep("b", rnd=1)).advance_to_s == 10.0 and c.now_s == 10.0 and c.advances == 0
    c.register("c", now_s=3.0)
    assert c.now_s == 10.0
    fresh = Coordinator()
    fresh.register("a", now_s=42.5)
    assert fresh.now_s == 42.5


def test_a_process_leaving_lets_the_rest_advance() -> None:
    """When a busy process's stream ends, the idle rest are probed."""
    c = Coordinator()
    two(c, rep("a", wake=1.0), rep("b", idle=False))
    step = c.leave("b")
    assert step.probe_round == 1
    assert c.report(rep("a", wake=1.0, rnd=1)).advance_to_s == 1.0


def test_time_holds_until_the_expected_processes_are_registered() -> None:
    """With expect=3, two quiet processes do not move time; the third joining lets it move."""
    c = Coordinator(expect=3)
    assert two(c, rep("a", wake=1.0), rep("b")) == Step()
    c.register("c")
    step = c.report(rep("c"))
    assert step.probe_round == 1
    for p, wake in (("a", 1.0), ("b", None), ("c", None)):
        step = c.report(rep(p, wake=wake, rnd=1))
    assert step.advance_to_s == 1.0


def test_report_rejects_negative_counters() -> None:
    """A report with a negative counter is refused."""
    with pytest.raises(ValueError):
        rep("a", out=-1)


async def test_event_clock_wakes_sleepers_in_order_and_never_goes_back() -> None:
    """sleep_until parks until advance() reaches its time; now() never decreases."""
    clock = EventClock()
    woke: list[float] = []

    async def sleeper(t: float) -> None:
        await clock.sleep_until(t)
        woke.append(clock.now())

    tasks = [asyncio.ensure_future(sleeper(t)) for t in (3.0, 1.0, 2.0)]
    await asyncio.sleep(0)
    assert clock.next_wake_s() == 1.0 and clock.activity >= 3
    clock.advance(2.0)
    await asyncio.sleep(0)
    assert woke == [2.0, 2.0] and clock.next_wake_s() == 3.0
    clock.advance(1.0)
    assert clock.now() == 2.0
    tasks[0].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert clock.next_wake_s() is None
    await clock.sleep_until(1.5)  # in the past: at once


def test_event_clock_busy_and_call_counters() -> None:
    """busy() holds the clock; call counters move with calls; every change bumps the activity."""
    clock = EventClock()
    seen: list[int] = []
    clock.on_change = lambda: seen.append(clock.activity)
    with clock.busy():
        assert clock.holds == 1
    clock.call_started(inbound=False)
    clock.call_started(inbound=True)
    assert (clock.calls_out, clock.calls_in) == (1, 1)
    clock.call_ended(inbound=False)
    clock.call_ended(inbound=True)
    assert (clock.holds, clock.calls_out, clock.calls_in) == (0, 0, 0)
    assert seen == [1, 2, 3, 4, 5, 6]


def test_module_busy_holds_only_the_installed_event_clock() -> None:
    """runtime.clock.busy() is a no-op in wall mode and holds the process's event clock in event mode."""
    from gigacluster.runtime import clock as clockmod

    with clockmod.busy():
        assert clockmod.active() is None
    ev = EventClock()
    clockmod.install(ev)
    try:
        with clockmod.busy():
            assert ev.holds == 1
        assert ev.holds == 0 and ev.activity == 2
    finally:
        clockmod.install(None)


async def test_an_ahead_sleeper_ends_once_the_horizon_passes_its_time() -> None:
    """sleep_until(t, ahead=True) returns as soon as an advance tells a horizon past t (time itself short of t),
    returns at once if the horizon is already past t, and otherwise waits for time as a plain sleeper does;
    plain sleepers never move for the horizon, and both count in next_wake_s."""
    clock = EventClock()
    woke: dict[str, float] = {}

    async def sleeper(name: str, t: float, ahead: bool) -> None:
        await clock.sleep_until(t, ahead=ahead)
        woke[name] = clock.now()

    tasks = [asyncio.ensure_future(sleeper("plain", 3.0, False)), asyncio.ensure_future(sleeper("ahead", 3.0, True)),
             asyncio.ensure_future(sleeper("far", 9.0, True))]
    await asyncio.sleep(0)
    assert clock.next_wake_s() == 3.0
    clock.advance(1.0, horizon_s=2.5)  # the horizon short of 3: nobody goes
    await asyncio.sleep(0)
    assert woke == {}
    clock.advance(2.0, horizon_s=4.0)  # past 3: the ahead sleeper goes at time 2, the plain one waits
    await asyncio.sleep(0)
    assert woke == {"ahead": 2.0}
    await clock.sleep_until(3.5, ahead=True)  # before the horizon: at once
    assert clock.now() == 2.0
    clock.advance(3.0)
    await asyncio.sleep(0)
    assert woke == {"ahead": 2.0, "plain": 3.0} and clock.next_wake_s() == 9.0
    clock.advance(9.0)
    await asyncio.gather(*tasks)
    assert woke["far"] == 9.0


def dormant(p: str, *, wake: float | None = None, act: int = 0, rnd: int = 0, inn: int = 0) -> Report:
    return Report(process=p, idle=True, next_wake_s=wake, calls_out=0, calls_in=inn, activity=act, round=rnd,
                  dormant=True)


def test_a_dormant_process_is_not_probed_and_hears_only_its_own_wake_up() -> None:
    """A process at rest (dormant, every counter zero) is left out of the probe round, its report standing for
    it; the advance goes to the live process and to the dormant one only once its wake-up is due."""
    c = Coordinator(expect=3)
    for p in ("live", "rest", "later"):
        c.register(p)
    c.report(rep("live", wake=5.0, act=1))
    c.report(dormant("rest"))
    step = c.report(dormant("later", wake=9.0))
    assert step.probe_round == 1 and step.targets == frozenset({"live"})
    step = c.report(rep("live", wake=5.0, act=1, rnd=1))
    assert step.advance_to_s == 5.0 and step.targets == frozenset({"live"})
    # live now sleeps past later's wake-up: time goes to 9, told to both live and later, not to rest
    c.report(rep("live", wake=20.0, act=2))
    step = c.report(rep("live", wake=20.0, act=2, rnd=2))
    assert step.advance_to_s == 9.0 and step.targets == frozenset({"live", "later"})
    assert not c.resting("later")  # its wake-up is due: probed until it reports again


def test_a_dormant_report_with_a_call_open_counts_as_a_live_one() -> None:
    """Dormancy needs every counter at zero: a process serving a call is probed whatever it says (a stale report
    with a call open could otherwise balance a call in transit elsewhere)."""
    assert dormant("a").at_rest
    assert not dormant("a", inn=1).at_rest
    c = Coordinator(expect=2)
    step = two(c, rep("a", out=1, act=1), dormant("b", inn=1))
    assert step.probe_round == 1 and step.targets is None and c.answers == {}  # the round asks both


def test_a_wake_is_acknowledged_at_once_and_ends_dormancy() -> None:
    """A dormant process a call reached reports with ``wake``: the coordinator acknowledges it (before any probe)
    and counts the process in its rounds again."""
    c = Coordinator(expect=2)
    two(c, rep("a", wake=3.0, act=1), dormant("b"))
    c.report(rep("a", wake=3.0, act=1, rnd=1))  # time moves to 3 (b not told)
    woke = Report("b", idle=True, next_wake_s=None, calls_out=0, calls_in=1, activity=1, wake=7)
    step = c.report(woke)
    assert step.woken == {"b": 7} and not c.resting("b")


def test_every_process_at_rest_moves_time_without_a_probe() -> None:
    """When every process is at rest the round is already answered: time moves to the earliest wake-up and only
    the process whose wake-up it is hears of it."""
    c = Coordinator(expect=2)
    step = two(c, dormant("a", wake=4.0), dormant("b", wake=6.0))
    assert step.probe_round is None and step.advance_to_s == 4.0 and step.targets == frozenset({"a"})


async def test_a_dormant_clock_waits_for_its_wake_before_a_call_runs() -> None:
    """EventClock.awaken waits for the agent's acknowledgement only while the process is dormant."""
    ck = EventClock()
    woke = asyncio.Event()

    async def on_awaken() -> None:
        await woke.wait()
        ck.dormant = False

    ck.on_awaken = on_awaken
    await ck.awaken()  # not dormant: no wait
    ck.dormant = True
    task = asyncio.ensure_future(ck.awaken())
    await asyncio.sleep(0.01)
    assert not task.done()
    woke.set()
    await asyncio.wait_for(task, 1)
    assert ck.at_rest
    ck.external += 1
    assert not ck.at_rest


async def test_a_process_reports_dormant_only_after_resting_without_activity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent says dormant only once the process has been at rest, with no activity, for DORMANT_AFTER_S (a
    process called every few ms stays in the rounds); any activity starts the rest again; a process that may not
    go dormant (it serves HTTP) never says so."""
    from gigacluster.runtime import coordinator_client as cc

    monkeypatch.setattr(cc, "DORMANT_AFTER_S", 0.05)
    ck = EventClock()
    agent = cc.ClockAgent(ck, "127.0.0.1:1", "chip", connect_timeout_s=1, dormancy=True)
    assert not agent._report(0).dormant
    await asyncio.sleep(0.06)
    assert agent._report(0).dormant
    ck.bump()
    assert not agent._report(0).dormant
    ck.calls_in = 1  # serving a call: never at rest
    await asyncio.sleep(0.06)
    assert not agent._report(0).dormant
    http = cc.ClockAgent(EventClock(), "127.0.0.1:1", "router", connect_timeout_s=1, dormancy=False)
    http._report(0)
    await asyncio.sleep(0.06)
    assert not http._report(0).dormant


def test_an_answer_to_a_given_up_round_that_makes_the_mesh_quiet_starts_the_next_round() -> None:
    """A change report gives up round 1 while the mesh is not quiet (a's call to b shows at a alone); b's late
    answer to round 1 then makes it quiet and starts round 2. It used to be ignored, and the mesh waited for an
    unrelated report (a chip shard's key pull, once a wall second) or, with none, for ever."""
    c = Coordinator()
    assert two(c, rep("a", wake=5.0, act=1), rep("b", act=1)).probe_round == 1
    assert c.report(rep("a", wake=5.0, out=1, act=2)) == Step()  # a's call to b leaves: round 1 given up
    assert c.active is None
    step = c.report(rep("b", inn=1, act=2, rnd=1))  # b's late answer: it serves the call, the mesh is quiet
    assert step.probe_round == 2 and c.active == 2 and c.now_s == 0.0
    assert c.report(rep("a", wake=5.0, out=1, act=2, rnd=1)) == Step()  # late for round 2's purposes: ignored
    c.report(rep("a", wake=5.0, out=1, act=2, rnd=2))
    assert c.report(rep("b", inn=1, act=2, rnd=2)).advance_to_s == 5.0
