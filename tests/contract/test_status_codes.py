"""Every RPC answers bad input with a precise status and a message that names the field.

Run against the real five-process mesh: missing, negative and absurd fields get
INVALID_ARGUMENT naming the field; unknown names NOT_FOUND; calls without credentials
UNAUTHENTICATED. ``test_every_rpc_has_a_case`` keeps this table complete as the protos grow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.errors import error_info
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack

pytestmark = [pytest.mark.contract, pytest.mark.integration]
IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
FP, RE, AE = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ALREADY_EXISTS
R = common_pb2.DeviceRange
M = common_pb2.ModelArchitecture
BASE = [0]  # first device of the tenant's 8-device instance on chip shard 0 (set by the fixture)


def dev(a: int, b: int) -> common_pb2.DeviceRange:
    """Devices [a, b) of the tenant's instance."""
    return R(start=BASE[0] + a, end=BASE[0] + b)


def work(**kw: Any) -> chip_pb2.WorkItem:
    base = {"kind": "matmul", "flops": 1e12, "bytes": 1e9, "precision": common_pb2.PRECISION_BF16, "count": 1}
    base.update(kw)
    return chip_pb2.WorkItem(**base)


def spec(**over: Any) -> scheduler_pb2.TrainingSpec:
    s = scheduler_pb2.TrainingSpec(
        model=M(preset="llama3-8b", seq_len=2048), batch=scheduler_pb2.BatchSpec(global_batch=16),
        parallelism=scheduler_pb2.ParallelismSpec(tp=8), hardware=scheduler_pb2.HardwareSpec(chip="h100-sxm", count=8),
        precision=common_pb2.PRECISION_BF16, steps=2)
    for path, value in over.items():
        obj: Any = s
        *parents, leaf = path.split(".")
        for p in parents:
            obj = getattr(obj, p)
        if isinstance(value, M):
            obj.model.CopyFrom(value) if leaf == "model" else None
        else:
            setattr(obj, leaf, value)
    return s


