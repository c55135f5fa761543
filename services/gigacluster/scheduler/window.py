"""Steady-state windows: many identical steps of a job per chain of calls.

Once two consecutive steps of a job came out the same, the next steps repeat them unless something
changes: :func:`run_window` books K of them at once. The fabric reserves the links of the step's
collective pattern (``ReserveWindow``; granted only while no other traffic uses them and the pattern
alone takes the reference step's durations) and each chip shard books K repetitions of the step's
work (``ExecuteWindow``), with exact busy time, energy and link bytes. The runner holds those
streams open and sleeps; it wakes when the window ends or is cut:

- by the fabric, at the exact time other traffic enters one of its links or a link fault comes in:
  the steps that ended by then count, and the fabric starts the rest of the step in progress as real
  flow groups (its collectives that had not started at their own times, one in flight with the bytes
  it had left), which the runner watches to finish that step exactly (``_finish_step``);
- by a chip shard, on an injected fault of one of its devices: the repetitions that started before
  the fault count, the fabric window is cut there, and the next step fails through the per-step path
  as after a hand-injected fault between two steps;
- by the scheduler (a message on ``wake``, the job book's watch queue: preemption, cancel): the step
  in progress completes, the rest of the window is cut, as the per-step loop finishes its step first.

Windows end at the job's last step and span its checkpoints: a checkpoint's pause is booked inside the
window (the next step starts that much later on chips and fabric alike, model/cadence.py), at the steps
the job's own checkpoint state machine takes them (:func:`window_plan`). Anything that
fails mid-window (a peer unavailable) unbooks the whole window on the chips and cuts the fabric's,
so the per-step path retries from the window's start: nothing of a window is accounted before it
ends, and then every step of it is accounted (and shown by ``watch``, GetJob and the trace) one by one.

A window is tried once the last two steps are alike (the same compute, energy and call times). The steady
step is the one the fabric runs the pattern in alone: concurrent calls reach the fabric in a different
order each step, so load-aware routing may make two of them collide on a link in one step and not in the
next. When the reference's collective durations are not those, the fabric answers with the durations alone
(``alone_s``) and the window is asked again with them (:func:`alone_reference`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import structlog

from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import WINDOW_NOT_STEADY
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.model.cadence import Cadence
from gigacluster.model.training import compose_step
from gigacluster.runtime import convert
from gigacluster.runtime.errors import error_info
from gigacluster.scheduler import step_comm
from gigacluster.scheduler.checkpoint import AsyncCheckpoints
from gigacluster.scheduler.core import JobRecord
from gigacluster.scheduler.runner import JobRunner, StepFailed, StepResult, gather_or_cancel, step_error

log = structlog.get_logger()
SAME_REL = 1e-9  # two steps are "the same" when their times agree this closely
MIN_WINDOW = 2  # fewer steps than this run through the per-step path


def alike(a: StepResult, b: StepResult) -> bool:
    """Whether ``b`` is ``a`` but for how long its collectives took: the same compute, energy and call times.
    (A job whose calls arrive at the fabric in another order each step may route them differently and collide
    on a link in one step and not the next; the window then asks the fabric for the step as it runs alone.)"""
    def close(x: float, y: float) -> bool:
        return abs(x - y) <= SAME_REL * max(abs(x), abs(y), 1e-12)
    return (len(a.calls) == len(b.calls) and close(a.chip_s, b.chip_s) and close(a.above_idle_j, b.above_idle_j)
            and all(close(x0 - a.start_s, y0 - b.start_s) for (x0, _), (y0, _) in zip(a.calls, b.calls, strict=True)))


class NotSteady(Exception):
    """The fabric refused a window because its pattern alone takes other durations than the reference step's:
    ``alone_s`` are those durations (one per collective call)."""

    def __init__(self, alone_s: tuple[float, ...]) -> None:
        super().__init__("the step alone differs from the reference")
        self.alone_s = alone_s


def step_from(runner: JobRunner, ref: StepResult, start_s: float, starts: list[float],
              ends: list[float], sel: list[int] | None = None) -> StepResult:
    """``ref``'s compute with collective calls ``sel`` (all if None) run from ``starts`` to ``ends``, timed as
    the per-step path times a step (scheduler/step_comm.py: each demand's samples, longest call per sample)."""
    names = [n for n, _ in runner.collective_calls]
    idx = list(range(len(names))) if sel is None else sel
    plan = runner.job.plan
    comm = step_comm.demand_s(plan, step_comm.per_call_s([names[i] for i in idx],
                                                         [runner.call_samples[i] for i in idx], starts, ends))
    bd = compose_step(plan, ref.chip_s, comm)
    return StepResult(start_s, bd, ref.above_idle_j, comm, tuple(zip(starts, ends, strict=True)), ref.chip_s)


def alone_reference(runner: JobRunner, ref: StepResult, alone_s: tuple[float, ...]) -> StepResult:
    """``ref`` with its collectives taking ``alone_s`` (the fabric's run of the step alone)."""
    starts = [a for a, _ in ref.calls]
    return step_from(runner, ref, ref.start_s, starts, [a + d for a, d in zip(starts, alone_s, strict=True)])


def carried_reference(runner: JobRunner, ref: StepResult, names: tuple[str, ...]) -> StepResult | None:
    """``ref`` (a steady step whose collective calls were ``names``) on the runner's chips after a restart: each
    of the runner's calls at the offset and with the duration of ``ref``'s first call of the same demand (a
    new placement may split a demand's groups into another number of calls). None if a demand is missing.
    The fabric answers the durations the calls take alone on the new chips (:class:`NotSteady`)."""
    first: dict[str, tuple[float, float]] = {}
    for n, (a, b) in zip(names, ref.calls, strict=True):
        first.setdefault(n, (a - ref.start_s, b - a))
    try:
        calls = [first[n] for n, _ in runner.collective_calls]
    except KeyError:
        return None
    starts = [ref.start_s + off for off, _ in calls]
    return step_from(runner, ref, ref.start_s, starts, [a + d for a, (_, d) in zip(starts, calls, strict=True)])


class ShiftedCalls(Sequence[tuple[float, float]]):
    """A reference step's collective calls moved by ``dt``, computed when read. A window's steps are made when it
    ends, thousands at a time, each with a few hundred calls for a pipelined 405B job, and only the last two are
    ever read (the next window's reference): building every tuple was 38% of the scheduler's time in the
    gigawatt day's last hours. Equal to the tuple of the moved calls."""

    __slots__ = ("_base", "_dt", "_moved")

    def __init__(self, base: Sequence[tuple[float, float]], dt: float) -> None:
        # A shift of a shift moves the calls as they were read (the same sums as before, and no chain of shifts
        # across windows: only a window's last steps become the next one's reference).
        self._base = base._tuple() if isinstance(base, ShiftedCalls) else base
        self._dt = dt
        self._moved: tuple[tuple[float, float], ...] | None = None

    def _tuple(self) -> tuple[tuple[float, float], ...]:
        if self._moved is None:
            dt = self._dt
            self._moved = tuple((a + dt, b + dt) for a, b in self._base)
        return self._moved

    def __len__(self) -> int:
        return len(self._base)

    def __getitem__(self, i: Any) -> Any:
        return self._tuple()[i]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self._tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._tuple() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return repr(self._tuple())


def shifted(ref: StepResult, start_s: float) -> StepResult:
    """``ref`` run again from ``start_s`` (its collective calls moved with it, when read). A copy of ``ref``'s
    fields, not ``dataclasses.replace`` (which checks and sets each field through ``__init__`` at several times
    the cost; ``ref`` was checked when it was made)."""
    out = object.__new__(StepResult)
    out.__dict__.update(ref.__dict__, start_s=start_s, calls=ShiftedCalls(ref.calls, start_s - ref.start_s))
    return out


def window_plan(job: JobRecord, ckpt: AsyncCheckpoints, max_steps: int, start_s: float, period_s: float,
                pause_s: float, write_s: float) -> tuple[int, tuple[int, ...]]:
    """(steps, pause_after) of the next window: up to ``max_steps`` and the job's last step, with the checkpoint
    pauses that fall inside it (steps after which the next starts ``pause_s`` later: model/cadence.py).

    The pauses come from running a copy of the job's checkpoint state machine over the window's steps, as
    ``after_step`` runs the real one when the window's steps are accounted, so the two agree step by step:
    an interval checkpoint, one deferred while a write is in flight, and the write's end. (0, ()) when fewer
    than two steps, or when a deferred checkpoint is due now (the per-step path takes it).
    """
    if max_steps <= 0 or (ckpt.deferred and ckpt.inflight is None):
        return 0, ()
    k = min(max_steps, job.steps_total - job.step)
    if k < MIN_WINDOW:
        return 0, ()
    sim = dataclasses.replace(ckpt)
    pauses: list[int] = []
    t = start_s
    for j in range(k - 1):  # a checkpoint after the window's last step is after_step's, not the window's
        t += period_s
        step = job.step + j + 1
        sim.settle(t)
        if sim.due(step, job.checkpoint_interval_steps, job.steps_total):
            pauses.append(j)
            t += pause_s
            sim.start(step, t, write_s)
    return k, tuple(pauses)


@dataclasses.dataclass(frozen=True)
class WindowRun:
    """What a window ran: its steps in order (the last one finished through real flows after a cut)."""

    steps: list[StepResult]
    cause: str = ""
    cut_s: float = 0.0
    failed: StepFailed | None = None  # the step in progress at a cut failed (a link fault): after ``steps``


class _Open:
    """The calls of one granted window: the fabric stream, one chip stream per shard."""

    def __init__(self, runner: JobRunner, cad: Cadence) -> None:
        self.runner, self.cadence, self.start_s = runner, cad, cad.start_s
        self.fabric = fabric_pb2_grpc.FabricServiceStub(runner.channel(runner.fabric_ep))
        self.name = ""
        self.streams: list[grpc.aio.UnaryStreamCall] = []
        self.cut_at = math.inf
        self.cause = ""  # why the runner cut the window (a chip's fault, the scheduler)

    def boundary(self, steps: int) -> float:
        """Start of step ``steps`` of the window (0-based; checkpoint pauses included)."""
        return self.cadence.start(steps)

    async def cut(self, at_s: float, *, fabric: bool = True, chips: bool = True) -> None:
        """Drop the steps that start at or after ``at_s`` on every chip shard and the fabric."""
        if at_s >= self.cut_at:
            return
        self.cut_at = at_s
        md = self.runner.metadata()
        calls = [chip_pb2_grpc.ChipServiceStub(self.runner.channel(ep)).CutWork(
            chip_pb2.CutWorkRequest(devices=convert.range_msgs(rs), at_s=at_s), metadata=md, timeout=30)
            for ep, rs in self.runner.shard_ranges] if chips else []
        if fabric and self.name:
            calls.append(self.fabric.CutWindow(fabric_pb2.CutWindowRequest(name=self.name, at_s=at_s),
                                               metadata=md, timeout=30))
        await gather_or_cancel(calls)

    def close(self) -> None:
        for s in self.streams:
            s.cancel()


def _reserve_request(runner: JobRunner, ref: StepResult, cad: Cadence) -> fabric_pb2.ReserveWindowRequest:
    cols = []
    for (_, req), (a, b) in zip(runner.collective_calls, ref.calls, strict=True):
        c = fabric_pb2.StartCollectiveRequest()
        c.CopyFrom(req)
        c.not_before_s = 0.0
        cols.append(fabric_pb2.WindowCollective(collective=c, offset_s=a - ref.start_s, expected_s=b - a))
    return fabric_pb2.ReserveWindowRequest(collectives=cols, start_s=cad.start_s, period_s=cad.period_s,
                                           repeat=cad.repeat, tag=runner.job.name, pause_after=cad.pause_after,
                                           pause_s=cad.pause_s)


async def run_window(runner: JobRunner, ref: StepResult, start_s: float, steps: int,
                     interrupted: Callable[[], bool], wake: asyncio.Queue[Any], pause_after: tuple[int, ...] = (),
                     pause_s: float = 0.0) -> WindowRun | None:
    """Run up to ``steps`` repetitions of ``ref`` from ``start_s`` as one window (``pause_s`` more after each step
    in ``pause_after``: the checkpoints inside it); None if it was not granted (nothing booked). Mesh errors
    come out as the per-step path's (``runner.step_error``)."""
    w = _Open(runner, Cadence(start_s, ref.breakdown.step_time_s, steps, pause_after, pause_s))
    try:
        return await _run(w, runner, ref, interrupted, wake)
    except grpc.aio.AioRpcError as err:
        # nothing of the window counts: the per-step path runs it again (the chips first: the fabric may be down)
        w.cut_at = math.inf
        with contextlib.suppress(grpc.aio.AioRpcError):
            await w.cut(start_s, fabric=False)
        w.cut_at = math.inf
        with contextlib.suppress(grpc.aio.AioRpcError):
            await w.cut(start_s, chips=False)
        raise step_error(err) from err
    finally:
        w.close()


async def _run(w: _Open, runner: JobRunner, ref: StepResult, interrupted: Callable[[], bool],
               wake: asyncio.Queue[Any]) -> WindowRun | None:
    job, md, cad = runner.job, runner.metadata(), w.cadence
    start_s = cad.start_s
    fab = w.fabric.ReserveWindow(_reserve_request(runner, ref, cad), metadata=md)
    w.streams.append(fab)
    grant = await fab.read()
    if not grant.granted:
        log.debug("window not granted", job=job.name, refused=grant.refused)
        if len(grant.alone_s) == len(runner.collective_calls):
            raise NotSteady(tuple(grant.alone_s))
        return None
    w.name = grant.name
    if abs(grant.end_s - cad.end(cad.repeat, cad.period_s)) > 1e-9 * max(cad.period_s, abs(grant.end_s)):
        # the fabric started it later (its simulator was past start_s: this runner's time was stale), so chips and
        # fabric would count the window's steps from different starts
        log.warning("window not run: the fabric's window starts at another time", job=job.name, start_s=start_s,
                    end_s=cad.end(cad.repeat, cad.period_s), fabric_end_s=grant.end_s)
        await w.cut(start_s, chips=False)
        await fab.read()
        return None
    items = runner.work_items()
    chips = [chip_pb2_grpc.ChipServiceStub(runner.channel(ep)).ExecuteWindow(chip_pb2.ExecuteWindowRequest(
        work=chip_pb2.ExecuteWorkRequest(devices=convert.range_msgs(rs), items=items, not_before_s=start_s,
                                         tag=job.name, memory_in_use_bytes=runner.memory_per_chip_bytes),
        repeat=cad.repeat, period_s=cad.period_s, pause_after=cad.pause_after, pause_s=cad.pause_s),
        metadata=md) for ep, rs in runner.shard_ranges]
    w.streams += chips
    try:
        firsts = await asyncio.gather(*(c.read() for c in chips))
    except grpc.aio.AioRpcError as err:
        info = error_info(err)
        if info is None or info.reason != WINDOW_NOT_STEADY:
            raise
        # a slow or throttled chip runs the step longer than the reference: single steps until it settles
        log.debug("window not run: the chips' work outlasts the step", job=job.name, detail=(err.details() or "")[:120])
        await w.cut(start_s)
        await fab.read()
        return None
    energy = sum(f.first.energy_j for f in firsts)
    chip_s = max(f.first.end_s for f in firsts) - start_s
    if abs(chip_s - ref.chip_s) > 1e-9 * ref.chip_s or abs(energy - ref.above_idle_j) > 1e-9 * ref.above_idle_j:
        log.debug("window not run: the chips' step differs from the reference", job=job.name)
        await w.cut(start_s)
        await fab.read()
        return None
    final = await _wait(w, fab, chips, interrupted, wake)
    n = final.steps
    # The chips keep the step the fabric's cut fell in (it finishes through real flows), nothing after.
    await w.cut(w.boundary(n + (1 if final.step_flows else 0)), fabric=False)
    done = [shifted(ref, w.boundary(j)) for j in range(n)]
    if final.step_flows:
        try:
            done.append(await _finish_step(runner, ref, w.boundary(n), list(final.step_flows)))
        except StepFailed as exc:  # the steps before it ran: they count, then the failure
            return WindowRun(done, final.cause or w.cause, final.cut_s, exc)
    return WindowRun(done, final.cause or w.cause, final.cut_s)


async def _wait(w: _Open, fab: grpc.aio.UnaryStreamCall, chips: list[grpc.aio.UnaryStreamCall],
                interrupted: Callable[[], bool], wake: asyncio.Queue[Any]) -> fabric_pb2.ReserveWindowResponse:
    """Until the fabric's final message, reacting to a chip's cut and to the scheduler's wake-up."""
    fab_final = asyncio.ensure_future(fab.read())
    chip_finals = {asyncio.ensure_future(c.read()) for c in chips}
    woken = asyncio.ensure_future(wake.get())
    try:
        while not fab_final.done():
            await asyncio.wait({fab_final, woken, *chip_finals}, return_when=asyncio.FIRST_COMPLETED)
            for t in [t for t in chip_finals if t.done()]:
                chip_finals.discard(t)
                msg = t.result()
                if msg.cause:  # a fault on one of its devices: the repetitions started before it count
                    w.cause = w.cause or f"chip: {msg.cause}"
                    await w.cut(w.boundary(msg.repeats))
            if woken.done():
                woken = asyncio.ensure_future(wake.get())
                if interrupted():  # the step in progress completes, as in the per-step loop
                    w.cause = w.cause or "the scheduler (preemption or cancel)"
                    await w.cut(w.boundary(w.cadence.started_by(w.runner.clock.now())))
        return fab_final.result()
    finally:
        for t in (fab_final, woken, *chip_finals):
            t.cancel()


async def _finish_step(runner: JobRunner, ref: StepResult, start_s: float,
                       flows: list[fabric_pb2.WindowFlow]) -> StepResult:
    """The step a cut fell in: its compute as booked, its collectives as run alone before the cut and as
    real flows (sharing the links) after it; returns when it ends in virtual time."""
    starts = [f.start_s for f in flows]
    ends = [f.end_s for f in flows]
    live = [i for i, f in enumerate(flows) if f.flow]
    for i, end in zip(live, await runner.flow_ends([flows[i].flow for i in live]), strict=True):
        ends[i] = end
    res = step_from(runner, ref, start_s, starts, ends, [f.index for f in flows])
    await runner.clock.sleep_until(res.end_s)
    return res
