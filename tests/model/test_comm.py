"""Alpha-beta collective model."""

from __future__ import annotations

import pytest

from gigacluster.hw.catalog import get_chip
from gigacluster.model import SpecError
from gigacluster.model.comm import AlphaBetaCommModel, CommModel, GroupLayout, volume_factor

H100 = get_chip("h100-sxm")
M = AlphaBetaCommModel()


def test_single_node_allreduce_busbw_matches_nccl_tests() -> None:
    """8x H100 ring all-reduce of 4 GiB: busbw about 370 GB/s (nccl-tests issues 212, 290)."""
    size = 4 * 2**30
    t = M.collective_time_s(H100, "hgx", "all_reduce", size, GroupLayout(8, 8))
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
    """All-reduce over 4 domains of 8 = inner ring on NVLink + outer ring on 1/8 of the data."""
    p = M.params
    s = 8e9
    t = M.collective_time_s(H100, "hgx", "all_reduce", s, GroupLayout(32, 8, 1))
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