# (service, rpc, request factory, who calls, expected code, text the message must contain)
# who: "tenant" (API key), "cap" (the tenant's capability for its 8 devices, dev(0, 8)), "admin".
CASES: list[tuple[str, str, Callable[[], Any], str, grpc.StatusCode, str]] = [
    # chip
    ("chip", "GetShard", lambda: chip_pb2.GetShardRequest(), "tenant", grpc.StatusCode.OK, ""),
    ("chip", "ListDevices", lambda: chip_pb2.ListDevicesRequest(page_token="zz"), "admin", IA, "page_token"),
    ("chip", "ListDevices", lambda: chip_pb2.ListDevicesRequest(devices=[R(start=9000, end=9001)]), "admin", NF,
     "devices"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(items=[work()]), "cap", IA, "devices"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)]), "cap", IA, "items"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work(flops=-1)]),
     "cap", IA, "items[0].flops"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work(flops=1e30)]),
     "cap", IA, "items[0].flops"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)],
                                                                items=[work(kind="quantum")]), "cap", IA,
     "items[0].kind"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()],
                                                                not_before_s=-5), "cap", IA, "not_before_s"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[R(start=5000, end=5008)], items=[work()]),
     "cap", NF, "devices"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(iterations=[chip_pb2.WorkIteration(items=[work()])]),
     "cap", IA, "devices"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[dev(0, 8)], iterations=[chip_pb2.WorkIteration(items=[work(kind="quantum")])]), "cap", IA,
     "iterations[0].items[0].kind"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[dev(0, 8)], iterations=[chip_pb2.WorkIteration(items=[work()])]), "cap", grpc.StatusCode.OK, ""),
    ("chip", "AllocateMemory", lambda: chip_pb2.AllocateMemoryRequest(device=BASE[0], size_bytes=0), "cap", IA,
     "size_bytes"),
    ("chip", "AllocateMemory", lambda: chip_pb2.AllocateMemoryRequest(device=9999, size_bytes=10), "cap", NF,
     "device"),
    ("chip", "SetMemoryInUse", lambda: chip_pb2.SetMemoryInUseRequest(bytes_per_device=1), "cap", IA, "devices"),
    ("chip", "SetMemoryInUse", lambda: chip_pb2.SetMemoryInUseRequest(devices=[R(start=5000, end=5008)],
                                                                      bytes_per_device=1), "cap", NF, "devices"),
    ("chip", "FreeMemory", lambda: chip_pb2.FreeMemoryRequest(name="nope"), "cap", IA, "name"),
    ("chip", "FreeMemory", lambda: chip_pb2.FreeMemoryRequest(name="allocations/987654"), "cap", NF, "987654"),
    ("chip", "WriteMemory", lambda: chip_pb2.WriteMemoryRequest(name="", data=b"x"), "cap", IA, "name"),
    ("chip", "ReadMemory", lambda: chip_pb2.ReadMemoryRequest(name="allocations/1", length=1 << 40), "cap", RE,
     "length"),
    ("chip", "ScrubInstance", lambda: chip_pb2.ScrubInstanceRequest(), "admin", IA, "instance"),
    ("chip", "InjectFault", lambda: chip_pb2.InjectFaultRequest(kind=chip_pb2.FAULT_KIND_FAILED), "admin", IA,
     "devices"),
    ("chip", "InjectFault", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=20, end=21)],
                                                                kind=chip_pb2.FAULT_KIND_SLOW, clock_factor=3),
     "admin", IA, "clock_factor"),
    ("chip", "ClearFault", lambda: chip_pb2.ClearFaultRequest(devices=[R(start=3, end=2)]), "admin", IA,
     "devices[0]"),
    ("chip", "GetStats", lambda: chip_pb2.GetStatsRequest(devices=[R(start=7000, end=7001)]), "admin", NF,
     "devices"),
    # fabric
    ("chip", "ExecuteWindow", lambda: chip_pb2.ExecuteWindowRequest(
        work=chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()]), period_s=1.0), "cap", IA, "repeat"),
    ("chip", "ExecuteWindow", lambda: chip_pb2.ExecuteWindowRequest(
        # shorter than the work on these devices now: a state of the devices (a slow chip), not a malformed field
        work=chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()]), repeat=3, period_s=1e-9), "cap", FP,
     "period_s"),
    ("chip", "ExecuteWindow", lambda: chip_pb2.ExecuteWindowRequest(
        work=chip_pb2.ExecuteWorkRequest(devices=[R(start=5000, end=5008)], items=[work()]), repeat=3,
        period_s=1.0), "cap", NF, "devices"),
    ("chip", "CutWork", lambda: chip_pb2.CutWorkRequest(at_s=1.0), "cap", IA, "devices"),
    ("chip", "CutWork", lambda: chip_pb2.CutWorkRequest(devices=[dev(0, 8)], at_s=-1.0), "cap", IA, "at_s"),
    ("fabric", "GetTopology", lambda: fabric_pb2.GetTopologyRequest(), "admin", grpc.StatusCode.OK, ""),
    ("fabric", "ListLinks", lambda: fabric_pb2.ListLinksRequest(tier="bogus"), "admin", IA, "tier"),
    ("fabric", "StartTransfer", lambda: fabric_pb2.StartTransferRequest(
        src_device=BASE[0], dst_device=BASE[0] + 1, bytes=-1),
     "cap", IA, "bytes"),
    ("fabric", "StartTransfer", lambda: fabric_pb2.StartTransferRequest(
        src_device=BASE[0], dst_device=BASE[0], bytes=10),
     "cap", IA, "dst_device"),
    ("fabric", "StartTransfer", lambda: fabric_pb2.StartTransferRequest(src_device=BASE[0], dst_device=99999, bytes=10),
     "cap", NF, "dst_device"),
    ("fabric", "StartCollective", lambda: fabric_pb2.StartCollectiveRequest(ranks=[dev(0, 8)], bytes=1e6),
     "cap", IA, "op"),
    ("fabric", "StartCollective", lambda: fabric_pb2.StartCollectiveRequest(
        op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, bytes=1e6), "cap", IA, "ranks"),
    ("fabric", "StartCollective", lambda: fabric_pb2.StartCollectiveRequest(
        op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, ranks=[dev(0, 8)], bytes=1e300), "cap", IA, "bytes"),
    ("fabric", "StartCollective", lambda: fabric_pb2.StartCollectiveRequest(
        op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, ranks=[dev(0, 4)], bytes=1e6, groups=2), "cap", IA,
     "group_stride"),
    ("fabric", "GetFlow", lambda: fabric_pb2.GetFlowRequest(name="f-1"), "cap", IA, "name"),
    ("fabric", "GetFlow", lambda: fabric_pb2.GetFlowRequest(name="flows/f-999999"), "cap", NF, "flows/f-999999"),
    ("fabric", "WatchFlows", lambda: fabric_pb2.WatchFlowsRequest(names=["flows/f-999999"]), "cap", NF,
     "flows/f-999999"),
    ("fabric", "GetLinkStats", lambda: fabric_pb2.GetLinkStatsRequest(), "admin", grpc.StatusCode.OK, ""),
    ("fabric", "ReserveWindow", lambda: fabric_pb2.ReserveWindowRequest(period_s=1.0), "cap", IA, "repeat"),
    ("fabric", "ReserveWindow", lambda: fabric_pb2.ReserveWindowRequest(period_s=1.0, repeat=2, collectives=[
        fabric_pb2.WindowCollective(collective=fabric_pb2.StartCollectiveRequest(ranks=[dev(0, 8)], bytes=1e6),
                                    offset_s=2.0)]), "cap", IA, "offset_s"),
    ("fabric", "ReserveWindow", lambda: fabric_pb2.ReserveWindowRequest(period_s=1.0, repeat=2, collectives=[
        fabric_pb2.WindowCollective(collective=fabric_pb2.StartCollectiveRequest(
            op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, ranks=[dev(0, 8)], bytes=-1.0))]),
     "cap", IA, "bytes"),
    ("fabric", "CutWindow", lambda: fabric_pb2.CutWindowRequest(name="windows/w-999999", at_s=1.0), "cap", NF,
     "windows/w-999999"),
    ("fabric", "CutWindow", lambda: fabric_pb2.CutWindowRequest(name="windows/w-1", at_s=-1.0), "cap", IA, "at_s"),
    ("fabric", "InjectLinkFault", lambda: fabric_pb2.InjectLinkFaultRequest(target="cable-7"), "admin", IA,
     "target"),
    ("fabric", "InjectLinkFault", lambda: fabric_pb2.InjectLinkFaultRequest(
        target="links/nowhere-to-nowhere", kind=fabric_pb2.InjectLinkFaultRequest.KIND_DOWN), "admin", NF, "target"),
    ("fabric", "ClearLinkFault", lambda: fabric_pb2.ClearLinkFaultRequest(target=""), "admin", IA, "target"),
    # broker
    ("broker", "CreateTenant", lambda: broker_pb2.CreateTenantRequest(tenant_id="Bad_Name"), "admin", IA,
     "tenant_id"),
    ("broker", "CreateTenant", lambda: broker_pb2.CreateTenantRequest(tenant_id="okname", weight=-1), "admin", IA,
     "weight"),
    ("broker", "GetTenant", lambda: broker_pb2.GetTenantRequest(name="acme"), "admin", IA, "name"),
    ("broker", "GetTenant", lambda: broker_pb2.GetTenantRequest(name="tenants/nobody-here"), "admin", NF,
     "tenants/nobody-here"),
    ("broker", "ListTenants", lambda: broker_pb2.ListTenantsRequest(page_token="x"), "admin", IA, "page_token"),
    ("broker", "Authenticate", lambda: broker_pb2.AuthenticateRequest(), "admin", IA, "api_key"),
    ("broker", "GetInventory", lambda: broker_pb2.GetInventoryRequest(), "tenant", grpc.StatusCode.OK, ""),
    ("broker", "AllocateInstance", lambda: broker_pb2.AllocateInstanceRequest(count=1), "tenant", IA, "chip_type"),
    ("broker", "AllocateInstance", lambda: broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm"), "tenant", IA,
     "count"),
    ("broker", "AllocateInstance", lambda: broker_pb2.AllocateInstanceRequest(chip_type="tpu-v9", count=1),
     "tenant", IA, "chip_type"),
    ("broker", "AllocateInstance", lambda: broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm", count=10**9),
     "tenant", RE, "free"),
    ("broker", "AllocateInstance", lambda: broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm", count=1,
                                                                              topology=77), "tenant", IA, "topology"),
    ("broker", "GetInstance", lambda: broker_pb2.GetInstanceRequest(name="i-1"), "tenant", IA, "name"),
    ("broker", "GetInstance", lambda: broker_pb2.GetInstanceRequest(name="instances/i-99999"), "tenant", NF,
     "instances/i-99999"),
    ("broker", "ListInstances", lambda: broker_pb2.ListInstancesRequest(page_token="-3"), "tenant", IA,
     "page_token"),
    ("broker", "ReleaseInstance", lambda: broker_pb2.ReleaseInstanceRequest(name="instances/i-99999"), "tenant", NF,
     "instances/i-99999"),
    ("broker", "RefreshCapability", lambda: broker_pb2.RefreshCapabilityRequest(instance=""), "tenant", IA,
     "name"),
    ("broker", "GetVerificationKeys", lambda: broker_pb2.GetVerificationKeysRequest(), "tenant",
     grpc.StatusCode.OK, ""),
    # scheduler
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(), "tenant", IA, "spec"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(**{"hardware.chip": ""})), "tenant",
     IA, "spec.hardware.chip"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(**{"hardware.count": 0})), "tenant",
     IA, "spec.hardware.count"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(**{"model.preset": "gpt9"})),
     "tenant", IA, "model.preset"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(**{"parallelism.tp": 3})),
     "tenant", IA, "tp"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(
        **{"parallelism.tp": 1, "parallelism.fsdp": True, "parallelism.fsdp_shard": 3})), "tenant", IA, "fsdp_shard"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(
        **{"parallelism.fsdp_shard": 2**32 - 1})), "tenant", IA, "fsdp_shard"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(
        **{"parallelism.recompute": "op", "parallelism.recompute_layers": 4})), "tenant", IA, "recompute_layers"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(steps=0)), "tenant", IA, "steps"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(steps=10**12)), "tenant", IA,
     "steps"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(), priority=99999), "tenant", IA,
     "priority"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(**{"hardware.count": 4096,
                                                                                  "batch.global_batch": 512})),
     "tenant", FP, "cluster has 64"),
    ("scheduler", "SubmitJob", lambda: scheduler_pb2.SubmitJobRequest(spec=spec(**{"model.preset": "llama3-405b"})),
     "tenant", FP, "GiB"),
    ("scheduler", "GetJob", lambda: scheduler_pb2.GetJobRequest(name="j-1"), "tenant", IA, "name"),
    ("scheduler", "GetJob", lambda: scheduler_pb2.GetJobRequest(name="jobs/j-424242"), "tenant", NF,
     "jobs/j-424242"),
    ("scheduler", "ListJobs", lambda: scheduler_pb2.ListJobsRequest(state=77), "tenant", IA, "state"),
    ("scheduler", "CancelJob", lambda: scheduler_pb2.CancelJobRequest(name="jobs/j-424242"), "tenant", NF,
     "jobs/j-424242"),
    ("scheduler", "WatchJob", lambda: scheduler_pb2.WatchJobRequest(name="jobs/j-424242"), "tenant", NF,
     "jobs/j-424242"),
    ("scheduler", "GetJobTrace", lambda: scheduler_pb2.GetJobTraceRequest(name="j-1"), "tenant", IA, "name"),
    ("scheduler", "GetJobTrace", lambda: scheduler_pb2.GetJobTraceRequest(name="jobs/j-424242"), "tenant", NF,
     "jobs/j-424242"),
    ("scheduler", "UpdateQueue", lambda: scheduler_pb2.UpdateQueueRequest(
        queue=scheduler_pb2.Queue(name="tenants/a/queues/q", quota={"h100-sxm": 8})), "tenant",
     grpc.StatusCode.PERMISSION_DENIED, "admin"),
    ("scheduler", "UpdateQueue", lambda: scheduler_pb2.UpdateQueueRequest(queue=scheduler_pb2.Queue(name="q1")),
     "admin", IA, "queue.name"),
    ("scheduler", "UpdateQueue", lambda: scheduler_pb2.UpdateQueueRequest(
        queue=scheduler_pb2.Queue(name="tenants/a/queues/q", quota={"tpu-v9": 8})), "admin", IA, "queue.quota"),
    ("scheduler", "ListQueues", lambda: scheduler_pb2.ListQueuesRequest(page_token="-3"), "tenant", IA,
     "page_token"),
    ("scheduler", "GetTenantUsage", lambda: scheduler_pb2.GetTenantUsageRequest(tenant="acme"), "tenant", IA,
     "tenant"),
    ("scheduler", "GetTenantUsage", lambda: scheduler_pb2.GetTenantUsageRequest(tenant="tenants/someone-else"),
     "tenant", grpc.StatusCode.PERMISSION_DENIED, "admin"),
    # router
    ("router", "DeployModel", lambda: router_pb2.DeployModelRequest(model=M(preset="llama3-8b"), chip="h100-sxm"),
     "tenant", IA, "deployment_id"),
    ("router", "DeployModel", lambda: router_pb2.DeployModelRequest(deployment_id="x1", chip="h100-sxm"), "tenant",
     IA, "model"),
    ("router", "DeployModel", lambda: router_pb2.DeployModelRequest(deployment_id="x1", model=M(preset="llama3-8b"),
                                                                    chip="tpu-v9"), "tenant", IA, "chip"),
    ("router", "DeployModel", lambda: router_pb2.DeployModelRequest(deployment_id="x1", model=M(preset="llama3-8b"),
                                                                    chip="h100-sxm", tp=64), "tenant", IA, "tp"),
    ("router", "DeployModel", lambda: router_pb2.DeployModelRequest(deployment_id="x1", model=M(preset="llama3-8b"),
                                                                    chip="h100-sxm", policy="random-ish"), "tenant",
     IA, "policy"),
    ("router", "DeployModel", lambda: router_pb2.DeployModelRequest(deployment_id="x1", model=M(preset="llama3-8b"),
                                                                    chip="h100-sxm", kv_fraction=7), "tenant", IA,
     "kv_fraction"),
    ("router", "DeployModel", lambda: router_pb2.DeployModelRequest(deployment_id="x1", model=M(preset="llama3-405b"),
                                                                    chip="h100-sxm", tp=1), "tenant", FP, "GB"),
    ("router", "GetDeployment", lambda: router_pb2.GetDeploymentRequest(name="deployments/nope"), "tenant", NF,
     "deployments/nope"),
    ("router", "ListDeployments", lambda: router_pb2.ListDeploymentsRequest(page_token="q"), "tenant", IA,
     "page_token"),
    ("router", "DeleteDeployment", lambda: router_pb2.DeleteDeploymentRequest(name="deployments/nope"), "tenant",
     NF, "deployments/nope"),
    ("router", "Generate", lambda: router_pb2.GenerateRequest(text="hi", max_tokens=4), "tenant", IA, "model"),
    ("router", "Generate", lambda: router_pb2.GenerateRequest(model="deployments/nope", text="hi", max_tokens=4),
     "tenant", NF, "deployments/nope"),
    ("router", "GetStats", lambda: router_pb2.GetStatsRequest(deployment="deployments/nope"), "tenant", NF,
     "deployments/nope"),
]


