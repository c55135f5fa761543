"""Checkpoint and restart costs of a training job, from the model size and the catalog's storage.

A checkpoint holds bf16 weights (2 B/param) plus fp32 master weights and two Adam moments
(12 B/param), written once across the job: data-parallel replicas write disjoint shards, so the
bytes do not grow with DP. Checkpoints are asynchronous (as PyTorch DCP ``async_save`` and the
Llama 3 run do): training pauses only for each chip's device-to-host copy of its shard
(:func:`pause_s`), and the checkpoint becomes durable when the write to storage, at the job's
share of the storage bandwidth, finishes (:func:`write_s`). A preempted job must finish the
write before it gives its chips back. A restart pays ``restart_init_s`` plus reading the
checkpoint back at the same bandwidth.
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


def restart_s(spec: TrainSpec) -> float:
    """Seconds from placement to the first step after a restart: relaunch plus checkpoint read."""
    return storage().restart_init_s + write_s(spec)
