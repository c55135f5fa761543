"""Every gRPC channel and listening port of the mesh, plain or mutually authenticated TLS.

mTLS is optional: set ``GIGACLUSTER_TLS_CA``, ``GIGACLUSTER_TLS_CERT`` and ``GIGACLUSTER_TLS_KEY``
(PEM files) and every service listens with TLS that requires a client certificate signed by the
CA, and every channel a service, the CLI or the client library opens presents its certificate.
:func:`make_dev_pki` writes a CA and one certificate for a local cluster (``gigacluster up --tls``).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import ipaddress
import json
import os
import pathlib
from collections.abc import Mapping

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gigacluster.runtime import clock
from gigacluster.runtime.clock_wire import client_interceptors

SERVER_NAME = "gigacluster"  # the name every service certificate carries (SAN), checked by clients


@dataclasses.dataclass(frozen=True)
class Tls:
    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tls | None:
        env = os.environ if env is None else env
        paths = [env.get(f"GIGACLUSTER_TLS_{k}", "") for k in ("CA", "CERT", "KEY")]
        if not any(paths):
            return None
        if not all(paths):
            raise ValueError("mTLS needs all of GIGACLUSTER_TLS_CA, GIGACLUSTER_TLS_CERT and GIGACLUSTER_TLS_KEY")
        return _load(*paths)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


@functools.cache
def _load(ca: str, cert: str, key: str) -> Tls:
    """The PEM files, read once per process (channels are opened often; the files do not change)."""
    return Tls(*(pathlib.Path(p).read_bytes() for p in (ca, cert, key)))


# A peer that restarts (kill -9, a rolling update) is reconnected within a second: gRPC's default reconnect
# backoff grows to 120 s, and while it waits every call fails fast with UNAVAILABLE, so a service started
# before its peer (the chip shards start before the broker) could answer UNAVAILABLE for seconds after the
# whole mesh was healthy.
MESH_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


#: gRPC's own retry policy (gRFC A6) for calls the mesh refused with RESOURCE_EXHAUSTED: a refusal is made before
#: any work (a saturated router or replica queue, a rate limit) and carries the server's pushback
#: (``grpc-retry-pushback-ms``, from its retry-after); one without a retry-after carries a negative pushback, which
#: tells the channel not to retry. Up to 4 retries, after which the refusal reaches the caller as before.
RETRY_REFUSED_CONFIG = json.dumps({"methodConfig": [{
    "name": [{}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "5s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]})


def open_channel(endpoint: str, tls: Tls | None = None, *, metered: bool = True,
                 retry_refused: bool = False) -> grpc.aio.Channel:
    """A channel to ``endpoint``: mTLS when configured (argument or environment), else plain. In
    event-clock mode its calls are counted for the clock (``metered``; not the clock's own channel).
    ``retry_refused``: gRPC retries calls refused with RESOURCE_EXHAUSTED after the server's pushback
    (:data:`RETRY_REFUSED_CONFIG`); off for the mesh's own channels and the load client, which must see every
    refusal."""
    tls = tls or Tls.from_env()
    interceptors = client_interceptors(clock.active()) if metered else []
    options = [*MESH_CHANNEL_OPTIONS, *([("grpc.service_config", RETRY_REFUSED_CONFIG)] if retry_refused else [])]
    if tls is None:
        return grpc.aio.insecure_channel(endpoint, options=options, interceptors=interceptors or None)
    return grpc.aio.secure_channel(endpoint, tls.channel_credentials(),
                                   options=[*options, ("grpc.ssl_target_name_override", SERVER_NAME)],
                                   interceptors=interceptors or None)


class ChannelPool:
    """One channel per endpoint, opened on first use (``open_channel``), all closed together."""

    def __init__(self, tls: Tls | None = None) -> None:
        self.tls = tls
        self.open: dict[str, grpc.aio.Channel] = {}

    def get(self, endpoint: str) -> grpc.aio.Channel:
        if endpoint not in self.open:
            self.open[endpoint] = open_channel(endpoint, self.tls)
        return self.open[endpoint]

    async def close(self) -> None:
        for ch in self.open.values():
            await ch.close()
        self.open.clear()


def add_port(server: grpc.aio.Server, address: str, tls: Tls | None = None) -> int:
    """Bind ``address``: with TLS requiring client certificates when configured."""
    tls = tls or Tls.from_env()
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials())


def make_dev_pki(directory: pathlib.Path) -> dict[str, str]:
    """A CA and one certificate (for every service and client of a local cluster); returns the env."""

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gigacluster local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME), x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = {
        "ca.pem": ca.public_bytes(serialization.Encoding.PEM),
        "cert.pem": cert.public_bytes(serialization.Encoding.PEM),
        "key.pem": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()),
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "key.pem").chmod(0o600)
    return {"GIGACLUSTER_TLS_CA": str(directory / "ca.pem"), "GIGACLUSTER_TLS_CERT": str(directory / "cert.pem"),
            "GIGACLUSTER_TLS_KEY": str(directory / "key.pem")}
