"""Shared fixtures of the inference-plane tests."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine, Request
from gigacluster.model.arch import preset


@pytest.fixture
def cfg8b() -> ReplicaConfig:
    return ReplicaConfig(preset("llama3-8b"), "a100-40gb")


def make_req(rid: str, n_prompt: int, max_tokens: int, *, seed: int = 0, arrival_s: float = 0.0,
             priority: int = 0, tenant: str = "", prefix: np.ndarray | None = None) -> Request:
    rng = np.random.default_rng(seed)
    toks = rng.integers(256, 128256, size=n_prompt, dtype=np.int32)
    if prefix is not None:
        toks = np.concatenate((prefix, toks))
    return Request(rid, toks, max_tokens, priority=priority, arrival_s=arrival_s, tenant=tenant)


def run_until_idle(eng: ReplicaEngine, t: float = 0.0, limit: int = 100_000) -> tuple[float, list]:
    """Drive ``eng`` in virtual time until it has nothing to do; returns (end time, events)."""
    events = []
    for _ in range(limit):
        it = eng.next_iteration(t)
        if it is None:
            return t, events
        t += it.predicted_s
        events.extend(eng.complete(it, t))
    raise AssertionError("engine did not go idle")
