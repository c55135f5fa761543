"""Checkpoint and restart costs of a training job, from the model size and the catalog's storage.

A checkpoint holds bf16 weights (2 B/param) plus fp32 master weights and two Adam moments
(12 B/param), written once across the job: data-parallel replicas write disjoint shards, so the
bytes do not grow with DP. Checkpoints are asynchronous (as PyTorch DCP ``async_save`` and the
Llama 3 run do): training pauses only for each chip's device-to-host copy of its shard
(:func:`pause_s`), and the checkpoint becomes durable when the write to storage, at the job's
share of the storage bandwidth, finishes (:func:`write_s`). A preempted job must finish the
write before it gives its chips back. A restart pays the relaunch (:func:`relaunch_s`: process start,
data loading, and collective initialisation that grows with the job, from the NCCLX paper's figure;
catalog section ``relaunch``) plus reading the checkpoint back at the same bandwidth.
"""

from __future__ import annotations

import dataclasses
import functools

from gigacluster.hw.catalog import _raw
from gigacluster.model.training import StepPlan, TrainSpec

CHECKPOINT_BYTES_PER_PARAM = 2.0 + 12.0


@dataclasses.dataclass(frozen=True)
class Storage:
    """The catalog's ``storage`` section."""

    write_Bps_per_chip: float
    write_Bps_max: float
    restart_init_s: float
    host_copy_Bps: float


@functools.cache
def storage() -> Storage:
    s = _raw()["storage"]
    return Storage(write_Bps_per_chip=float(s["checkpoint_write_Bps_per_chip"]),
                   write_Bps_max=float(s["checkpoint_write_Bps_max"]), restart_init_s=float(s["restart_init_s"]),
                   host_copy_Bps=float(s["host_copy_Bps"]))


def checkpoint_bytes(spec: TrainSpec) -> float:
    """Bytes of one full checkpoint (weights and optimizer state)."""
    return CHECKPOINT_BYTES_PER_PARAM * spec.arch.params


def storage_Bps(chips: int) -> float:
    """Write (and read) bandwidth a job of ``chips`` gets from checkpoint storage."""
    st = storage()
    return min(st.write_Bps_per_chip * chips, st.write_Bps_max)


def write_s(spec: TrainSpec) -> float:
    """Seconds to write one checkpoint to storage (what a preempted job waits for)."""
    return checkpoint_bytes(spec) / storage_Bps(spec.count)


def pause_s(plan: StepPlan) -> float:
    """Seconds training pauses for an asynchronous checkpoint: the busiest chip's weights and
    optimizer shard copied to host memory."""
    m = plan.memory
    return (m.weights_bytes + m.optimizer_bytes) / storage().host_copy_Bps


@functools.cache
def _relaunch_terms() -> tuple[float, float]:
    """(seconds independent of size, collective-init seconds per chip) from the catalog's ``relaunch``."""
    r = _raw()["relaunch"]
    return (float(r["process_start_s"]) + float(r["data_loader_s"]),
            float(r["collective_init_s_ref"]) / float(r["collective_init_ref_chips"]))


def relaunch_s(chips: int) -> float:
    """Seconds to relaunch a job of ``chips`` before its checkpoint is read: process start and data loading,
    plus collective initialisation scaled linearly from the published 265 s at 96k GPUs (NCCLX)."""
    fixed, per_chip = _relaunch_terms()
    return fixed + per_chip * chips


def restart_s(spec: TrainSpec) -> float:
    """Seconds from placement to the first step after a restart: relaunch plus checkpoint read."""
    return relaunch_s(spec.count) + write_s(spec)


@dataclasses.dataclass
class AsyncCheckpoints:
    """The asynchronous checkpoint writes of one running job, and which step is durable.

    A checkpoint counts only when its write has ended (``settle``). At most one write is in flight:
    a checkpoint that falls due while the previous write is still going is deferred to the first
    step boundary after that write ends, never started on top of it. (Starting a new write that
    supersedes the one in flight would, whenever a write outlasts the checkpoint interval, leave no
    checkpoint ever durable.) Pure: times are virtual seconds given by the caller.
    """

    durable_step: int = 0
    inflight: tuple[int, float] | None = None  # (step, virtual time its write ends)
    deferred: bool = False  # a checkpoint fell due while a write was in flight

    def settle(self, t: float) -> bool:
        """Make the in-flight write durable if it has ended by ``t``; True if ``durable_step`` moved."""
        if self.inflight is not None and self.inflight[1] <= t:
            self.durable_step = self.inflight[0]
            self.inflight = None
            return True
        return False

    def due(self, step: int, interval: int, steps_total: int) -> bool:
        """Whether a checkpoint should start after ``step`` (its interval or a deferred one)."""
        if not interval or step >= steps_total:
            return False
        if step % interval == 0:
            self.deferred = True
        return self.deferred and self.inflight is None

    def start(self, step: int, t: float, write_s: float) -> None:
        """Begin the write of ``step``'s checkpoint at virtual time ``t`` (after the host copy)."""
        if self.inflight is not None:
            raise ValueError("a checkpoint write is already in flight")
        self.inflight = (step, t + write_s)
        self.deferred = False

    def flush_end(self, t: float, write_s: float) -> float:
        """When a synchronous checkpoint begun at ``t`` is durable: after any write in flight, then its own."""
        return max(t, self.inflight[1] if self.inflight is not None else t) + write_s

    def lost_steps(self, step: int, t: float) -> int:
        """Steps a failure at virtual time ``t`` after ``step`` completed steps throws away."""
        self.settle(t)
        return step - self.durable_step
