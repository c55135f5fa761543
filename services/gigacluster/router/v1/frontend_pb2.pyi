from gigacluster.router.v1 import router_pb2 as _router_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LinkUp(_message.Message):
    __slots__ = ("secret", "frontend", "calls")
    SECRET_FIELD_NUMBER: _ClassVar[int]
    FRONTEND_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    secret: str
    frontend: int
    calls: _containers.RepeatedCompositeFieldContainer[LinkCall]
    def __init__(self, secret: _Optional[str] = ..., frontend: _Optional[int] = ..., calls: _Optional[_Iterable[_Union[LinkCall, _Mapping]]] = ...) -> None: ...

class LinkCall(_message.Message):
    __slots__ = ("stream", "cancel", "principal_kind", "principal_tenant", "request", "max_tokens", "open_to_context", "priority")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_KIND_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OPEN_TO_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    stream: int
    cancel: bool
    principal_kind: str
    principal_tenant: str
    request: _router_pb2.GenerateRequest
    max_tokens: int
    open_to_context: bool
    priority: int
    def __init__(self, stream: _Optional[int] = ..., cancel: _Optional[bool] = ..., principal_kind: _Optional[str] = ..., principal_tenant: _Optional[str] = ..., request: _Optional[_Union[_router_pb2.GenerateRequest, _Mapping]] = ..., max_tokens: _Optional[int] = ..., open_to_context: _Optional[bool] = ..., priority: _Optional[int] = ...) -> None: ...

class LinkDown(_message.Message):
    __slots__ = ("events", "has_state", "reconciled", "deployments")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HAS_STATE_FIELD_NUMBER: _ClassVar[int]
    RECONCILED_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[LinkEvent]
    has_state: bool
    reconciled: bool
    deployments: _containers.RepeatedCompositeFieldContainer[LinkDeployment]
    def __init__(self, events: _Optional[_Iterable[_Union[LinkEvent, _Mapping]]] = ..., has_state: _Optional[bool] = ..., reconciled: _Optional[bool] = ..., deployments: _Optional[_Iterable[_Union[LinkDeployment, _Mapping]]] = ...) -> None: ...

class LinkEvent(_message.Message):
    __slots__ = ("stream", "chunk", "prompt_tokens", "error_code", "error_message", "error_reason", "error_field", "retry_after_s", "error_metadata")
    class ErrorMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_METADATA_FIELD_NUMBER: _ClassVar[int]
    stream: int
    chunk: _router_pb2.GenerateResponse
    prompt_tokens: int
    error_code: str
    error_message: str
    error_reason: str
    error_field: str
    retry_after_s: float
    error_metadata: _containers.ScalarMap[str, str]
    def __init__(self, stream: _Optional[int] = ..., chunk: _Optional[_Union[_router_pb2.GenerateResponse, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., error_reason: _Optional[str] = ..., error_field: _Optional[str] = ..., retry_after_s: _Optional[float] = ..., error_metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LinkDeployment(_message.Message):
    __slots__ = ("tenant", "deployment_id", "created_s", "seq_len", "state", "qualified_name")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_S_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    QUALIFIED_NAME_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    deployment_id: str
    created_s: float
    seq_len: int
    state: str
    qualified_name: str
    def __init__(self, tenant: _Optional[str] = ..., deployment_id: _Optional[str] = ..., created_s: _Optional[float] = ..., seq_len: _Optional[int] = ..., state: _Optional[str] = ..., qualified_name: _Optional[str] = ...) -> None: ...
