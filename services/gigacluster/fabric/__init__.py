"""The network fabric model: topologies, routing, max-min fair sharing, collectives as flows.

Pure modules (no gRPC, no I/O, no global mutable state). The fabric service keeps one
:class:`~gigacluster.fabric.sim.FlowSim` for the cluster; the offline ``gigacluster estimate
collective`` command and the training model's :class:`~gigacluster.fabric.comm_model.FabricCommModel`
run the same code on small topologies of their own.

Modules::

    topology     TopologyConfig -> Topology: scale-up domains + rail-optimised fat-tree, as arrays
    routing      shortest up/down paths, ECMP by flow hash or packet spraying, fault-aware
    maxmin       weighted max-min fair rates by vectorised progressive filling (+ a pure-Python baseline)
    collectives  collective algorithms as phases of flows, a selection policy, nccl-tests algbw/busbw
    sim          FlowSim: event-driven flow simulator in virtual seconds, with faults and traffic classes
    flows        the simulator's values: class policies, events, link stats, flow-group state and handles
    estimate     estimate_collective: one collective on an idle fabric (FlowSim), nccl-tests style
    comm_model   FabricCommModel: collective time for the training model, contention included

Exceptions (``SpecError`` is the model package's; the rest are this package's), in the one tree
rooted in :mod:`gigacluster.errors` (a fabric error is INTERNAL on the wire: it is ours, not the caller's)::

    DomainError
    └── ModelError (also ValueError)   gigacluster.model
        ├── SpecError                  bad user input; names the field and the allowed values
        └── FabricError                the fabric cannot do what was asked
            ├── NoPathError            no live path between two chips (after link or switch faults)
            ├── FlowCancelledError     a group ended early on purpose (its instance was released)
            └── UnknownFlowGroupError  a handle id the simulator does not know
"""

from __future__ import annotations

from gigacluster.model import ModelError


class FabricError(ModelError):
    """Base of the fabric package's own errors (not bad user input: that is SpecError)."""


class NoPathError(FabricError):
    """No live path connects two chips; the message names the chips and why."""

    def __init__(self, message: str, *, src_chip: int = -1, dst_chip: int = -1) -> None:
        super().__init__(message)
        self.src_chip = src_chip
        self.dst_chip = dst_chip


class FlowCancelledError(FabricError):
    """A flow group ended before its bytes were sent because its owner asked or lost its devices."""


class UnknownFlowGroupError(FabricError, KeyError):
    """A flow-group (transfer or collective) id that the simulator does not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown flow group"


__all__ = ["FabricError", "NoPathError", "UnknownFlowGroupError"]
