"""The event clock's advance rule: when the mesh's virtual time may jump, and to what (no gRPC here).

Conservative synchronisation, as parallel discrete-event simulators do it: virtual time moves to
the earliest pending wake-up of any process only when nothing can still happen before it. Each
process reports whether it is idle (no work the coordinator cannot see), its earliest wake-up, the
mesh calls it has open as client and as server, the messages of open server streams it sent and
received, and an activity counter that grows with every call, message, sleep and wake-up. A call
in transit shows as open at its client and not (yet, or any more) at its server, a streamed
message as sent and not received, so the totals differ.

A snapshot of reports taken at different moments can miss a call that left an idle process after
it reported and reached one that had already reported (Mattern's four-counter problem). So the
rule is two waves: when the latest report of every process is quiet (idle, totals balanced), the
coordinator starts a probe round and every process reports again; it advances only if every
answer is idle, balanced, and shows the same activity as the report that started the round, i.e.
nothing at all happened in between, so both waves describe one instant at which the mesh was idle
and nothing was in flight.

Dormant processes. Most processes of a large mesh are idle most of the time with no call open (a chip
shard no job runs on), yet each would answer every probe and hear every advance. A process may say it
is *dormant* (idle, no call or stream open either way) and promise to wake through the coordinator
before it handles any call that reaches it: its report with ``wake`` set is taken in, acknowledged, and
only then does its handler run. Until then nothing can change it but time reaching its own wake-up, so
its last report stands for it in probe rounds (it is not asked) and it is told the time only when its
wake-up is due. This is safe because a dormant report has every counter at zero: a call on its way to
a dormant process shows open at its client alone, so the totals differ until the woken process reports
it; and the caller cannot see its call end (and balance the totals) before the wake was acknowledged,
so a dormant report can never stand for a process a call has already changed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Report:
    """What one process says about itself (see the module docstring)."""

    process: str
    idle: bool
    next_wake_s: float | None
    calls_out: int
    calls_in: int
    activity: int
    round: int = 0  # the probe round this answers; 0 = sent because the process's state changed
    now_s: float = 0.0
    msgs_sent: int = 0  # messages of open server streams this process sent as their server
    msgs_received: int = 0  # ... and received as their client
    dormant: bool = False  # asks to be left out of rounds until it wakes (see the module docstring)
    wake: int = 0  # non-zero: a call reached this dormant process; it waits for this to be acknowledged

    def __post_init__(self) -> None:
        if min(self.calls_out, self.calls_in, self.activity, self.round, self.msgs_sent, self.msgs_received,
               self.wake) < 0:
            raise ValueError("counters must be >= 0")

    @property
    def at_rest(self) -> bool:
        """Dormant as the coordinator may take it: idle with every counter at zero (a report that says dormant
        with a call open is counted as a live one)."""
        return (self.dormant and self.idle and not self.wake and self.calls_out == 0 and self.calls_in == 0
                and self.msgs_sent == 0 and self.msgs_received == 0)


@dataclasses.dataclass(frozen=True)
class Step:
    """What the coordinator must do after a report: ask every process for a report, tell every
    process the time, or nothing (both None)."""

    probe_round: int | None = None
    advance_to_s: float | None = None
    # with an advance: each process's horizon, the earliest wake-up of every other process (inf: none)
    horizons: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # the processes to send the probe or the time to (None: every process); dormant ones are left out
    targets: frozenset[str] | None = None
    # process -> the ``wake`` of its report to acknowledge (with the time), sent before anything else
    woken: Mapping[str, int] = dataclasses.field(default_factory=dict)


NOTHING = Step()


def quiet(reports: Mapping[str, Report]) -> bool:
    """Every process idle, every mesh call open at a client also open at its server, and every message
    a server stream sent received by its client."""
    rs = reports.values()
    return (bool(reports) and all(r.idle for r in rs)
            and sum(r.calls_out for r in rs) == sum(r.calls_in for r in rs)
            and sum(r.msgs_sent for r in rs) == sum(r.msgs_received for r in rs))


def earliest_wake(reports: Mapping[str, Report]) -> float | None:
    wakes = [r.next_wake_s for r in reports.values() if r.next_wake_s is not None]
    return min(wakes) if wakes else None


def horizons(reports: Mapping[str, Report]) -> dict[str, float]:
    """Each process's lookahead: the earliest wake-up among all the *other* processes (inf when none waits).
    From the two earliest wake-ups: the process holding the earliest sees the second, every other the first."""
    wakes = sorted((r.next_wake_s, p) for p, r in reports.items() if r.next_wake_s is not None)
    first = wakes[0] if wakes else (math.inf, "")
    second = wakes[1][0] if len(wakes) > 1 else math.inf
    return {p: (second if p == first[1] else first[0]) for p in reports}


class Coordinator:
    """The mesh's virtual time and the state of the two-wave advance rule."""

    def __init__(self, now_s: float = 0.0, *, expect: int = 0) -> None:
        if expect < 0:
            raise ValueError(f"expect must be >= 0, got {expect}")
        self.now_s = now_s
        # Processes the mesh has: time holds while fewer are registered (at start, while a killed service
        # restarts, and after the coordinator itself restarted, until every process has reconnected).
        self.expect = expect
        self.latest: dict[str, Report] = {}
        self.registered: set[str] = set()
        self.round = 0  # the last probe round started
        self.active: int | None = None  # the round in progress
        self.snapshot: dict[str, Report] = {}  # the reports that started it
        self.answers: dict[str, Report] = {}
        self.advances = 0
        self.advances_by_kind: dict[str, int] = {}  # advances by the kind of process whose wake-up they were

    def register(self, process: str, now_s: float = 0.0) -> None:
        """A process joined (or rejoined): time never goes backwards, even for a restarted coordinator."""
        self.registered.add(process)
        self.latest.pop(process, None)
        self.now_s = max(self.now_s, now_s)
        self.active = None  # the new process has not answered the round in progress

    def leave(self, process: str) -> Step:
        """A process left (its stream ended): the others may now be quiet without it."""
        self.registered.discard(process)
        self.latest.pop(process, None)
        self.answers.pop(process, None)
        self.active = None
        return self._maybe_probe()

    def report(self, rep: Report) -> Step:
        """Fold in one report; returns what to do next (with a wake, its acknowledgement first)."""
        step = self._fold(rep)
        return dataclasses.replace(step, woken={rep.process: rep.wake}) if rep.wake else step

    def _fold(self, rep: Report) -> Step:
        if rep.process not in self.registered:
            self.register(rep.process, rep.now_s)
        self.latest[rep.process] = rep
        if rep.round == 0:
            self.active = None  # something changed: the round in progress cannot succeed
            return self._maybe_probe()
        if rep.round != self.active:
            # An answer to a round already given up is still this process's latest state; with no round in
            # progress it may be the report that makes the mesh quiet, and no other report may follow it.
            return self._maybe_probe() if self.active is None else NOTHING
        self.answers[rep.process] = rep
        if set(self.answers) != self.registered:
            return NOTHING
        return self._conclude()

    def resting(self, process: str) -> bool:
        """Whether ``process`` is left out of rounds: its latest report is at rest and its wake-up not due."""
        r = self.latest.get(process)
        return r is not None and r.at_rest and (r.next_wake_s is None or r.next_wake_s > self.now_s)

    def _maybe_probe(self) -> Step:
        if (self.active is not None or len(self.registered) < self.expect or set(self.latest) != self.registered
                or not quiet(self.latest)):
            return NOTHING
        self.round += 1
        self.active = self.round
        self.snapshot = dict(self.latest)
        resting = {p for p in self.registered if self.resting(p)}
        self.answers = {p: self.latest[p] for p in resting}  # their reports stand for them
        if set(self.answers) == self.registered:  # every process at rest: the round is already answered
            return self._conclude()
        return Step(probe_round=self.round, targets=frozenset(self.registered - resting) if resting else None)

    def _conclude(self) -> Step:
        answers, snapshot = self.answers, self.snapshot
        self.active = None
        unchanged = all(answers[p].activity == snapshot[p].activity for p in answers if p in snapshot)
        if not (unchanged and set(snapshot) == set(answers) and quiet(answers)):
            return self._maybe_probe()  # try again from the answers (they are the latest reports)
        wake = earliest_wake(answers)
        if wake is None:
            return NOTHING  # idle with nothing pending: time stays until something happens
        if wake > self.now_s:
            self.now_s = wake
            self.advances += 1
            owner = min((r.next_wake_s, p) for p, r in answers.items() if r.next_wake_s is not None)[1]
            kind = owner.partition("-")[0]
            self.advances_by_kind[kind] = self.advances_by_kind.get(kind, 0) + 1
        # a wake-up at or before now: tell the laggard the time. A process at rest hears it only when its
        # wake-up is due (its clock is told the time again by the next call that reaches it).
        due = frozenset(p for p, r in answers.items()
                        if not r.at_rest or (r.next_wake_s is not None and r.next_wake_s <= self.now_s))
        return Step(advance_to_s=self.now_s, horizons=horizons(answers),
                    targets=due if len(due) < len(answers) else None)


__all__ = ["NOTHING", "Coordinator", "Report", "Step", "earliest_wake", "horizons", "quiet"]
