from gigacluster.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Deployment(_message.Message):
    __slots__ = ("name", "tenant", "model", "chip", "tp", "replicas", "max_batch", "kv_fraction", "precision", "policy", "state", "reason", "instances", "kv_cache_bytes_per_replica", "max_queue", "prefill_replicas", "decode_replicas", "chunked_prefill", "ep", "chips_per_replica")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Deployment.State]
        STATE_DEPLOYING: _ClassVar[Deployment.State]
        STATE_READY: _ClassVar[Deployment.State]
        STATE_FAILED: _ClassVar[Deployment.State]
        STATE_DELETING: _ClassVar[Deployment.State]
        STATE_DEGRADED: _ClassVar[Deployment.State]
    STATE_UNSPECIFIED: Deployment.State
    STATE_DEPLOYING: Deployment.State
    STATE_READY: Deployment.State
    STATE_FAILED: Deployment.State
    STATE_DELETING: Deployment.State
    STATE_DEGRADED: Deployment.State
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHIP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    KV_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DECODE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    CHIPS_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant: str
    model: _common_pb2.ModelArchitecture
    chip: str
    tp: int
    replicas: int
    max_batch: int
    kv_fraction: float
    precision: _common_pb2.Precision
    policy: str
    state: Deployment.State
    reason: str
    instances: _containers.RepeatedScalarFieldContainer[str]
    kv_cache_bytes_per_replica: int
    max_queue: int
    prefill_replicas: int
    decode_replicas: int
    chunked_prefill: bool
    ep: int
    chips_per_replica: int
    def __init__(self, name: _Optional[str] = ..., tenant: _Optional[str] = ..., model: _Optional[_Union[_common_pb2.ModelArchitecture, _Mapping]] = ..., chip: _Optional[str] = ..., tp: _Optional[int] = ..., replicas: _Optional[int] = ..., max_batch: _Optional[int] = ..., kv_fraction: _Optional[float] = ..., precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., policy: _Optional[str] = ..., state: _Optional[_Union[Deployment.State, str]] = ..., reason: _Optional[str] = ..., instances: _Optional[_Iterable[str]] = ..., kv_cache_bytes_per_replica: _Optional[int] = ..., max_queue: _Optional[int] = ..., prefill_replicas: _Optional[int] = ..., decode_replicas: _Optional[int] = ..., chunked_prefill: _Optional[bool] = ..., ep: _Optional[int] = ..., chips_per_replica: _Optional[int] = ...) -> None: ...

class DeployModelRequest(_message.Message):
    __slots__ = ("deployment_id", "model", "chip", "tp", "replicas", "max_batch", "kv_fraction", "precision", "policy", "max_queue", "prefill_replicas", "decode_replicas", "chunked_prefill", "ep")
    DEPLOYMENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHIP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    KV_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DECODE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    deployment_id: str
    model: _common_pb2.ModelArchitecture
    chip: str
    tp: int
    replicas: int
    max_batch: int
    kv_fraction: float
    precision: _common_pb2.Precision
    policy: str
    max_queue: int
    prefill_replicas: int
    decode_replicas: int
    chunked_prefill: bool
    ep: int
    def __init__(self, deployment_id: _Optional[str] = ..., model: _Optional[_Union[_common_pb2.ModelArchitecture, _Mapping]] = ..., chip: _Optional[str] = ..., tp: _Optional[int] = ..., replicas: _Optional[int] = ..., max_batch: _Optional[int] = ..., kv_fraction: _Optional[float] = ..., precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., policy: _Optional[str] = ..., max_queue: _Optional[int] = ..., prefill_replicas: _Optional[int] = ..., decode_replicas: _Optional[int] = ..., chunked_prefill: _Optional[bool] = ..., ep: _Optional[int] = ...) -> None: ...

class DeployModelResponse(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ...) -> None: ...

class GetDeploymentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetDeploymentResponse(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ...) -> None: ...

class ListDeploymentsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDeploymentsResponse(_message.Message):
    __slots__ = ("deployments", "next_page_token")
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[Deployment]
    next_page_token: str
    def __init__(self, deployments: _Optional[_Iterable[_Union[Deployment, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteDeploymentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteDeploymentResponse(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "text", "token_ids", "max_tokens", "priority", "request_id", "stop", "ignore_eos")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    token_ids: TokenIds
    max_tokens: int
    priority: int
    request_id: str
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., max_tokens: _Optional[int] = ..., priority: _Optional[int] = ..., request_id: _Optional[str] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerateUsage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "queue_s", "ttft_s", "e2e_s", "energy_j", "kv_transfer_s", "kv_transfer_bytes", "prefill_replica")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_REPLICA_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    queue_s: float
    ttft_s: float
    e2e_s: float
    energy_j: float
    kv_transfer_s: float
    kv_transfer_bytes: float
    prefill_replica: str
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., queue_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., e2e_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., kv_transfer_s: _Optional[float] = ..., kv_transfer_bytes: _Optional[float] = ..., prefill_replica: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "index", "token_ids", "text", "time_s", "finish_reason", "usage", "replica", "token_times_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TIMES_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    time_s: float
    finish_reason: str
    usage: GenerateUsage
    replica: str
    token_times_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, request_id: _Optional[str] = ..., index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., time_s: _Optional[float] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[GenerateUsage, _Mapping]] = ..., replica: _Optional[str] = ..., token_times_s: _Optional[_Iterable[float]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("deployment",)
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    def __init__(self, deployment: _Optional[str] = ...) -> None: ...

class DeploymentStats(_message.Message):
    __slots__ = ("deployment", "ttft", "tpot", "itl", "e2e", "queue", "tokens_per_s", "kv_cache_usage", "prefix_hit_rate", "queue_depth", "running", "completed", "rejected", "kv_transfers", "kv_transfer_bytes", "a2a_flows", "a2a_bytes")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TTFT_FIELD_NUMBER: _ClassVar[int]
    TPOT_FIELD_NUMBER: _ClassVar[int]
    ITL_FIELD_NUMBER: _ClassVar[int]
    E2E_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    A2A_FLOWS_FIELD_NUMBER: _ClassVar[int]
    A2A_BYTES_FIELD_NUMBER: _ClassVar[int]
    deployment: str
    ttft: _common_pb2.LatencySummary
    tpot: _common_pb2.LatencySummary
    itl: _common_pb2.LatencySummary
    e2e: _common_pb2.LatencySummary
    queue: _common_pb2.LatencySummary
    tokens_per_s: float
    kv_cache_usage: float
    prefix_hit_rate: float
    queue_depth: int
    running: int
    completed: int
    rejected: int
    kv_transfers: int
    kv_transfer_bytes: float
    a2a_flows: int
    a2a_bytes: float
    def __init__(self, deployment: _Optional[str] = ..., ttft: _Optional[_Union[_common_pb2.LatencySummary, _Mapping]] = ..., tpot: _Optional[_Union[_common_pb2.LatencySummary, _Mapping]] = ..., itl: _Optional[_Union[_common_pb2.LatencySummary, _Mapping]] = ..., e2e: _Optional[_Union[_common_pb2.LatencySummary, _Mapping]] = ..., queue: _Optional[_Union[_common_pb2.LatencySummary, _Mapping]] = ..., tokens_per_s: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., prefix_hit_rate: _Optional[float] = ..., queue_depth: _Optional[int] = ..., running: _Optional[int] = ..., completed: _Optional[int] = ..., rejected: _Optional[int] = ..., kv_transfers: _Optional[int] = ..., kv_transfer_bytes: _Optional[float] = ..., a2a_flows: _Optional[int] = ..., a2a_bytes: _Optional[float] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("deployments", "now_s")
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    deployments: _containers.RepeatedCompositeFieldContainer[DeploymentStats]
    now_s: float
    def __init__(self, deployments: _Optional[_Iterable[_Union[DeploymentStats, _Mapping]]] = ..., now_s: _Optional[float] = ...) -> None: ...
