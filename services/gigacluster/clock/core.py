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

    def __post_init__(self) -> None:
        if min(self.calls_out, self.calls_in, self.activity, self.round, self.msgs_sent, self.msgs_received) < 0:
            raise ValueError("counters must be >= 0")


@dataclasses.dataclass(frozen=True)
class Step:
    """What the coordinator must do after a report: ask every process for a report, tell every
    process the time, or nothing (both None)."""

    probe_round: int | None = None
    advance_to_s: float | None = None
    # with an advance: each process's horizon, the earliest wake-up of every other process (inf: none)
    horizons: Mapping[str, float] = dataclasses.field(default_factory=dict)


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
        """Fold in one report; returns what to do next."""
        if rep.process not in self.registered:
            self.register(rep.process, rep.now_s)
        self.latest[rep.process] = rep
        if rep.round == 0:
            self.active = None  # something changed: the round in progress cannot succeed
            return self._maybe_probe()
        if rep.round != self.active:
            return NOTHING  # an answer to a round already given up
        self.answers[rep.process] = rep
        if set(self.answers) != self.registered:
            return NOTHING
        return self._conclude()

    def _maybe_probe(self) -> Step:
        if (self.active is not None or len(self.registered) < self.expect or set(self.latest) != self.registered
                or not quiet(self.latest)):
            return NOTHING
        self.round += 1
        self.active = self.round
        self.snapshot = dict(self.latest)
        self.answers = {}
        return Step(probe_round=self.round)

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
        # a wake-up at or before now: tell the laggard the time
        return Step(advance_to_s=self.now_s, horizons=horizons(answers))


__all__ = ["NOTHING", "Coordinator", "Report", "Step", "earliest_wake", "horizons", "quiet"]
