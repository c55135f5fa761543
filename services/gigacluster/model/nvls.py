"""NCCL's NVLink SHARP all-reduces as its tuner runs them: NVLS inside one switched domain, NVLSTree across them.

The one home of the rules and constants both communication models price them with: the flow model's
``nvls`` and ``nvls_tree`` algorithms (:mod:`gigacluster.fabric.algorithms`) and the alpha-beta model
(:class:`gigacluster.model.comm.AlphaBetaCommModel`). What runs where, from NCCL's source (catalog
``efficiency.comm.nvls`` and ``efficiency.comm.nvls_tree``, sourced there):

* NVLS needs a chip whose switch reduces (``nvls.chips``, NVSwitch 3+) and more than two of the
  communicator's GPUs on the node (``nvls.min_local_ranks`` 3: NCCL's ``ncclNvlsInit`` turns NVLS off at
  ``gpuCount <= 2``), so a data-parallel group of one or two ranks per node never runs it;
* NVLSTree needs that in every one of >= 2 nodes holding the same number of ranks, and a per-channel
  ceiling for the chip's architecture (``nvls_tree.head_busbw_GBps``; none for GB200, whose multi-node
  NVLink NCCL runs without NVLSTree);
* both are all-reduce only: NVLS reduce-scatter and all-gather run on one node (or across nodes with
  CollNet/SHARP switches only) and move ``S`` one way where a ring moves ``(n-1)/n S`` each way, so they are
  no faster than the ring (NVIDIA/nccl issues 1083 and 1506, S. Jeaugey) and the models keep the ring there.

Everything here is plain arithmetic on catalog numbers (no topology), so the model never imports the fabric.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from gigacluster.hw.catalog import _raw
from gigacluster.model import SpecError


def _section(name: str) -> dict:
    return _raw()["efficiency"]["comm"].get(name) or {}


@functools.cache
def nvls_chips() -> frozenset[str]:
    """Chips whose scale-up switch reduces in the switch (catalog ``efficiency.comm.nvls.chips``)."""
    return frozenset(str(x) for x in _section("nvls").get("chips", ()))


@functools.cache
def nvls_efficiency(chip: str) -> float:
    """The NVLS efficiency of ``chip``'s NVLink generation: its own ``efficiency.comm.nvls.chip_efficiency``
    entry (Blackwell), else the calibrated ``efficiency.comm.nvls.efficiency`` (Hopper)."""
    c = _section("nvls")
    value = float((c.get("chip_efficiency") or {}).get(chip, c.get("efficiency", 1.0)))
    if not 0.0 < value <= 1.0:
        raise SpecError(f"efficiency.comm.nvls.chip_efficiency.{chip}", f"must be in (0, 1], got {value!r}")
    return value


@functools.cache
def nvls_min_local_ranks() -> int:
    """Fewest ranks of one communicator on a node for NCCL to set NVLS up (catalog
    ``efficiency.comm.nvls.min_local_ranks``)."""
    value = _section("nvls").get("min_local_ranks")
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise SpecError("efficiency.comm.nvls.min_local_ranks", f"must be an integer >= 2, got {value!r}")
    return value


def nvls_runs(chip: str, scaleup: str, local_ranks: int) -> bool:
    """Whether NCCL can run NVLS for ``local_ranks`` ranks of one communicator in a ``scaleup`` domain of ``chip``."""
    return scaleup == "switch" and chip in nvls_chips() and local_ranks >= nvls_min_local_ranks()


def nvls_link_bytes(bytes_: float, n: int, chip: str) -> float:
    """Bytes each GPU link carries each way, at the link's point-to-point goodput, for an NVLS all-reduce of
    ``bytes_`` over ``n`` GPUs of one switch: ``(1 + 1/n) S`` (load-reduce S in, S/n out; store S/n, multicast S
    back) over the switch path's efficiency."""
    return (1.0 + 1.0 / n) * bytes_ / nvls_efficiency(chip)


class NvlsPipeline(NamedTuple):
    """How NCCL's NVLS all-reduce moves a message inside one switch (catalog ``efficiency.comm.nvls.pipeline``):
    ``channels`` CTAs each take chunks of the size NCCL's chunk ladder gives the message (``chunk_bytes`` cut to
    ``size`` below ``mult`` x channels x heads x the current chunk, for each ``(mult, size)`` of ``chunk_steps``),
    every chunk of a channel costs its transfer plus ``slice_s`` of synchronisation, the first one crosses a
    pipeline ``depth`` chunks deep, and a call costs ``call_s`` plus ``latency_s`` (NCCL's baseLat and hwLat)."""

    channels: int
    chunk_bytes: float
    chunk_steps: tuple[tuple[float, float], ...]
    depth: int
    slice_s: float
    latency_s: float
    call_s: float


