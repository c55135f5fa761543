"""A seeded request generator that walks every RPC from the proto descriptors (no grpc import).

Requests are built field by field from each method's input descriptor with malformed, extreme and
random values; ``raw`` cases send random bytes as the whole body. ``describe`` renders a request
short enough to quote in a failure list.
"""

from __future__ import annotations

import importlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

SERVICES = ("chip", "fabric", "broker", "scheduler", "router")
MB = 1 << 20
MAX_REQUEST_BYTES = 2 * MB  # under gRPC's 4 MB receive limit, so every status is the service's own
MAX_DEPTH = 4
BIG_REPEAT = 2000  # "deep" repeated scalars, within a bound

U64 = [0, 1, 7, 2**64 - 1, 2**63, 2**32, 2**32 - 1, 2**63 - 1]
I64 = [0, -1, 1, 2**63 - 1, -(2**63), 2**31 - 1, -(2**31), 2**32]
U32 = [0, 1, 3, 8, 2**32 - 1, 2**31, 2**16]
I32 = [0, -1, 1, 2**31 - 1, -(2**31), 99999]
FLOATS = [math.nan, math.inf, -math.inf, 1e308, -1e308, -1.0, 0.0, 5e-324, 1e30, 1.5, 3.0]
NAMES = ["tenants/fuzz", "tenants/nobody", "instances/i-1", "instances/i-999999", "deployments/fz", "fz",
         "deployments/nope", "jobs/j-1", "jobs/j-999999", "flows/f-1", "allocations/1", "links/a-b",
         "tenants/fuzz/queues/q", "h100-sxm", "llama3-8b", "matmul", "prefix_aware", "nvlink"]
NASTY = ["", " ", "\x00", "é\u202e\u0000", "../../etc/passwd", "%s%n%x", "' OR 1=1 --", "a" * 300,
         "tenants/" + "x" * 200, "{{7*7}}", "\ud7ff" * 10]


@dataclass(frozen=True)
class Rpc:
    service: str
    name: str
    path: str  # /package.Service/Method
    input: Descriptor
    server_streaming: bool
    client_streaming: bool


def all_rpcs() -> list[Rpc]:
    """Every RPC of every gigacluster service, read from the generated descriptors."""
    out: list[Rpc] = []
    for svc in SERVICES:
        pb2 = importlib.import_module(f"gigacluster.{svc}.v1.{svc}_pb2")
        for sd in pb2.DESCRIPTOR.services_by_name.values():
            for m in sd.methods:
                out.append(_rpc(svc, sd.full_name, m))
    return out


def _rpc(svc: str, full: str, m: MethodDescriptor) -> Rpc:
    return Rpc(svc, m.name, f"/{full}/{m.name}", m.input_type, bool(m.server_streaming), bool(m.client_streaming))


