"""Collectives: nccl-tests calibration, algbw/busbw definitions, latency terms, algorithm policy, CLI."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from gigacluster.cli.estimate_collective import parse_bytes
from gigacluster.cli.main import main
from gigacluster.fabric.collectives import (
    ALGORITHMS,
    bus_factor,
    collective_constants,
    plan_collective,
)
from gigacluster.fabric.estimate import estimate_collective
from gigacluster.fabric.protocols import get_protocol
from gigacluster.fabric.topology import Topology
from gigacluster.model import SpecError


def test_bus_factor_matches_nccl_tests() -> None:
    """nccl-tests doc/PERFORMANCE.md: all-reduce 2(n-1)/n; RS, AG, A2A (n-1)/n; broadcast 1."""
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    for op in ("reduce_scatter", "all_gather", "all_to_all"):
        assert bus_factor(op, 8) == pytest.approx(0.875)
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("send_recv", 2) == 1.0
    with pytest.raises(SpecError):
        bus_factor("reduce", 8)


def test_8x_h100_ring_busbw_within_15_percent_of_nccl_tests() -> None:
    """8x H100 SXM one node, 1 GiB ring all-reduce: about 370 GB/s busbw (nccl-tests issues 212, 290)."""
    est = estimate_collective("all_reduce", 2**30, "h100-sxm", 8, algo="ring")
    assert est.algorithm == "ring"
    assert abs(est.busbw_GBps - 370.0) / 370.0 < 0.15
    assert est.algbw_GBps == pytest.approx(2**30 / est.time_s / 1e9)
    assert est.busbw_GBps == pytest.approx(est.algbw_GBps * 1.75)


def test_small_messages_are_latency_bound() -> None:
    """An 8-byte ring all-reduce runs LL: LL's base cost + 2(n-1) steps of max(path latency, LL step cost),
    the wire carrying twice the payload; busbw near 0."""
    est = estimate_collective("all_reduce", 8, "h100-sxm", 8, algo="ring")
    assert est.algorithm == "ring/ll"
    launch_s, step_s = collective_constants("ll")
    path_s = 3.0e-7 + 2 * 2 * 5.0e-9  # NVSwitch 300 ns + 2 m of cable each way
    wire = 8 / 0.5  # LL: 4 bytes of data per 8-byte line
    assert est.time_s == pytest.approx(launch_s + 14 * max(path_s, step_s) + wire / (450e9 * 0.82) * 1.75, rel=1e-6)
    big = estimate_collective("all_reduce", 2**30, "h100-sxm", 8, algo="ring")
    assert est.busbw_GBps < 0.01 * big.busbw_GBps


def test_policy_prefers_few_steps_for_small_and_bandwidth_for_large(two_groups: Topology) -> None:
    """Small messages avoid the 2(n-1)-step ring; for 1 GiB the chosen plan is at least as fast as the ring."""
    ranks = np.arange(64)
    small = plan_collective("all_reduce", ranks, 1024, two_groups)
    assert small.algorithm.split("/")[0] in ("tree", "halving_doubling")
    t_best = estimate_collective("all_reduce", 2**30, "h100-sxm", 64).time_s
    t_ring = estimate_collective("all_reduce", 2**30, "h100-sxm", 64, algo="ring").time_s
    assert t_best <= t_ring * (1 + 1e-9)


def test_forced_algorithm_must_support_the_op() -> None:
    """Forcing halving_doubling on 6 ranks or the tree on all_gather is a SpecError naming algo."""
    with pytest.raises(SpecError) as exc:
        estimate_collective("all_reduce", 1e6, "h100-sxm", 6, algo="halving_doubling")
    assert exc.value.field == "algo"
    with pytest.raises(SpecError) as exc:
        estimate_collective("all_gather", 1e6, "h100-sxm", 8, algo="tree")
    assert exc.value.field == "algo" and "ring" in str(exc.value)
    with pytest.raises(SpecError) as exc:
        estimate_collective("all_reduce", 1e6, "h100-sxm", 8, algo="collnet")
    assert exc.value.field == "algo"


def test_hierarchical_plan_runs_three_phases_with_rail_rings(two_groups: Topology) -> None:
    """Hierarchical all-reduce over 2 nodes: intra RS, inter ring of S/8 per rail, intra AG."""
    plan = plan_collective("all_reduce", np.arange(16), 8e6, two_groups, algo="hierarchical")
    assert len(plan.phases) == 3
    inter = plan.phases[1]
    # wire bytes: the payload over the wire efficiency of the protocol the plan runs
    assert inter.bytes_per_hop * get_protocol(inter.proto).wire_efficiency == pytest.approx(2 * 1 / 2 * 8e6 / 8)
    assert (two_groups.chip_local[inter.src] == two_groups.chip_local[inter.dst]).all()


def test_all_ops_complete_and_report_busbw() -> None:
    """Every op runs on 16 H100s; all-to-all over NICs cannot beat the NIC goodput (46 GB/s)."""
    for op in ("reduce_scatter", "all_gather", "all_to_all", "broadcast"):
        est = estimate_collective(op, 2**28, "h100-sxm", 16)
        assert est.time_s > 0 and est.busbw_GBps > 0
    a2a = estimate_collective("all_to_all", 2**28, "h100-sxm", 16)
    # each rank sends 8/16 of S over its NIC to the other node
    assert a2a.time_s >= 0.5 * 2**28 / (50e9 * 0.92)
    sr = estimate_collective("send_recv", 2**28, "h100-sxm", 2)
    assert sr.algorithm == "direct" and sr.busbw_GBps == pytest.approx(sr.algbw_GBps)


def test_trainium_and_mi300x_collectives_run() -> None:
    """The torus, ring-of-tori and mesh domains carry collectives at their modelled link rates."""
    trn = estimate_collective("all_reduce", 2**30, "trainium2", 16, algo="ring")
    # a ring on the 4x4 torus in rank order: one 128 GB/s link per hop at 0.82
    assert trn.busbw_GBps == pytest.approx(128 * 0.82, rel=0.02)
    mi = estimate_collective("all_reduce", 2**30, "mi300x", 8, algo="ring")
    assert mi.busbw_GBps == pytest.approx(64 * 0.75, rel=0.02)  # one xGMI link per hop, 48 of 64 GB/s usable
    us = estimate_collective("all_reduce", 2**26, "trainium2", 64, system="trn2-ultraserver")
    assert us.time_s > 0


def test_parse_bytes_units() -> None:
    """KiB/MiB/GiB are powers of 2, KB/MB/GB powers of 10, plain integers are bytes."""
    assert parse_bytes("1GiB") == 2**30
    assert parse_bytes("64KiB") == 65536
    assert parse_bytes("1GB") == 1e9
    assert parse_bytes("1048576") == 1048576
    with pytest.raises(SpecError) as exc:
        parse_bytes("1 parsec")
    assert exc.value.field == "bytes"


def test_cli_json_and_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints time_s, algbw_GBps, busbw_GBps, algorithm; bad input exits 2 naming the field."""
    rc = main(["estimate", "collective", "--op", "all_reduce", "--bytes", "1GiB", "--chip", "h100-sxm",
               "--count", "8", "--algo", "ring", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["algorithm"] == "ring" and abs(d["busbw_GBps"] - 370) / 370 < 0.15
    assert d["algbw_GBps"] == pytest.approx(2**30 / d["time_s"] / 1e9)
    rc = main(["estimate", "collective", "--op", "allreduce", "--bytes", "1GiB", "--chip", "h100-sxm",
               "--count", "8"])
    assert rc == 2
    assert "op:" in capsys.readouterr().err
    rc = main(["estimate", "collective", "--op", "all_reduce", "--bytes", "1GiB", "--chip", "h100-sxm",
               "--count", "0"])
    assert rc == 2
    assert "count:" in capsys.readouterr().err


def test_registry_names_match_the_proto() -> None:
    """The algorithm names the fabric proto documents are registered."""
    for name in ("ring", "tree", "hierarchical", "halving_doubling"):
        assert name in ALGORITHMS


def test_phase_terms_are_cached_per_geometry_on_the_intact_fabric_only(two_groups: Topology,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A phase routed once on the intact fabric gives the same terms from the cache (the reduce-scatter and the
    all-gather of a group share their ring's sub-flows); with dead links the terms are routed again, and a
    cleared cache routes afresh to the same figures."""
    import gigacluster.fabric.collectives as col
    from gigacluster.fabric.routing import route as real_route

    calls: list[int] = []

    def counting_route(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real_route(*a, **k)

    monkeypatch.setattr(col, "route", counting_route)
    ranks = np.arange(16)
    phase = ALGORITHMS["ring"].phases("reduce_scatter", ranks, 2**26, two_groups)[0]
    col.clear_terms_cache(two_groups)
    first = col.phase_terms(phase, two_groups)
    again = col.phase_terms(ALGORITHMS["ring"].phases("all_gather", ranks, 2**20, two_groups)[0], two_groups)
    assert len(calls) == 1 and again == first  # same pairs, same terms: routed once
    dead = np.ones(two_groups.n_links, dtype=bool)
    dead[0] = False
    col.phase_terms(phase, two_groups, alive=dead)
    assert len(calls) == 2  # a degraded fabric is never served from the cache
    col.clear_terms_cache(two_groups)
    assert col.phase_terms(phase, two_groups) == first and len(calls) == 3