@functools.cache
def nvls_pipeline() -> NvlsPipeline:
    """The catalog's NVLS pipeline (``efficiency.comm.nvls.pipeline``), checked; SpecError naming a bad field."""
    c = _section("nvls").get("pipeline") or {}
    try:
        pipe = NvlsPipeline(int(c["channels"]), float(c["chunk_bytes"]),
                            tuple((float(m), float(b)) for m, b in c.get("chunk_steps", ())), int(c["depth"]),
                            float(c["slice_s"]), float(c["latency_s"]), float(c.get("call_s", 0.0)))
    except (KeyError, TypeError, ValueError) as e:
        raise SpecError("efficiency.comm.nvls.pipeline",
                        f"needs channels, chunk_bytes, depth, slice_s, latency_s: {e}") from e
    if pipe.channels < 1 or pipe.depth < 1 or pipe.chunk_bytes <= 0:
        raise SpecError("efficiency.comm.nvls.pipeline", "channels and depth must be >= 1, chunk_bytes > 0")
    if any(m <= 0 or b <= 0 for m, b in pipe.chunk_steps):
        raise SpecError("efficiency.comm.nvls.pipeline.chunk_steps", "each (mult, size) must be > 0")
    for field in ("slice_s", "latency_s", "call_s"):
        if not 0 <= getattr(pipe, field) < 1e-3:
            raise SpecError(f"efficiency.comm.nvls.pipeline.{field}", "must be in [0, 1 ms)")
    return pipe


def nvls_chunk_bytes(bytes_: float, n: int) -> float:
    """NCCL's NVLS chunk for an all-reduce of ``bytes_`` over ``n`` GPUs (one head each): the ladder of
    ``calcCollChunking`` (src/enqueue.cc), which halves the chunk as the message falls below multiples of
    channels x heads x chunk."""
    pipe = nvls_pipeline()
    ops = pipe.channels * n
    c = pipe.chunk_bytes
    for mult, size in pipe.chunk_steps:
        if bytes_ < mult * ops * c and c > size:
            c = size
    return c


def nvls_size_breaks(n: int) -> tuple[float, ...]:
    """Message sizes (ascending) at which an NVLS all-reduce over ``n`` GPUs changes its chunk (the ladder's
    thresholds) or starts to fill a whole loop of channels x heads chunks: between two, its time is affine in
    the bytes."""
    pipe = nvls_pipeline()
    ops = pipe.channels * n
    c, out = pipe.chunk_bytes, []
    for mult, size in pipe.chunk_steps:
        if c > size:
            out.append(mult * ops * c)
            c = size
    out.append(ops * c)
    return tuple(sorted(set(out)))


def nvls_chunks(bytes_: float, n: int) -> tuple[float, float]:
    """(chunk bytes, chunks each channel runs) of an NVLS all-reduce: at least one chunk per head (a message
    smaller than one loop of channels x heads chunks still pays a whole loop's chunks)."""
    s = nvls_chunk_bytes(bytes_, n)
    return s, max(bytes_ / (nvls_pipeline().channels * s), float(n))


def nvls_stage_bytes(bytes_: float, n: int) -> float:
    """Payload whose link time the NVLS pipeline spends: its chunks plus the ``depth - 1`` chunks of every
    channel's pipeline fill (so a message below one loop costs a loop)."""
    pipe = nvls_pipeline()
    s, count = nvls_chunks(bytes_, n)
    return (count + pipe.depth - 1) * s * pipe.channels


def nvls_sync_s(bytes_: float, n: int) -> float:
    """Seconds of per-chunk synchronisation on one channel's path: ``slice_s`` for each of its chunks and fill."""
    pipe = nvls_pipeline()
    _, count = nvls_chunks(bytes_, n)
    return (count + pipe.depth - 1) * pipe.slice_s


def nvls_time_s(bytes_: float, n: int, chip: str, link_Bps: float) -> float:
    """Seconds of an NVLS all-reduce of ``bytes_`` over ``n`` GPUs of one switch in closed form (the alpha-beta
    model's; the flow model's ``nvls`` books the same terms): NCCL's call and NVLS latency, the pipeline's
    link time at ``link_Bps`` per GPU link each way, and its per-chunk synchronisation."""
    pipe = nvls_pipeline()
    return (pipe.call_s + pipe.latency_s + nvls_link_bytes(nvls_stage_bytes(bytes_, n), n, chip) / link_Bps
            + nvls_sync_s(bytes_, n))


@functools.cache
def nvls_tree_head_busbw_Bps(chip: str, n_domains: int) -> float | None:
    """NCCL's ceiling on one NVLSTree channel (one NIC head), as busbw B/s, for ``chip`` on ``n_domains`` nodes
    (catalog ``efficiency.comm.nvls_tree.head_busbw_GBps``: [two nodes, more]); None where NCCL runs no NVLSTree."""
    pair = (_section("nvls_tree").get("head_busbw_GBps") or {}).get(chip)
    if pair is None:
        return None
    value = float(pair[0] if n_domains <= 2 else pair[1])
    if not (math.isfinite(value) and value > 0):
        raise SpecError(f"efficiency.comm.nvls_tree.head_busbw_GBps.{chip}", f"must be > 0, got {value!r}")
    return value * 1e9


