"""The inference plane's pure models: replica engine, KV and prefix cache, routing, metrics.

No gRPC and no I/O here: the router service drives :class:`~.engine.ReplicaEngine` in real time
and sends each iteration's ``Work`` to the chips; :mod:`.sim` drives the same engines in virtual
time for ``gigacluster estimate infer`` and the routing comparison (docs/inference.md).

Modules: ``engine`` (ReplicaConfig, Request, ReplicaEngine, Iteration, TokenEvent), ``work``
(the roofline Work of an iteration), ``kvcache`` (paged blocks + prefix cache), ``hashing``,
``policies`` (RoutingPolicy, POLICIES, make_policy), ``metrics`` (LatencyHistogram,
ServingMetrics), ``tokenizer``, ``workload``, ``sim``, ``estimate``.

Exceptions::

    gigacluster.model.ModelError (ValueError)       bad input, mapped to INVALID_ARGUMENT
    ├── SpecError          a field is invalid (names it and the allowed values)
    └── DoesNotFitError    weights + one full-length sequence of KV exceed HBM
    InferenceError (RuntimeError)
    ├── AdmissionError     queue full or shed; carries retry_after_s (RESOURCE_EXHAUSTED / 429)
    └── EngineStateError   the engine was driven out of order (a bug in the caller)
"""

from gigacluster.inference.engine import (
    CompletionBatch,
    Iteration,
    ReplicaConfig,
    ReplicaEngine,
    ReplicaStats,
    Request,
    RequestSummary,
    TokenEvent,
)
from gigacluster.inference.errors import AdmissionError, EngineStateError, InferenceError
from gigacluster.inference.metrics import LatencyHistogram, ServingMetrics
from gigacluster.inference.policies import POLICIES, ReplicaView, RoutingPolicy, make_policy
from gigacluster.inference.tokenizer import Tokenizer, decode, encode

__all__ = [
    "POLICIES",
    "AdmissionError",
    "CompletionBatch",
    "EngineStateError",
    "InferenceError",
    "Iteration",
    "LatencyHistogram",
    "ReplicaConfig",
    "ReplicaEngine",
    "ReplicaStats",
    "ReplicaView",
    "Request",
    "RequestSummary",
    "RoutingPolicy",
    "ServingMetrics",
    "TokenEvent",
    "Tokenizer",
    "decode",
    "encode",
    "make_policy",
]
