"""Steady-state windows of the fabric: a job's step pattern reserved for many steps (no gRPC).

A window holds the links its pattern's collectives use (found by running one step of the pattern
alone on a scratch simulator with the live link state) for ``repeat`` steps of ``period_s``. Its
flows never enter the shared simulator while it runs, so it costs nothing per step; its link bytes
are credited when it ends (``steps`` x the step's, exactly). It is granted only while its links
carry no other traffic (no active flow, no other window) and the pattern alone takes the durations
the caller measured in its reference step, and cut at the exact time other traffic enters one of
its links (:attr:`FlowSim.reserved` reports it) or a link fault comes in.

Exactness at a cut at ``t`` (:func:`cut_plan`): steps that ended by ``t`` count in full; of the step
in progress, a collective that ended by ``t`` counts as run alone (it was), one that has not started
starts as a real flow group at its own time, and one in flight continues as a real flow group from
``t`` with the share of its bytes it had left (its remaining time over its duration, alone). From
``t`` on, the newcomer and the job's flows share the links in the simulator as they would have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from gigacluster.errors import FailedPrecondition, NotFound
from gigacluster.fabric.sim import N_TIERS, FlowGroupHandle, FlowSim
from gigacluster.model.cadence import Cadence

MATCH_REL = 1e-6  # a pattern's alone duration matches the caller's reference within this share
ISOLATED_CACHE = 256  # step patterns whose alone run is remembered (per link state)


@dataclasses.dataclass(frozen=True)
class PatternCollective:
    """One collective of a step pattern, as StartCollective takes it, with its offset in the step."""

    op: str
    ranks: np.ndarray
    stride: int
    groups: int
    bytes_: float
    algorithm: str | None
    traffic_class: str
    tag: str
    offset_s: float
    expected_s: float
    repeats: int = 1  # calls it stands for per step (statistics only: FlowSim.start_planned)

    def key(self) -> tuple[object, ...]:
        return (self.op, self.ranks.tobytes(), self.stride, self.groups, self.bytes_, self.algorithm,
                self.traffic_class, self.offset_s, self.repeats)


@dataclasses.dataclass(frozen=True, eq=False)
class IsolatedStep:
    """One step of a pattern run alone: each collective's duration, the links it uses and the bytes one step
    moves on each (what a window of whole steps credits)."""

    durations_s: tuple[float, ...]
    links: np.ndarray  # every link the pattern uses
    step_bytes: np.ndarray  # bytes one step moves on each of ``links``
    # Per tier (indexed as TIER_NAMES), what one step makes: link-seconds of utilisation, bytes, and the highest
    # utilisation a link reaches within it (FlowSim.tier_totals, tier_peak): what the open window adds to the
    # tier's figures while it runs, O(tiers) per read.
    tier_busy_s: np.ndarray
    tier_bytes: np.ndarray
    tier_peak: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class LinkState:
    """What a scratch simulator copies from the live one (read on the event loop; used on a worker thread): the
    links down and the links degraded with their capacity factors (:meth:`FlowSim.link_faults`)."""

    sim: FlowSim
    down: np.ndarray
    degraded: np.ndarray
    factors: np.ndarray

    @classmethod
    def of(cls, sim: FlowSim) -> LinkState:
        return cls(sim, *sim.link_faults())

    def digest(self) -> bytes:
        return hashlib.blake2b(b"".join(a.tobytes() for a in (self.down, self.degraded, self.factors)),
                               digest_size=16).digest()


SCRATCH_KEEP = 2  # idle scratch simulators kept per live one (each holds a few arrays over every link)
_scratch_lock = threading.Lock()
_idle: weakref.WeakKeyDictionary[FlowSim, OrderedDict[bytes, list[FlowSim]]] = weakref.WeakKeyDictionary()


def _new_scratch(ls: LinkState) -> FlowSim:
    """An empty simulator of the live one's topology, classes and link state (down and degraded links)."""
    sim = ls.sim
    scratch = FlowSim(sim.topo, classes=sim.classes, policy=sim.policy, track_links=True)
    for lid in ls.down.tolist():
        scratch.fail_link(lid)
    for lid, f in zip(ls.degraded.tolist(), ls.factors.tolist(), strict=True):
        scratch.degrade_link(lid, f)
    return scratch


@contextlib.contextmanager
def _scratch(ls: LinkState) -> Iterator[FlowSim]:
    """An empty simulator of the live one's topology, classes and link state, for one alone run: an idle one
    kept from an earlier run under the same link state (cleared of its traffic, its plans kept) or a new one.
    On a 10M-link site a new one allocates and fills arrays over every link (a fault that cuts 25 windows
    asks for about a hundred), and its planner plans every shape afresh. Any thread may take one: each is used
    by one caller at a time."""
    key = ls.digest()
    with _scratch_lock:
        free = _idle.setdefault(ls.sim, OrderedDict())
        kept = free.get(key)
        sim = kept.pop() if kept else None
    if sim is None:
        sim = _new_scratch(ls)
    try:
        yield sim
    finally:
        sim.clear_traffic()
        with _scratch_lock:
            free.setdefault(key, []).append(sim)
            free.move_to_end(key)
            while sum(len(v) for v in free.values()) > SCRATCH_KEEP:  # the oldest link state's first
                oldest = next(iter(free))
                free[oldest].pop(0)
                if not free[oldest]:
                    del free[oldest]


