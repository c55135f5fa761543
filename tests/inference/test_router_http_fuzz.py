"""The OpenAI endpoint under random bodies (in-process, no broker): never a 500, always an OpenAI JSON error."""

from __future__ import annotations

import json
import random
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gigacluster.inference.engine import ReplicaConfig
from gigacluster.inference.policies import make_policy
from gigacluster.model.arch import preset
from gigacluster.router.deployment import LiveDeployment
from gigacluster.router.http import OpenAIServer
from gigacluster.router.service import RouterService
from gigacluster.router.store import DeploymentStore
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.config import RouterConfig

VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**63, 2**70, 1.5, -0.0, "", "x", "m", "é" * 10, [], [1], [[1]], ["a"], {},
    {"a": 1}, [None], [{"role": "user"}], [{"role": 1}], [{"role": "u", "content": [1, {"type": "text", "text": 5}]}],
    [{"role": "u", "content": {"a": 1}}], [{"role": "u", "content": [{"type": "text", "text": "hi"}]}],
]
KEYS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options",
        "priority", "request_id", "temperature"]


async def test_random_bodies_never_answer_500() -> None:
    """600 random bodies (seeded) on both POST routes: every answer is JSON with a 4xx/503 status, none 500."""
    svc = RouterService(RouterConfig())
    svc.reconciled.set()

    async def principal(ctx: Any) -> Principal:
        return Principal("tenant", "tenants/alice")

    svc.auth.principal = principal  # type: ignore[method-assign]
    dep = LiveDeployment("m", "tenants/alice", ReplicaConfig(preset("llama3-8b"), "h100-sxm"),
                         make_policy("round_robin"), "round_robin")
    dep.state = "ready"  # no replicas: a valid request ends 503 at routing
    svc.deployments[DeploymentStore.key("tenants/alice", "m")] = dep
    rng = random.Random(11)
    statuses: dict[int, int] = {}
    async with TestClient(TestServer(OpenAIServer(svc).app())) as client:
        for _ in range(600):
            body = {k: rng.choice(VALUES) for k in rng.sample(KEYS, rng.randint(0, len(KEYS)))}
            if rng.random() < 0.5:
                body["model"] = "m"
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            r = await client.post(path, data=json.dumps(body), headers={"Authorization": "Bearer k"})
            obj = await r.json()
            statuses[r.status] = statuses.get(r.status, 0) + 1
            assert r.status in (400, 404, 503), (path, body, obj)
            assert set(obj["error"]) == {"message", "type", "param", "code"}
    assert statuses.get(400, 0) > 400 and statuses.get(503, 0) > 0
