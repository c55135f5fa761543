"""What a neighbouring job's traffic does to a job's transfers on a non-blocking, sprayed fat-tree."""

from __future__ import annotations

import numpy as np

from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import TopologyConfig, build_topology

WINDOW_S = 4.15  # a Llama 3 70B step on Trainium3 (estimate train), over which its PP transfers are spread
PP_BYTES = 1.68e7  # one PP send/recv of that job (its plan)


def _pp_times(sim: FlowSim) -> list[float]:
    """One PP send/recv (512 pairs, chip k to k + 512) at five points of the window; seconds of each."""
    out = []
    for k in range(5):
        at = WINDOW_S * (k + 0.5) / 5
        sim.advance(max(at, sim.now_s))
        h = sim.start_collectives("send_recv", np.array([0, 512]), 1, 512, PP_BYTES, start_s=at)[0]
        while h.state in ("pending", "running"):
            nxt = sim.next_event_s()
            sim.advance(nxt if nxt is not None else sim.now_s + 1.0)
        out.append(h.end_s - h.start_s)
    return out


def test_a_neighbours_dp_burst_does_not_slow_a_jobs_pp_on_a_non_blocking_sprayed_fabric() -> None:
    """32,768 Trainium3 on three tiers at 1:1 with spraying: a 16k-chip neighbour's DP reduce-scatter (128 rings
    of 128 ranks across domains, 12.8 GB) overlapping the middle of the window leaves every PP transfer of a
    2k-chip job at its solo time: each flow's bottleneck is its own NIC, which no other job shares."""
    topo = build_topology(TopologyConfig(chip="trainium3", count=32768, system="trn3-ultraserver", tiers=3,
                                         routing="spray"))
    solo = _pp_times(FlowSim(topo))
    sim = FlowSim(topo)
    burst = sim.start_collectives("reduce_scatter", 2048 + 128 * np.arange(128), 1, 128, 1.28e10, start_s=1.8)[0]
    busy = _pp_times(sim)
    assert burst.start_s == 1.8 and (burst.state != "done" or burst.end_s > WINDOW_S * 2.5 / 5)  # overlaps the middle
    np.testing.assert_allclose(busy, solo, rtol=1e-9)
    assert 0.5e-3 < solo[2] < 1.0e-3  # the plan's 0.74 ms per call
