"""An expert-parallel replica's all-to-all as fabric flows.

Each decode or prefill iteration of an MoE replica with ``ep > 1`` dispatches and combines its
tokens over the replica's chips (priced in the iteration by :func:`gigacluster.inference.cost.moe_a2a_s`).
So that this traffic loads the same links as everyone else's (a training job's, a P/D transfer's),
the replica books it on the fabric as inference-class all-to-all collectives over its chips: the
bytes of the iterations of one ``window_s`` of virtual time go out as one collective starting at
the window's start (one RPC per window, never one per iteration or layer, and never waited for by
the token loop). The measured over predicted time of those flows (an EWMA) scales the all-to-all
part of later iterations, so contention on the fabric slows the replica's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc
import structlog

from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.inference.config import ReplicaConfig
from gigacluster.inference.cost import moe_a2a_s
from gigacluster.inference.request import Iteration
from gigacluster.router.deployment import KvTransport, ReplicaFailed

log = structlog.get_logger()

WINDOW_S = 0.05  # virtual seconds of iterations per booked collective


class A2aTraffic:
    """Books a replica's all-to-all bytes on the fabric and reports how much slower it runs there."""

    def __init__(self, cfg: ReplicaConfig, transport: KvTransport, devices: Callable[[], list[tuple[int, int]]],
                 *, tag: str, window_s: float = WINDOW_S) -> None:
        self.cfg, self.transport, self.devices, self.tag, self.window_s = cfg, transport, devices, tag, window_s
        self._start_s = -1.0
        self._bytes = 0.0
        self._task: asyncio.Task[None] | None = None
        self.booked_bytes = 0.0  # per rank, all windows sent
        self.flows = 0

    def book(self, it: Iteration, start_s: float) -> float:
        """Add ``it``'s all-to-all (starting at ``start_s``); the extra seconds the fabric's measured
        slowdown adds to it (0 while the fabric keeps to its prediction)."""
        tokens = it.prefill_tokens + it.decode_tokens
        dispatch, combine = self.cfg.shard.moe.a2a_bytes(tokens)
        if not dispatch:
            return 0.0
        if self._start_s < 0:
            self._start_s = start_s
        self._bytes += self.cfg.arch.moe_layers * (dispatch + combine)
        if start_s - self._start_s >= self.window_s and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._send(self._start_s, self._bytes))
            self._start_s, self._bytes = -1.0, 0.0
        extra = max(0.0, self.transport.slow_ratio - 1.0)
        return extra * moe_a2a_s(self.cfg.chip_spec, self.cfg.shard, tokens) if extra else 0.0

    async def _send(self, start_s: float, bytes_: float) -> None:
        try:
            await self.transport.collective(fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL, self.devices(), bytes_, start_s,
                                            self.tag)
            self.booked_bytes += bytes_
            self.flows += 1
        except (grpc.aio.AioRpcError, ReplicaFailed) as exc:  # the tokens never wait on it: log and go on
            log.warning("all-to-all flow not booked", tag=self.tag, error=str(exc)[:200])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.transport.channel.close()
