from gigacluster.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchSpec(_message.Message):
    __slots__ = ("global_batch", "global_batch_tokens")
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    global_batch: int
    global_batch_tokens: int
    def __init__(self, global_batch: _Optional[int] = ..., global_batch_tokens: _Optional[int] = ...) -> None: ...

class ParallelismSpec(_message.Message):
    __slots__ = ("tp", "pp", "dp", "cp", "microbatch_size", "recompute", "virtual_stages", "tp_comm_overlap", "cp_comm_overlap", "pp_comm_overlap", "distributed_optimizer", "grad_reduce_dtype", "ep", "capacity_factor", "moe_overlap", "pipeline_schedule", "sequence_parallel", "fsdp", "fsdp_shard", "fsdp_reshard_after_forward", "recompute_layers")
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_STAGES_FIELD_NUMBER: _ClassVar[int]
    TP_COMM_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    CP_COMM_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    PP_COMM_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTED_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    GRAD_REDUCE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MOE_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    FSDP_FIELD_NUMBER: _ClassVar[int]
    FSDP_SHARD_FIELD_NUMBER: _ClassVar[int]
    FSDP_RESHARD_AFTER_FORWARD_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    tp: int
    pp: int
    dp: int
    cp: int
    microbatch_size: int
    recompute: str
    virtual_stages: int
    tp_comm_overlap: float
    cp_comm_overlap: float
    pp_comm_overlap: float
    distributed_optimizer: bool
    grad_reduce_dtype: str
    ep: int
    capacity_factor: float
    moe_overlap: float
    pipeline_schedule: str
    sequence_parallel: bool
    fsdp: bool
    fsdp_shard: int
    fsdp_reshard_after_forward: bool
    recompute_layers: int
    def __init__(self, tp: _Optional[int] = ..., pp: _Optional[int] = ..., dp: _Optional[int] = ..., cp: _Optional[int] = ..., microbatch_size: _Optional[int] = ..., recompute: _Optional[str] = ..., virtual_stages: _Optional[int] = ..., tp_comm_overlap: _Optional[float] = ..., cp_comm_overlap: _Optional[float] = ..., pp_comm_overlap: _Optional[float] = ..., distributed_optimizer: _Optional[bool] = ..., grad_reduce_dtype: _Optional[str] = ..., ep: _Optional[int] = ..., capacity_factor: _Optional[float] = ..., moe_overlap: _Optional[float] = ..., pipeline_schedule: _Optional[str] = ..., sequence_parallel: _Optional[bool] = ..., fsdp: _Optional[bool] = ..., fsdp_shard: _Optional[int] = ..., fsdp_reshard_after_forward: _Optional[bool] = ..., recompute_layers: _Optional[int] = ...) -> None: ...

class HardwareSpec(_message.Message):
    __slots__ = ("chip", "count", "system")
    CHIP_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    chip: str
    count: int
    system: str
    def __init__(self, chip: _Optional[str] = ..., count: _Optional[int] = ..., system: _Optional[str] = ...) -> None: ...

