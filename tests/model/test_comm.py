"""Alpha-beta collective model."""

from __future__ import annotations

import pytest

from gigacluster.hw.catalog import get_chip
from gigacluster.model import SpecError
from gigacluster.model.comm import AlphaBetaCommModel, CommModel, GroupLayout, volume_factor

H100 = get_chip("h100-sxm")
M = AlphaBetaCommModel()
RING = AlphaBetaCommModel(nvls=False)  # rings only (NCCL_ALGO=Ring)


def test_single_node_allreduce_busbw_matches_nccl_tests() -> None:
    """8x H100 ring all-reduce of 4 GiB: busbw about 370 GB/s (nccl-tests issues 212, 290)."""
    size = 4 * 2**30
    t = RING.collective_time_s(H100, "hgx", "all_reduce", size, GroupLayout(8, 8))
    busbw = size / t * volume_factor("all_reduce", 8)
    assert busbw == pytest.approx(370e9, rel=0.03)


def test_volume_factors_follow_nccl_tests() -> None:
    """Bus factors: all-reduce 2(n-1)/n, all-gather (n-1)/n, broadcast 1 (nccl-tests PERFORMANCE.md)."""
    assert volume_factor("all_reduce", 8) == pytest.approx(1.75)
    assert volume_factor("all_gather", 8) == pytest.approx(0.875)
    assert volume_factor("broadcast", 8) == 1.0
    assert volume_factor("all_reduce", 1) == 0.0


def test_cross_domain_group_runs_at_nic_speed() -> None:
    """A DP group of 64 with one rank per node moves its data over 400 Gb/s NICs, far slower than NVLink."""
    size = 1e9
    dp = M.collective_time_s(H100, "hgx", "reduce_scatter", size, GroupLayout(64, 1, 8))
    expect = 63 / 64 * size / (400e9 / 8 * M.params.scaleout_bus_fraction) + 63 * M.params.scaleout_alpha_s
    assert dp == pytest.approx(expect)
    tp = M.collective_time_s(H100, "hgx", "reduce_scatter", size, GroupLayout(8, 8))
    assert dp > 5 * tp


def test_oversubscribed_nics_slow_down() -> None:
    """Two ranks of a group per node plus 8 groups per node share 8 NICs: half the bandwidth each."""
    a = M.collective_time_s(H100, "hgx", "all_gather", 1e9, GroupLayout(64, 1, 8))
    b = M.collective_time_s(H100, "hgx", "all_gather", 1e9, GroupLayout(64, 1, 16))
    assert b > 1.8 * a


def test_hierarchical_allreduce_splits_inner_and_outer() -> None:
    """Ring all-reduce over 4 domains of 8 = inner ring on NVLink + outer ring on 1/8 of the data."""
    p = RING.params
    s = 8e9
    t = RING.collective_time_s(H100, "hgx", "all_reduce", s, GroupLayout(32, 8, 1))
    inner = 14 * p.scaleup_alpha_s + 1.75 * s / (450e9 * p.scaleup_bus_fraction)
    outer = 6 * p.scaleout_alpha_s + 1.5 * (s / 8) / (50e9 * p.scaleout_bus_fraction)
    assert t == pytest.approx(inner + outer)


def test_trivial_group_and_zero_bytes_cost_nothing() -> None:
    """A group of one or an empty message takes no time."""
    assert M.collective_time_s(H100, "hgx", "all_reduce", 1e9, GroupLayout(1, 1)) == 0.0
    assert M.collective_time_s(H100, "hgx", "all_reduce", 0.0, GroupLayout(8, 8)) == 0.0


def test_bad_op_and_layout_raise_spec_error() -> None:
    """An unknown op or an impossible layout names the field."""
    with pytest.raises(SpecError) as exc:
        M.collective_time_s(H100, "hgx", "gossip", 1.0, GroupLayout(8, 8))
    assert exc.value.field == "op"
    with pytest.raises(SpecError) as exc2:
        GroupLayout(4, 8)
    assert exc2.value.field == "layout.ranks_per_domain"


def test_alpha_beta_model_satisfies_protocol() -> None:
    """AlphaBetaCommModel implements the CommModel protocol the fabric model also implements."""
    assert isinstance(M, CommModel)


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        # nccl-tests src/all_reduce.cu AllReduceGetBw: factor = 2*(nranks-1)/nranks
        ("all_reduce", 1, 0.0), ("all_reduce", 8, 1.75),
        # src/reduce_scatter.cu, src/all_gather.cu, src/alltoall.cu: factor = (nranks-1)/nranks
        ("reduce_scatter", 1, 0.0), ("reduce_scatter", 8, 0.875),
        ("all_gather", 1, 0.0), ("all_gather", 8, 0.875),
        ("all_to_all", 1, 0.0), ("all_to_all", 8, 0.875),
        # src/broadcast.cu BroadcastGetBw and src/sendrecv.cu SendRecvGetBw: factor = 1, whatever nranks
        ("broadcast", 1, 1.0), ("broadcast", 8, 1.0),
        ("send_recv", 1, 1.0), ("send_recv", 2, 1.0),
    ],
)
def test_one_bus_factor_as_nccl_tests_defines_it(op: str, n: int, factor: float) -> None:
    """busbw = algbw x factor(op, n) per NVIDIA/nccl-tests (src/*.cu *GetBw, doc/PERFORMANCE.md), n = 1 included;
    the fabric and the model share the one function."""
    from gigacluster.fabric import collectives
    from gigacluster.model import comm

    assert comm.bus_factor(op, n) == pytest.approx(factor)
    assert collectives.bus_factor is comm.bus_factor and comm.volume_factor is comm.bus_factor
    assert collectives.OPS is comm.OPS


