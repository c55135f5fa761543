"""A replica whose chips live on several chip shards: its devices split by shard, and the shards' answers for the
same iterations merged (lock step)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gigacluster.chip.v1 import chip_pb2
from gigacluster.errors import Unavailable
from gigacluster.router.messages import shard_ranges
from gigacluster.router.reporting import merge_reports


def _inv(*shards: tuple[str, int, int]) -> SimpleNamespace:
    return SimpleNamespace(shards=[SimpleNamespace(endpoint=ep, devices=SimpleNamespace(start=a, end=b))
                                   for ep, a, b in shards])


def test_devices_split_by_shard_first_device_first() -> None:
    """Devices 8..23 on shards of 16 split into 8..15 on the first shard and 16..23 on the second, in that order."""
    inv = _inv(("b", 16, 32), ("a", 0, 16))
    assert shard_ranges(inv, [(8, 24)]) == [("a", [(8, 16)]), ("b", [(16, 24)])]
    assert shard_ranges(inv, [(20, 24), (2, 4)]) == [("b", [(20, 24)]), ("a", [(2, 4)])]


def test_devices_outside_every_shard_are_unavailable() -> None:
    """A device no shard of the inventory holds is refused as UNAVAILABLE (retry), not silently dropped."""
    with pytest.raises(Unavailable):
        shard_ranges(_inv(("a", 0, 16)), [(8, 24)])


def test_merged_iteration_spans_the_slowest_shard_and_sums_energy() -> None:
    """Each iteration starts at the earliest shard's start, ends at the latest shard's end, with the energy summed
    and the slowest clock."""
    a = chip_pb2.ReportWorkResponse(results=[chip_pb2.ExecuteWorkResponse(start_s=1.0, end_s=2.0, energy_j=10.0,
                                                                          clock_factor=1.0)])
    b = chip_pb2.ReportWorkResponse(results=[chip_pb2.ExecuteWorkResponse(start_s=1.0, end_s=2.5, energy_j=7.0,
                                                                          clock_factor=0.8)])
    (r,) = merge_reports([a, b]).results
    assert (r.start_s, r.end_s, r.energy_j, r.clock_factor) == (1.0, 2.5, 17.0, pytest.approx(0.8))
