"""Where the replicas of a disaggregated deployment go (pure: no gRPC).

All replicas of a disaggregated deployment are allocated as ONE broker instance of exact devices,
so a single capability covers the prefill and the decode chips and the router may move KV caches
between them over the fabric. Each replica is ``tp`` devices inside one scale-up domain, aligned
to ``tp`` (a TP group never straddles two domains). Prefill replicas fill the free space from the
lowest device id up, decode replicas from the highest down, so the two pools sit in different
domains whenever the free space allows: each KV cache then crosses the scale-out network (NIC,
leaf, spine), where it shares links with other tenants' training traffic, as in a cluster where
prefill and decode pools are separate nodes (NVIDIA Dynamo, llm-d).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gigacluster.errors import ResourceExhausted


def aligned_groups(free: Sequence[tuple[int, int]], domain: int, tp: int) -> list[int]:
    """Start devices of every free, ``tp``-aligned group of ``tp`` devices inside one domain, ascending."""
    if tp < 1 or domain % tp:
        raise ValueError(f"tp ({tp}) must divide the domain size ({domain})")
    if not free:
        return []
    ids = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in free if b > a])
    if ids.size == 0:
        return []
    is_free = np.zeros(int(ids.max()) + tp + 1, dtype=bool)
    is_free[ids] = True
    starts = np.arange(0, is_free.size - tp + 1, tp, dtype=np.int64)
    # all tp devices free (groups are tp-aligned and tp divides the domain, so none crosses a domain)
    ok = np.ones(starts.size, dtype=bool)
    for k in range(tp):
        ok &= is_free[starts + k]
    return starts[ok].tolist()  # type: ignore[no-any-return]


def place_disaggregated(free: Sequence[tuple[int, int]], domain: int, tp: int, n_prefill: int,
                        n_decode: int) -> tuple[list[int], list[int]]:
    """Start devices of the prefill and the decode replicas (each a group of ``tp``).

    Raises ``ResourceExhausted`` (with the numbers) when fewer than ``n_prefill + n_decode`` groups
    are free.
    """
    groups = aligned_groups(free, domain, tp)
    need = n_prefill + n_decode
    if len(groups) < need:
        raise ResourceExhausted(f"a disaggregated deployment of {n_prefill} prefill + {n_decode} decode replicas "
                                f"of tp={tp} needs {need} free groups of {tp} devices in one domain; "
                                f"{len(groups)} are free")
    prefill = groups[:n_prefill]
    rest = groups[n_prefill:]
    p_domains = {g // domain for g in prefill}
    # Highest first, preferring domains that hold no prefill replica.
    other = [g for g in reversed(rest) if g // domain not in p_domains]
    same = [g for g in reversed(rest) if g // domain in p_domains]
    decode = (other + same)[:n_decode]
    return prefill, sorted(decode)