@pytest.fixture(scope="module")
async def callers(stack: Stack) -> dict[str, Any]:
    key = await stack.create_tenant("contract")
    gc = Client(stack.endpoints, key)
    admin_md = call_metadata(api_key=stack.admin_key)
    inv = await gc.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=admin_md)
    free = {i for r in inv.free for i in range(r.start, r.end)}
    base = next(b for b in range(0, 32, 8) if set(range(b, b + 8)) <= free)  # a whole free domain on shard 0
    BASE[0] = base
    r = await gc.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
        chip_type="h100-sxm", count=8, devices=[R(start=base, end=base + 8)], tenant="tenants/contract"),
        metadata=admin_md)
    yield {
        "client": gc,
        "tenant": call_metadata(api_key=key),
        "cap": call_metadata(capability=r.capability),
        "admin": call_metadata(api_key=stack.admin_key),
        "none": (),
    }
    await gc.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=r.instance.name), metadata=admin_md)
    await gc.close()


async def _call(gc: Client, service: str, rpc: str, req: Any, md: Any) -> None:
    method = getattr(getattr(gc, service), rpc)
    call = method(req, metadata=md, timeout=30)
    if hasattr(call, "__aiter__"):
        async for _ in call:
            break
    else:
        await call


@pytest.mark.parametrize(("service", "rpc", "make", "who", "code", "text"), CASES,
                         ids=[f"{c[0]}.{c[1]}-{i}" for i, c in enumerate(CASES)])
