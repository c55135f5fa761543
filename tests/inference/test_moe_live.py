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


async def test_wide_ep_replica_spanning_two_shards_books_on_both(mosquitto: str, tmp_path: Path) -> None:
    """A gpt-oss-20b replica with ep 16 on 16 H100 that spans two chip shards books its iterations' work, energy
    and memory on the devices of both shards (not only the first shard's)."""
    from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
    from gigacluster.runtime.auth import call_metadata
    from gigacluster.runtime.channels import open_channel

    async with live_stack("moespan", mosquitto, tmp_path, chips=32, shards=2) as st:
        key = await st.create_tenant("moe")
        async with Client(st.endpoints, key) as gc:
            # An 8-chip replica first takes one HGX domain, so the 16-chip one is placed across the shard boundary.
            await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="small", model=common_pb2.ModelArchitecture(preset="gpt-oss-20b"), chip="h100-sxm",
                ep=8, max_batch=8), metadata=gc.md)
            dep = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="wide", model=common_pb2.ModelArchitecture(preset="gpt-oss-20b"), chip="h100-sxm",
                ep=16, max_batch=8), metadata=gc.md)).deployment
            assert dep.chips_per_replica == 16
            await asyncio.gather(*(_drain(gc, "wide", 24) for _ in range(2)))
            await asyncio.sleep(0.5)  # the last reports land after the tokens
        devices = await _replica_devices(st, key, "deployments/wide")
        per_shard = {}
        md = call_metadata(api_key=st.admin_key)
        for port in st.shard_ports:
            ch = open_channel(f"127.0.0.1:{port}")
            resp = await chip_pb2_grpc.ChipServiceStub(ch).ListDevices(chip_pb2.ListDevicesRequest(page_size=64),
                                                                        metadata=md, timeout=10)
            await ch.close()
            per_shard[port] = {d.id: d for d in resp.devices}
        mine = [{i: d for i, d in shard.items() if i in devices} for shard in per_shard.values()]
        assert all(mine), f"the replica's devices {sorted(devices)} do not span both shards"
        for shard, own in zip(per_shard.values(), mine, strict=True):
            assert all(d.busy_s > 0 and d.memory_used_bytes > 0 for d in own.values())
            idle = [d for i, d in shard.items() if i not in devices and d.busy_s == 0]
            if idle:  # a device that ran nothing drew idle power only: the replica's drew more
                assert min(d.energy_j for d in own.values()) > max(d.energy_j for d in idle)


async def _replica_devices(st: object, key: str, name: str) -> set[int]:
    """The device ids of a deployment's replicas (from its broker instances)."""
    from gigacluster.broker.v1 import broker_pb2

    async with Client(st.endpoints, key) as gc:  # type: ignore[attr-defined]
        dep = (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name=name), metadata=gc.md)).deployment
        out: set[int] = set()
        for inst in dep.instances:
            r = await gc.broker.GetInstance(broker_pb2.GetInstanceRequest(name=inst), metadata=gc.md)
            for rg in r.instance.devices:
                out.update(range(rg.start, rg.end))
        return out


async def test_up_deploys_an_moe_model_expert_parallel(mosquitto: str, tmp_path: Path) -> None:
    """What ``up --model gpt-oss-20b --model-ep 2`` does (bring_up with those flags): the router serves the MoE
    model expert-parallel, 2 H100 per replica, and streams a completion."""
    import argparse

    from gigacluster.cli import up as up_cli
    from gigacluster.cli.up import bring_up
    from gigacluster.stack import Stack

    from ..conftest import live_config

    p = argparse.ArgumentParser()
    up_cli.register(p.add_subparsers())
    st = Stack(live_config("upmoe", mosquitto, tmp_path, chips=8, shards=1))
    try:
        key = await bring_up(st, args=p.parse_args(["up", "--model", "gpt-oss-20b", "--model-ep", "2"]))
        async with Client(st.endpoints, key) as gc:
            dep = (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name="deployments/gpt-oss-20b"),
                                                 metadata=gc.md)).deployment
            assert dep.ep == 2 and dep.chips_per_replica == 2 and dep.model.experts == 32
            chunks = [c async for c in gc.generate("gpt-oss-20b", "hello experts", max_tokens=4)]
            assert sum(len(c.token_ids) for c in chunks) == 4
    finally:
        await st.stop()
