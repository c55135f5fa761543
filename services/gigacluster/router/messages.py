"""All proto <-> domain conversion of the router: the deploy request in, deployments, stats and chunks out."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument, Unavailable
from gigacluster.hw.catalog import chip_names, default_system, get_system
from gigacluster.inference.engine import ReplicaConfig
from gigacluster.inference.policies import POLICIES
from gigacluster.inference.request import RequestSummary
from gigacluster.model.arch import ARCH_FIELDS, ARCH_TEXT_FIELDS, MOE_ARCH_FIELDS, arch_from_dict
from gigacluster.router.deployment import LiveDeployment
from gigacluster.router.generation import Chunk
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import convert
from gigacluster.runtime.config import RouterConfig

MAX_NAME_CHARS = 64  # preset and chip names: refused before lookup, so no error echoes a long one
STATES = {"deploying": 1, "ready": 2, "failed": 3, "deleting": 4, "degraded": 5}


@dataclasses.dataclass(frozen=True)
class DeploySpec:
    """A validated DeployModelRequest: replica config, routing policy and replica counts."""

    cfg: ReplicaConfig
    policy: str
    replicas: int
    n_pre: int
    n_dec: int




def deploy_spec(request: router_pb2.DeployModelRequest, c: RouterConfig) -> DeploySpec:
    """Validate a DeployModelRequest against the configured bounds (no work, no broker call)."""
    if not request.HasField("model"):
        raise InvalidArgument("model", "required: a preset (e.g. llama3-8b) or an architecture")
    m = request.model
    if len(m.preset) > MAX_NAME_CHARS or len(request.chip) > MAX_NAME_CHARS:
        raise InvalidArgument("model.preset" if len(m.preset) > MAX_NAME_CHARS else "chip",
                              f"at most {MAX_NAME_CHARS} characters")
    arch = arch_from_dict(arch_fields(m))
    if request.chip not in chip_names():
        raise InvalidArgument("chip", f"allowed: {', '.join(chip_names())}; got {request.chip[:64]!r}")
    tp = int(request.tp) or 1
    dom = get_system(default_system(request.chip)).chips
    if tp > dom:
        raise InvalidArgument("tp", f"must be <= {dom} (one {request.chip} scale-up domain), got {tp}")
    ep = int(request.ep) or 1  # bounded by the model's experts, which it must divide (ReplicaConfig)
    n_pre, n_dec = int(request.prefill_replicas), int(request.decode_replicas)
    if (n_pre > 0) != (n_dec > 0):
        raise InvalidArgument("decode_replicas" if n_pre else "prefill_replicas",
                              "a disaggregated deployment needs both prefill_replicas and decode_replicas > 0")
    if n_pre and request.replicas not in (0, n_pre + n_dec):
        raise InvalidArgument("replicas", f"leave 0 (or {n_pre + n_dec}) with prefill/decode replicas, "
                                          f"got {request.replicas}")
    replicas = n_pre + n_dec or int(request.replicas) or 1
    if replicas > c.max_replicas:
        raise InvalidArgument("replicas", f"must be <= {c.max_replicas} (router max_replicas), got {replicas}")
    for field, value, limit in (("max_queue", int(request.max_queue), c.max_queue_limit),
                                ("max_batch", int(request.max_batch), c.max_batch_limit)):
        if value > limit:
            raise InvalidArgument(field, f"must be <= {limit} (router {field}_limit), got {value}")
    policy_name = request.policy or "least_outstanding"
    if policy_name not in POLICIES:
        raise InvalidArgument("policy", f"allowed: {', '.join(sorted(POLICIES))}; got {policy_name[:64]!r}")
    kv = request.kv_fraction or 0.9
    if not 0 < kv <= 1:  # also refuses NaN
        raise InvalidArgument("kv_fraction", f"must be in (0, 1], got {kv}")
    cfg = ReplicaConfig(arch=arch, chip=request.chip, tp=tp, ep=ep,
                        precision=convert.precision_name(request.precision),
                        max_batch=int(request.max_batch) or 256, kv_fraction=kv,
                        max_queue=int(request.max_queue) or 1024, chunked_prefill=bool(request.chunked_prefill))
    return DeploySpec(cfg, policy_name, replicas, n_pre, n_dec)


def arch_fields(m: common_pb2.ModelArchitecture) -> dict[str, object]:
    """A ModelArchitecture as the mapping ``arch_from_dict`` reads: the dense, MoE/MLA/window and text
    fields (zero and empty fields left to the preset or the defaults), so an MoE model runs as MoE."""
    for k in ARCH_TEXT_FIELDS:
        if len(getattr(m, k)) > MAX_NAME_CHARS:
            raise InvalidArgument(f"model.{k}", f"at most {MAX_NAME_CHARS} characters")
    d: dict[str, object] = {"preset": m.preset} if m.preset else {}
    d.update({k: int(getattr(m, k)) for k in (*ARCH_FIELDS, *MOE_ARCH_FIELDS) if getattr(m, k)})
    d.update({k: str(getattr(m, k)) for k in ARCH_TEXT_FIELDS if getattr(m, k)})
    return d


def shard_endpoint(inv: Any, devs: list[tuple[int, int]]) -> str:
    """The endpoint of the chip shard holding the first of ``devs`` (from a GetInventory answer)."""
    for s in inv.shards:
        if s.devices.start <= devs[0][0] < s.devices.end:
            return str(s.endpoint)
    raise Unavailable(f"no chip shard in the inventory holds device {devs[0][0]}; retry")


def shard_ranges(inv: Any, devs: list[tuple[int, int]]) -> list[tuple[str, list[tuple[int, int]]]]:
    """``devs`` split by the chip shard holding them: (endpoint, ranges on it), the first device's shard first.

    A wide expert-parallel replica can span shards; each books its own devices' work and memory."""
    out: dict[str, list[tuple[int, int]]] = {shard_endpoint(inv, devs): []}
    for a, b in devs:
        for s in inv.shards:
            lo, hi = max(a, int(s.devices.start)), min(b, int(s.devices.end))
            if lo < hi:
                out.setdefault(str(s.endpoint), []).append((lo, hi))
    covered = sum(b - a for rs in out.values() for a, b in rs)
    if covered != sum(b - a for a, b in devs):
        raise Unavailable(f"the inventory's shards do not hold all of devices {devs[0][0]}..{devs[-1][1] - 1}; retry")
    return list(out.items())


