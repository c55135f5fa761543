"""The fabric's flow book: API-level flow groups over the simulator's handles (no gRPC).

A flow record names one StartTransfer or StartCollective call (a collective with ``groups`` > 1
is several simulator handles). The book indexes records by handle and by the broker instance whose
capability started them, says each record's state from its handles, wakes watchers when one ends,
and forgets the oldest finished ones past a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Iterator

from gigacluster.errors import InvalidArgument, NotFound
from gigacluster.fabric.sim import FlowSim
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.errors import preview

KEEP_FINISHED = 20_000
MAX_WATCH_QUEUE = 10_000  # names queued for one slow watcher before more are dropped


@dataclasses.dataclass
class FlowRecord:
    """One API-level flow group: a transfer, or a collective and its identical copies."""

    name: str
    tenant: str
    handles: list[str]
    algorithm: str
    start_s: float
    bytes_: float
    tag: str
    op: str
    n_ranks: int
    instance: str = ""  # the broker instance whose capability started it: released, its flows end


@dataclasses.dataclass(frozen=True)
class FlowStatus:
    """Where a flow group stands: ``running``, ``done`` or ``failed``, with its times and bandwidths."""

    state: str
    predicted_end_s: float
    end_s: float
    error: str = ""
    algbw_GBps: float = 0.0
    busbw_GBps: float = 0.0


class FlowBook:
    """Flow records by name (oldest first), by simulator handle and by broker instance; watchers."""

    def __init__(self, sim: FlowSim, *, keep_finished: int = KEEP_FINISHED) -> None:
        self.sim = sim
        self.keep_finished = keep_finished
        self.flows: OrderedDict[str, FlowRecord] = OrderedDict()
        self._by_handle: dict[str, str] = {}
        self._by_instance: dict[str, set[str]] = {}  # instance -> its flow records' names
        self._ids = itertools.count(1)
        self._watchers: set[asyncio.Queue[str]] = set()

    def __len__(self) -> int:
        return len(self.flows)

    def new_name(self) -> str:
        return f"flows/f-{next(self._ids)}"

    def add(self, rec: FlowRecord) -> None:
        self.flows[rec.name] = rec
        for h in rec.handles:
            self._by_handle[h] = rec.name
        if rec.instance:
            self._by_instance.setdefault(rec.instance, set()).add(rec.name)

    def get(self, name: str) -> FlowRecord | None:
        return self.flows.get(name)

    def name_of_handle(self, handle: str) -> str:
        return self._by_handle.get(handle, "")

    def visible(self, p: Principal, name: str) -> FlowRecord:
        """The record ``name`` if ``p`` may see it (its own tenant's, or any for a privileged caller)."""
        if not name.startswith("flows/") or len(name) <= 6:
            raise InvalidArgument("name", f"must look like 'flows/<id>', got {preview(name, 64)!r}")
        rec = self.flows.get(name)
        if rec is None or not self.may_see(p, rec):
            raise NotFound(preview(name, 64))
        return rec

    @staticmethod
    def may_see(p: Principal, rec: FlowRecord) -> bool:
        return p.privileged or rec.tenant == p.tenant

    def status(self, rec: FlowRecord) -> FlowStatus:
        """The group's state from its simulator handles (failed if any failed, done when all are)."""
        hs = [self.sim.get(h) for h in rec.handles]
        failed = [h for h in hs if h.state == "failed"]
        if failed:
            end = float(failed[0].end_s)
            return FlowStatus("failed", end, end, str(failed[0].error))
        pred = max(self.sim.predicted_end_s(h.id) for h in hs)
        if all(h.state == "done" for h in hs):
            return FlowStatus("done", pred, max(float(h.end_s) for h in hs), "",
                              hs[0].algbw_GBps, hs[0].busbw_GBps)
        return FlowStatus("running", pred, 0.0)

    def failed_names(self) -> set[str]:
        return {n for n, r in self.flows.items() if self.status(r).state == "failed"}

    def take_instance(self, instance: str) -> list[FlowRecord]:
        """Remove and return the records started under ``instance`` (it was released)."""
        names = self._by_instance.pop(instance, set())
        return [rec for rec in (self.flows.get(n) for n in names) if rec is not None]

    def instances(self) -> list[str]:
        return list(self._by_instance)

    # -- watchers ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def watch(self) -> Iterator[asyncio.Queue[str]]:
        """A queue that receives the name of every flow group that ends while the block runs."""
        q: asyncio.Queue[str] = asyncio.Queue()
        self._watchers.add(q)
        try:
            yield q
        finally:
            self._watchers.discard(q)

    def notify(self, name: str) -> None:
        for q in self._watchers:
            if q.qsize() < MAX_WATCH_QUEUE:
                q.put_nowait(name)

    def trim(self) -> None:
        """Forget the oldest finished flow groups beyond ``keep_finished`` (bounded memory)."""
        excess = len(self.flows) - self.keep_finished
        if excess <= 0:
            return
        for name in list(self.flows)[: excess * 2]:
            rec = self.flows[name]
            if self.status(rec).state in ("done", "failed"):
                for h in rec.handles:
                    self.sim.forget(h)
                    self._by_handle.pop(h, None)
                names = self._by_instance.get(rec.instance)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._by_instance[rec.instance]
                del self.flows[name]
                excess -= 1
                if excess <= 0:
                    return


__all__ = ["KEEP_FINISHED", "FlowBook", "FlowRecord", "FlowStatus"]
