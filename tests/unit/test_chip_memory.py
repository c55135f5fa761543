"""HBM in use that instances report to a chip shard (jobs' and replicas' modelled memory)."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.chip.shard import ChipShard
from gigacluster.errors import InvalidArgument
from gigacluster.hw.catalog import get_chip, get_system


def test_chip_shard_holds_reported_memory_until_released() -> None:
    """A shard records the HBM an instance reports per device, refuses more than the chip's HBM, and
    released devices drop to 0."""
    chip = get_chip("h100-sxm")
    shard = ChipShard(chip, get_system("hgx"), offset=0, count=8, start_s=0.0)
    shard.hold_memory(np.arange(2, 6), 17 * 10**9)
    assert shard.held_bytes.tolist() == [0, 0, *[17 * 10**9] * 4, 0, 0]
    with pytest.raises(InvalidArgument, match="HBM"):
        shard.hold_memory(np.arange(2), chip.hbm_bytes + 1)
    shard.release_memory(np.arange(2, 4))
    assert shard.held_bytes.tolist() == [0, 0, 0, 0, 17 * 10**9, 17 * 10**9, 0, 0]
