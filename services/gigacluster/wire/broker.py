"""Broker messages <-> domain values: tenants, instances, shards, device sets, principals, keys."""

from __future__ import annotations

from collections.abc import Iterable

from gigacluster.broker.v1 import broker_pb2
from gigacluster.common.v1 import common_pb2
from gigacluster.runtime import convert
from gigacluster.security.apikeys import Principal
from gigacluster.security.capability import DeviceSet


def device_ranges(d: DeviceSet) -> list[common_pb2.DeviceRange]:
    return convert.range_msgs(zip(d.starts.tolist(), d.stops.tolist(), strict=True))


def tenant_msg(name: str, display_name: str, created_s: float, weight: float, devices_held: int) -> broker_pb2.Tenant:
    return broker_pb2.Tenant(name=name, display_name=display_name, created_s=created_s, weight=weight,
                             devices_held=devices_held)


def instance_msg(name: str, tenant_id: str, chip_type: str, devices: DeviceSet, *, nic_share: float,
                 created_s: float, purpose: str) -> broker_pb2.Instance:
    return broker_pb2.Instance(
        name=name, tenant=f"tenants/{tenant_id}", chip_type=chip_type, devices=device_ranges(devices),
        device_count=len(devices), nic_share=nic_share, created_s=created_s, purpose=purpose,
    )


def shard_msg(endpoint: str, chip_type: str, start: int, end: int, system: str,
              chips_per_domain: int) -> broker_pb2.Shard:
    return broker_pb2.Shard(endpoint=endpoint, chip_type=chip_type, devices=convert.range_msgs([(start, end)])[0],
                            system=system, chips_per_domain=chips_per_domain)


def authenticate_msg(p: Principal) -> broker_pb2.AuthenticateResponse:
    """Authenticate's answer for the principal of a key (runtime.auth.BrokerAuth reads it back)."""
    return broker_pb2.AuthenticateResponse(principal=p.tenant or p.kind, admin=p.kind == "admin")


def verification_keys_msg(cluster: str, keys: dict[str, str],
                          revocations: Iterable[tuple[str, float]]) -> broker_pb2.GetVerificationKeysResponse:
    return broker_pb2.GetVerificationKeysResponse(
        cluster=cluster, public_keys=keys,
        revocations=[broker_pb2.Revocation(instance=i, revoked_s=t) for i, t in revocations])


__all__ = ["authenticate_msg", "device_ranges", "instance_msg", "shard_msg", "tenant_msg", "verification_keys_msg"]
