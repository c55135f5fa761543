from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SyncRequest(_message.Message):
    __slots__ = ("process", "round", "idle", "next_wake_s", "calls_out", "calls_in", "activity", "now_s", "stream_messages_sent", "stream_messages_received", "dormant", "wake")
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    NEXT_WAKE_S_FIELD_NUMBER: _ClassVar[int]
    CALLS_OUT_FIELD_NUMBER: _ClassVar[int]
    CALLS_IN_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    STREAM_MESSAGES_SENT_FIELD_NUMBER: _ClassVar[int]
    STREAM_MESSAGES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    DORMANT_FIELD_NUMBER: _ClassVar[int]
    WAKE_FIELD_NUMBER: _ClassVar[int]
    process: str
    round: int
    idle: bool
    next_wake_s: float
    calls_out: int
    calls_in: int
    activity: int
    now_s: float
    stream_messages_sent: int
    stream_messages_received: int
    dormant: bool
    wake: int
    def __init__(self, process: _Optional[str] = ..., round: _Optional[int] = ..., idle: _Optional[bool] = ..., next_wake_s: _Optional[float] = ..., calls_out: _Optional[int] = ..., calls_in: _Optional[int] = ..., activity: _Optional[int] = ..., now_s: _Optional[float] = ..., stream_messages_sent: _Optional[int] = ..., stream_messages_received: _Optional[int] = ..., dormant: _Optional[bool] = ..., wake: _Optional[int] = ...) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("now_s", "probe_round", "horizon_s", "woken")
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    PROBE_ROUND_FIELD_NUMBER: _ClassVar[int]
    HORIZON_S_FIELD_NUMBER: _ClassVar[int]
    WOKEN_FIELD_NUMBER: _ClassVar[int]
    now_s: float
    probe_round: int
    horizon_s: float
    woken: int
    def __init__(self, now_s: _Optional[float] = ..., probe_round: _Optional[int] = ..., horizon_s: _Optional[float] = ..., woken: _Optional[int] = ...) -> None: ...

class GetTimeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTimeResponse(_message.Message):
    __slots__ = ("now_s", "processes", "advances", "probes", "advances_by_kind")
    class AdvancesByKindEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    ADVANCES_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    ADVANCES_BY_KIND_FIELD_NUMBER: _ClassVar[int]
    now_s: float
    processes: int
    advances: int
    probes: int
    advances_by_kind: _containers.ScalarMap[str, int]
    def __init__(self, now_s: _Optional[float] = ..., processes: _Optional[int] = ..., advances: _Optional[int] = ..., probes: _Optional[int] = ..., advances_by_kind: _Optional[_Mapping[str, int]] = ...) -> None: ...
