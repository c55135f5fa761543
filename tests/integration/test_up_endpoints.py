"""``gigacluster up``'s banner, driven as a newcomer would: every endpoint it prints answers, and the
``mosquitto_sub`` command it prints (run by the real Mosquitto client against the credentials ``up``
wrote) receives telemetry, where the anonymous command the docs used to show is refused."""

from __future__ import annotations

import asyncio
import io
import json
import re
import urllib.request
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from gigacluster.cli.up import bring_up, mosquitto_sub_command, print_endpoints
from gigacluster.client import DEFAULT_PORTS
from gigacluster.stack import Stack, StackConfig
from tests.conftest import required_exe

from ..conftest import TEST_SPEEDUP
from ..ops.prometheus import ROOT

pytestmark = pytest.mark.integration
SUB_WAIT_S = 20  # mosquitto_sub -W: the client gives up after this many seconds without enough messages


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def up_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Stack, str]]:
    """What ``up`` starts (embedded MQTT broker enforcing the generated credentials, metrics, OpenAI
    HTTP, the default model), on free ports and a temp state directory; yields it and its banner."""
    cfg = StackConfig(cluster="uptest", chips=8, speedup=TEST_SPEEDUP, ports={k: 0 for k in DEFAULT_PORTS},
                      state_dir=tmp_path_factory.mktemp("up"), mqtt_port=0, http_port=0, metrics=True)
    st = Stack(cfg)
    try:
        await bring_up(st)
        out = io.StringIO()
        print_endpoints(st, out)
        yield st, out.getvalue()
    finally:
        await st.stop()


async def run_shell(cmd: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec("bash", "-c", cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), SUB_WAIT_S + 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_banner_prints_every_endpoint_and_each_answers(up_stack: tuple[Stack, str]) -> None:
    """The banner names each service's gRPC address, the OpenAI base URL, every service's /metrics URL
    (each serving Prometheus text), the MQTT broker and where the credentials are."""
    st, banner = up_stack
    for name in DEFAULT_PORTS:
        assert re.search(rf"\b{name}\s+{re.escape(st.endpoint_of(name))}\b", banner), name
    assert st.openai_base_url and st.openai_base_url in banner
    assert set(st.metrics_urls) == {"chip", "fabric", "broker", "scheduler", "router"}
    for name, url in st.metrics_urls.items():
        assert re.search(rf"\b{name}\s+{re.escape(url)}", banner), name
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert b"# TYPE " in r.read()
    assert st.mqtt in banner
    assert str(st.cfg.state_dir / "credentials.json") in banner


async def test_banner_mosquitto_sub_command_receives_telemetry(up_stack: tuple[Stack, str]) -> None:
    """The exact mosquitto_sub line of the banner (admin credentials read from credentials.json) receives
    the stack's telemetry; the same command without credentials is refused by the broker."""
    required_exe("mosquitto_sub", "mosquitto-clients")
    st, banner = up_stack
    line = next(ln.strip() for ln in banner.splitlines() if ln.strip().startswith("mosquitto_sub "))
    assert line == mosquitto_sub_command(st)
    code, out, err = await run_shell(f"{line} -C 3 -W {SUB_WAIT_S}")
    assert code == 0, err
    topics = [ln.split(" ", 1)[0] for ln in out.splitlines()]
    assert len(topics) == 3 and all(t.startswith("gigacluster/uptest/") for t in topics)
    assert all(json.loads(ln.split(" ", 1)[1]) for ln in out.splitlines())
    anonymous = re.sub(r" -u \S+ -P \"\$\(.*?\)\"", "", line)
    assert " -u " not in anonymous
    code, _, err = await run_shell(f"{anonymous} -C 1 -W 5")
    assert code != 0 and "not authorised" in err.lower(), (code, err)


async def test_tenant_mosquitto_sub_command_reads_only_its_own_branches(up_stack: tuple[Stack, str]) -> None:
    """The default tenant's command (its MQTT user from credentials.json) receives its deployment's stats
    and nothing else, not even the broker's retained audit anchor that the admin's ``#`` filter matches
    (amqtt replayed other clients' filters' retained messages to every client that connected)."""
    st, _ = up_stack
    admin = await asyncio.create_subprocess_exec(  # an admin '#' subscription live in the broker
        "bash", "-c", f"{mosquitto_sub_command(st)} -W {SUB_WAIT_S}", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        await asyncio.sleep(1.0)
        code, out, err = await run_shell(f"{mosquitto_sub_command(st, who='tenant')} -C 2 -W {SUB_WAIT_S}")
    finally:
        admin.terminate()
        await admin.wait()
    assert code == 0, err
    for line in out.strip().splitlines():
        topic, payload = line.split(" ", 1)
        assert topic == "gigacluster/uptest/router/tenants/default/deployments/llama3-8b/stats"
        assert json.loads(payload)["deployment"].endswith("llama3-8b")


def _doc_commands() -> list[str]:
    """The mosquitto_sub commands of docs/telemetry.md, continuation lines joined."""
    text = (ROOT / "docs" / "telemetry.md").read_text().replace("\\\n", " ")
    return [" ".join(ln.split()) for ln in text.splitlines() if ln.startswith("mosquitto_sub ")]


async def test_docs_mosquitto_sub_commands_work_against_ups_broker(up_stack: tuple[Stack, str]) -> None:
    """Both commands docs/telemetry.md shows (admin: everything; tenant: its branches), with this stack's
    port, cluster and credentials file in place of up's defaults, receive telemetry."""
    st, _ = up_stack
    cmds = _doc_commands()
    assert len(cmds) == 2 and all(" -u " in c and " -P " in c for c in cmds)
    for cmd in cmds:
        local = (cmd.replace("-p 1883", f"-p {st.mqtt.rpartition(':')[2]}")
                 .replace("~/.gigacluster/local/credentials.json", str(st.cfg.state_dir / "credentials.json"))
                 .replace("gigacluster/local/", "gigacluster/uptest/"))
        code, out, err = await run_shell(f"{local} -C 1 -W {SUB_WAIT_S}")
        assert code == 0, (cmd, err)
        assert out.startswith("gigacluster/uptest/")
