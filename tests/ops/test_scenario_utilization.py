"""The scenario report's per-tier utilisation on a live event-clock mesh: a training job that runs in steady-state
windows shows its modelled bytes on the NIC tier, which samples of live flows never saw."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from gigacluster.client import Client
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import TIER_NAMES, Topology, TopologyConfig, build_topology
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.model.step import plan_step
from gigacluster.model.training import TrainSpec
from gigacluster.scenario import runner, spec
from gigacluster.scheduler import step_comm
from gigacluster.scheduler.core import rank_groups
from gigacluster.scheduler.runner import arithmetic_runs, device_runs
from tests.conftest import live_stack

pytestmark = pytest.mark.integration  # one small event-clock run: under a minute on a loaded 2-core machine
ROOT = pathlib.Path(__file__).resolve().parents[2]
NIC, SCALEUP = TIER_NAMES.index("nic"), TIER_NAMES.index("scaleup")
# Two HGX H100 nodes, TP 8 inside each, data parallel 2 across them: the gradient and parameter collectives cross
# the NIC links once per step (the TP collectives stay on scale-up), the same rail on the same leaf.
JOB: dict[str, Any] = {
    "model": {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
              "seq_len": 1024, "mlp": "swiglu"},
    "batch": {"global_batch": 32}, "parallelism": {"tp": 8, "microbatch_size": 1},
    "hardware": {"chip": "h100-sxm", "count": 16}, "precision": "bf16", "steps": 1_000_000,
}
SCENARIO: dict[str, Any] = {
    "name": "util", "site": {"chip": "h100-sxm", "chips": 64}, "duration_s": 120, "sample_every_s": 10,
    "tenants": [{"name": "alpha"}], "jobs": [{"tenant": "alpha", "name": "dp2", "at_s": 0, "spec": JOB}],
}


def step_busy_link_s(topo: Topology) -> np.ndarray:
    """Per tier, the link-seconds (bytes / capacity summed over links) of one step of the job on chips 0-15: its
    step plan's collectives, as the scheduler's runner calls them, run alone through the fabric model, read from
    every link's carried bytes. The NIC links a collective uses depend only on its ranks, not on ECMP."""
    ts = TrainSpec.from_dict(JOB)
    devices = np.arange(ts.count)
    sim = FlowSim(topo)
    for d in plan_step(ts).collectives:
        size, stride, _copies, offsets = rank_groups(ts, d.name)
        for run in arithmetic_runs(offsets):
            for ranks, count, group_stride in device_runs(devices, run, stride, size):
                sim.start_collectives(d.op, ranks, group_stride, count, d.bytes_, start_s=0.0,
                                      repeats=step_comm.repeats(d))
    sim.run_until_idle()
    carried = sim.link_stats().bytes_carried
    return np.bincount(topo.link_tier, weights=carried / topo.link_capacity_Bps, minlength=len(TIER_NAMES))


async def test_a_job_in_steady_state_windows_shows_its_modelled_bytes_on_the_nic_tier(
        mosquitto: str, tmp_path: pathlib.Path) -> None:
    """On the event clock the job runs almost all of its steps as windows: the NIC tier's time-average utilisation
    is its steps x one step's modelled NIC link-seconds / (NIC links x elapsed virtual s) within 3%, where the
    mean of the samples of live flows (the report's figure before) stays below a tenth of it. The scale-up tier
    likewise, with every TP collective of a step counted (``repeats``: the fabric used to see one call of each
    inline demand per step: 1/640 of its TP traffic here, 640 TP calls a step)."""
    sc = spec.parse(SCENARIO, base_dir=ROOT)
    async with live_stack("util", mosquitto, tmp_path, clock="event") as st:
        async with Client(st.endpoints, st.admin_key) as admin:
            live = await admin.fabric.GetTopology(fabric_pb2.GetTopologyRequest(), metadata=admin.md, timeout=30)
        rep = await runner.run(sc, runner.Target(st.endpoints, st.admin_key,
                                                 clock_coordinator=st.endpoint_of("clock")))
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=64))
    offline = topo.summary()
    assert [(t.tier, t.links) for t in live.tiers] == [(t["tier"], t["links"]) for t in offline["tiers"]]
    (job,) = rep["jobs"]
    assert not job["error"] and job["steps"] > 100, job
    nic = next(r for r in rep["tiers"] if r["tier"] == "nic")
    expected = job["steps"] * step_busy_link_s(topo)[NIC] / (nic["links"] * nic["elapsed_s"])
    assert nic["elapsed_s"] == pytest.approx(120.0, abs=1.0)
    assert nic["mean_utilization"] == pytest.approx(expected, rel=0.03), (nic, expected)
    assert nic["sampled_mean_utilization"] < 0.1 * expected, nic
    up = next(r for r in rep["tiers"] if r["tier"] == "scaleup")
    step = step_busy_link_s(topo)
    assert step[SCALEUP] > 3 * step[NIC]  # TP moves more inside the nodes than DP between them (about 6x)
    assert up["mean_utilization"] == pytest.approx(job["steps"] * step[SCALEUP] / (up["links"] * up["elapsed_s"]),
                                                   rel=0.03), (up, step)
    assert 0 < nic["peak_utilization"] <= 1.0 + 1e-9
    assert runner.end_to_end_check(rep) == []