def message_class(desc: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(desc)  # type: ignore[no-any-return]


class Generator:
    """Seeded requests for one RPC: ``cases(rpc, n)`` yields (kind, body bytes, request or None)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._huge_used = False

    # -- scalars ---------------------------------------------------------------------------------
    def _string(self) -> str:
        r = self.rng.random()
        if r < 0.02 and not self._huge_used:
            self._huge_used = True
            return "A" * MB
        if r < 0.45:
            return self.rng.choice(NAMES)
        if r < 0.75:
            return self.rng.choice(NASTY)
        n = self.rng.choice([1, 8, 64, 1000])
        return "".join(chr(self.rng.randint(32, 0x2FF)) for _ in range(n))

    def _bytes(self) -> bytes:
        r = self.rng.random()
        if r < 0.03 and not self._huge_used:
            self._huge_used = True
            return self.rng.randbytes(MB)
        return self.rng.randbytes(self.rng.choice([0, 1, 16, 4096]))

    def scalar(self, f: FieldDescriptor, extreme: str | None = None) -> Any:
        t = f.type
        if t == FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            if extreme == "max":
                return 1e308 if t == FieldDescriptor.TYPE_DOUBLE else 3.4e38
            if extreme == "nan":
                return math.nan
            if extreme == "neg":
                return -1.0
            return self.rng.choice(FLOATS) if self.rng.random() < 0.8 else self.rng.uniform(-1e6, 1e6)
        if t == FieldDescriptor.TYPE_STRING:
            if extreme == "max":
                return "Z" * 100_000
            return "" if extreme else self._string()
        if t == FieldDescriptor.TYPE_BYTES:
            return self.rng.randbytes(100_000) if extreme == "max" else self._bytes()
        if t == FieldDescriptor.TYPE_ENUM:
            vals = [v.number for v in f.enum_type.values]
            if extreme:
                return 2**31 - 1 if extreme == "max" else -1
            return self.rng.choice(vals) if self.rng.random() < 0.7 else self.rng.choice([77, -1, 2**31 - 1])
        unsigned = t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_UINT32,
                         FieldDescriptor.TYPE_FIXED32)
        wide = t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_INT64,
                     FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64)
        pool = (U64 if wide else U32) if unsigned else (I64 if wide else I32)
        if extreme == "max":
            return max(pool)
        if extreme in ("neg", "nan"):
            return 0 if unsigned else min(pool)
        return self.rng.choice(pool) if self.rng.random() < 0.8 else self.rng.randint(0, 64)

    # -- messages --------------------------------------------------------------------------------
    def fill(self, msg: Message, depth: int = 0, extreme: str | None = None, p_set: float = 0.6) -> None:
        for f in msg.DESCRIPTOR.fields:
            if extreme is None and self.rng.random() > p_set:
                continue
            try:
                self._set(msg, f, depth, extreme)
            except (ValueError, TypeError, OverflowError):
                continue  # a value the field's type cannot hold (e.g. a float32 overflow): skip it

    def _set(self, msg: Message, f: FieldDescriptor, depth: int, extreme: str | None) -> None:
        is_msg = f.type == FieldDescriptor.TYPE_MESSAGE
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            m = getattr(msg, f.name)
            kf, vf = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            for _ in range(self.rng.choice([1, 3, 50])):
                k = self.scalar(kf)
                if vf.type == FieldDescriptor.TYPE_MESSAGE:
                    self.fill(m[k], depth + 1, extreme)
                else:
                    m[k] = self.scalar(vf, extreme)
            return
        if f.is_repeated:
            seq = getattr(msg, f.name)
            n = self.rng.choice([0, 1, 2, 5, 50 if is_msg else BIG_REPEAT]) if extreme is None else 3
            if is_msg:
                if depth >= MAX_DEPTH:
                    return
                for _ in range(min(n, 200)):
                    self.fill(seq.add(), depth + 1, extreme)
            else:
                seq.extend(self.scalar(f, extreme) for _ in range(n))
            return
        if is_msg:
            if depth < MAX_DEPTH:
                self.fill(getattr(msg, f.name), depth + 1, extreme)
                getattr(msg, f.name).SetInParent()
            return
        setattr(msg, f.name, self.scalar(f, extreme))

    def request(self, rpc: Rpc, kind: str) -> Message:
        for _ in range(5):
            self._huge_used = False
            msg = message_class(rpc.input)()
            if kind == "empty":
                return msg
            self.fill(msg, extreme=None if kind == "random" else kind)
            if msg.ByteSize() <= MAX_REQUEST_BYTES:
                return msg
        return message_class(rpc.input)()

    def cases(self, rpc: Rpc, n: int) -> Iterator[tuple[str, bytes, Message | None]]:
        """``n`` cases: the empty request, each extreme, then random ones, one in eight raw bytes."""
        fixed = ["empty", "max", "neg", "nan"]
        for i in range(n):
            kind = fixed[i] if i < len(fixed) else ("raw" if self.rng.random() < 0.125 else "random")
            if kind == "raw":
                body = self.rng.randbytes(self.rng.choice([1, 7, 64, 4096]))
                yield kind, body, None
            else:
                msg = self.request(rpc, kind)
                yield kind, msg.SerializeToString(), msg


def describe(msg: Message | None, body: bytes, limit: int = 240) -> str:
    """A short rendering of a request: long strings and lists are elided with their length."""
    if msg is None:
        return f"raw {len(body)} random bytes {body[:8].hex()}..."
    parts = []
    for f, v in msg.ListFields():
        parts.append(f"{f.name}={_short(v)}")
    out = "{" + ", ".join(parts) + "}"
    return out if len(out) <= limit else out[:limit] + "...}"


def _short(v: Any) -> str:
    if isinstance(v, Message):
        return describe(v, b"", limit=120)
    if isinstance(v, str | bytes):
        return repr(v) if len(v) <= 24 else f"{v[:12]!r}...(len {len(v)})"
    if hasattr(v, "__len__") and not isinstance(v, str | bytes):
        items = list(v.items()) if hasattr(v, "items") else list(v)
        head = ", ".join(_short(x) for x in items[:3])
        return f"[{head}{', ...' if len(items) > 3 else ''}](n={len(items)})"
    return repr(v)
