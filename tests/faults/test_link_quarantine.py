"""Chips behind a down NIC link: the fabric reports them cut off, and the scheduler's placement keeps jobs off
them until the link is repaired (issue 14 item 3: NIC and cable faults through the real path)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from gigacluster.broker.v1 import broker_pb2
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import FailedPrecondition
from gigacluster.fabric.service.linkstore import LinkStore
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.scheduler.cluster import ClusterView
from gigacluster.scheduler.placement import Layout, get_policy
from gigacluster.wire import fabric as wire


def test_the_fabric_reports_chips_whose_nic_link_is_down_until_it_is_restored() -> None:
    """One direction of chip 3's NIC link down cuts chip 3 off (only it); a leaf switch down cuts off every chip
    under it; restored, none is."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=32))
    sim = FlowSim(topo)
    assert not sim.cut_off_chips().any()
    sim.fail_link(int(topo.nic_down[3]))
    assert np.flatnonzero(sim.cut_off_chips()).tolist() == [3]
    sim.restore_link(int(topo.nic_down[3]))
    leaf_node = int(topo.link_dst[topo.nic_up[0]])  # the switch chip 0's NIC link goes up to
    sim.fail_switch(leaf_node)
    under = np.flatnonzero(topo.chip_leaf == topo.chip_leaf[0]).tolist()
    assert np.flatnonzero(sim.cut_off_chips()).tolist() == under and 0 < len(under) < 32
    sim.restore_switch(leaf_node)
    assert not sim.cut_off_chips().any()


def test_link_stats_carry_the_cut_off_chips_as_ranges() -> None:
    """GetLinkStats lists the cut-off chips as device ranges (a few records, not one per chip)."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=16))
    sim = FlowSim(topo)
    for chip in (2, 3, 9):
        sim.fail_link(int(topo.nic_up[chip]))
    msg = wire.link_stats_msg(*sim.tier_stats(), now_s=1.0, cut_off=sim.cut_off_chips())
    assert [(r.start, r.end) for r in msg.cut_off_chips] == [(2, 4), (9, 10)]
    assert not wire.link_stats_msg(*sim.tier_stats(), now_s=1.0).cut_off_chips
    only = wire.cut_off_msg(sim.cut_off_chips(), now_s=1.0)  # GetLinkStats(cut_off_only): no statistics
    assert [(r.start, r.end) for r in only.cut_off_chips] == [(2, 4), (9, 10)] and not only.tiers


def test_placement_keeps_a_gang_off_cut_off_chips_and_takes_them_back_once_repaired() -> None:
    """With chip 3 cut off, an 8-chip TP-8 gang cannot use domain 0 (it lands on domain 1); with the link
    repaired (the fabric reports none), domain 0 is free again; broker-held devices stay excluded as before."""
    view = ClusterView(SchedulerConfig(), auth=None, book=None)  # type: ignore[arg-type]
    lay = Layout.uniform(24, 8, 1)
    inv = broker_pb2.GetInventoryResponse(free=[common_pb2.DeviceRange(start=0, end=24)])
    view.cut_off = [(3, 4)]
    free = view.free_devices(inv, {"h100-sxm": lay}, now=0.0)["h100-sxm"]
    assert np.flatnonzero(~free).tolist() == [3]
    placed = get_policy("topology").place(lay, free, 8, tp=8)
    assert placed is not None and placed.tolist() == list(range(8, 16))
    view.cut_off = []
    free = view.free_devices(inv, {"h100-sxm": lay}, now=0.0)["h100-sxm"]
    assert free.all() and get_policy("topology").place(lay, free, 8, tp=8).tolist() == list(range(8))


def test_link_faults_are_persisted_and_restored_on_a_fresh_fabric(tmp_path: pathlib.Path) -> None:
    """Down links (one by one and a whole switch) and a degraded link saved, then restored on a new simulator of
    the same topology: the same links are down or degraded and the same chips cut off; cleared, the file says so."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=32))
    sim = FlowSim(topo)
    sim.fail_link(int(topo.nic_up[5]))
    sim.degrade_link(int(topo.nic_up[6]), 0.25)
    sim.fail_switch(int(topo.link_dst[topo.nic_up[20]]))
    store = LinkStore.for_state_dir(str(tmp_path))
    store.save(sim)
    again = FlowSim(topo)
    assert store.restore(again) == int((~sim.link_alive).sum()) + 1
    assert np.array_equal(again.link_alive, sim.link_alive) and np.array_equal(again.link_factor, sim.link_factor)
    assert np.array_equal(again.cut_off_chips(), sim.cut_off_chips())
    store.save(FlowSim(topo))
    assert json.loads((tmp_path / "fabric-link-faults.json").read_text()) == {"version": 1, "down": [], "degraded": []}
    assert LinkStore.for_state_dir("").restore(again) == 0


def test_a_link_fault_file_it_cannot_read_is_refused_and_unknown_links_are_skipped(tmp_path: pathlib.Path) -> None:
    """Garbage or another version: FailedPrecondition naming the file; a link this topology lacks is skipped."""
    path = tmp_path / "fabric-link-faults.json"
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=16))
    sim = FlowSim(topo)
    for body in ("{", '{"version": 9, "down": [], "degraded": []}'):
        path.write_text(body)
        with pytest.raises(FailedPrecondition, match=r"fabric-link-faults\.json"):
            LinkStore(path).restore(sim)
    path.write_text(json.dumps({"version": 1, "down": ["chip999-leaf0", topo.link_name(int(topo.nic_up[1]))],
                                "degraded": []}))
    assert LinkStore(path).restore(sim) == 1 and np.flatnonzero(sim.cut_off_chips()).tolist() == [1]
