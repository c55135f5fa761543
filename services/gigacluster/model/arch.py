"""Transformer architectures and the presets shared by training and inference models."""

from __future__ import annotations

import dataclasses
from typing import Any

from gigacluster.model import SpecError


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer. ``mlp`` is ``swiglu`` (3 matrices) or ``gelu`` (2)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    mlp: str = "swiglu"

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise SpecError(f"model.{f}", f"must be a positive integer, got {v!r}")
        if self.hidden % self.heads:
            raise SpecError("model.heads", f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise SpecError("model.kv_heads", f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.mlp not in ("swiglu", "gelu"):
            raise SpecError("model.mlp", f"allowed: swiglu, gelu; got {self.mlp!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @property
    def params_per_layer(self) -> int:
        attn = self.hidden * (self.hidden + 2 * self.kv_dim) + self.hidden * self.hidden
        mlp = self.mlp_matrices * self.hidden * self.ffn_hidden
        return attn + mlp

    @property
    def embedding_params(self) -> int:
        """Input embedding plus an untied output projection."""
        return 2 * self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params

    def kv_bytes_per_token(self, bytes_per_elem: float = 2.0) -> float:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2.0 * self.layers * self.kv_dim * bytes_per_elem


# Sources: Llama 3 paper (2024), Table 3; GPT-3 paper (Brown et al. 2020), Table 2.1.
PRESETS: dict[str, ModelArch] = {
    "llama3-8b": ModelArch("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": ModelArch("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": ModelArch("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    "gpt3-175b": ModelArch("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, 2048, mlp="gelu"),
}


def preset(name: str) -> ModelArch:
    if name not in PRESETS:
        raise SpecError("model.preset", f"unknown preset {name!r}; allowed: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


# The architecture fields a spec or a deployment may give instead of (or on top of) a preset.
ARCH_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")


def arch_from_dict(d: dict[str, Any], *, field: str = "model") -> ModelArch:
    """A preset (with optional overrides, e.g. ``seq_len``) or an explicit architecture."""
    if not isinstance(d, dict):
        raise SpecError(field, "must be a mapping with `preset` or `layers`, `hidden`, `heads`, ...")
    known = {"preset", "name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "mlp"}
    extra = set(d) - known
    if extra:
        raise SpecError(f"{field}.{sorted(extra)[0]}", f"unknown field; allowed: {', '.join(sorted(known))}")
    if "preset" in d:
        base = preset(str(d["preset"]))
        over = {k: v for k, v in d.items() if k not in ("preset", "name")}
        return dataclasses.replace(base, **over) if over else base
    for req in ("layers", "hidden", "heads", "vocab", "seq_len"):
        if req not in d:
            raise SpecError(f"{field}.{req}", "required when no preset is given")
    hidden = d["hidden"]
    return ModelArch(
        name=str(d.get("name", "custom")),
        layers=d["layers"],
        hidden=hidden,
        heads=d["heads"],
        kv_heads=d.get("kv_heads", d["heads"]),
        ffn_hidden=d.get("ffn_hidden", 4 * hidden if isinstance(hidden, int) else hidden),
        vocab=d["vocab"],
        seq_len=d["seq_len"],
        mlp=d.get("mlp", "swiglu"),
    )
