"""A replica's batch iterations reported to its chips after the fact, batched, off the token path.

The replica times each iteration itself where the batch is formed (the engine's roofline time,
scaled by what the chips said of the last iterations: a throttled or slow chip shows there) and
emits its tokens at that virtual time; :class:`WorkReporter` books the iterations on the chips
with ``ReportWork``, one call in flight per replica carrying every iteration that ran meanwhile
(at most ``max_batch`` a call, and at most one call every ``interval_s`` wall seconds: a report
costs the router and the shard a gRPC call each, so under load each call carries the iterations of
``interval_s``, not of one round trip). The shard books each exactly as ``ExecuteWork`` would, so its
busy time, energy and memory-in-use totals are unchanged; only the round trip left the path of
the tokens. A failed report (chips gone, capability refused and not renewable) is kept in
:attr:`WorkReporter.error` and the replica is woken to heal, as a failed ExecuteWork used to.

A replica whose chips live on several shards (a wide expert-parallel replica) books every iteration
on each shard, for that shard's devices, in one concurrent call per shard: the chips run in lock
step, so an iteration ends when the slowest shard's chips end it and its energy is the shards' sum.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpc
import structlog

from gigacluster.chip.v1 import chip_pb2
from gigacluster.inference.request import Iteration
from gigacluster.runtime.auth import call_metadata
from gigacluster.wire import chip as chip_wire

log = structlog.get_logger()

TOKEN_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
RATE_LIMITED_RETRY_S = 0.05  # wait before re-sending iterations the chip refused for the tenant's RPC rate
RATIO_BOUNDS = (1e-3, 1e3)  # a chip's time over the roofline's, as learnt from reports, is kept within these


class WorkReporter:
    """Books a replica's iterations on its chips in the background (see the module docstring).

    ``target`` gives the current ``([(stub, device ranges)] one per shard, lease, memory bytes)`` of
    the replica (they change when it heals or moves to a new instance); ``on_result`` receives each
    booked iteration with its ``ExecuteWorkResponse`` (merged over the shards); ``wake`` is called
    when a report fails.
    """

    def __init__(self, target: Callable[[], tuple[list[tuple[Any, Any]], Any, int]],
                 on_result: Callable[[Iteration, Any], None], wake: Callable[[], None], *, max_batch: int,
                 tag: Callable[[], str], interval_s: float = 0.0) -> None:
        self._target = target
        self._on_result = on_result
        self._wake = wake
        self._tag = tag
        self.max_batch = max_batch
        self.interval_s = interval_s
        self._sent_s = -float("inf")  # loop time of the last call
        self.pending: list[tuple[Iteration, float]] = []
        self.task: asyncio.Task[None] | None = None
        self.error: grpc.aio.AioRpcError | None = None
        self.lost = False  # the broker no longer knows the instance (its capability could not be renewed)
        self.ratio = 1.0  # chip time / roofline compute time of the last reported iterations
        self.chip_end_s = 0.0  # when the last reported iteration ended on the chips (virtual)
        self.reports = 0
        self.reported_memory = -1
        self._epoch = 0  # bumped by reset(): a report sent before it is about chips (or a lease) since replaced

    def add(self, it: Iteration, start_s: float) -> None:
        """Queue one iteration that started at ``start_s``; never waits."""
        self.pending.append((it, start_s))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    @property
    def busy(self) -> bool:
        """A report is under way or queued."""
        return bool(self.pending) or (self.task is not None and not self.task.done())

    def duration_s(self, it: Iteration) -> float:
        """The iteration's compute time on these chips as the last reports measured them."""
        return it.compute_s * self.ratio

    async def drain(self) -> None:
        """Wait until everything queued has been reported (or a report failed)."""
        while self.task is not None and not self.task.done():
            await asyncio.shield(self.task)

    def reset(self) -> None:
        """Forget what was not reported (the chips that ran it are gone) and any error."""
        self.pending.clear()
        self.error = None
        self.lost = False
        self.ratio = 1.0
        self.chip_end_s = 0.0
        self.reported_memory = -1
        self._epoch += 1

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending and self.error is None and not self.lost:
            wait_s = self._sent_s + self.interval_s - loop.time()
            if wait_s > 0:  # the last call went out less than interval_s ago: let more iterations join
                await asyncio.sleep(wait_s)
                continue  # (reset() may have emptied pending meanwhile)
            self._sent_s = loop.time()
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch:]
            epoch = self._epoch
            try:
                resp = await self._send(batch)
            except grpc.aio.AioRpcError as err:
                if epoch != self._epoch:
                    continue  # about chips the replica has left since: nothing to heal
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # the tenant's chip RPC rate: later, merged
                    self.pending[:0] = batch
                    await asyncio.sleep(RATE_LIMITED_RETRY_S)
                    continue
                self.error = err
                self._wake()
                return
            if epoch != self._epoch:
                continue
            if resp is None:
                self.lost = True
                self._wake()
                return
            self.reports += 1
            chip_s = roof_s = 0.0
            for (it, _), r in zip(batch, resp.results, strict=False):
                self._on_result(it, r)
                chip_s += r.end_s - r.start_s
                roof_s += it.compute_s
                self.chip_end_s = max(self.chip_end_s, r.end_s)
            if roof_s > 0 and chip_s > 0:
                self.ratio = min(max(chip_s / roof_s, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])

    async def _send(self, batch: list[tuple[Iteration, float]]) -> Any:
        """One ReportWork call per shard the replica's chips live on, concurrently, merged (None when the
        broker no longer knows the instance)."""
        parts, lease, memory = self._target()
        iterations = [chip_pb2.WorkIteration(items=chip_wire.work_msgs(it.work), not_before_s=start)
                      for it, start in batch]
        calls = [self._send_one(stub, chip_pb2.ReportWorkRequest(
            devices=ranges, tag=self._tag(), memory_in_use_bytes=memory, iterations=iterations), lease)
            for stub, ranges in parts]
        resps = [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)
        if any(r is None for r in resps):
            return None
        self.reported_memory = memory
        return resps[0] if len(resps) == 1 else merge_reports(resps)

    @staticmethod
    async def _send_one(stub: Any, req: chip_pb2.ReportWorkRequest, lease: Any) -> Any:
        """One shard's ReportWork; a refused capability is refreshed and the call retried once."""
        try:
            return await stub.ReportWork(req, metadata=call_metadata(capability=lease()), timeout=30)
        except grpc.aio.AioRpcError as err:
            if err.code() not in TOKEN_REFUSED:
                raise
            log.info("capability refused; refreshing", instance=lease.instance, error=(err.details() or "")[:200])
            try:
                await lease.refresh()
            except grpc.aio.AioRpcError:
                if lease.lost:
                    return None
                raise err from None
            return await stub.ReportWork(req, metadata=call_metadata(capability=lease()), timeout=30)

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self.task


def merge_reports(resps: list[Any]) -> chip_pb2.ReportWorkResponse:
    """The shards' answers for the same iterations as one: each iteration starts when the first shard starts it
    and ends when the last ends it (lock step), its energy the sum, its clock the slowest shard's."""
    out = [chip_pb2.ExecuteWorkResponse(start_s=min(r.start_s for r in rs), end_s=max(r.end_s for r in rs),
                                        energy_j=sum(r.energy_j for r in rs),
                                        clock_factor=min(r.clock_factor for r in rs))
           for rs in zip(*(resp.results for resp in resps), strict=True)]
    return chip_pb2.ReportWorkResponse(results=out)