def arch_msg(dep: LiveDeployment) -> common_pb2.ModelArchitecture:
    """The deployment's architecture, MoE/MLA/window fields included (head_dim is the dataclass's attn_head_dim)."""
    a = dep.cfg.arch
    moe = {k: int(getattr(a, "attn_head_dim" if k == "head_dim" else k)) for k in MOE_ARCH_FIELDS}
    return common_pb2.ModelArchitecture(preset=a.name, layers=a.layers, hidden=a.hidden, heads=a.heads,
                                        kv_heads=a.kv_heads, ffn_hidden=a.ffn_hidden, vocab=a.vocab, seq_len=a.seq_len,
                                        mlp=a.mlp, attention=a.attention, **moe)


def deployment_msg(dep: LiveDeployment) -> router_pb2.Deployment:
    c = dep.cfg
    state, reason = dep.health()
    return router_pb2.Deployment(
        name=dep.name, tenant=dep.tenant, model=arch_msg(dep), chip=c.chip, tp=c.tp, replicas=len(dep.replicas),
        max_batch=c.max_batch, kv_fraction=c.kv_fraction, precision=convert.PRECISION_ENUMS[c.precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
        policy=dep.policy_name, state=STATES[state], reason=reason,  # type: ignore[arg-type]
        instances=list(dict.fromkeys(r.instance for r in dep.replicas)),
        kv_cache_bytes_per_replica=int(c.kv_cache_bytes),
        max_queue=c.max_queue, prefill_replicas=len(dep.pool("prefill")), decode_replicas=len(dep.pool("decode")),
        chunked_prefill=c.chunked_prefill, ep=c.ep, chips_per_replica=c.chips,
    )


def latency_summary(d: dict[str, float]) -> common_pb2.LatencySummary:
    return common_pb2.LatencySummary(count=int(d["count"]), p50_s=d["p50"], p90_s=d["p90"], p99_s=d["p99"],
                                     p999_s=d["p99.9"], mean_s=d["mean"], max_s=d["max"])




def generate_response(c: Chunk, into: router_pb2.GenerateResponse | None = None) -> router_pb2.GenerateResponse:
    """One chunk of tokens as a GenerateResponse, with the request's usage on the last; filled in place when
    ``into`` is given (the core builds its link frames' chunks where they will be sent, with no copy)."""
    resp = router_pb2.GenerateResponse() if into is None else into
    resp.request_id = c.request_id
    resp.index = c.index
    resp.token_ids.extend(c.token_ids)
    resp.text = c.text
    resp.time_s = c.time_s
    resp.replica = c.replica
    if c.finish_reason:
        resp.finish_reason = c.finish_reason
    if c.token_times_s:
        resp.token_times_s.extend(c.token_times_s)
    s = c.summary
    if s is not None:
        u = resp.usage
        u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens = s.prompt_tokens, s.output_tokens, s.cached_tokens
        u.queue_s, u.ttft_s, u.e2e_s, u.energy_j = s.queue_s, s.ttft_s, s.e2e_s, s.energy_j
        u.kv_transfer_s, u.kv_transfer_bytes = s.kv_transfer_s, c.kv_transfer_bytes
        u.prefill_replica = c.prefill_replica
    return resp


def stats_msg(d: LiveDeployment) -> router_pb2.DeploymentStats:
    """A deployment's serving statistics (latency summaries, throughput, cache and queue)."""
    s: Any = d.stats_snapshot()
    return router_pb2.DeploymentStats(
        deployment=d.name, ttft=latency_summary(s["ttft_s"]), tpot=latency_summary(s["tpot_s"]),
        itl=latency_summary(s["itl_s"]), e2e=latency_summary(s["e2e_s"]), queue=latency_summary(s["queue_s"]),
        tokens_per_s=float(s["output_tokens_per_s"]), kv_cache_usage=float(s["kv_used_now"]),
        prefix_hit_rate=float(s["prefix_hit_rate"]),
        queue_depth=int(s["queue_depth"]),
        running=int(s["running"]), completed=int(s["requests"]),
        rejected=int(s["rejected"]) + int(s["shed"]),
        kv_transfers=int(s["kv_transfers"]),
        kv_transfer_bytes=float(s["kv_transfer_bytes"]),
        a2a_flows=int(s["a2a_flows"]), a2a_bytes=float(s["a2a_bytes"]),
    )


def merged(chunks: Sequence[router_pb2.GenerateResponse]) -> router_pb2.GenerateResponse:
    """Chunks of one request that piled up, as one message (their tokens and text; the last one's time,
    finish and usage)."""
    if len(chunks) == 1:
        return chunks[0]
    out = router_pb2.GenerateResponse()
    out.CopyFrom(chunks[-1])
    out.index = chunks[0].index
    del out.token_ids[:]
    for c in chunks:
        out.token_ids.extend(c.token_ids)
    out.text = "".join(c.text for c in chunks)
    if any(c.token_times_s for c in chunks):  # stamped tokens (the event clock) keep each one's time
        del out.token_times_s[:]
        for c in chunks:
            out.token_times_s.extend(c.token_times_s or [c.time_s] * len(c.token_ids))
        if len(set(out.token_times_s)) == 1:
            del out.token_times_s[:]
    return out


def chunk_of(r: router_pb2.GenerateResponse) -> Chunk:
    """A GenerateResponse as the HTTP API's :class:`Chunk` (its usage as a summary with the same timings)."""
    summary = None
    if r.HasField("usage"):
        u = r.usage
        summary = RequestSummary(
            request_id=r.request_id, tenant="", priority=0, arrival_s=0.0, first_scheduled_s=u.queue_s,
            first_token_s=u.ttft_s, finish_s=u.e2e_s, prompt_tokens=u.prompt_tokens,
            output_tokens=u.completion_tokens, cached_tokens=u.cached_prompt_tokens, preemptions=0,
            finish_reason=r.finish_reason, kv_transfer_s=u.kv_transfer_s, energy_j=u.energy_j)
    return Chunk(request_id=r.request_id, index=r.index, token_ids=list(r.token_ids), text=r.text, time_s=r.time_s,
                 replica=r.replica, finish_reason=r.finish_reason, summary=summary,
                 prefill_replica=r.usage.prefill_replica, kv_transfer_bytes=r.usage.kv_transfer_bytes,
                 token_times_s=tuple(r.token_times_s))


def generate_request(model: str, text: str | None, token_ids: Sequence[int] | None, request_id: str,
                     stop: Sequence[str], ignore_eos: bool) -> router_pb2.GenerateRequest:
    """A Generate's request as a front end forwards it to the core (max_tokens and priority go beside it)."""
    req = router_pb2.GenerateRequest(model=model, request_id=request_id, stop=stop, ignore_eos=ignore_eos)
    if text is not None:
        req.text = text
    elif token_ids is not None:
        req.token_ids.ids.extend(token_ids)
    return req


def generate_args(request: router_pb2.GenerateRequest) -> dict[str, Any]:
    """A GenerateRequest as the keyword arguments of ``generate`` (max_tokens 0: no limit set)."""
    which = request.WhichOneof("prompt")
    return {"text": request.text if which == "text" else None,
            "token_ids": list(request.token_ids.ids) if which == "token_ids" else None,
            "max_tokens": int(request.max_tokens) or None, "priority": int(request.priority),
            "request_id": request.request_id, "stop": list(request.stop), "ignore_eos": bool(request.ignore_eos)}
