"""Optional mutual TLS: with it on, every service requires a client certificate from the cluster CA."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.runtime.channels import open_channel
from gigacluster.stack import Stack, StackConfig

pytestmark = [pytest.mark.security, pytest.mark.integration]


async def test_mtls_mesh_runs_a_job_and_refuses_plain_clients(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A mesh started with tls=True places and runs a job for a client holding the CA-signed certificate,
    and a client without TLS cannot even reach the health service."""
    cfg = StackConfig(cluster="tls", chip="h100-sxm", chips=16, speedup=10.0, mqtt="", mqtt_port=0,
                      ports={k: 0 for k in DEFAULT_PORTS}, state_dir=tmp_path_factory.mktemp("tls"), tls=True,
                      restart=False)
    async with Stack(cfg) as st:
        key = await st.create_tenant("secure")
        async with Client(st.endpoints, key, tls=st.tls) as gc:
            spec = {"model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 8},
                    "parallelism": {"tp": 8}, "hardware": {"chip": "h100-sxm", "count": 8}, "precision": "bf16",
                    "steps": 2}
            job = await gc.submit_job(spec)
            last = None
            async for upd in gc.watch_job(job.name):
                last = upd.job
            assert last is not None and last.step == 2 and last.reason == ""
        async with open_channel(st.endpoint_of("scheduler"), None) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=3)
            assert exc.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
