"""Telemetry credentials and ACLs: the Mosquitto $7$ format and the tenant topic isolation."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from gigacluster.security import InvalidArgument
from gigacluster.security.mqtt_auth import (
    TelemetryAcl,
    acl_allows,
    mosquitto_hash,
    parse_password_file,
    render_password_file,
    verify_mosquitto_hash,
)
from gigacluster.stack import free_port as _free_port
from tests.security_unit.mqtt_probe import topics_received

ACL = TelemetryAcl.of("gc1", ["acme", "beta"])


def test_hash_matches_a_known_mosquitto_passwd_line() -> None:
    """Our PBKDF2-SHA512 over the raw 12-byte salt reproduces a line written by mosquitto_passwd 2.0.11."""
    stored = ("$7$101$nQ0Fx4bN9cmWEVk9$D0bbPyxErTPg5LXo8Eiyq1zCr4VSQVrNoxWLQt5ItcB39GNCXsaHlDqof45VpeMTg"
              "fNaF7KTolog9xTQChVorg==")
    assert verify_mosquitto_hash(stored, "s3cret")
    assert not verify_mosquitto_hash(stored, "s3cret!")
    salt = base64.b64decode("nQ0Fx4bN9cmWEVk9")
    assert mosquitto_hash("s3cret", iterations=101, salt=salt) == stored


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd not installed")
def test_verifies_fresh_mosquitto_passwd_output(tmp_path: Path) -> None:
    """A password file made now by mosquitto_passwd -b verifies with our check."""
    f = tmp_path / "pw"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(f), "alice", "pa55word"], check=True, timeout=30)
    h = parse_password_file(f.read_text())["alice"]
    assert h.startswith("$7$") and verify_mosquitto_hash(h, "pa55word")


def test_generated_hash_shape() -> None:
    """Generated hashes are $7$<iterations>$<16 base64 chars = 12-byte salt>$<88 chars = 64-byte digest>."""
    parts = mosquitto_hash("x").split("$")
    assert parts[1] == "7" and int(parts[2]) >= 101
    assert len(base64.b64decode(parts[3])) == 12 and len(base64.b64decode(parts[4])) == 64
    assert mosquitto_hash("x") != mosquitto_hash("x")  # random salt
    for junk in ["", "$6$abc$def", "$7$x$y$z", "$7$10$!!$AAAA"]:
        assert not verify_mosquitto_hash(junk, "x")


def test_password_file_round_trip_and_bad_user_names() -> None:
    """render_password_file lines verify per user; names with ':' or wildcards are refused."""
    text = render_password_file({"tenant-acme": "p1", "service": "p2"}, iterations=200)
    hashes = parse_password_file(text)
    assert sorted(hashes) == ["service", "tenant-acme"]
    assert verify_mosquitto_hash(hashes["tenant-acme"], "p1") and not verify_mosquitto_hash(hashes["service"], "p1")
    for user in ["a:b", "a/b", "#", ""]:
        with pytest.raises(InvalidArgument):
            render_password_file({user: "p"})


@pytest.mark.parametrize(
    ("user", "topic", "access", "allowed"),
    [
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/acme/chips/3/power", "read", True),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/acme/#", "subscribe", True),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/acme", "read", True),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/beta/chips/3/power", "read", False),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/+/chips/3/power", "subscribe", False),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/#", "subscribe", False),
        ("tenant-acme", "#", "subscribe", False),
        ("tenant-acme", "gigacluster/gc2/scheduler/tenants/acme/x", "read", False),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/acme/x", "write", False),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/acme/+", "read", False),
        ("tenant-ghost", "gigacluster/gc1/scheduler/tenants/ghost/x", "read", False),
        ("service", "gigacluster/gc1/scheduler/tenants/beta/x", "write", True),
        ("service", "gigacluster/gc1/cluster/power", "write", True),
        ("service", "gigacluster/gc1/scheduler/tenants/beta/x", "read", False),
        ("admin", "#", "subscribe", True),
        ("admin", "gigacluster/gc1/scheduler/tenants/beta/x", "read", True),
        ("admin", "gigacluster/gc1/scheduler/tenants/beta/x", "write", False),
        ("admin", "$SYS/broker/clients", "read", False),
        (None, "gigacluster/gc1/scheduler/tenants/acme/x", "read", False),
        ("tenant-acme", "gigacluster/gc1/scheduler/tenants/acme/x", "delete", False),
    ],
)
def test_acl_allows(user: str | None, topic: str, access: str, allowed: bool) -> None:
    """Tenants read only their subtree, cannot widen it with wildcards; service writes, admin reads all."""
    assert ACL.allows(user, topic, access) is allowed
    assert acl_allows(user, topic, access, cluster="gc1", tenants=["acme", "beta"]) is allowed


def test_acl_file_lists_exactly_the_rules() -> None:
    """The Mosquitto ACL file has one user block per rule and no anonymous or pattern entries."""
    text = ACL.render_acl_file()
    assert "user tenant-acme\ntopic read gigacluster/gc1/scheduler/tenants/acme/#\n" in text
    assert "user service\ntopic write #\n" in text and "user admin\ntopic read #\n" in text
    assert "pattern" not in text and text.count("\ntopic ") == 2 + 5 * len(ACL.tenants)  # 5 services per tenant


def test_credentials_keep_existing_passwords() -> None:
    """Adding a tenant keeps the other users' passwords and makes a new random one."""
    old = ACL.credentials()
    new = TelemetryAcl.of("gc1", ["acme", "beta", "gamma"]).credentials(old)
    assert {u: new[u] for u in old} == old and len(new["tenant-gamma"]) == 32


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists(),
                    reason="mosquitto not installed")
async def test_real_mosquitto_enforces_generated_files(tmp_path: Path) -> None:
    """Mosquitto with our password and ACL files: a tenant subscribed to # gets only its own topics."""
    import aiomqtt

    creds = ACL.credentials()
    (tmp_path / "pw").write_text(render_password_file(creds, iterations=1000))
    (tmp_path / "acl").write_text(ACL.render_acl_file())
    port = _free_port()
    # As root, mosquitto drops to its own user, which cannot read pytest's private tmp_path.
    keep_user = "user root\n" if os.geteuid() == 0 else ""
    (tmp_path / "m.conf").write_text(
        f"{keep_user}listener {port} 127.0.0.1\nallow_anonymous false\n"
        f"password_file {tmp_path}/pw\nacl_file {tmp_path}/acl\n"
    )
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = await asyncio.create_subprocess_exec(exe, "-c", str(tmp_path / "m.conf"),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(50):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            await asyncio.sleep(0.1)
        got = await topics_received(
            port, creds, user="tenant-acme", filters=["#"],
            topics=["gigacluster/gc1/scheduler/tenants/acme/m", "gigacluster/gc1/scheduler/tenants/beta/m",
                    "gigacluster/gc1/x"])
        assert got == ["gigacluster/gc1/scheduler/tenants/acme/m"]
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client("127.0.0.1", port, username="tenant-acme", password="wrong"):
                pass
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
