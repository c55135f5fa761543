from gigacluster.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopologyConstraint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPOLOGY_CONSTRAINT_UNSPECIFIED: _ClassVar[TopologyConstraint]
    TOPOLOGY_CONSTRAINT_NONE: _ClassVar[TopologyConstraint]
    TOPOLOGY_CONSTRAINT_SAME_DOMAIN: _ClassVar[TopologyConstraint]
    TOPOLOGY_CONSTRAINT_CONTIGUOUS: _ClassVar[TopologyConstraint]
TOPOLOGY_CONSTRAINT_UNSPECIFIED: TopologyConstraint
TOPOLOGY_CONSTRAINT_NONE: TopologyConstraint
TOPOLOGY_CONSTRAINT_SAME_DOMAIN: TopologyConstraint
TOPOLOGY_CONSTRAINT_CONTIGUOUS: TopologyConstraint

class Tenant(_message.Message):
    __slots__ = ("name", "display_name", "created_s", "weight", "devices_held")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_S_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_HELD_FIELD_NUMBER: _ClassVar[int]
    name: str
    display_name: str
    created_s: float
    weight: float
    devices_held: int
    def __init__(self, name: _Optional[str] = ..., display_name: _Optional[str] = ..., created_s: _Optional[float] = ..., weight: _Optional[float] = ..., devices_held: _Optional[int] = ...) -> None: ...

class CreateTenantRequest(_message.Message):
    __slots__ = ("tenant_id", "display_name", "weight")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    display_name: str
    weight: float
    def __init__(self, tenant_id: _Optional[str] = ..., display_name: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class CreateTenantResponse(_message.Message):
    __slots__ = ("tenant", "api_key", "mqtt_username", "mqtt_password")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    MQTT_USERNAME_FIELD_NUMBER: _ClassVar[int]
    MQTT_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    api_key: str
    mqtt_username: str
    mqtt_password: str
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ..., api_key: _Optional[str] = ..., mqtt_username: _Optional[str] = ..., mqtt_password: _Optional[str] = ...) -> None: ...

class GetTenantRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetTenantResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants", "next_page_token")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    next_page_token: str
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ("api_key",)
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    api_key: str
    def __init__(self, api_key: _Optional[str] = ...) -> None: ...

class AuthenticateResponse(_message.Message):
    __slots__ = ("principal", "admin")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    principal: str
    admin: bool
    def __init__(self, principal: _Optional[str] = ..., admin: _Optional[bool] = ...) -> None: ...

class GetInventoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Shard(_message.Message):
    __slots__ = ("endpoint", "chip_type", "devices", "system", "chips_per_domain")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    CHIP_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    CHIPS_PER_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    chip_type: str
    devices: _common_pb2.DeviceRange
    system: str
    chips_per_domain: int
    def __init__(self, endpoint: _Optional[str] = ..., chip_type: _Optional[str] = ..., devices: _Optional[_Union[_common_pb2.DeviceRange, _Mapping]] = ..., system: _Optional[str] = ..., chips_per_domain: _Optional[int] = ...) -> None: ...

class GetInventoryResponse(_message.Message):
    __slots__ = ("cluster", "shards", "fabric_endpoint", "free_devices", "free")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    FREE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    fabric_endpoint: str
    free_devices: int
    free: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    def __init__(self, cluster: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ..., fabric_endpoint: _Optional[str] = ..., free_devices: _Optional[int] = ..., free: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("name", "tenant", "chip_type", "devices", "device_count", "nic_share", "created_s", "purpose")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CHIP_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    NIC_SHARE_FIELD_NUMBER: _ClassVar[int]
    CREATED_S_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant: str
    chip_type: str
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    device_count: int
    nic_share: float
    created_s: float
    purpose: str
    def __init__(self, name: _Optional[str] = ..., tenant: _Optional[str] = ..., chip_type: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., device_count: _Optional[int] = ..., nic_share: _Optional[float] = ..., created_s: _Optional[float] = ..., purpose: _Optional[str] = ...) -> None: ...

class AllocateInstanceRequest(_message.Message):
    __slots__ = ("chip_type", "count", "topology", "purpose", "tenant", "devices")
    CHIP_TYPE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    chip_type: str
    count: int
    topology: TopologyConstraint
    purpose: str
    tenant: str
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    def __init__(self, chip_type: _Optional[str] = ..., count: _Optional[int] = ..., topology: _Optional[_Union[TopologyConstraint, str]] = ..., purpose: _Optional[str] = ..., tenant: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ...) -> None: ...

class AllocateInstanceResponse(_message.Message):
    __slots__ = ("instance", "capability", "capability_expires_s")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_EXPIRES_S_FIELD_NUMBER: _ClassVar[int]
    instance: Instance
    capability: str
    capability_expires_s: float
    def __init__(self, instance: _Optional[_Union[Instance, _Mapping]] = ..., capability: _Optional[str] = ..., capability_expires_s: _Optional[float] = ...) -> None: ...

class GetInstanceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetInstanceResponse(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: Instance
    def __init__(self, instance: _Optional[_Union[Instance, _Mapping]] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "next_page_token")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    next_page_token: str
    def __init__(self, instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReleaseInstanceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ReleaseInstanceResponse(_message.Message):
    __slots__ = ("scrub_s",)
    SCRUB_S_FIELD_NUMBER: _ClassVar[int]
    scrub_s: float
    def __init__(self, scrub_s: _Optional[float] = ...) -> None: ...

class RefreshCapabilityRequest(_message.Message):
    __slots__ = ("instance",)
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    instance: str
    def __init__(self, instance: _Optional[str] = ...) -> None: ...

class RefreshCapabilityResponse(_message.Message):
    __slots__ = ("capability", "capability_expires_s")
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_EXPIRES_S_FIELD_NUMBER: _ClassVar[int]
    capability: str
    capability_expires_s: float
    def __init__(self, capability: _Optional[str] = ..., capability_expires_s: _Optional[float] = ...) -> None: ...

class GetVerificationKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Revocation(_message.Message):
    __slots__ = ("instance", "revoked_s")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    REVOKED_S_FIELD_NUMBER: _ClassVar[int]
    instance: str
    revoked_s: float
    def __init__(self, instance: _Optional[str] = ..., revoked_s: _Optional[float] = ...) -> None: ...

class GetVerificationKeysResponse(_message.Message):
    __slots__ = ("cluster", "public_keys", "revocations")
    class PublicKeysEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEYS_FIELD_NUMBER: _ClassVar[int]
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    public_keys: _containers.ScalarMap[str, str]
    revocations: _containers.RepeatedCompositeFieldContainer[Revocation]
    def __init__(self, cluster: _Optional[str] = ..., public_keys: _Optional[_Mapping[str, str]] = ..., revocations: _Optional[_Iterable[_Union[Revocation, _Mapping]]] = ...) -> None: ...
