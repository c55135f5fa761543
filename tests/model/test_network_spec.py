"""The training spec's ``network`` section and the offline estimate's fabric built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gigacluster.fabric.comm_model import FabricCommModel
from gigacluster.fabric.estimate import estimate_collective
from gigacluster.hw.catalog import get_chip
from gigacluster.model import SpecError
from gigacluster.model.comm import GroupLayout
from gigacluster.model.network_spec import DEFAULT_ROUTING, NetworkSpec
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _spec(network: Any = None) -> TrainSpec:
    d = yaml.safe_load((EXAMPLES / "train-llama3-8b-small.yaml").read_text())
    if network is not None:
        d["network"] = network
    return TrainSpec.from_dict(d)


def test_default_network_is_adaptive_one_nic_per_chip() -> None:
    """Without a network section the estimate uses adaptive routing and the chips' own NICs."""
    spec = _spec()
    assert spec.network == NetworkSpec()
    assert spec.network.routing == DEFAULT_ROUTING == "adaptive"
    assert spec.network.topology_kw() == {"routing": "adaptive", "oversubscription": 1.0}


def test_network_section_parses_every_field() -> None:
    """nic, nics_per_node, routing, tiers, oversubscription and switch reach the topology fields."""
    net = {"nic": "nic400", "nics_per_node": 4, "routing": "ecmp", "tiers": 3, "oversubscription": 2,
           "switch": "tomahawk6"}
    spec = _spec(net)
    assert spec.network.topology_kw() == {"routing": "ecmp", "oversubscription": 2.0, "nic": "nic400",
                                          "nics_per_node": 4, "tiers": 3, "switch": "tomahawk6"}


@pytest.mark.parametrize(("net", "field"), [
    ({"routing": "valiant"}, "network.routing"),
    ({"nic": "cx9"}, "network.nic"),
    ({"switch": "quantum"}, "network.switch"),
    ({"tiers": 4}, "network.tiers"),
    ({"nics_per_node": 0}, "network.nics_per_node"),
    ({"nics_per_node": True}, "network.nics_per_node"),
    ({"oversubscription": 0.5}, "network.oversubscription"),
    ({"colour": "red"}, "network.colour"),
    ("fast", "network"),
    ({"nic": "x" * 500}, "network.nic"),
])
def test_bad_network_section_names_the_field(net: Any, field: str) -> None:
    """A bad value is a SpecError naming network.<field>, quoting at most a short prefix."""
    with pytest.raises(SpecError) as exc:
        _spec(net)
    assert exc.value.field == field
    assert len(str(exc.value)) < 300


def test_estimate_reports_the_network_it_used() -> None:
    """estimate train's JSON carries the network section, defaults included."""
    est = estimate_train(_spec({"routing": "spray", "nics_per_node": 8}))
    assert est.to_dict()["network"]["routing"] == "spray"
    assert est.to_dict()["network"]["nics_per_node"] == 8


def test_fewer_nics_per_node_share_them() -> None:
    """Four NICs for eight A100s halve each chip's scale-out share: cross-node busbw about halves."""
    full = estimate_collective("all_reduce", 2**30, "a100-80gb", 16)
    half = estimate_collective("all_reduce", 2**30, "a100-80gb", 16, nics_per_node=4)
    assert half.busbw_GBps == pytest.approx(full.busbw_GBps / 2, rel=0.05)
    with pytest.raises(SpecError) as exc:
        estimate_collective("all_reduce", 2**30, "a100-80gb", 16, nics_per_node=-1)
    assert exc.value.field == "nics_per_node"


def test_adaptive_routing_avoids_ecmp_collisions_at_scale() -> None:
    """Data-parallel all-reduce over 1,024 nodes (8 rail-local groups at once): its tree edges cross leaves,
    ECMP hashes some onto one spine link and the tree slows below the rail-local ring; adaptive routing
    spreads them and the tree wins. The ring's neighbours share a leaf, so an all-gather does not care."""
    chip = get_chip("h100-sxm")
    layout = GroupLayout(1024, 1, 8)
    s = float(2**28)
    t = {r: FabricCommModel(routing=r).collective_time_s(chip, "hgx", "all_reduce", s, layout)
         for r in ("ecmp", "adaptive")}
    assert t["ecmp"] > 1.1 * t["adaptive"]
    ag = {r: FabricCommModel(routing=r).collective_time_s(chip, "hgx", "all_gather", s, layout)
          for r in ("ecmp", "adaptive")}
    assert ag["ecmp"] == pytest.approx(ag["adaptive"])