def test_one_collective_op_table_on_the_wire() -> None:
    """The proto enum <-> name maps are built from model.comm.OPS and cover every op both ways."""
    from gigacluster.fabric.v1 import fabric_pb2
    from gigacluster.model.comm import OPS
    from gigacluster.wire import fabric as convert

    assert list(convert.OP_ENUMS) == list(OPS)
    assert convert.OP_ENUMS["all_to_all"] == fabric_pb2.COLLECTIVE_OP_ALL_TO_ALL
    assert {convert.OP_NAMES[v]: v for v in convert.OP_ENUMS.values()} == convert.OP_ENUMS
    assert set(fabric_pb2.CollectiveOp.values()) - set(convert.OP_NAMES) == {fabric_pb2.COLLECTIVE_OP_UNSPECIFIED}


def test_scaleup_fraction_is_the_chips_own() -> None:
    """A100 uses its own sourced 0.78 (NCCL's 235 GB/s cap), not H100's calibrated 0.82; switchable off."""
    s = float(2**30)
    layout = GroupLayout(8, 8, 1)
    a100 = M.collective_time_s(get_chip("a100-80gb"), "hgx", "all_reduce", s, layout)
    assert 1.75 * s / a100 == pytest.approx(300e9 * 0.78, rel=0.01)
    plain = AlphaBetaCommModel(chip_overrides=False).collective_time_s(get_chip("a100-80gb"), "hgx", "all_reduce",
                                                                       s, layout)
    assert 1.75 * s / plain == pytest.approx(300e9 * 0.82, rel=0.01)


def _busbw(model: AlphaBetaCommModel, chip: str, op: str, size: float, layout: GroupLayout) -> float:
    return size / model.collective_time_s(get_chip(chip), "hgx", op, size, layout) * volume_factor(op, layout.size)


def test_single_node_allreduce_is_nvls_where_the_switch_reduces() -> None:
    """8x H100 default all-reduce of 4 GiB is NVLS at about 480 GB/s busbw (nccl-tests issue 212, NVIDIA's
    S. Jeaugey: "a peak busBw of ~480GB/s"), the flow model's calibration row; A100's NVSwitch has none."""
    assert _busbw(M, "h100-sxm", "all_reduce", 4 * 2**30, GroupLayout(8, 8)) == pytest.approx(480e9, rel=0.03)
    a100 = GroupLayout(8, 8)
    assert _busbw(M, "a100-80gb", "all_reduce", 2**30, a100) == _busbw(RING, "a100-80gb", "all_reduce", 2**30, a100)


def test_two_node_allreduce_is_nvls_tree_at_nccls_channel_ceiling() -> None:
    """2 x 8 H100, 8 GiB: NVLSTree held by NCCL's perChMaxNVLSTreeBws (8 heads x 57.7 GB/s busbw,
    src/tuning/cost_model.cc), within 5% of coreweave/nccl-tests PR 92's 440.58 GB/s; the ring was 244."""
    lay = GroupLayout(16, 8)
    busbw = _busbw(M, "h100-sxm", "all_reduce", 8 * 2**30, lay)
    assert busbw == pytest.approx(8 * 57.7e9, rel=0.01)
    assert busbw == pytest.approx(440.58e9, rel=0.05)
    assert _busbw(RING, "h100-sxm", "all_reduce", 8 * 2**30, lay) < 0.6 * busbw


def test_nvls_tree_is_the_same_code_as_the_flow_models() -> None:
    """The alpha-beta NVLSTree and the fabric's nvls_tree take the same NCCL ceiling and latency
    (gigacluster.model.nvls): on 2 x 8 H100, where the ceiling binds, they agree within 1%."""
    from gigacluster.fabric.estimate import collective_estimate_s

    size = 8 * 2**30
    fabric_s = collective_estimate_s("all_reduce", size, "h100-sxm", 16)
    assert M.collective_time_s(H100, "hgx", "all_reduce", size, GroupLayout(16, 8)) == pytest.approx(fabric_s, rel=0.01)


def test_no_nvls_for_two_ranks_per_node_nor_for_reduce_scatter() -> None:
    """NCCL sets NVLS up only for 3+ of a communicator's GPUs on a node (src/transport/nvls.cc, gpuCount <= 2)
    and runs NVLSTree for all-reduce only (src/tuning/nvls.cc), so those price as rings."""
    for op, lay in (("all_reduce", GroupLayout(16, 2, 4)), ("all_reduce", GroupLayout(2, 2)),
                    ("reduce_scatter", GroupLayout(16, 8)), ("all_gather", GroupLayout(8, 8))):
        assert M.collective_time_s(H100, "hgx", op, 2**30, lay) == RING.collective_time_s(H100, "hgx", op, 2**30, lay)


def test_gb200_racks_run_no_nvls_tree() -> None:
    """NCCL disables NVLSTree on multi-node NVLink (src/graph/tuning.cc, MNNVL): GB200 across racks keeps rings."""
    gb = get_chip("gb200")
    lay = GroupLayout(144, 72)
    assert M.collective_time_s(gb, "gb200-nvl72", "all_reduce", 2**30, lay) == RING.collective_time_s(
        gb, "gb200-nvl72", "all_reduce", 2**30, lay)
