"""Fabric messages <-> domain values: collective ops, traffic classes, flows, links, tiers, topology."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gigacluster.errors import InvalidArgument
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.model.comm import OPS
from gigacluster.runtime.convert import range_msgs
from gigacluster.security.devices import DeviceSet

if TYPE_CHECKING:  # annotations only: the fabric service imports this module (no package cycle)
    from gigacluster.fabric.flows import TierStats
    from gigacluster.fabric.sim import LinkStats
    from gigacluster.fabric.topology import Topology

OP_ENUMS: dict[str, fabric_pb2.CollectiveOp] = {
    op: fabric_pb2.CollectiveOp.Value("COLLECTIVE_OP_" + op.upper()) for op in OPS
}
"""Collective op name (model.comm.OPS, the one table) -> fabric proto enum value."""
OP_NAMES: dict[fabric_pb2.CollectiveOp, str] = {v: k for k, v in OP_ENUMS.items()}
CLASSES: dict[int, str] = {
    fabric_pb2.TRAFFIC_CLASS_UNSPECIFIED: "training",
    fabric_pb2.TRAFFIC_CLASS_TRAINING: "training",
    fabric_pb2.TRAFFIC_CLASS_INFERENCE: "inference",
    fabric_pb2.TRAFFIC_CLASS_STORAGE: "storage",
}
"""Traffic class enum -> the simulator's class name (unspecified is training)."""
FLOW_STATES: dict[str, fabric_pb2.Flow.State] = {
    "running": fabric_pb2.Flow.STATE_RUNNING,
    "done": fabric_pb2.Flow.STATE_DONE,
    "failed": fabric_pb2.Flow.STATE_FAILED,
}
LINK_STATES = {0: fabric_pb2.Link.STATE_UP, 1: fabric_pb2.Link.STATE_DEGRADED, 2: fabric_pb2.Link.STATE_DOWN}
FAULT_KINDS: dict[int, str] = {fabric_pb2.InjectLinkFaultRequest.KIND_DOWN: "down",
               fabric_pb2.InjectLinkFaultRequest.KIND_DEGRADED: "degraded"}


def op_name(value: int) -> str:
    """The collective op of a StartCollective request (INVALID_ARGUMENT lists the allowed ones)."""
    op = OP_NAMES.get(value)  # type: ignore[call-overload]  # protobuf enums are int NewTypes
    if op is None:
        raise InvalidArgument("op", "allowed: COLLECTIVE_OP_ALL_REDUCE, _REDUCE_SCATTER, _ALL_GATHER, "
                                    "_ALL_TO_ALL, _BROADCAST, _SEND_RECV")
    return op


def traffic_class(value: int) -> str:
    if value not in CLASSES:
        raise InvalidArgument("traffic_class", f"unknown traffic class {value}")
    return CLASSES[value]


def fault_kind(value: int) -> str:
    """``down`` or ``degraded`` for an InjectLinkFault request."""
    if value not in FAULT_KINDS:
        raise InvalidArgument("kind", "allowed: KIND_DOWN, KIND_DEGRADED")
    return FAULT_KINDS[value]


def fault_kind_label(value: int) -> str:
    return fabric_pb2.InjectLinkFaultRequest.Kind.Name(value)  # type: ignore[arg-type]


def flow_msg(name: str, state: str, *, algorithm: str, start_s: float, predicted_end_s: float, end_s: float,
             bytes_: float, error: str, tag: str, algbw_gbps: float, busbw_gbps: float) -> fabric_pb2.Flow:
    return fabric_pb2.Flow(name=name, state=FLOW_STATES[state], algorithm=algorithm, start_s=start_s,
                           predicted_end_s=predicted_end_s, end_s=end_s, bytes=bytes_, error=error, tag=tag,
                           algbw_gbps=algbw_gbps, busbw_gbps=busbw_gbps)


def running(msg: fabric_pb2.Flow) -> bool:
    return msg.state == fabric_pb2.Flow.STATE_RUNNING


def topology_msg(summary: Mapping[str, Any], *, now_s: float, nic: str) -> fabric_pb2.GetTopologyResponse:
    s = summary
    return fabric_pb2.GetTopologyResponse(
        chip_type=s["chip"], system=s["system"], chips=s["chips"], switches=s["switches"], links=s["links"],
        chips_per_domain=s["chips_per_domain"], oversubscription=s["oversubscription"],
        bisection_Bps=s["bisection_Bps"], now_s=now_s, switch=s["switch"], nic=nic,
        switch_tiers=s["switch_tiers"], routing=s["routing"],
        tiers=[fabric_pb2.TierSummary(tier=t["tier"], links=t["links"], capacity_Bps=t["capacity_Bps"])
               for t in s["tiers"]],
    )


def link_msgs(topo: Topology, stats: LinkStats, ids: Iterable[int]) -> list[fabric_pb2.Link]:
    return [fabric_pb2.Link(
        name=f"links/{topo.link_name(int(i))}", tier=topo.link_tier_name(int(i)),
        state=LINK_STATES[int(stats.state[i])], capacity_Bps=float(stats.capacity_Bps[i]),
        utilization=float(stats.utilization[i]), active_flows=int(stats.active_flows[i]),
        bytes_carried=float(stats.bytes_carried[i])) for i in np.asarray(list(ids), dtype=np.int64)]


def link_stats_msg(tiers: Sequence[TierStats], active_flows: int, *, now_s: float,
                   cut_off: np.ndarray | None = None, stats_time_s: float = 0.0) -> fabric_pb2.GetLinkStatsResponse:
    """The stats message from the per-tier aggregates (as of ``stats_time_s``); ``cut_off`` is the per-chip mask
    of chips cut off from the scale-out network."""
    return fabric_pb2.GetLinkStatsResponse(
        active_flows=active_flows, now_s=now_s, cut_off_chips=_cut_off_ranges(cut_off), stats_time_s=stats_time_s,
        tiers=[fabric_pb2.TierStats(tier=t.tier, links=t.links, mean_utilization=t.mean_utilization,
                                    max_utilization=t.max_utilization, links_down=t.links_down,
                                    links_degraded=t.links_degraded, busy_link_s=t.busy_link_s,
                                    bytes_carried=t.bytes_carried,
                                    windows_max_utilization=t.windows_max_utilization) for t in tiers])


def cut_off_msg(cut_off: np.ndarray, *, now_s: float) -> fabric_pb2.GetLinkStatsResponse:
    """The answer to ``GetLinkStats(cut_off_only)``: the cut-off chips (per-chip mask) as ranges, no statistics."""
    return fabric_pb2.GetLinkStatsResponse(now_s=now_s, cut_off_chips=_cut_off_ranges(cut_off))


def _cut_off_ranges(cut_off: np.ndarray | None) -> list[Any]:
    cut = DeviceSet.from_mask(cut_off) if cut_off is not None else DeviceSet.empty()
    return range_msgs(zip(cut.starts.tolist(), cut.stops.tolist(), strict=True))


__all__ = ["CLASSES", "OP_ENUMS", "OP_NAMES", "cut_off_msg", "flow_msg", "link_msgs", "link_stats_msg", "op_name",
           "topology_msg", "traffic_class"]
