from gigacluster.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FaultKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_KIND_UNSPECIFIED: _ClassVar[FaultKind]
    FAULT_KIND_FAILED: _ClassVar[FaultKind]
    FAULT_KIND_HBM: _ClassVar[FaultKind]
    FAULT_KIND_SLOW: _ClassVar[FaultKind]
FAULT_KIND_UNSPECIFIED: FaultKind
FAULT_KIND_FAILED: FaultKind
FAULT_KIND_HBM: FaultKind
FAULT_KIND_SLOW: FaultKind

class GetShardRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetShardResponse(_message.Message):
    __slots__ = ("name", "chip_type", "devices", "system", "chips_per_domain", "hbm_bytes_per_device", "now_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CHIP_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    CHIPS_PER_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    HBM_BYTES_PER_DEVICE_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    chip_type: str
    devices: _common_pb2.DeviceRange
    system: str
    chips_per_domain: int
    hbm_bytes_per_device: int
    now_s: float
    def __init__(self, name: _Optional[str] = ..., chip_type: _Optional[str] = ..., devices: _Optional[_Union[_common_pb2.DeviceRange, _Mapping]] = ..., system: _Optional[str] = ..., chips_per_domain: _Optional[int] = ..., hbm_bytes_per_device: _Optional[int] = ..., now_s: _Optional[float] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("id", "state", "tenant", "utilization", "power_w", "temperature_c", "clock_factor", "memory_used_bytes", "energy_j", "busy_s", "fault")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Device.State]
        STATE_HEALTHY: _ClassVar[Device.State]
        STATE_THROTTLED: _ClassVar[Device.State]
        STATE_FAILED: _ClassVar[Device.State]
    STATE_UNSPECIFIED: Device.State
    STATE_HEALTHY: Device.State
    STATE_THROTTLED: Device.State
    STATE_FAILED: Device.State
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    id: int
    state: Device.State
    tenant: str
    utilization: float
    power_w: float
    temperature_c: float
    clock_factor: float
    memory_used_bytes: int
    energy_j: float
    busy_s: float
    fault: str
    def __init__(self, id: _Optional[int] = ..., state: _Optional[_Union[Device.State, str]] = ..., tenant: _Optional[str] = ..., utilization: _Optional[float] = ..., power_w: _Optional[float] = ..., temperature_c: _Optional[float] = ..., clock_factor: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., energy_j: _Optional[float] = ..., busy_s: _Optional[float] = ..., fault: _Optional[str] = ...) -> None: ...

class ListDevicesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "devices")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ...) -> None: ...

class ListDevicesResponse(_message.Message):
    __slots__ = ("devices", "next_page_token")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    next_page_token: str
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WorkItem(_message.Message):
    __slots__ = ("kind", "flops", "bytes", "precision", "count", "shape", "graph")
    KIND_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    flops: float
    bytes: float
    precision: _common_pb2.Precision
    count: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    graph: bool
    def __init__(self, kind: _Optional[str] = ..., flops: _Optional[float] = ..., bytes: _Optional[float] = ..., precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., count: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., graph: _Optional[bool] = ...) -> None: ...

class ExecuteWorkRequest(_message.Message):
    __slots__ = ("devices", "items", "not_before_s", "wait", "tag", "memory_in_use_bytes")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IN_USE_BYTES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    items: _containers.RepeatedCompositeFieldContainer[WorkItem]
    not_before_s: float
    wait: bool
    tag: str
    memory_in_use_bytes: int
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., items: _Optional[_Iterable[_Union[WorkItem, _Mapping]]] = ..., not_before_s: _Optional[float] = ..., wait: _Optional[bool] = ..., tag: _Optional[str] = ..., memory_in_use_bytes: _Optional[int] = ...) -> None: ...

class ExecuteWorkResponse(_message.Message):
    __slots__ = ("start_s", "end_s", "energy_j", "clock_factor")
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FACTOR_FIELD_NUMBER: _ClassVar[int]
    start_s: float
    end_s: float
    energy_j: float
    clock_factor: float
    def __init__(self, start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., clock_factor: _Optional[float] = ...) -> None: ...

class ReportWorkRequest(_message.Message):
    __slots__ = ("devices", "iterations", "tag", "memory_in_use_bytes")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    MEMORY_IN_USE_BYTES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    iterations: _containers.RepeatedCompositeFieldContainer[WorkIteration]
    tag: str
    memory_in_use_bytes: int
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., iterations: _Optional[_Iterable[_Union[WorkIteration, _Mapping]]] = ..., tag: _Optional[str] = ..., memory_in_use_bytes: _Optional[int] = ...) -> None: ...

class WorkIteration(_message.Message):
    __slots__ = ("not_before_s", "items")
    NOT_BEFORE_S_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    not_before_s: float
    items: _containers.RepeatedCompositeFieldContainer[WorkItem]
    def __init__(self, not_before_s: _Optional[float] = ..., items: _Optional[_Iterable[_Union[WorkItem, _Mapping]]] = ...) -> None: ...

class ReportWorkResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ExecuteWorkResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[ExecuteWorkResponse, _Mapping]]] = ...) -> None: ...

