"""The fabric service's parts without gRPC: the flow book, the request checks and the wire module."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.errors import InvalidArgument, NotFound, ResourceExhausted
from gigacluster.fabric.service import checks
from gigacluster.fabric.service.book import FlowBook, FlowRecord
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.config import FabricConfig
from gigacluster.wire import broker as broker_wire
from gigacluster.wire import fabric as wire


@pytest.fixture
def book() -> FlowBook:
    return FlowBook(FlowSim(build_topology(TopologyConfig(chip="h100-sxm", count=16))), keep_finished=1)


def _transfer(book: FlowBook, tenant: str = "tenants/a", instance: str = "") -> FlowRecord:
    h = book.sim.start_transfer(0, 9, 1e9, start_s=0.0)
    rec = FlowRecord(book.new_name(), tenant, [h.id], h.algorithm, 0.0, 1e9, "", "send_recv", 2, instance=instance)
    book.add(rec)
    return rec


def test_book_status_follows_the_simulator_from_running_to_done(book: FlowBook) -> None:
    """A booked transfer is running until the simulator passes its end, then done with its bandwidths."""
    rec = _transfer(book)
    st = book.status(rec)
    assert st.state == "running" and st.end_s == 0.0 and st.predicted_end_s > 0
    book.sim.advance(st.predicted_end_s + 1.0)
    done = book.status(rec)
    assert done.state == "done" and done.end_s == pytest.approx(st.predicted_end_s) and done.algbw_GBps > 0


def test_book_shows_a_flow_only_to_its_tenant_or_a_privileged_caller(book: FlowBook) -> None:
    """Another tenant gets NOT_FOUND (not a hint that the flow exists); the admin sees it; bad names are rejected."""
    rec = _transfer(book, "tenants/a")
    assert book.visible(Principal("tenant", "tenants/a"), rec.name) is rec
    assert book.visible(Principal("admin"), rec.name) is rec
    with pytest.raises(NotFound):
        book.visible(Principal("tenant", "tenants/b"), rec.name)
    with pytest.raises(InvalidArgument, match="name"):
        book.visible(Principal("admin"), "links/x")


def test_book_trims_finished_flows_past_its_bound_and_hands_out_an_instances_flows(book: FlowBook) -> None:
    """Finished records beyond keep_finished are forgotten oldest first; take_instance empties the instance."""
    first, second = _transfer(book, instance="i-1"), _transfer(book, instance="i-2")
    book.sim.advance(1e6)
    book.trim()
    assert book.get(first.name) is None and book.get(second.name) is second
    assert book.instances() == ["i-2"]
    assert book.take_instance("i-2") == [second] and book.instances() == []


def test_book_watch_queue_receives_notified_names_while_open(book: FlowBook) -> None:
    """A watcher gets the names notified while its block runs, and nothing after it closes."""
    with book.watch() as q:
        book.notify("flows/f-1")
    book.notify("flows/f-2")
    assert q.qsize() == 1 and q.get_nowait() == "flows/f-1"


def test_checks_bound_start_time_bytes_and_devices() -> None:
    """not_before_s past the horizon, bytes over the cap and devices outside the topology name their field."""
    assert checks.start_s(0.0, now=5.0, horizon=10.0, sim_now=4.0) == 5.0
    assert checks.start_s(7.0, now=5.0, horizon=10.0, sim_now=8.0) == 8.0
    with pytest.raises(InvalidArgument, match="not_before_s"):
        checks.start_s(100.0, now=5.0, horizon=10.0, sim_now=0.0)
    with pytest.raises(InvalidArgument, match="bytes"):
        checks.flow_bytes(float("nan"), 1e12)
    with pytest.raises(NotFound, match="src_device"):
        checks.device("src_device", 16, 16)


def test_checks_expand_collective_ranks_and_refuse_oversized_requests() -> None:
    """Ranks of group 0, groups and stride come back checked; too many groups is RESOURCE_EXHAUSTED."""
    cfg = FabricConfig()
    ranks, groups, stride = checks.collective_ranks([(0, 4)], 2, 8, cfg, 16)
    assert ranks.tolist() == [0, 1, 2, 3] and (groups, stride) == (2, 8)
    with pytest.raises(NotFound, match="ranks"):
        checks.collective_ranks([(0, 4)], 3, 8, cfg, 16)
    with pytest.raises(ResourceExhausted, match="max_collective_groups"):
        checks.collective_ranks([(0, 2)], cfg.max_collective_groups + 1, 2, cfg, 1 << 30)
    with pytest.raises(InvalidArgument, match="distinct"):
        checks.collective_ranks([(0, 4), (2, 6)], 1, 0, cfg, 16)


def test_checks_take_repeats_zero_as_once_and_refuse_absurd_counts() -> None:
    """StartCollectiveRequest.repeats: 0 (unset) and 1 are one call, up to a million calls per timed one, beyond
    that INVALID_ARGUMENT naming the field and the bound."""
    assert checks.repeats(0) == 1 and checks.repeats(1) == 1 and checks.repeats(1600) == 1600
    assert checks.repeats(checks.MAX_REPEATS) == checks.MAX_REPEATS
    with pytest.raises(InvalidArgument) as ei:
        checks.repeats(checks.MAX_REPEATS + 1)
    assert ei.value.field == "repeats" and "1,000,000" in str(ei.value)


def test_wire_maps_every_op_and_class_and_refuses_unknown_values() -> None:
    """Each op enum maps to its name and back; an unknown op or traffic class is INVALID_ARGUMENT."""
    for name, value in wire.OP_ENUMS.items():
        assert wire.op_name(value) == name
    assert wire.traffic_class(fabric_pb2.TRAFFIC_CLASS_UNSPECIFIED) == "training"
    with pytest.raises(InvalidArgument, match="op"):
        wire.op_name(fabric_pb2.COLLECTIVE_OP_UNSPECIFIED)
    with pytest.raises(InvalidArgument, match="traffic_class"):
        wire.traffic_class(99)


def test_wire_builds_links_for_a_tier_with_their_names_and_states() -> None:
    """ListLinks' messages carry the link's name, tier and state from the simulator's stats."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=16))
    sim = FlowSim(topo)
    ids = checks.link_ids(topo, "nic")
    msgs = wire.link_msgs(topo, sim.link_stats(), ids[:2])
    assert [m.name for m in msgs] == [f"links/{topo.link_name(int(i))}" for i in ids[:2]]
    assert {m.tier for m in msgs} == {"nic"} and {m.state for m in msgs} == {fabric_pb2.Link.STATE_UP}
    assert np.array_equal(checks.link_ids(topo, ""), np.arange(topo.n_links))


def test_broker_wire_says_who_a_key_belongs_to() -> None:
    """Authenticate's answer names the tenant, or the role with admin set for the admin."""
    assert broker_wire.authenticate_msg(Principal("tenant", "tenants/a")).principal == "tenants/a"
    admin = broker_wire.authenticate_msg(Principal("admin"))
    assert admin.principal == "admin" and admin.admin
