"""The amqtt plugins enforce the same credentials and ACL as the Mosquitto files."""

from __future__ import annotations

from pathlib import Path

import pytest

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
