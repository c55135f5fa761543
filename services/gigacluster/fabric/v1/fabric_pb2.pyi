from gigacluster.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrafficClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAFFIC_CLASS_UNSPECIFIED: _ClassVar[TrafficClass]
    TRAFFIC_CLASS_TRAINING: _ClassVar[TrafficClass]
    TRAFFIC_CLASS_INFERENCE: _ClassVar[TrafficClass]
    TRAFFIC_CLASS_STORAGE: _ClassVar[TrafficClass]

class CollectiveOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTIVE_OP_UNSPECIFIED: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_ALL_REDUCE: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_REDUCE_SCATTER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_ALL_GATHER: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_ALL_TO_ALL: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_BROADCAST: _ClassVar[CollectiveOp]
    COLLECTIVE_OP_SEND_RECV: _ClassVar[CollectiveOp]
TRAFFIC_CLASS_UNSPECIFIED: TrafficClass
TRAFFIC_CLASS_TRAINING: TrafficClass
TRAFFIC_CLASS_INFERENCE: TrafficClass
TRAFFIC_CLASS_STORAGE: TrafficClass
COLLECTIVE_OP_UNSPECIFIED: CollectiveOp
COLLECTIVE_OP_ALL_REDUCE: CollectiveOp
COLLECTIVE_OP_REDUCE_SCATTER: CollectiveOp
COLLECTIVE_OP_ALL_GATHER: CollectiveOp
COLLECTIVE_OP_ALL_TO_ALL: CollectiveOp
COLLECTIVE_OP_BROADCAST: CollectiveOp
COLLECTIVE_OP_SEND_RECV: CollectiveOp

class GetTopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierSummary(_message.Message):
    __slots__ = ("tier", "links", "capacity_Bps")
    TIER_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BPS_FIELD_NUMBER: _ClassVar[int]
    tier: str
    links: int
    capacity_Bps: float
    def __init__(self, tier: _Optional[str] = ..., links: _Optional[int] = ..., capacity_Bps: _Optional[float] = ...) -> None: ...

class GetTopologyResponse(_message.Message):
    __slots__ = ("chip_type", "system", "chips", "switches", "links", "chips_per_domain", "tiers", "oversubscription", "bisection_Bps", "now_s", "switch", "nic", "switch_tiers", "routing")
    CHIP_TYPE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    CHIPS_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    CHIPS_PER_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    OVERSUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    BISECTION_BPS_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    NIC_FIELD_NUMBER: _ClassVar[int]
    SWITCH_TIERS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    chip_type: str
    system: str
    chips: int
    switches: int
    links: int
    chips_per_domain: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierSummary]
    oversubscription: float
    bisection_Bps: float
    now_s: float
    switch: str
    nic: str
    switch_tiers: int
    routing: str
    def __init__(self, chip_type: _Optional[str] = ..., system: _Optional[str] = ..., chips: _Optional[int] = ..., switches: _Optional[int] = ..., links: _Optional[int] = ..., chips_per_domain: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierSummary, _Mapping]]] = ..., oversubscription: _Optional[float] = ..., bisection_Bps: _Optional[float] = ..., now_s: _Optional[float] = ..., switch: _Optional[str] = ..., nic: _Optional[str] = ..., switch_tiers: _Optional[int] = ..., routing: _Optional[str] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("name", "tier", "state", "capacity_Bps", "utilization", "active_flows", "bytes_carried")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Link.State]
        STATE_UP: _ClassVar[Link.State]
        STATE_DEGRADED: _ClassVar[Link.State]
        STATE_DOWN: _ClassVar[Link.State]
    STATE_UNSPECIFIED: Link.State
    STATE_UP: Link.State
    STATE_DEGRADED: Link.State
    STATE_DOWN: Link.State
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BPS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FLOWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_CARRIED_FIELD_NUMBER: _ClassVar[int]
    name: str
    tier: str
    state: Link.State
    capacity_Bps: float
    utilization: float
    active_flows: int
    bytes_carried: float
    def __init__(self, name: _Optional[str] = ..., tier: _Optional[str] = ..., state: _Optional[_Union[Link.State, str]] = ..., capacity_Bps: _Optional[float] = ..., utilization: _Optional[float] = ..., active_flows: _Optional[int] = ..., bytes_carried: _Optional[float] = ...) -> None: ...

class ListLinksRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "tier")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    tier: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., tier: _Optional[str] = ...) -> None: ...

class ListLinksResponse(_message.Message):
    __slots__ = ("links", "next_page_token")
    LINKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[Link]
    next_page_token: str
    def __init__(self, links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StartTransferRequest(_message.Message):
    __slots__ = ("src_device", "dst_device", "bytes", "traffic_class", "not_before_s", "tag")
    SRC_DEVICE_FIELD_NUMBER: _ClassVar[int]
    DST_DEVICE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_CLASS_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_S_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    src_device: int
    dst_device: int
    bytes: float
    traffic_class: TrafficClass
    not_before_s: float
    tag: str
    def __init__(self, src_device: _Optional[int] = ..., dst_device: _Optional[int] = ..., bytes: _Optional[float] = ..., traffic_class: _Optional[_Union[TrafficClass, str]] = ..., not_before_s: _Optional[float] = ..., tag: _Optional[str] = ...) -> None: ...

class StartTransferResponse(_message.Message):
    __slots__ = ("name", "start_s", "predicted_end_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_END_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    start_s: float
    predicted_end_s: float
    def __init__(self, name: _Optional[str] = ..., start_s: _Optional[float] = ..., predicted_end_s: _Optional[float] = ...) -> None: ...

class StartCollectiveRequest(_message.Message):
    __slots__ = ("op", "ranks", "bytes", "algorithm", "traffic_class", "not_before_s", "tag", "groups", "group_stride", "repeats")
    OP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_CLASS_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_S_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUP_STRIDE_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    op: CollectiveOp
    ranks: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    bytes: float
    algorithm: str
    traffic_class: TrafficClass
    not_before_s: float
    tag: str
    groups: int
    group_stride: int
    repeats: int
    def __init__(self, op: _Optional[_Union[CollectiveOp, str]] = ..., ranks: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., bytes: _Optional[float] = ..., algorithm: _Optional[str] = ..., traffic_class: _Optional[_Union[TrafficClass, str]] = ..., not_before_s: _Optional[float] = ..., tag: _Optional[str] = ..., groups: _Optional[int] = ..., group_stride: _Optional[int] = ..., repeats: _Optional[int] = ...) -> None: ...

class StartCollectiveResponse(_message.Message):
    __slots__ = ("name", "algorithm", "start_s", "predicted_end_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_END_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    algorithm: str
    start_s: float
    predicted_end_s: float
    def __init__(self, name: _Optional[str] = ..., algorithm: _Optional[str] = ..., start_s: _Optional[float] = ..., predicted_end_s: _Optional[float] = ...) -> None: ...

class Flow(_message.Message):
    __slots__ = ("name", "state", "algorithm", "start_s", "predicted_end_s", "end_s", "bytes", "error", "tag", "algbw_gbps", "busbw_gbps")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Flow.State]
        STATE_RUNNING: _ClassVar[Flow.State]
        STATE_DONE: _ClassVar[Flow.State]
        STATE_FAILED: _ClassVar[Flow.State]
    STATE_UNSPECIFIED: Flow.State
    STATE_RUNNING: Flow.State
    STATE_DONE: Flow.State
    STATE_FAILED: Flow.State
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_END_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    ALGBW_GBPS_FIELD_NUMBER: _ClassVar[int]
    BUSBW_GBPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: Flow.State
    algorithm: str
    start_s: float
    predicted_end_s: float
    end_s: float
    bytes: float
    error: str
    tag: str
    algbw_gbps: float
    busbw_gbps: float
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[Flow.State, str]] = ..., algorithm: _Optional[str] = ..., start_s: _Optional[float] = ..., predicted_end_s: _Optional[float] = ..., end_s: _Optional[float] = ..., bytes: _Optional[float] = ..., error: _Optional[str] = ..., tag: _Optional[str] = ..., algbw_gbps: _Optional[float] = ..., busbw_gbps: _Optional[float] = ...) -> None: ...

class GetFlowRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetFlowResponse(_message.Message):
    __slots__ = ("flow",)
    FLOW_FIELD_NUMBER: _ClassVar[int]
    flow: Flow
    def __init__(self, flow: _Optional[_Union[Flow, _Mapping]] = ...) -> None: ...

class WatchFlowsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchFlowsResponse(_message.Message):
    __slots__ = ("flow",)
    FLOW_FIELD_NUMBER: _ClassVar[int]
    flow: Flow
    def __init__(self, flow: _Optional[_Union[Flow, _Mapping]] = ...) -> None: ...

class GetLinkStatsRequest(_message.Message):
    __slots__ = ("cut_off_only",)
    CUT_OFF_ONLY_FIELD_NUMBER: _ClassVar[int]
    cut_off_only: bool
    def __init__(self, cut_off_only: _Optional[bool] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "links", "mean_utilization", "max_utilization", "links_down", "links_degraded", "busy_link_s", "bytes_carried", "windows_max_utilization")
    TIER_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    MEAN_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MAX_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    LINKS_DOWN_FIELD_NUMBER: _ClassVar[int]
    LINKS_DEGRADED_FIELD_NUMBER: _ClassVar[int]
    BUSY_LINK_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_CARRIED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_MAX_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    tier: str
    links: int
    mean_utilization: float
    max_utilization: float
    links_down: int
    links_degraded: int
    busy_link_s: float
    bytes_carried: float
    windows_max_utilization: float
    def __init__(self, tier: _Optional[str] = ..., links: _Optional[int] = ..., mean_utilization: _Optional[float] = ..., max_utilization: _Optional[float] = ..., links_down: _Optional[int] = ..., links_degraded: _Optional[int] = ..., busy_link_s: _Optional[float] = ..., bytes_carried: _Optional[float] = ..., windows_max_utilization: _Optional[float] = ...) -> None: ...

class GetLinkStatsResponse(_message.Message):
    __slots__ = ("tiers", "active_flows", "now_s", "cut_off_chips", "stats_time_s")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FLOWS_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    CUT_OFF_CHIPS_FIELD_NUMBER: _ClassVar[int]
    STATS_TIME_S_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    active_flows: int
    now_s: float
    cut_off_chips: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceRange]
    stats_time_s: float
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., active_flows: _Optional[int] = ..., now_s: _Optional[float] = ..., cut_off_chips: _Optional[_Iterable[_Union[_common_pb2.DeviceRange, _Mapping]]] = ..., stats_time_s: _Optional[float] = ...) -> None: ...

class InjectLinkFaultRequest(_message.Message):
    __slots__ = ("target", "kind", "capacity_factor")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[InjectLinkFaultRequest.Kind]
        KIND_DOWN: _ClassVar[InjectLinkFaultRequest.Kind]
        KIND_DEGRADED: _ClassVar[InjectLinkFaultRequest.Kind]
    KIND_UNSPECIFIED: InjectLinkFaultRequest.Kind
    KIND_DOWN: InjectLinkFaultRequest.Kind
    KIND_DEGRADED: InjectLinkFaultRequest.Kind
    TARGET_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    target: str
    kind: InjectLinkFaultRequest.Kind
    capacity_factor: float
    def __init__(self, target: _Optional[str] = ..., kind: _Optional[_Union[InjectLinkFaultRequest.Kind, str]] = ..., capacity_factor: _Optional[float] = ...) -> None: ...