class AllocateMemoryRequest(_message.Message):
    __slots__ = ("device", "size_bytes")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    device: int
    size_bytes: int
    def __init__(self, device: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class AllocateMemoryResponse(_message.Message):
    __slots__ = ("name", "device", "size_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    device: int
    size_bytes: int
    def __init__(self, name: _Optional[str] = ..., device: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class FreeMemoryRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class FreeMemoryResponse(_message.Message):
    __slots__ = ("scrub_s",)
    SCRUB_S_FIELD_NUMBER: _ClassVar[int]
    scrub_s: float
    def __init__(self, scrub_s: _Optional[float] = ...) -> None: ...

class WriteMemoryRequest(_message.Message):
    __slots__ = ("name", "offset", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    data: bytes
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WriteMemoryResponse(_message.Message):
    __slots__ = ("written_bytes",)
    WRITTEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    written_bytes: int
    def __init__(self, written_bytes: _Optional[int] = ...) -> None: ...

class ReadMemoryRequest(_message.Message):
    __slots__ = ("name", "offset", "length")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    length: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReadMemoryResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ScrubInstanceRequest(_message.Message):
    __slots__ = ("instance", "devices")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    instance: str
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    def __init__(self, instance: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ...) -> None: ...

class ScrubInstanceResponse(_message.Message):
    __slots__ = ("scrub_s", "scrubbed_bytes")
    SCRUB_S_FIELD_NUMBER: _ClassVar[int]
    SCRUBBED_BYTES_FIELD_NUMBER: _ClassVar[int]
    scrub_s: float
    scrubbed_bytes: int
    def __init__(self, scrub_s: _Optional[float] = ..., scrubbed_bytes: _Optional[int] = ...) -> None: ...

class InjectFaultRequest(_message.Message):
    __slots__ = ("devices", "kind", "clock_factor", "repair_after_s")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FACTOR_FIELD_NUMBER: _ClassVar[int]
    REPAIR_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    kind: FaultKind
    clock_factor: float
    repair_after_s: float
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., kind: _Optional[_Union[FaultKind, str]] = ..., clock_factor: _Optional[float] = ..., repair_after_s: _Optional[float] = ...) -> None: ...

class InjectFaultResponse(_message.Message):
    __slots__ = ("affected",)
    AFFECTED_FIELD_NUMBER: _ClassVar[int]
    affected: int
    def __init__(self, affected: _Optional[int] = ...) -> None: ...

class ClearFaultRequest(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ...) -> None: ...

class ClearFaultResponse(_message.Message):
    __slots__ = ("affected",)
    AFFECTED_FIELD_NUMBER: _ClassVar[int]
    affected: int
    def __init__(self, affected: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("devices", "healthy", "failed", "throttled", "mean_utilization", "power_w", "energy_j", "busy_s", "memory_used_bytes", "max_temperature_c", "now_s")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    MEAN_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    devices: int
    healthy: int
    failed: int
    throttled: int
    mean_utilization: float
    power_w: float
    energy_j: float
    busy_s: float
    memory_used_bytes: int
    max_temperature_c: float
    now_s: float
    def __init__(self, devices: _Optional[int] = ..., healthy: _Optional[int] = ..., failed: _Optional[int] = ..., throttled: _Optional[int] = ..., mean_utilization: _Optional[float] = ..., power_w: _Optional[float] = ..., energy_j: _Optional[float] = ..., busy_s: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., max_temperature_c: _Optional[float] = ..., now_s: _Optional[float] = ...) -> None: ...

class SetMemoryInUseRequest(_message.Message):
    __slots__ = ("devices", "bytes_per_device")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_DEVICE_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    bytes_per_device: int
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., bytes_per_device: _Optional[int] = ...) -> None: ...

class SetMemoryInUseResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: int
    def __init__(self, devices: _Optional[int] = ...) -> None: ...

class ExecuteWindowRequest(_message.Message):
    __slots__ = ("work", "repeat", "period_s", "pause_after", "pause_s")
    WORK_FIELD_NUMBER: _ClassVar[int]
    REPEAT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    PAUSE_AFTER_FIELD_NUMBER: _ClassVar[int]
    PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    work: ExecuteWorkRequest
    repeat: int
    period_s: float
    pause_after: _containers.RepeatedScalarFieldContainer[int]
    pause_s: float
    def __init__(self, work: _Optional[_Union[ExecuteWorkRequest, _Mapping]] = ..., repeat: _Optional[int] = ..., period_s: _Optional[float] = ..., pause_after: _Optional[_Iterable[int]] = ..., pause_s: _Optional[float] = ...) -> None: ...

class ExecuteWindowResponse(_message.Message):
    __slots__ = ("first", "repeats", "end_s", "final", "cause")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    first: ExecuteWorkResponse
    repeats: int
    end_s: float
    final: bool
    cause: str
    def __init__(self, first: _Optional[_Union[ExecuteWorkResponse, _Mapping]] = ..., repeats: _Optional[int] = ..., end_s: _Optional[float] = ..., final: _Optional[bool] = ..., cause: _Optional[str] = ...) -> None: ...

class CutWorkRequest(_message.Message):
    __slots__ = ("devices", "at_s")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    AT_S_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    at_s: float
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., at_s: _Optional[float] = ...) -> None: ...

class CutWorkResponse(_message.Message):
    __slots__ = ("windows", "repeats_removed")
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    REPEATS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    windows: int
    repeats_removed: int
    def __init__(self, windows: _Optional[int] = ..., repeats_removed: _Optional[int] = ...) -> None: ...