async def test_status_code(callers: dict[str, Any], service: str, rpc: str, make: Callable[[], Any], who: str,
                           code: grpc.StatusCode, text: str) -> None:
    """The RPC answers the bad request with the exact status code, a message naming the field, and ErrorInfo."""
    gc = callers["client"]
    if code == grpc.StatusCode.OK:
        await _call(gc, service, rpc, make(), callers[who])
        return
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _call(gc, service, rpc, make(), callers[who])
    assert exc.value.code() == code, exc.value.details()
    assert text in (exc.value.details() or ""), exc.value.details()
    info = error_info(exc.value)
    assert info is not None and info.domain == "gigacluster.dev" and info.reason


@pytest.mark.parametrize(("service", "rpc", "make"), sorted({(c[0], c[1], c[2]) for c in CASES},
                                                            key=lambda c: (c[0], c[1])),
                         ids=lambda v: v if isinstance(v, str) else "")
async def test_calls_without_credentials_are_unauthenticated(callers: dict[str, Any], service: str, rpc: str,
                                                             make: Callable[[], Any]) -> None:
    """No API key and no capability: UNAUTHENTICATED (or a field error checked before identity): every public
    RPC of every service authenticates its caller."""
    gc = callers["client"]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _call(gc, service, rpc, make(), ())
    assert exc.value.code() in (grpc.StatusCode.UNAUTHENTICATED, IA, NF), exc.value.details()


def test_every_rpc_has_a_case() -> None:
    """The table above covers every RPC of every service, so a new RPC cannot skip its contract."""
    import importlib

    from tests.contract.test_protos import SERVICES

    covered = {(c[0], c[1]) for c in CASES}
    for service, (_m, _c, base_mod, base_cls) in SERVICES.items():
        base = getattr(importlib.import_module(base_mod), base_cls)
        for rpc in (n for n, v in vars(base).items() if callable(v) and not n.startswith("_")):
            assert (service, rpc) in covered, f"no status-code case for {service}.{rpc}"
