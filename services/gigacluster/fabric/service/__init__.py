"""The fabric service in parts: flow book, simulator driver, request checks, thin servicer, composition."""

from __future__ import annotations

from gigacluster.fabric.service.book import FlowBook, FlowRecord, FlowStatus
from gigacluster.fabric.service.driver import SimDriver
from gigacluster.fabric.service.service import FabricService
from gigacluster.fabric.service.servicer import FabricServicer

__all__ = ["FabricService", "FabricServicer", "FlowBook", "FlowRecord", "FlowStatus", "SimDriver"]
