"""A chip shard's injected faults: repair times, and the fault file that brings them back after kill -9."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from gigacluster.chip.faultstore import FaultStore
from gigacluster.chip.shard import FAILED, FAULT_FAILED, FAULT_HBM, FAULT_NONE, FAULT_SLOW, HEALTHY, ChipShard, FaultRun
from gigacluster.errors import FailedPrecondition, InvalidArgument
from gigacluster.hw.catalog import get_chip, get_system
from gigacluster.model.roofline import Work

GEMM = Work(2 * 8192**3, 3 * 8192**2 * 2, "bf16", "matmul", 1, (8192, 8192, 8192))


def shard(n: int = 64, offset: int = 128) -> ChipShard:
    return ChipShard(get_chip("h100-sxm"), get_system("hgx"), offset=offset, count=n, start_s=0.0)


def test_a_fault_with_a_repair_time_clears_itself_when_it_is_due() -> None:
    """A fault repaired at t=100 holds until then (work on it fails) and is gone at t=100; one without stays."""
    s = shard()
    s.inject_fault(np.array([3]), FAULT_FAILED, repair_at_s=100.0)
    s.inject_fault(np.array([5]), FAULT_HBM)
    assert s.repair_due(99.9).size == 0 and s.state()[3] == FAILED
    with pytest.raises(FailedPrecondition, match="device 131 has failed"):
        s.execute(np.arange(0, 4), [GEMM], not_before_s=0.0, now_s=50.0)
    assert s.repair_due(100.0).tolist() == [3]
    assert s.state()[3] == HEALTHY and s.state()[5] == FAILED
    assert s.repair_due(1e9).size == 0 and math.isinf(s.repair_at_s[5])


def test_a_later_fault_replaces_the_earlier_one_and_clear_forgets_its_repair() -> None:
    """Re-injecting a device takes the new kind and repair time; ClearFault drops the pending repair."""
    s = shard()
    s.inject_fault(np.array([1]), FAULT_SLOW, 0.5, repair_at_s=10.0)
    s.inject_fault(np.array([1]), FAULT_FAILED, repair_at_s=20.0)
    assert s.fault_factor[1] == 1.0 and s.repair_due(15.0).size == 0 and s.fault[1] == FAULT_FAILED
    s.clear_fault(np.array([1]))
    assert s.fault[1] == FAULT_NONE and math.isinf(s.repair_at_s[1])
    with pytest.raises(InvalidArgument, match="repair_after_s"):
        s.inject_fault(np.array([2]), FAULT_FAILED, repair_at_s=math.nan)


def test_fault_runs_are_few_records_in_global_ids_and_restore_exactly() -> None:
    """Faults are stored as runs of equal (kind, factor, repair): 3 runs for 3 distinct faults over 12
    devices, in global ids; restored on a fresh shard they give the same per-device arrays."""
    s = shard(n=1024, offset=1000)
    s.inject_fault(np.arange(0, 8), FAULT_FAILED, repair_at_s=3600.0)
    s.inject_fault(np.arange(8, 10), FAULT_SLOW, 0.25)
    s.inject_fault(np.array([500, 501]), FAULT_HBM)
    runs = s.fault_runs()
    assert runs == [FaultRun(1000, 1008, FAULT_FAILED, 1.0, 3600.0), FaultRun(1008, 1010, FAULT_SLOW, 0.25, math.inf),
                    FaultRun(1500, 1502, FAULT_HBM, 1.0, math.inf)]
    t = shard(n=1024, offset=1000)
    assert t.restore_faults(runs) == 12
    for name in ("fault", "fault_factor", "repair_at_s"):
        assert np.array_equal(getattr(t, name), getattr(s, name))


def test_the_fault_file_round_trips_and_a_repair_due_while_down_applies_at_once(tmp_path: pathlib.Path) -> None:
    """Saved, then loaded by a 'restarted' shard: the faults are back; the one whose repair fell due while the
    shard was down is cleared by its first repair check; no state dir persists nothing."""
    store = FaultStore.for_shard(str(tmp_path), "h100-sxm", 128)
    s = shard()
    s.inject_fault(np.array([0]), FAULT_FAILED, repair_at_s=50.0)
    s.inject_fault(np.array([9]), FAULT_HBM, repair_at_s=5000.0)
    store.save(s.fault_runs())
    assert store.path is not None and store.path.name == "chip-h100-sxm-128-faults.json"
    again = shard()
    again.restore_faults(FaultStore.for_shard(str(tmp_path), "h100-sxm", 128).load())
    assert again.state()[0] == FAILED and again.state()[9] == FAILED
    assert again.repair_due(60.0).tolist() == [0]
    assert again.state()[9] == FAILED and again.repair_at_s[9] == 5000.0
    assert FaultStore.for_shard("", "h100-sxm", 128).load() == []


def test_a_shard_of_another_size_takes_only_its_part_of_the_file(tmp_path: pathlib.Path) -> None:
    """Runs are in global ids: a shard restarted with fewer devices restores the faults that fall on it."""
    store = FaultStore(tmp_path / "f.json")
    store.save([FaultRun(130, 140, FAULT_FAILED, 1.0, math.inf)])
    small = shard(n=4, offset=128)  # devices 128..131
    assert small.restore_faults(store.load()) == 2
    assert small.fault.tolist() == [0, 0, FAULT_FAILED, FAULT_FAILED]


@pytest.mark.parametrize("body", ['{"version": 2, "faults": []}', "not json",
                                  '{"version": 1, "faults": [[5, 2, 1, 1.0, null]]}',
                                  '{"version": 1, "faults": [[0, 2, 7, 1.0, null]]}',
                                  '{"version": 1, "faults": [[0, 2, 3, 0.0, null]]}'])
def test_a_fault_file_it_cannot_read_is_refused_naming_it(tmp_path: pathlib.Path, body: str) -> None:
    """Another version, garbage, a bad range, kind or factor: FailedPrecondition naming the file, never a guess."""
    path = tmp_path / "chip-h100-sxm-0-faults.json"
    path.write_text(body)
    with pytest.raises(FailedPrecondition, match=r"chip-h100-sxm-0-faults\.json"):
        FaultStore(path).load()


def test_the_file_is_replaced_whole(tmp_path: pathlib.Path) -> None:
    """Every save is the whole state (a cleared fault disappears from the file) and leaves no temporary file."""
    store = FaultStore(tmp_path / "f.json")
    store.save([FaultRun(0, 1, FAULT_FAILED, 1.0, 7.0)])
    store.save([])
    assert json.loads((tmp_path / "f.json").read_text()) == {"version": 1, "faults": []}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]
