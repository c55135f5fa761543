"""The simulator driver: keeps the one :class:`FlowSim` of the cluster in step with the virtual clock.

The simulator lags the clock by a small window so a call that arrives a few milliseconds after
its ``not_before_s`` still starts its flows at that exact time (RPC latency does not leak into
results). Asking for a flow whose predicted end has passed advances the simulator to that end,
so a caller that waited for its collective sees it done at once.

Planning a collective over many groups (shapes, algorithm choice, phase layout; more than
``INLINE_PLAN_MAX_RANKS`` ranks in all) runs on one worker thread, off the event loop, so health
checks and other calls keep answering; a caller that cancels (its deadline passed) sets the
plan's stop flag and nothing of it is started. Only the short commit into the simulator runs on
the loop. While a plan is being made, the simulator is held at its start time (as the lag window
does for RPC latency), so time spent planning never delays the flows in virtual time: a step's
collectives start when the job asked, however long the fabric took to plan them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gigacluster.errors import InvalidArgument, ResourceExhausted
from gigacluster.fabric.service.book import FlowBook, FlowRecord
from gigacluster.fabric.service.windows import (
    IsolatedStep,
    LinkState,
    PatternCollective,
    Window,
    WindowBook,
    credit,
    cut_plan,
    isolated_step,
)
from gigacluster.fabric.sim import FlowEvent, FlowGroupHandle, FlowSim, TierStats
from gigacluster.fabric.topology import TIER_NAMES, Topology
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.clock import busy as clock_busy

MAX_ACTIVE_GROUPS = 200_000
MAX_TICK_S = 0.05  # wall seconds between two looks at the clock when nothing is due sooner
INLINE_PLAN_MAX_RANKS = 1024  # collectives over at most this many ranks (all groups) are planned on the loop


class SimDriver:
    """Advances the simulator (``lag_s`` behind the clock), turns its events into notifications and
    telemetry, and applies faults and cancellations."""

    def __init__(self, sim: FlowSim, topo: Topology, book: FlowBook, clock: VirtualClock, *, lag_s: float,
                 publish: Callable[[str, dict[str, Any]], None]) -> None:
        self.sim, self.topo, self.book, self.clock = sim, topo, book, clock
        self.lag_s = lag_s
        self.publish = publish
        self._wake = asyncio.Event()
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fabric-plan")
        self._planning: dict[int, float] = {}  # start times of collectives being planned off the loop
        self._plan_seq = 0
        self.windows = WindowBook(sim)
        self._window_wake: dict[str, asyncio.Event] = {}  # an open window's stream, woken when it is cut

    def close(self) -> None:
        """Stop the planning thread (plans queued behind the running one are dropped)."""
        self._planner.shutdown(wait=False, cancel_futures=True)

    async def start_collectives(self, op: str, ranks: np.ndarray, stride: int, groups: int, bytes_: float, *,
                                algo: str | None, start_s: float, traffic_class: str,
                                tag: str, repeats: int = 1) -> list[FlowGroupHandle]:
        """Plan off the loop (one plan per shape), then start the groups; a cancelled caller starts nothing."""
        stop = threading.Event()
        plan = functools.partial(self.sim.plan_collectives, op, ranks, stride, groups, bytes_, algo=algo, stop=stop)
        if groups * ranks.size <= INLINE_PLAN_MAX_RANKS:  # a few ms at most: not worth a thread hop
            return self.sim.start_planned(plan(), start_s=start_s, traffic_class=traffic_class, tag=tag,
                                          repeats=repeats)
        self._plan_seq += 1
        key = self._plan_seq
        self._planning[key] = start_s  # hold the simulator there until the plan is committed
        try:
            with clock_busy():  # the event clock holds time while the thread plans (the process looks idle)
                planned = await asyncio.get_running_loop().run_in_executor(self._planner, plan)
            return self.sim.start_planned(planned, start_s=start_s, traffic_class=traffic_class, tag=tag,
                                          repeats=repeats)
        except asyncio.CancelledError:
            stop.set()
            raise
        finally:
            del self._planning[key]
            self._wake.set()

    def horizon_s(self, until_s: float) -> float:
        """How far the simulator may advance toward ``until_s``: not past a collective still being planned."""
        return min(until_s, min(self._planning.values())) if self._planning else until_s

    def advance(self, until_s: float) -> None:
        until_s = self.horizon_s(until_s)
        while until_s > self.sim.now_s:
            stop = until_s
            if self.windows.windows:  # event by event, so a window is cut at the exact time traffic hits it
                nxt = self.sim.next_event_s()
                if nxt is not None and self.sim.now_s < nxt < until_s:
                    stop = nxt
            self.events(self.sim.advance(stop))
            self.cut_hit_windows()

    def tier_stats(self) -> tuple[tuple[TierStats, ...], int, float]:
        """(per-tier statistics, active sub-flows, the virtual time they are as of), the simulator first brought to
        the clock (less the lag) as the driver's loop would: the flows' aggregates at that instant, plus per tier
        the cumulative link-seconds of utilisation and bytes of the flows, of the windows credited, and of the
        steps the open windows have completed by then; and the highest utilisation the open windows' steps reach.
        O(tiers) beyond what advancing the simulator costs anyway."""
        self.advance(self.clock.now() - self.lag_s)
        t = self.sim.now_s
        tiers, active = self.sim.tier_stats()
        busy, byt = self.sim.tier_totals()
        w_busy, w_bytes, w_peak = self.windows.open_totals(t)
        out = []
        for ts in tiers:
            i = TIER_NAMES.index(ts.tier)
            out.append(dataclasses.replace(ts, busy_link_s=float(busy[i] + w_busy[i]),
                                           bytes_carried=float(byt[i] + w_bytes[i]),
                                           windows_max_utilization=float(w_peak[i])))
        return tuple(out), active, t

    def catch_up(self) -> None:
        """Advance the simulator to the clock's now (before a fault, so it hits the present)."""
        self.advance(self.clock.now())

    def events(self, events: list[FlowEvent]) -> None:
        for ev in events:
            name = self.book.name_of_handle(ev.group_id)
            if ev.kind in ("completed", "failed") and name:
                self.book.notify(name)
            elif ev.kind not in ("completed", "failed", "rerouted"):
                self.publish("events", {"event": ev.kind, "t_s": ev.time_s, "message": ev.message,
                                        "link": self.topo.link_name(ev.link_id) if ev.link_id >= 0 else ""})
        self.book.trim()

    def add(self, rec: FlowRecord) -> None:
        """Book ``rec`` and wake the loop (its flows may be due before the next tick)."""
        self.book.add(rec)
        self.cut_hit_windows()
        self._wake.set()

    # -- steady-state windows ---------------------------------------------------------------------
    async def isolated(self, pattern: list[PatternCollective]) -> tuple[IsolatedStep, LinkState]:
        """A step pattern's alone run (cached per link state) and the link state it was run under; a new one runs
        on the planning thread, off the loop (holding the event clock: a call open at both ends, its handler
        awaiting a thread, looks idle)."""
        key, ls, iso = self.windows.lookup(pattern)
        if iso is None:
            if sum(c.groups * c.ranks.size for c in pattern) <= INLINE_PLAN_MAX_RANKS:
                iso = isolated_step(ls, pattern)
            else:
                with clock_busy():
                    iso = await asyncio.get_running_loop().run_in_executor(self._planner, isolated_step, ls,
                                                                           pattern)
            self.windows.remember(key, iso)
        return iso, ls

    def open_window(self, win: Window) -> asyncio.Event:
        """Track a granted window's stream: the event is set when the window is cut."""
        ev = self._window_wake[win.name] = asyncio.Event()
        return ev

    def cut_hit_windows(self) -> None:
        """Cut every window whose links other traffic has entered, at the time it entered."""
        hits, self.sim.reserved_hits = self.sim.reserved_hits, []
        for t, group, links in hits:
            name = self.book.name_of_handle(group) or group
            for win in self.windows.hit(links):
                self.cut_window(win, t, f"traffic of {name} entered its links")

    def cut_window(self, win: Window, t: float, cause: str) -> None:
        """Cut ``win`` at ``t``: credit what ran, and start the rest of the step in progress as real flows."""
        if win.final:
            return
        k, flows = cut_plan(win, t)
        self.windows.close(win)
        win.final, win.cause, win.cut_s, win.step_flows = True, cause, t, flows
        if k >= win.repeat:
            win.cause = ""
        win.repeat = k
        self.sim.credit_bytes(*credit(win, k, flows))
        for f in flows:
            if f.end_s > 0:
                continue
            c = win.pattern[f.index]
            hs = self.sim.start_collectives(c.op, c.ranks, c.stride, c.groups, f.bytes_, start_s=f.at_s,
                                            algo=c.algorithm, traffic_class=c.traffic_class, tag=c.tag,
                                            repeats=c.repeats)
            rec = FlowRecord(self.book.new_name(), win.tenant, [h.id for h in hs], hs[0].algorithm, f.at_s,
                             f.bytes_, c.tag, c.op, int(c.ranks.size), instance=win.instance)
            self.book.add(rec)
            win.flow_names[f.index] = rec.name
        ev = self._window_wake.get(win.name)
        if ev is not None:
            ev.set()
        self._wake.set()

    def end_window(self, win: Window) -> None:
        """``win``'s stream is over: if it was not cut, credit the steps that ran by now and free its links."""
        self._window_wake.pop(win.name, None)
        if win.final:
            return
        win.repeat = win.steps_by(self.clock.now())
        win.final = True
        self.windows.close(win)
        self.sim.credit_bytes(*credit(win, win.repeat, []))

    def shorten_window(self, win: Window, at_s: float) -> int:
        """Drop the steps of ``win`` that start at or after ``at_s`` (the caller's cut); returns the steps left."""
        if not win.final:
            win.repeat = win.steps_before(at_s)
            ev = self._window_wake.get(win.name)
            if ev is not None:
                ev.set()
        return win.repeat

    async def run(self) -> None:
        """Keep the simulator ``lag_s`` behind the clock and deliver completions on time."""
        event_clock = isinstance(self.clock, EventClock)
        while True:
            self.advance(self.clock.now() - self.lag_s)
            nxt = self.sim.next_event_s()
            self._wake.clear()
            if event_clock:
                # Event mode: the simulator's next event is a wake-up the clock coordinator knows about, so
                # the mesh's time stops there (flows slowed by contention end when the simulator says).
                await self._wake_or_until(nxt)
                continue
            delay = MAX_TICK_S if nxt is None else min(
                MAX_TICK_S, max(self.clock.wall_s(nxt + self.lag_s - self.clock.now()), 0.001))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _wake_or_until(self, t_s: float | None) -> None:
        """Until a call wakes the driver or (when ``t_s`` is given) virtual time reaches ``t_s``."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._wake.wait())]
        if t_s is not None:
            waits.append(asyncio.ensure_future(self.clock.sleep_until(t_s + self.lag_s)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    def settle(self, rec: FlowRecord) -> None:
        """If ``rec`` should have ended by now, advance the simulator to its end."""
        end = max(self.sim.predicted_end_s(h) for h in rec.handles)
        if self.sim.now_s < end <= self.clock.now():
            self.advance(end)

    def end_released(self, is_revoked: Callable[[str], bool]) -> int:
        """End the pending and running flows of instances the broker has released (revoked): a tenant cannot
        leave traffic booked ahead on links the next tenant shares. Returns how many groups it ended."""
        ended = 0
        for instance in [i for i in self.book.instances() if is_revoked(i)]:
            for rec in self.book.take_instance(instance):
                for h in rec.handles:
                    events = self.sim.cancel(h, f"cancelled: instances/{instance} was released")
                    ended += len(events)
                    self.events(events)
        return ended

    def check_capacity(self, n: int) -> None:
        active = sum(1 for _ in self.sim.groups(active_only=True)) if len(self.book) > MAX_ACTIVE_GROUPS else 0
        if active + n > MAX_ACTIVE_GROUPS:
            raise ResourceExhausted(f"fabric holds at most {MAX_ACTIVE_GROUPS} active flow groups", retry_after_s=1.0)

    # -- faults -----------------------------------------------------------------------------------
    def inject_fault(self, target: tuple[str, int], kind: str,
                     capacity_factor: float) -> tuple[list[FlowEvent], set[str]]:
        """Take a link or switch down, or degrade a link; returns the events and the groups it failed."""
        what, ident = target
        if kind != "down":  # checked before anything moves: a refused request cuts no window
            if what != "link":
                raise InvalidArgument("kind", "only links can be degraded; take a switch down instead")
            if not 0 < capacity_factor < 1:  # NaN fails this too
                raise InvalidArgument("capacity_factor", f"must be in (0, 1), got {capacity_factor}")
        self.catch_up()
        self.cut_all_windows("a link fault")
        before = self.book.failed_names()
        if kind == "down":
            events = self.sim.fail_link(ident) if what == "link" else self.sim.fail_switch(ident)
        else:
            events = self.sim.degrade_link(ident, capacity_factor)
        self.events(events)
        failed = self.book.failed_names() - before
        for n in failed:
            self.book.notify(n)
        return events, failed

    def cut_all_windows(self, cause: str) -> None:
        """Cut every open window now (a link fault or repair may move routes; conservative and exact)."""
        for win in list(self.windows.windows.values()):
            self.cut_window(win, self.sim.now_s, cause)

    def clear_fault(self, target: tuple[str, int]) -> None:
        what, ident = target
        self.catch_up()
        self.cut_all_windows("a link repair")
        self.events(self.sim.restore_link(ident) if what == "link" else self.sim.restore_switch(ident))

    def links_affected(self, target: tuple[str, int]) -> int:
        what, ident = target
        return 1 if what == "link" else len(self.topo.links_of_node(ident))


__all__ = ["MAX_ACTIVE_GROUPS", "SimDriver"]
