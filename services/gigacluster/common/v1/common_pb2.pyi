from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Precision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECISION_UNSPECIFIED: _ClassVar[Precision]
    PRECISION_FP32: _ClassVar[Precision]
    PRECISION_TF32: _ClassVar[Precision]
    PRECISION_BF16: _ClassVar[Precision]
    PRECISION_FP8: _ClassVar[Precision]
    PRECISION_FP16: _ClassVar[Precision]
    PRECISION_MXFP6: _ClassVar[Precision]
    PRECISION_MXFP4: _ClassVar[Precision]
    PRECISION_NVFP4: _ClassVar[Precision]
PRECISION_UNSPECIFIED: Precision
PRECISION_FP32: Precision
PRECISION_TF32: Precision
PRECISION_BF16: Precision
PRECISION_FP8: Precision
PRECISION_FP16: Precision
PRECISION_MXFP6: Precision
PRECISION_MXFP4: Precision
PRECISION_NVFP4: Precision

class DeviceRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("energy_it_j", "energy_facility_j", "chip_hours", "cost_usd")
    ENERGY_IT_J_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FACILITY_J_FIELD_NUMBER: _ClassVar[int]
    CHIP_HOURS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    energy_it_j: float
    energy_facility_j: float
    chip_hours: float
    cost_usd: float
    def __init__(self, energy_it_j: _Optional[float] = ..., energy_facility_j: _Optional[float] = ..., chip_hours: _Optional[float] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class ModelArchitecture(_message.Message):
    __slots__ = ("preset", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "head_dim", "attention", "mlp", "sliding_window", "global_attention_every", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "experts", "experts_per_token", "shared_experts", "expert_ffn_hidden", "first_dense_layers", "mtp_layers")
    PRESET_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    FFN_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    MLP_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_ATTENTION_EVERY_FIELD_NUMBER: _ClassVar[int]
    Q_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    KV_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    QK_ROPE_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    V_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SHARED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    EXPERT_FFN_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    FIRST_DENSE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    MTP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    preset: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    head_dim: int
    attention: str
    mlp: str
    sliding_window: int
    global_attention_every: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    v_head_dim: int
    experts: int
    experts_per_token: int
    shared_experts: int
    expert_ffn_hidden: int
    first_dense_layers: int
    mtp_layers: int
    def __init__(self, preset: _Optional[str] = ..., layers: _Optional[int] = ..., hidden: _Optional[int] = ..., heads: _Optional[int] = ..., kv_heads: _Optional[int] = ..., ffn_hidden: _Optional[int] = ..., vocab: _Optional[int] = ..., seq_len: _Optional[int] = ..., head_dim: _Optional[int] = ..., attention: _Optional[str] = ..., mlp: _Optional[str] = ..., sliding_window: _Optional[int] = ..., global_attention_every: _Optional[int] = ..., q_lora_rank: _Optional[int] = ..., kv_lora_rank: _Optional[int] = ..., qk_rope_head_dim: _Optional[int] = ..., v_head_dim: _Optional[int] = ..., experts: _Optional[int] = ..., experts_per_token: _Optional[int] = ..., shared_experts: _Optional[int] = ..., expert_ffn_hidden: _Optional[int] = ..., first_dense_layers: _Optional[int] = ..., mtp_layers: _Optional[int] = ...) -> None: ...

class LatencySummary(_message.Message):
    __slots__ = ("count", "p50_s", "p90_s", "p99_s", "p999_s", "mean_s", "max_s")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    P50_S_FIELD_NUMBER: _ClassVar[int]
    P90_S_FIELD_NUMBER: _ClassVar[int]
    P99_S_FIELD_NUMBER: _ClassVar[int]
    P999_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_S_FIELD_NUMBER: _ClassVar[int]
    MAX_S_FIELD_NUMBER: _ClassVar[int]
    count: int
    p50_s: float
    p90_s: float
    p99_s: float
    p999_s: float
    mean_s: float
    max_s: float
    def __init__(self, count: _Optional[int] = ..., p50_s: _Optional[float] = ..., p90_s: _Optional[float] = ..., p99_s: _Optional[float] = ..., p999_s: _Optional[float] = ..., mean_s: _Optional[float] = ..., max_s: _Optional[float] = ...) -> None: ...
