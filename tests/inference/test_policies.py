"""Routing policies: registry, each policy's choice, and the prefix index's bounds."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.inference.policies import POLICIES, PrefixAware, ReplicaView, make_policy
from gigacluster.model import SpecError
from tests.inference.conftest import make_req


def views(outstanding: list[int], kv: list[float] | None = None, blocks: int = 1000) -> list[ReplicaView]:
    kv = kv or [0.0] * len(outstanding)
    return [ReplicaView(i, o, 0, o, k, blocks) for i, (o, k) in enumerate(zip(outstanding, kv, strict=True))]


RNG = np.random.default_rng(0)


def test_registry_and_unknown_name() -> None:
    """All five issue policies are registered; an unknown name is a SpecError on 'policy' listing them."""
    assert set(POLICIES) == {"round_robin", "least_outstanding", "kv_usage", "prefix_aware", "power_of_two"}
    for name in POLICIES:
        assert make_policy(name).name == name
    with pytest.raises(SpecError) as ei:
        make_policy("random_walk")
    assert ei.value.field == "policy" and "round_robin" in str(ei.value)


def test_round_robin_cycles() -> None:
    """round_robin visits replicas in order regardless of load."""
    p = make_policy("round_robin")
    v = views([9, 0, 0])
    assert [p.pick(make_req("r", 10, 1), v, RNG) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_outstanding_and_kv_usage() -> None:
    """least_outstanding takes the fewest requests; kv_usage takes the emptiest KV cache."""
    req = make_req("r", 10, 1)
    assert make_policy("least_outstanding").pick(req, views([5, 2, 7]), RNG) == 1
    assert make_policy("kv_usage").pick(req, views([0, 0, 0], [0.9, 0.5, 0.1]), RNG) == 2


def test_power_of_two_never_picks_the_busiest_of_its_pair() -> None:
    """power_of_two never chooses the most loaded replica when another one is sampled with it."""
    p = make_policy("power_of_two")
    v = views([100, 0, 1, 2])
    picks = [p.pick(make_req("r", 10, 1), v, np.random.default_rng(s)) for s in range(200)]
    assert 0 not in picks and len(set(picks)) == 3


def test_prefix_aware_follows_prefix_and_balances() -> None:
    """prefix_aware sends a known prefix to the replica that saw it, not to an overloaded one; else round robin."""
    p = make_policy("prefix_aware")
    prefix = np.arange(300, 300 + 512, dtype=np.int32)
    first = make_req("a", 64, 1, prefix=prefix)
    k = p.pick(first, views([0, 0, 0, 0]), RNG)
    p.on_routed(first, k)
    again = make_req("b", 64, 1, seed=9, prefix=prefix)
    load = [3, 3, 3, 3]
    assert p.pick(again, views(load), RNG) == k
    load[k] = 200  # imbalance beyond balance_abs and balance_rel: load wins over cache affinity
    assert p.pick(again, views(load), RNG) != k
    stranger = make_req("c", 600, 1, seed=4)
    picks = {p.pick(stranger, views([3, 3, 3, 3]), RNG) for _ in range(4)}
    assert picks == {0, 1, 2, 3}  # no match and balanced load: round robin


def test_prefix_index_is_lru_bounded() -> None:
    """The per-replica prefix index never holds more hashes than its capacity."""
    p = PrefixAware(capacity_blocks=50)
    v = views([0])
    for i in range(40):
        r = make_req(f"r{i}", 160, 1, seed=i)  # 10 blocks each
        p.on_routed(r, p.pick(r, v, RNG))
    assert p.index_size(0) == 50


def test_replica_view_validates() -> None:
    """A negative load or a KV fraction above 1 is refused."""
    with pytest.raises(SpecError):
        ReplicaView(0, -1)
    with pytest.raises(SpecError):
        ReplicaView(0, 0, kv_used_frac=1.5)
