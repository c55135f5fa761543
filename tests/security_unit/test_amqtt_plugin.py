"""The amqtt plugins enforce the same credentials and ACL as the Mosquitto files."""

from __future__ import annotations

import asyncio
import gc
import warnings
from pathlib import Path

import pytest

from gigacluster.runtime.telemetry import EmbeddedBroker
from gigacluster.security.mqtt_auth import TelemetryAcl, render_password_file
from gigacluster.stack import free_port
from tests.security_unit.mqtt_probe import topics_received

ACL = TelemetryAcl.of("gc1", ["acme", "beta"])


@pytest.mark.integration
async def test_embedded_amqtt_broker_isolates_tenants(tmp_path: Path) -> None:
    """An amqtt broker with our plugins admits only right passwords and shows a tenant only its subtree."""
    import aiomqtt
    from amqtt.broker import Broker

    creds = ACL.credentials()
    (tmp_path / "pw").write_text(render_password_file(creds, iterations=1000))
    port = free_port()
    broker = Broker({
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
        "plugins": {
            "gigacluster.security.amqtt_plugin.GigaclusterAuthPlugin": {"password_file": str(tmp_path / "pw")},
            "gigacluster.security.amqtt_plugin.GigaclusterTopicPlugin": {"cluster": "gc1", "tenants": ["acme", "beta"]},
        },
    })
    await broker.start()
    try:
        got = await topics_received(
            port, creds, user="tenant-acme",
            filters=["gigacluster/gc1/scheduler/tenants/acme/#", "#"],  # "#" is refused by the topic plugin
            topics=["gigacluster/gc1/scheduler/tenants/acme/m", "gigacluster/gc1/scheduler/tenants/beta/m"])
        assert got == ["gigacluster/gc1/scheduler/tenants/acme/m"]
        for user, pw in [("tenant-acme", "wrong"), ("nobody", "x")]:
            with pytest.raises(aiomqtt.MqttError):
                async with aiomqtt.Client("127.0.0.1", port, username=user, password=pw):
                    pass
    finally:
        await broker.shutdown()



@pytest.mark.integration
async def test_embedded_broker_closes_the_stream_of_a_client_that_never_connects(tmp_path: Path) -> None:
    """A TCP connection that closes before its MQTT CONNECT (a port probe, a load balancer's health check) made
    amqtt 0.12.1's ``_client_connected`` return without closing the server's end ("Failed to initialize client
    session: No more data"), an open socket per probe until the garbage collector found it and warned, in whichever
    test was running then. The embedded broker closes every client's stream when amqtt is done with it: no socket is
    left for the collector (without the fix each probe below leaves one)."""
    creds = ACL.credentials()
    (tmp_path / "pw").write_text(render_password_file(creds, iterations=1000))
    port = free_port()
    broker = EmbeddedBroker("127.0.0.1", port, password_file=str(tmp_path / "pw"), cluster="gc1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        await broker.start()
        try:
            for probe in (b"", b"\x00\x01not mqtt"):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(probe)
                await writer.drain()
                writer.close()
                await writer.wait_closed()
            await asyncio.sleep(0.3)
        finally:
            await broker.stop()
        gc.collect()
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaked == []
