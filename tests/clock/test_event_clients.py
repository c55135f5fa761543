"""The clients on an event-clock mesh (issue 14 item 4): the CLI, the openai client, and `gigacluster
loadtest`, which joins the clock from the credentials file `up` leaves and reports virtual seconds."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys

import openai
import pytest
import yaml

from gigacluster.cli.up import bring_up
from gigacluster.client import Client
from gigacluster.router.v1 import router_pb2
from gigacluster.stack import Stack
from tests.clock.test_event_mesh import DEMO
from tests.conftest import live_config

pytestmark = pytest.mark.integration


async def _ready(st: Stack, key: str) -> None:
    async with Client(st.endpoints, key) as gc:
        for _ in range(600):
            dep = (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name="deployments/llama3-8b"),
                                                 metadata=gc.md, timeout=10)).deployment
            if dep.state == router_pb2.Deployment.STATE_READY:
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"deployment not ready: {dep.state} {dep.reason}")


async def test_cli_openai_and_loadtest_work_in_event_mode(mosquitto: str, tmp_path: pathlib.Path) -> None:
    """submit, watch, jobs, generate and trace-request from the CLI; a streamed completion through the openai
    client; and `gigacluster loadtest` over gRPC and HTTP, sending at virtual times (no send lag) and
    reporting its run in virtual seconds."""
    home = tmp_path / "home"
    st = Stack(live_config("evcli", mosquitto, home / "evcli", clock="event", shards=1, http_port=0))
    try:
        key = await bring_up(st, deploy=True, disaggregated=True)  # KV caches cross the fabric: its flows on the clock
        await _ready(st, key)
        env = {**os.environ, "GIGACLUSTER_HOME": str(home), "GIGACLUSTER_API_KEY": key}

        async def cli(*args: str) -> str:
            r = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gigacluster.cli.main", *args,
                                                         *(("--cluster", "evcli") if args[0] != "loadtest" else ())],
                                        capture_output=True, text=True, env=env, timeout=240, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, f"gigacluster {' '.join(args)}: {r.stderr[-1500:]}"
            return r.stdout

        job = yaml.safe_load(DEMO.read_text())
        job["steps"] = 6
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
        name = json.loads(await cli("submit", str(tmp_path / "job.yaml"), "--json"))["name"]
        lines = (await cli("watch", name)).strip().splitlines()
        # a wall-clock client may find the job already done: virtual time ran on while the CLI started
        assert "SUCCEEDED step 6/6" in lines[-1], lines[-3:]
        assert [j["state"] for j in json.loads(await cli("jobs", "--json")) if j["name"] == name] == ["SUCCEEDED"]
        assert (await cli("generate", "hello there", "--max-tokens", "8")).strip()
        trace = json.loads(await cli("trace-request", "hello", "--max-tokens", "4"))
        assert trace["traceEvents"]

        oai = openai.AsyncOpenAI(base_url=st.openai_base_url, api_key=key, max_retries=0)
        stream = await oai.completions.create(model="llama3-8b", prompt="hello", max_tokens=8, stream=True)
        texts = [c.choices[0].text async for c in stream if c.choices]
        await oai.close()
        assert texts

        sc = tmp_path / "sc.yaml"
        sc.write_text(yaml.safe_dump({
            "name": "evcli", "duration_s": 4, "seed": 3, "drain_s": 60,
            "streams": [{"name": "grpc", "kind": "generate", "model": "llama3-8b", "prompt_tokens": 128,
                         "max_tokens": 16, "arrival": {"type": "poisson", "rate_per_s": 2}},
                        {"name": "http", "kind": "http_completions", "model": "llama3-8b", "prompt_tokens": 128,
                         "max_tokens": 16, "arrival": {"type": "uniform", "rate_per_s": 1}}]}))
        out = await cli("loadtest", str(sc), "--cluster", "evcli", "--out", str(tmp_path / "lt"),
                        "--http", st.openai_base_url.removesuffix("/v1"))
        assert "virtual s (event clock)" in out
        summary = json.loads((tmp_path / "lt" / "summary.json").read_text())
        for s in summary["streams"]:
            assert s["offered"] > 0 and s["ok"] == s["offered"], s
            assert s["send_lag_p99_s"] == 0.0 and s["ttft"]["p50"] > 0
    finally:
        await st.stop()
