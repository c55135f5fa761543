"""The policy registry: one error for unknown names, config-time checks, and policies added from
another package (an import path in the config, and an installed entry point), as docs/extending.md
shows."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gigacluster import registry
from gigacluster.errors import InvalidArgument
from gigacluster.inference.engine import Request
from gigacluster.inference.policies import POLICIES, ReplicaView, make_policy
from gigacluster.model import SpecError
from gigacluster.registry import UnknownName
from gigacluster.runtime.config import ConfigError, FabricConfig, RouterConfig, SchedulerConfig, load
from gigacluster.scheduler.placement import PLACEMENTS, Layout, get_policy

PLUGIN = textwrap.dedent('''
    """A user's package, outside the gigacluster source tree."""
    import numpy as np

    from gigacluster.inference.policies import RoutingPolicy
    from gigacluster.scheduler.placement import PlacementPolicy


    class LastDomainFirst(PlacementPolicy):
        """Fill domains from the highest id down."""

        name = "last_domain_first"

        def choose(self, layout, slots, need, full):
            order = np.flatnonzero(slots > 0)[::-1]
            cum = np.cumsum(slots[order])
            k = int(np.searchsorted(cum, need))
            if k >= order.size:
                return None, np.empty(0, dtype=np.int64)
            take = slots[order[: k + 1]].copy()
            take[-1] -= int(cum[k]) - need
            return order[: k + 1], take


    class AlwaysLast(RoutingPolicy):
        """Every request to the last replica."""

        name = "always_last"

        def pick(self, req, replicas, rng):
            return len(replicas) - 1
''')


@pytest.fixture
def user_package(tmp_path: Path) -> Iterator[Path]:
    """``acme_policies`` written to tmp_path with a dist-info declaring an entry point, on sys.path."""
    (tmp_path / "acme_policies.py").write_text(PLUGIN)
    dist = tmp_path / "acme_policies-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-policies\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gigacluster.routing]\nalways_last = acme_policies:AlwaysLast\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("acme_policies", None)
        PLACEMENTS.unregister("acme_policies:LastDomainFirst")
        POLICIES.unregister("always_last")


def test_placement_policy_from_an_import_path_in_the_config(user_package: Path) -> None:
    """A scheduler config naming pkg.module:Class registers it, and get_policy then places with it."""
    cfg = SchedulerConfig(placement="acme_policies:LastDomainFirst")
    policy = get_policy(cfg.placement)
    lay = Layout.uniform(32, 8, 2)
    devs = policy.place(lay, np.ones(32, dtype=bool), 8, tp=8)
    assert devs is not None and devs.tolist() == list(range(24, 32))


def test_routing_policy_from_an_installed_entry_point(user_package: Path) -> None:
    """An entry point in group gigacluster.routing is listed, selectable by name, and routes."""
    assert "always_last" in POLICIES.names()
    policy = make_policy("always_last")
    replicas = [ReplicaView(i) for i in range(3)]
    assert policy.pick(Request("r", [1, 2, 3], 4), replicas, np.random.default_rng(0)) == 2
    assert "always_last" in POLICIES  # what the router's DeployModel check asks


def test_routing_policy_from_an_import_path_in_the_router_config(user_package: Path) -> None:
    """RouterConfig.routing_policies registers a policy under its import path for deployments."""
    cfg = RouterConfig(routing_policies="acme_policies:AlwaysLast")
    try:
        assert make_policy(cfg.routing_policy_paths[0]).name == "always_last"
    finally:
        POLICIES.unregister("acme_policies:AlwaysLast")


def test_a_request_cannot_import_by_path() -> None:
    """A name from a request is looked up, never imported: an import path not loaded by config is unknown."""
    with pytest.raises(UnknownName):
        make_policy("os:system")
    assert "os:system" not in POLICIES


def test_unknown_names_are_one_error_listing_the_allowed_names() -> None:
    """Every family refuses an unknown name with UnknownName (InvalidArgument and SpecError) naming its field."""
    for key, field in (("placement", "placement"), ("failures", "table"), ("routing", "policy"),
                       ("collectives", "algo"), ("collective_policies", "policy"), ("fabric_routing", "routing")):
        reg = registry.family(key)
        assert reg.group == f"gigacluster.{key}"
        with pytest.raises(UnknownName) as ei:
            reg.lookup("no-such-policy")
        err = ei.value
        assert isinstance(err, InvalidArgument) and isinstance(err, SpecError)
        assert err.field == field and err.code == "INVALID_ARGUMENT"
        assert f"allowed: {', '.join(reg.names())}" in str(err) and reg.names()


def test_names_are_checked_when_the_config_loads() -> None:
    """Bad placement and fabric routing names fail at config load, listing the choices (failure tables are the
    fault injector's, tests/faults)."""
    with pytest.raises(ConfigError, match="allowed: binpack, spread, topology"):
        SchedulerConfig(placement="random")
    with pytest.raises(ConfigError, match="allowed: adaptive, ecmp, spray"):
        load(FabricConfig, flags={"routing": "valiant"}, env={})
    with pytest.raises(ConfigError, match="cannot import"):
        SchedulerConfig(placement="no_such_module_xyz:Policy")
    with pytest.raises(ConfigError, match="import paths"):
        RouterConfig(routing_policies="round_robin")


def test_an_import_path_must_name_a_policy_of_the_family(user_package: Path) -> None:
    """A path to something that is not a PlacementPolicy subclass is refused at config load."""
    with pytest.raises(ConfigError, match="is not a placement policy"):
        SchedulerConfig(placement="acme_policies:AlwaysLast")
    assert "acme_policies:AlwaysLast" not in PLACEMENTS
