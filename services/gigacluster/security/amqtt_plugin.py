"""amqtt broker plugins enforcing the telemetry credentials and ACLs of :mod:`.mqtt_auth`.

For an embedded broker (amqtt) instead of Mosquitto, with the same files and the same rules::

    plugins:
      gigacluster.security.amqtt_plugin.GigaclusterAuthPlugin:
        password_file: /run/gigacluster/mqtt.passwd      # the $7$ file render_password_file writes
      gigacluster.security.amqtt_plugin.GigaclusterTopicPlugin:
        cluster: gc1
        tenants: [acme, beta]                             # or password_file: the tenant-* users in it

Use them in place of amqtt's anonymous and ACL plugins (amqtt admits a client only if every auth
plugin says yes). Both re-read the password file when it changes, so tenants the isolation broker
creates later are admitted (and confined) without restarting the MQTT broker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from amqtt.contexts import Action, BaseContext
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin
from amqtt.session import Session

from gigacluster.security.mqtt_auth import (
    TENANT_USER_PREFIX,
    Access,
    TelemetryAcl,
    parse_password_file,
    verify_mosquitto_hash,
)

_ACCESS = {Action.PUBLISH: Access.WRITE, Action.SUBSCRIBE: Access.SUBSCRIBE, Action.RECEIVE: Access.READ}


class _PasswordFile:
    """A Mosquitto password file, re-read whenever its modification time changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime = -1.0
        self._hashes: dict[str, str] = {}

    def hashes(self) -> dict[str, str]:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return {}
        if mtime != self._mtime:
            self._hashes = parse_password_file(self.path.read_text(encoding="utf-8"))
            self._mtime = mtime
        return self._hashes


class GigaclusterAuthPlugin(BaseAuthPlugin):
    """Admits a client whose user name and password match the ``$7$`` password file; no anonymous."""

    @dataclass
    class Config:
        """Path of the Mosquitto-format password file."""

        password_file: str | None = None

    def __init__(self, context: BaseContext) -> None:
        super().__init__(context)
        path = self._get_config_option("password_file", None)
        self._file = _PasswordFile(Path(path)) if path else None

    async def authenticate(self, *, session: Session) -> bool | None:
        """True only for a known user with the right password."""
        if session is None or not session.username:
            return False
        stored = self._file.hashes().get(session.username) if self._file is not None else None
        if stored is None:
            return False
        password = session.password or ""
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        # PBKDF2 takes milliseconds: keep it off the broker's event loop.
        return await asyncio.to_thread(verify_mosquitto_hash, stored, password)


class GigaclusterTopicPlugin(BaseTopicPlugin):
    """Allows publish, subscribe and receive exactly as :meth:`TelemetryAcl.allows` says."""

    @dataclass
    class Config:
        """Cluster name and tenant ids whose topics the rules cover."""

        cluster: str = "gigacluster"
        tenants: list[str] = field(default_factory=list)
        password_file: str | None = None

    def __init__(self, context: BaseContext) -> None:
        super().__init__(context)
        self._cluster = self._get_config_option("cluster", "gigacluster")
        self._static = list(self._get_config_option("tenants", []) or [])
        path = self._get_config_option("password_file", None)
        self._file = _PasswordFile(Path(path)) if path else None
        self._acl_key: tuple[str, ...] = ()
        self._acl = TelemetryAcl.of(self._cluster, self._static)

    @property
    def acl(self) -> TelemetryAcl:
        """The rules for the configured tenants plus every tenant user in the password file."""
        if self._file is None:
            return self._acl
        tenants = tuple(sorted({*self._static, *(u.removeprefix(TENANT_USER_PREFIX)
                                                 for u in self._file.hashes() if u.startswith(TENANT_USER_PREFIX))}))
        if tenants != self._acl_key:
            self._acl_key, self._acl = tenants, TelemetryAcl.of(self._cluster, tenants)
        return self._acl

    async def topic_filtering(
        self, *, session: Session | None = None, topic: str | None = None, action: Action | None = None
    ) -> bool | None:
        """True if the session's user may take ``action`` on ``topic``."""
        if session is None or topic is None or action not in _ACCESS:
            return False
        return self.acl.allows(session.username, topic, _ACCESS[action])