class TrainingSpec(_message.Message):
    __slots__ = ("model", "batch", "parallelism", "hardware", "precision", "tokens", "steps", "pue", "attention_impl", "loss_impl")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PUE_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_IMPL_FIELD_NUMBER: _ClassVar[int]
    LOSS_IMPL_FIELD_NUMBER: _ClassVar[int]
    model: _common_pb2.ModelArchitecture
    batch: BatchSpec
    parallelism: ParallelismSpec
    hardware: HardwareSpec
    precision: _common_pb2.Precision
    tokens: int
    steps: int
    pue: float
    attention_impl: str
    loss_impl: str
    def __init__(self, model: _Optional[_Union[_common_pb2.ModelArchitecture, _Mapping]] = ..., batch: _Optional[_Union[BatchSpec, _Mapping]] = ..., parallelism: _Optional[_Union[ParallelismSpec, _Mapping]] = ..., hardware: _Optional[_Union[HardwareSpec, _Mapping]] = ..., precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., tokens: _Optional[int] = ..., steps: _Optional[int] = ..., pue: _Optional[float] = ..., attention_impl: _Optional[str] = ..., loss_impl: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("name", "tenant", "display_name", "queue", "priority", "spec", "state", "reason", "steps_total", "step", "tokens", "last_step_time_s", "predicted_step_time_s", "mfu", "usage", "eta_s", "created_s", "started_s", "finished_s", "instance", "restarts", "max_restarts", "checkpoint_interval_steps", "last_checkpoint_step", "goodput", "compute_s", "exposed_comm_s", "bubble_s", "preemptions", "lost_steps", "lost_s", "checkpoint_pause_s", "restart_s", "borrowing", "placement_domains", "placement_leaf_groups", "dp_spine_crossings", "estimated_end_s", "reserved_start_s", "failures", "performance_alert", "slowdown", "mean_step_time_s")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Job.State]
        STATE_QUEUED: _ClassVar[Job.State]
        STATE_PLACING: _ClassVar[Job.State]
        STATE_RUNNING: _ClassVar[Job.State]
        STATE_CHECKPOINTING: _ClassVar[Job.State]
        STATE_RESTARTING: _ClassVar[Job.State]
        STATE_PREEMPTED: _ClassVar[Job.State]
        STATE_SUCCEEDED: _ClassVar[Job.State]
        STATE_FAILED: _ClassVar[Job.State]
        STATE_CANCELLED: _ClassVar[Job.State]
    STATE_UNSPECIFIED: Job.State
    STATE_QUEUED: Job.State
    STATE_PLACING: Job.State
    STATE_RUNNING: Job.State
    STATE_CHECKPOINTING: Job.State
    STATE_RESTARTING: Job.State
    STATE_PREEMPTED: Job.State
    STATE_SUCCEEDED: Job.State
    STATE_FAILED: Job.State
    STATE_CANCELLED: Job.State
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    MFU_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    CREATED_S_FIELD_NUMBER: _ClassVar[int]
    STARTED_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_S_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_INTERVAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_COMM_S_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_S_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    LOST_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOST_S_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    RESTART_S_FIELD_NUMBER: _ClassVar[int]
    BORROWING_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_LEAF_GROUPS_FIELD_NUMBER: _ClassVar[int]
    DP_SPINE_CROSSINGS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_END_S_FIELD_NUMBER: _ClassVar[int]
    RESERVED_START_S_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    PERFORMANCE_ALERT_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    MEAN_STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant: str
    display_name: str
    queue: str
    priority: int
    spec: TrainingSpec
    state: Job.State
    reason: str
    steps_total: int
    step: int
    tokens: float
    last_step_time_s: float
    predicted_step_time_s: float
    mfu: float
    usage: _common_pb2.Usage
    eta_s: float
    created_s: float
    started_s: float
    finished_s: float
    instance: str
    restarts: int
    max_restarts: int
    checkpoint_interval_steps: int
    last_checkpoint_step: int
    goodput: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    preemptions: int
    lost_steps: int
    lost_s: float
    checkpoint_pause_s: float
    restart_s: float
    borrowing: bool
    placement_domains: int
    placement_leaf_groups: int
    dp_spine_crossings: int
    estimated_end_s: float
    reserved_start_s: float
    failures: int
    performance_alert: str
    slowdown: float
    mean_step_time_s: float
    def __init__(self, name: _Optional[str] = ..., tenant: _Optional[str] = ..., display_name: _Optional[str] = ..., queue: _Optional[str] = ..., priority: _Optional[int] = ..., spec: _Optional[_Union[TrainingSpec, _Mapping]] = ..., state: _Optional[_Union[Job.State, str]] = ..., reason: _Optional[str] = ..., steps_total: _Optional[int] = ..., step: _Optional[int] = ..., tokens: _Optional[float] = ..., last_step_time_s: _Optional[float] = ..., predicted_step_time_s: _Optional[float] = ..., mfu: _Optional[float] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., eta_s: _Optional[float] = ..., created_s: _Optional[float] = ..., started_s: _Optional[float] = ..., finished_s: _Optional[float] = ..., instance: _Optional[str] = ..., restarts: _Optional[int] = ..., max_restarts: _Optional[int] = ..., checkpoint_interval_steps: _Optional[int] = ..., last_checkpoint_step: _Optional[int] = ..., goodput: _Optional[float] = ..., compute_s: _Optional[float] = ..., exposed_comm_s: _Optional[float] = ..., bubble_s: _Optional[float] = ..., preemptions: _Optional[int] = ..., lost_steps: _Optional[int] = ..., lost_s: _Optional[float] = ..., checkpoint_pause_s: _Optional[float] = ..., restart_s: _Optional[float] = ..., borrowing: _Optional[bool] = ..., placement_domains: _Optional[int] = ..., placement_leaf_groups: _Optional[int] = ..., dp_spine_crossings: _Optional[int] = ..., estimated_end_s: _Optional[float] = ..., reserved_start_s: _Optional[float] = ..., failures: _Optional[int] = ..., performance_alert: _Optional[str] = ..., slowdown: _Optional[float] = ..., mean_step_time_s: _Optional[float] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "cohort", "quota", "used", "borrowed")
    class QuotaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class UsedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BorrowedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    name: str
    cohort: str
    quota: _containers.ScalarMap[str, int]
    used: _containers.ScalarMap[str, int]
    borrowed: _containers.ScalarMap[str, int]
    def __init__(self, name: _Optional[str] = ..., cohort: _Optional[str] = ..., quota: _Optional[_Mapping[str, int]] = ..., used: _Optional[_Mapping[str, int]] = ..., borrowed: _Optional[_Mapping[str, int]] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class UpdateQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "next_page_token")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[Queue]
    next_page_token: str
    def __init__(self, queues: _Optional[_Iterable[_Union[Queue, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetTenantUsageRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class GetTenantUsageResponse(_message.Message):
    __slots__ = ("tenant", "usage", "jobs", "running_jobs", "running_chips", "weight", "chip_hours_share")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_CHIPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CHIP_HOURS_SHARE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    usage: _common_pb2.Usage
    jobs: int
    running_jobs: int
    running_chips: int
    weight: float
    chip_hours_share: float
    def __init__(self, tenant: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ..., running_chips: _Optional[int] = ..., weight: _Optional[float] = ..., chip_hours_share: _Optional[float] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("display_name", "queue", "priority", "spec", "checkpoint_interval_steps", "max_restarts", "request_id")
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_INTERVAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    display_name: str
    queue: str
    priority: int
    spec: TrainingSpec
    checkpoint_interval_steps: int
    max_restarts: int
    request_id: str
    def __init__(self, display_name: _Optional[str] = ..., queue: _Optional[str] = ..., priority: _Optional[int] = ..., spec: _Optional[_Union[TrainingSpec, _Mapping]] = ..., checkpoint_interval_steps: _Optional[int] = ..., max_restarts: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "tenant", "state")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    tenant: str
    state: Job.State
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., tenant: _Optional[str] = ..., state: _Optional[_Union[Job.State, str]] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class WatchJobResponse(_message.Message):
    __slots__ = ("job", "kind", "message")
    JOB_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job: Job
    kind: str
    message: str
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class GetJobTraceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class StepTrace(_message.Message):
    __slots__ = ("step", "start_s", "step_time_s", "compute_s", "exposed_comm_s", "bubble_s", "comm_s")
    class CommSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_COMM_S_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_S_FIELD_NUMBER: _ClassVar[int]
    COMM_S_FIELD_NUMBER: _ClassVar[int]
    step: int
    start_s: float
    step_time_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    comm_s: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., start_s: _Optional[float] = ..., step_time_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., exposed_comm_s: _Optional[float] = ..., bubble_s: _Optional[float] = ..., comm_s: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetJobTraceResponse(_message.Message):
    __slots__ = ("name", "tp", "pp", "dp", "cp", "microbatches", "virtual_stages", "steps")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_STAGES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tp: int
    pp: int
    dp: int
    cp: int
    microbatches: int
    virtual_stages: int
    steps: _containers.RepeatedCompositeFieldContainer[StepTrace]
    def __init__(self, name: _Optional[str] = ..., tp: _Optional[int] = ..., pp: _Optional[int] = ..., dp: _Optional[int] = ..., cp: _Optional[int] = ..., microbatches: _Optional[int] = ..., virtual_stages: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[StepTrace, _Mapping]]] = ...) -> None: ...