def nvls_tree_runs(chip: str, scaleup: str, n_domains: int, local_ranks: int) -> bool:
    """Whether NCCL can run NVLSTree over ``n_domains`` domains holding ``local_ranks`` ranks each."""
    return (n_domains >= 2 and nvls_runs(chip, scaleup, local_ranks)
            and nvls_tree_head_busbw_Bps(chip, n_domains) is not None)


@functools.cache
def nvls_tree_latency_s() -> tuple[float, float]:
    """(inside a node, per network level) latency of NVLSTree: catalog ``efficiency.comm.nvls_tree.latency_s``
    (NCCL's hwLat for NVLSTree/Simple over NVLink and the network)."""
    pair = _section("nvls_tree").get("latency_s") or (0.0, 0.0)
    intra, inter = float(pair[0]), float(pair[1])
    if not (0 <= intra < 1e-3 and 0 <= inter < 1e-3):
        raise SpecError("efficiency.comm.nvls_tree.latency_s", f"must be in [0, 1 ms), got {pair!r}")
    return intra, inter


def nvls_tree_levels(n_domains: int) -> int:
    """Depth of the tree between the domains (network levels, each paid up and down)."""
    return (n_domains - 1).bit_length() if n_domains > 1 else 0  # ceil(log2 g), exactly


def nvls_tree_call_latency_s(n_domains: int) -> float:
    """NCCL's NVLSTree latency for one call: ``intraLat + 2 log2(nNodes) interLat`` (src/tuning/nvls.cc)."""
    intra, inter = nvls_tree_latency_s()
    return intra + 2 * nvls_tree_levels(n_domains) * inter


def double_binary_tree(n_domains: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """NCCL's two complementary binary trees over ``n_domains`` domains, as (child, parent) domain indices per
    tree; each tree carries half of a head's shard up and back down every edge."""
    pos = np.arange(1, n_domains)
    parent = (pos - 1) // 2
    return tuple(((pos + shift) % n_domains, (parent + shift) % n_domains) for shift in (0, 1))


def nvls_tree_nic_load(n_domains: int) -> float:
    """The most any one domain's head sends (and receives) over its NIC between the domains, in shards: half a
    shard for every edge of either tree it sits on (1.0 on two domains, where a ring sends ``2(g-1)/g``)."""
    degree = np.zeros(n_domains)
    for child, parent in double_binary_tree(n_domains):
        np.add.at(degree, child, 1.0)
        np.add.at(degree, parent, 1.0)
    return 0.5 * float(degree.max()) if n_domains > 1 else 0.0


def nvls_tree_cap_s(chip: str, n_domains: int, local_ranks: int, heads: int, bytes_: float) -> float:
    """Least time NCCL's per-channel ceiling allows an NVLSTree all-reduce of ``bytes_``: ``heads`` channels of
    ``perChMaxNVLSTreeBw`` busbw each, turned into algbw as NCCL does (x n / 2(n-1), n the ranks)."""
    head_Bps = nvls_tree_head_busbw_Bps(chip, n_domains)
    if head_Bps is None or heads < 1:
        raise SpecError("algo", f"no NVLSTree ceiling for {chip} on {n_domains} domains")
    n = n_domains * local_ranks
    return bytes_ / (heads * head_Bps * n / (2.0 * (n - 1)))


def nvls_tree_time_s(chip: str, n_domains: int, local_ranks: int, bytes_: float, *, link_Bps: float,
                     nic_Bps: float, heads: int) -> float:
    """Seconds of an NVLSTree all-reduce in closed form (the alpha-beta model's): the pipelined stages run at the
    pace of the slowest of the NVLS links inside a domain (``link_Bps`` per GPU link each way), the heads' NICs
    between domains (``nic_Bps`` each) and NCCL's channel ceiling, plus NCCL's NVLSTree latency."""
    shard = bytes_ / local_ranks
    inside = nvls_link_bytes(bytes_, local_ranks, chip) / link_Bps
    between = nvls_tree_nic_load(n_domains) * shard / nic_Bps
    cap = nvls_tree_cap_s(chip, n_domains, local_ranks, heads, bytes_)
    return nvls_tree_call_latency_s(n_domains) + max(inside, between, cap)


__all__ = [
    "NvlsPipeline", "double_binary_tree", "nvls_chips", "nvls_chunk_bytes", "nvls_chunks", "nvls_efficiency",
    "nvls_link_bytes", "nvls_min_local_ranks", "nvls_pipeline", "nvls_runs", "nvls_size_breaks", "nvls_stage_bytes",
    "nvls_sync_s", "nvls_time_s",
    "nvls_tree_call_latency_s", "nvls_tree_cap_s", "nvls_tree_head_busbw_Bps", "nvls_tree_latency_s",
    "nvls_tree_levels", "nvls_tree_nic_load", "nvls_tree_runs", "nvls_tree_time_s",
]
