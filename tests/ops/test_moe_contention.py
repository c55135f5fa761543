"""examples/moe-contention.yaml, shortened, against a real mesh: an MoE training job's expert all-to-all slows
down while a wide-EP MoE fleet shares the leaf-spine links, by at least what the fabric model says a shared
uplink costs, and the report's contention figures agree with its other figures."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from gigacluster import safeyaml
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.model.step import plan_step
from gigacluster.model.training import TrainSpec
from gigacluster.scenario import runner, spec
from tests.conftest import live_stack

pytestmark = pytest.mark.integration  # about 90 s of wall time
ROOT = pathlib.Path(__file__).resolve().parents[2]
OVERSUBSCRIPTION = "63"  # as the example's header says: 2 uplink ports per leaf of 4 chips


def _small() -> dict[str, Any]:
    """The example with its three phases cut to 15 s (fleet alone), 30 s (both) and 20 s (training alone)."""
    d = safeyaml.load_file(ROOT / "examples" / "moe-contention.yaml")
    d["duration_s"], d["sample_every_s"] = 65, 5
    d["jobs"][0]["at_s"] = 15
    d["inference"].update(duration_s=45, drain_s=20)
    return d


def full_overlap_a2a_ratio(job_spec: dict[str, Any]) -> float:
    """The fabric model's time of one of the job's all-to-all exchanges while the fleet's all-to-all runs
    throughout, over its time alone: training on two HGX nodes (its two EP groups, Megatron order), a 16-chip
    replica on the other two, on the example's fabric."""
    ts = TrainSpec.from_dict(job_spec)
    (a2a,) = [d for d in plan_step(ts).collectives if d.name == "ep_a2a"]
    topo = build_topology(TopologyConfig("h100-sxm", 32, oversubscription=float(OVERSUBSCRIPTION)))

    def run(fleet: bool) -> float:
        sim = FlowSim(topo)
        if fleet:  # 10x the bytes: it outlasts the training exchange
            sim.start_collective("all_to_all", np.arange(16, 32), 10 * a2a.bytes_, start_s=0.0,
                                 traffic_class="inference")
        hs = [sim.start_collective("all_to_all", np.arange(g, 16, ts.tp), a2a.bytes_, start_s=0.0)
              for g in range(ts.tp)]
        sim.run_until_idle()
        return max(h.end_s for h in hs)

    return run(True) / run(False)


async def test_moe_training_all_to_all_slows_while_the_moe_fleet_shares_the_fabric(
        mosquitto: str, tmp_path: pathlib.Path) -> None:
    """The job's all-to-all is slower with the fleet than alone (mean), its busiest step at least half of what the
    fabric model gives for a full overlap; alone it steps at the idle estimate; every step and request falls in
    exactly one phase."""
    raw = _small()
    sc = spec.parse(raw, base_dir=ROOT)
    ratio = full_overlap_a2a_ratio(raw["jobs"][0]["spec"])
    assert ratio > 1.2  # the model itself says the shared uplinks cost the job
    async with live_stack("moecont", mosquitto, tmp_path, chips=32, shards=1, speedup=1.0,
                          extra_env={"GIGACLUSTER_OVERSUBSCRIPTION": OVERSUBSCRIPTION}) as st:
        rep = await runner.run(sc, runner.Target(st.endpoints, st.admin_key))
    assert runner.end_to_end_check(rep) == []
    (job,) = rep["jobs"]
    assert job["error"] == "" and job["steps"] > 10
    c = rep["contention"]
    (jc,) = c["jobs"]
    alone, with_ = jc["alone"], jc["with_fleet"]
    assert alone["steps"] >= 5 and with_["steps"] >= 5
    # Alone, the job steps at the idle-cluster estimate (the same model, no neighbour on its links).
    assert alone["mean_step_s"] == pytest.approx(job["estimate_step_s"], rel=0.05)
    # With the fleet: slower on average, and at least one step shared the uplinks for most of its exchange.
    assert jc["a2a_slowdown"] > 0 and jc["step_slowdown"] > 0
    assert jc["a2a_peak_ratio"] >= 1 + 0.5 * (ratio - 1), (jc, ratio)
    # The fleet: every request in one phase, both phases served.
    f = c["fleet"]
    offered = rep["inference"]["streams"][0]["offered"]
    assert f["alone"]["requests"] + f["with_training"]["requests"] == offered
    assert f["alone"]["ok"] > 0 and f["with_training"]["ok"] > 0
    assert f["alone"]["server_ttft_p50_s"] > 0 and f["with_training"]["server_tpot_p50_s"] > 0