def _start(sim: FlowSim, c: PatternCollective, start_s: float, bytes_: float | None = None) -> list[FlowGroupHandle]:
    return sim.start_collectives(c.op, c.ranks, c.stride, c.groups, c.bytes_ if bytes_ is None else bytes_,
                                 start_s=start_s, algo=c.algorithm, traffic_class=c.traffic_class, tag=c.tag,
                                 repeats=c.repeats)


def isolated_step(ls: LinkState, pattern: list[PatternCollective]) -> IsolatedStep:
    """Run one step of ``pattern`` alone on a scratch simulator with the live link state ``ls`` (touches nothing
    of the live simulator: a worker thread may run it)."""
    with _scratch(ls) as scratch:
        handles = [_start(scratch, c, c.offset_s) for c in pattern]
        scratch.run_until_idle()
        durations = []
        for c, hs in zip(pattern, handles, strict=True):
            failed = [h for h in hs if h.state != "done"]
            if failed:
                raise FailedPrecondition(f"a {c.op} of the step pattern cannot run: {failed[0].error[:120]}")
            durations.append(max(float(h.end_s) for h in hs) - c.offset_s)
        links, b = scratch.carried()
        busy, byt = scratch.tier_totals()
        peak = scratch.tier_peak()
    return IsolatedStep(tuple(durations), links, b, busy, byt, peak)


