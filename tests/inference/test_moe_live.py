"""A mixture of experts deployed on a real stack: the router serves it as MoE (expert parallel over two chips),
colocated and with prefill/decode disaggregation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2

from ..conftest import live_stack

pytestmark = pytest.mark.integration


async def test_gpt_oss_20b_deploys_as_moe_and_streams(mosquitto: str, tmp_path: Path) -> None:
    """gpt-oss-20b with ep 2 deploys on 2 H100 per replica, reports its 32 experts, 2-way EP and sliding window,
    streams a completion while booking its all-to-all on the fabric, and a P/D deployment of it moves the
    prompt's KV over the fabric."""
    async with live_stack("moelive", mosquitto, tmp_path, chips=16, shards=1) as st:
        key = await st.create_tenant("moe")
        async with Client(st.endpoints, key) as gc:
            dep = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="oss", model=common_pb2.ModelArchitecture(preset="gpt-oss-20b"), chip="h100-sxm",
                ep=2, max_batch=8), metadata=gc.md)).deployment
            assert dep.ep == 2 and dep.chips_per_replica == 2 and dep.tp == 1
            got = (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name=dep.name),
                                                 metadata=gc.md)).deployment
            m = got.model
            assert (m.experts, m.experts_per_token, m.sliding_window, m.head_dim) == (32, 4, 128, 64)
            chunks = [c async for c in gc.generate("oss", "Explain expert parallelism", max_tokens=12)]
            assert sum(len(c.token_ids) for c in chunks) == 12 and chunks[-1].usage.completion_tokens == 12
            # enough decode steps to span more than one 50 ms window of all-to-all bookings
            await asyncio.gather(*(_drain(gc, "oss", 64) for _ in range(4)))
            st_oss = await _stats(gc, "deployments/oss")
            assert st_oss.a2a_flows >= 1 and st_oss.a2a_bytes > 0

            pd = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="osspd", model=common_pb2.ModelArchitecture(preset="gpt-oss-20b"), chip="h100-sxm",
                ep=2, prefill_replicas=1, decode_replicas=1, max_batch=8), metadata=gc.md)).deployment
            assert pd.chips_per_replica == 2 and len(pd.instances) == 1
            chunks = [c async for c in gc.generate("osspd", list(range(300, 700)), max_tokens=6)]
            u = chunks[-1].usage
            # 400 prompt tokens: 12 full-attention layers x 400 + 12 windowed layers x 128, 2,048 B per layer-token
            assert u.completion_tokens == 6 and u.kv_transfer_bytes == (400 * 12 + 128 * 12) * 2048


async def _drain(gc: Client, model: str, n: int) -> None:
    async for _ in gc.generate(model, "Route the tokens to their experts", max_tokens=n):
        pass


async def _stats(gc: Client, name: str) -> router_pb2.DeploymentStats:
    for _ in range(50):  # the booked flow settles on the fabric shortly after the tokens
        resp = await gc.router.GetStats(router_pb2.GetStatsRequest(deployment=name), metadata=gc.md)
        (d,) = resp.deployments
        if d.a2a_flows:
            return d
        await asyncio.sleep(0.1)
    return d