class InjectLinkFaultResponse(_message.Message):
    __slots__ = ("links_affected", "flows_rerouted", "flows_failed")
    LINKS_AFFECTED_FIELD_NUMBER: _ClassVar[int]
    FLOWS_REROUTED_FIELD_NUMBER: _ClassVar[int]
    FLOWS_FAILED_FIELD_NUMBER: _ClassVar[int]
    links_affected: int
    flows_rerouted: int
    flows_failed: int
    def __init__(self, links_affected: _Optional[int] = ..., flows_rerouted: _Optional[int] = ..., flows_failed: _Optional[int] = ...) -> None: ...

class ClearLinkFaultRequest(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class ClearLinkFaultResponse(_message.Message):
    __slots__ = ("links_affected",)
    LINKS_AFFECTED_FIELD_NUMBER: _ClassVar[int]
    links_affected: int
    def __init__(self, links_affected: _Optional[int] = ...) -> None: ...

class WindowCollective(_message.Message):
    __slots__ = ("collective", "offset_s", "expected_s")
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_S_FIELD_NUMBER: _ClassVar[int]
    collective: StartCollectiveRequest
    offset_s: float
    expected_s: float
    def __init__(self, collective: _Optional[_Union[StartCollectiveRequest, _Mapping]] = ..., offset_s: _Optional[float] = ..., expected_s: _Optional[float] = ...) -> None: ...

class ReserveWindowRequest(_message.Message):
    __slots__ = ("collectives", "start_s", "period_s", "repeat", "tag", "pause_after", "pause_s")
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    REPEAT_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PAUSE_AFTER_FIELD_NUMBER: _ClassVar[int]
    PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    collectives: _containers.RepeatedCompositeFieldContainer[WindowCollective]
    start_s: float
    period_s: float
    repeat: int
    tag: str
    pause_after: _containers.RepeatedScalarFieldContainer[int]
    pause_s: float
    def __init__(self, collectives: _Optional[_Iterable[_Union[WindowCollective, _Mapping]]] = ..., start_s: _Optional[float] = ..., period_s: _Optional[float] = ..., repeat: _Optional[int] = ..., tag: _Optional[str] = ..., pause_after: _Optional[_Iterable[int]] = ..., pause_s: _Optional[float] = ...) -> None: ...

class WindowFlow(_message.Message):
    __slots__ = ("index", "start_s", "end_s", "flow")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    index: int
    start_s: float
    end_s: float
    flow: str
    def __init__(self, index: _Optional[int] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., flow: _Optional[str] = ...) -> None: ...

class ReserveWindowResponse(_message.Message):
    __slots__ = ("name", "granted", "refused", "steps", "end_s", "final", "cause", "cut_s", "step_flows", "alone_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    CUT_S_FIELD_NUMBER: _ClassVar[int]
    STEP_FLOWS_FIELD_NUMBER: _ClassVar[int]
    ALONE_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    granted: bool
    refused: str
    steps: int
    end_s: float
    final: bool
    cause: str
    cut_s: float
    step_flows: _containers.RepeatedCompositeFieldContainer[WindowFlow]
    alone_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, name: _Optional[str] = ..., granted: _Optional[bool] = ..., refused: _Optional[str] = ..., steps: _Optional[int] = ..., end_s: _Optional[float] = ..., final: _Optional[bool] = ..., cause: _Optional[str] = ..., cut_s: _Optional[float] = ..., step_flows: _Optional[_Iterable[_Union[WindowFlow, _Mapping]]] = ..., alone_s: _Optional[_Iterable[float]] = ...) -> None: ...

class CutWindowRequest(_message.Message):
    __slots__ = ("name", "at_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    at_s: float
    def __init__(self, name: _Optional[str] = ..., at_s: _Optional[float] = ...) -> None: ...

class CutWindowResponse(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    def __init__(self, steps: _Optional[int] = ...) -> None: ...