def collective_bytes(ls: LinkState, pattern: list[PatternCollective]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(link ids, bytes) each collective of ``pattern`` moves in one step, each run alone under ``ls`` (only a
    cut that splits a step needs them: a window of whole steps credits :attr:`IsolatedStep.step_bytes`)."""
    out = []
    with _scratch(ls) as alone:
        for c in pattern:
            _start(alone, c, 0.0)
            alone.run_until_idle()
            out.append(alone.carried())
            alone.clear_traffic()
    return out


@dataclasses.dataclass(frozen=True)
class StepFlow:
    """A collective of the step a cut fell in: ended by the cut (``end_s``), or to run from ``at_s``
    with ``bytes_`` (all of it if it had not started, the share it had left if it was in flight)."""

    index: int
    start_s: float
    end_s: float
    at_s: float
    bytes_: float


@dataclasses.dataclass(eq=False)
class Window:
    """A granted window: ``repeat`` steps of ``period_s`` from ``start_s`` (``repeat`` shrinks on a cut)."""

    name: str
    tenant: str
    instance: str
    tag: str
    pattern: list[PatternCollective]
    iso: IsolatedStep
    link_state: LinkState  # the links' state the window was granted under (a cut splitting a step needs it)
    cadence: Cadence  # when each step starts (a period, and checkpoint pauses: model/cadence.py)
    repeat: int
    final: bool = False
    cause: str = ""
    cut_s: float = 0.0
    step_flows: list[StepFlow] = dataclasses.field(default_factory=list)
    flow_names: dict[int, str] = dataclasses.field(default_factory=dict)  # StepFlow index -> flow group

    @property
    def period_s(self) -> float:
        return self.cadence.period_s

    @property
    def end_s(self) -> float:
        return self.cadence.end(self.repeat, self.period_s)

    def steps_by(self, t: float) -> int:
        """Steps that ended by ``t`` (a float-noise margin keeps a step boundary exact)."""
        return min(self.cadence.ended_by(t, self.period_s), self.repeat)

    def steps_before(self, at_s: float) -> int:
        """Steps that start before ``at_s``."""
        return min(self.cadence.started_before(at_s), self.repeat)


def cut_plan(win: Window, t: float) -> tuple[int, list[StepFlow]]:
    """(steps completed by ``t``, the collectives of the step in progress at ``t``); see the module doc."""
    k = win.steps_by(t)
    if k >= win.repeat:
        return win.repeat, []
    s_k = win.cadence.start(k)
    out = []
    for i, (c, d) in enumerate(zip(win.pattern, win.iso.durations_s, strict=True)):
        a = s_k + c.offset_s
        e = a + d
        if e <= t:
            out.append(StepFlow(i, a, e, a, 0.0))
        elif a >= t:
            out.append(StepFlow(i, a, 0.0, a, c.bytes_))
        else:
            out.append(StepFlow(i, a, 0.0, t, c.bytes_ * (e - t) / d))
    return k, out


def credit(win: Window, steps: int, flows: list[StepFlow]) -> tuple[np.ndarray, np.ndarray]:
    """(link ids, bytes) that ``steps`` whole steps moved, plus what the collectives of the step in progress
    moved before the cut (all of one that ended, the share sent of one in flight)."""
    whole = (win.iso.links, win.iso.step_bytes * steps)
    if not flows:
        return whole
    part = np.zeros(len(win.pattern))
    for f in flows:
        full = win.pattern[f.index].bytes_
        part[f.index] = 1.0 if f.end_s > 0 else (full - f.bytes_) / full
    per = collective_bytes(win.link_state, win.pattern)
    return (np.concatenate([whole[0], *(ids for ids, _ in per)]),
            np.concatenate([whole[1], *(b * k for (_, b), k in zip(per, part, strict=True))]))


class WindowBook:
    """Granted windows by name, the links they hold, and the alone runs of the patterns seen."""

    def __init__(self, sim: FlowSim) -> None:
        self.sim = sim
        self.windows: dict[str, Window] = {}
        self._held = np.zeros(sim.topo.n_links, dtype=np.int32)
        self._ids = itertools.count(1)
        self._iso: OrderedDict[tuple[object, ...], IsolatedStep] = OrderedDict()

    def lookup(self, pattern: list[PatternCollective]) -> tuple[tuple[object, ...], LinkState, IsolatedStep | None]:
        """(cache key, the live link state, the pattern's alone run under it if already known)."""
        ls = LinkState.of(self.sim)
        key = (ls.digest(), *(c.key() for c in pattern))
        iso = self._iso.get(key)
        if iso is not None:
            self._iso.move_to_end(key)
        return key, ls, iso

    def remember(self, key: tuple[object, ...], iso: IsolatedStep) -> None:
        self._iso[key] = iso
        if len(self._iso) > ISOLATED_CACHE:
            self._iso.popitem(last=False)

    def isolated(self, pattern: list[PatternCollective]) -> IsolatedStep:
        """The pattern's alone run under the present link state (cached), on the calling thread."""
        key, ls, iso = self.lookup(pattern)
        if iso is None:
            iso = isolated_step(ls, pattern)
            self.remember(key, iso)
        return iso

    @staticmethod
    def mismatch(pattern: list[PatternCollective], iso: IsolatedStep) -> int | None:
        """The index of the first collective whose alone duration is not the caller's reference (None: all match)."""
        for i, (c, d) in enumerate(zip(pattern, iso.durations_s, strict=True)):
            if abs(d - c.expected_s) > MATCH_REL * max(c.expected_s, 1e-9):
                return i
        return None

    def refusal(self, pattern: list[PatternCollective], iso: IsolatedStep, period_s: float) -> str:
        """Why a window of ``pattern`` cannot be granted now ('' if it can)."""
        i = self.mismatch(pattern, iso)
        if i is not None:
            c, d = pattern[i], iso.durations_s[i]
            return (f"the {c.op} at offset {c.offset_s:.6g} s takes {d:.6g} s alone, the reference step "
                    f"{c.expected_s:.6g} s: the step is not in a steady state")
        for c, d in zip(pattern, iso.durations_s, strict=True):
            if c.offset_s + d > period_s * (1 + MATCH_REL):
                return f"the {c.op} at offset {c.offset_s:.6g} s ends after the step ({period_s:.6g} s)"
        if iso.links.size and self._held[iso.links].any():
            return "another window holds some of its links"
        if self.sim.flows_on(iso.links):
            return "other traffic is on some of its links"
        return ""

    def grant(self, *, tenant: str, instance: str, tag: str, pattern: list[PatternCollective], iso: IsolatedStep,
              cadence: Cadence, link_state: LinkState | None = None) -> Window:
        """Grant a window; ``link_state`` is the one its alone run was made under (read now if not given)."""
        win = Window(f"windows/w-{next(self._ids)}", tenant, instance, tag, pattern, iso,
                     link_state or LinkState.of(self.sim), cadence, cadence.repeat)
        self.windows[win.name] = win
        self._held[iso.links] += 1
        self._publish_held()
        return win

    def get(self, name: str, tenant: str) -> Window:
        win = self.windows.get(name)
        if win is None or (tenant and win.tenant != tenant):
            raise NotFound(name[:64])
        return win

    def close(self, win: Window) -> None:
        """The window is over (ended or cut): its links are free, its bytes credited by the caller."""
        if self.windows.pop(win.name, None) is not None:
            self._held[win.iso.links] -= 1
            self._publish_held()

    def open_totals(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per tier, over the open windows: the link-seconds of utilisation and the bytes of the steps each has
        completed by ``t`` (credited to the simulator only when the window ends or is cut, so a read adds them:
        :meth:`FlowSim.tier_totals` plus this is the tier's total as of ``t``, short of the steps in progress), and
        the highest link utilisation any of them reaches within its step. O(windows x tiers)."""
        busy, byt, peak = np.zeros(N_TIERS), np.zeros(N_TIERS), np.zeros(N_TIERS)
        for w in self.windows.values():
            k = w.steps_by(t)
            busy += k * w.iso.tier_busy_s
            byt += k * w.iso.tier_bytes
            if w.cadence.start_s <= t < w.end_s:
                np.maximum(peak, w.iso.tier_peak, out=peak)
        return busy, byt, peak

    def hit(self, links: np.ndarray) -> list[Window]:
        """Open windows that hold any of ``links``."""
        return [w for w in self.windows.values() if np.isin(links, w.iso.links).any()]

    def _publish_held(self) -> None:
        self.sim.reserved = (self._held > 0) if self.windows else None
