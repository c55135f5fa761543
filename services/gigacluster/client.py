"""A thin async client over the five services' stubs (used by the CLI, the tests and examples/).

    async with Client.connect(api_key=...) as gc:
        job = await gc.submit_job_file("examples/train-llama3-8b-small.yaml")
        async for update in gc.watch_job(job.name): ...

Credentials: ``api_key`` if given, else ``GIGACLUSTER_API_KEY``, else the file
``gigacluster up`` writes (``~/.gigacluster/<cluster>/credentials.json``).

``retry_refused=True`` lets gRPC itself retry a call refused with RESOURCE_EXHAUSTED, after the
server's pushback (its retry-after; gRFC A6), up to 4 times: the CLI's client commands do. Off by
default, so that a caller who measures or sheds load sees every refusal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc

from gigacluster import safeyaml
from gigacluster.broker.v1 import broker_pb2_grpc
from gigacluster.chip.v1 import chip_pb2_grpc
from gigacluster.fabric.v1 import fabric_pb2_grpc
from gigacluster.router.v1 import router_pb2, router_pb2_grpc
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import Tls, open_channel
from gigacluster.scheduler.spec import job_fields, spec_to_proto, split_job_file
from gigacluster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

DEFAULT_PORTS = {"chip": 50051, "fabric": 50052, "broker": 50053, "scheduler": 50054, "router": 50055}


def submit_request(spec: dict[str, Any], **job: Any) -> scheduler_pb2.SubmitJobRequest:
    """The SubmitJobRequest of a spec and job fields; InvalidArgument naming the field before anything is sent."""
    f = job_fields(job)
    return scheduler_pb2.SubmitJobRequest(
        display_name=f["name"], queue=f["queue"], priority=f["priority"], spec=spec_to_proto(spec),
        checkpoint_interval_steps=f["checkpoint_interval_steps"], max_restarts=f["max_restarts"],
        request_id=str(job.get("request_id", ""))[:128],
    )


def read_job_file(path: str | os.PathLike[str], **overrides: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(spec, job fields) of a job file, read with the bounded YAML loader and checked as a request."""
    spec, job = split_job_file(safeyaml.load_file(path))
    job.update(overrides)
    submit_request(spec, **job)
    return spec, job


def state_dir(cluster: str = "local") -> pathlib.Path:
    base = os.environ.get("GIGACLUSTER_HOME") or str(pathlib.Path.home() / ".gigacluster")
    return pathlib.Path(base) / cluster


def load_credentials(cluster: str = "local") -> dict[str, Any]:
    """What ``gigacluster up`` left for clients: api_key, admin_key, endpoints (empty if none)."""
    path = state_dir(cluster) / "credentials.json"
    if path.is_file():
        return dict(json.loads(path.read_text()))
    return {}


@dataclasses.dataclass(frozen=True)
class Endpoints:
    chip: str = f"127.0.0.1:{DEFAULT_PORTS['chip']}"
    fabric: str = f"127.0.0.1:{DEFAULT_PORTS['fabric']}"
    broker: str = f"127.0.0.1:{DEFAULT_PORTS['broker']}"
    scheduler: str = f"127.0.0.1:{DEFAULT_PORTS['scheduler']}"
    router: str = f"127.0.0.1:{DEFAULT_PORTS['router']}"

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> Endpoints:
        return cls(**{k: v for k, v in d.items() if k in DEFAULT_PORTS})


S = TypeVar("S")


class _Stub(Generic[S]):
    """``Client.<service>``: a ``stub`` over the client's one channel to the service of that name."""

    def __init__(self, stub: Callable[[grpc.aio.Channel], S]) -> None:
        self.stub = stub
        self.service = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.service = name

    def __get__(self, client: Client, owner: type | None = None) -> S:
        return self.stub(client.channel(self.service))


class Client:
    """Channels and stubs to one cluster, with the caller's API key on every call."""

    scheduler = _Stub(scheduler_pb2_grpc.SchedulerServiceStub)
    router = _Stub(router_pb2_grpc.RouterServiceStub)
    broker = _Stub(broker_pb2_grpc.BrokerServiceStub)
    fabric = _Stub(fabric_pb2_grpc.FabricServiceStub)
    chip = _Stub(chip_pb2_grpc.ChipServiceStub)

    def __init__(self, endpoints: Endpoints, api_key: str | None, *, tls: Tls | None = None,
                 retry_refused: bool = False) -> None:
        self.endpoints = endpoints
        self.api_key = api_key
        self.tls = tls
        self.retry_refused = retry_refused  # gRPC retries RESOURCE_EXHAUSTED after the server's pushback
        self._channels: dict[str, grpc.aio.Channel] = {}

    @classmethod
    def connect(cls, *, api_key: str | None = None, endpoints: Endpoints | None = None,
                cluster: str = "local", retry_refused: bool = False) -> Client:
        creds = load_credentials(cluster)
        key = api_key or os.environ.get("GIGACLUSTER_API_KEY") or creds.get("api_key")
        eps = endpoints or (Endpoints.from_dict(creds["endpoints"]) if "endpoints" in creds else Endpoints())
        tls = Tls.from_env(creds["tls"]) if creds.get("tls") else None
        return cls(eps, key, tls=tls, retry_refused=retry_refused)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    def channel(self, service: str) -> grpc.aio.Channel:
        if service not in self._channels:
            self._channels[service] = open_channel(getattr(self.endpoints, service), self.tls,
                                                   retry_refused=self.retry_refused)
        return self._channels[service]

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(api_key=self.api_key)

    # -- jobs -------------------------------------------------------------------------------------
    async def submit_job(self, spec: dict[str, Any], **job: Any) -> scheduler_pb2.Job:
        resp = await self.scheduler.SubmitJob(submit_request(spec, **job), metadata=self.md)
        return resp.job

    async def submit_job_file(self, path: str | os.PathLike[str], **overrides: Any) -> scheduler_pb2.Job:
        spec, job = read_job_file(path, **overrides)
        return await self.submit_job(spec, **job)

    async def get_job(self, name: str) -> scheduler_pb2.Job:
        return (await self.scheduler.GetJob(scheduler_pb2.GetJobRequest(name=name), metadata=self.md)).job

    async def list_jobs(self, *, state: int = 0, page_size: int = 0) -> list[scheduler_pb2.Job]:
        out: list[scheduler_pb2.Job] = []
        token = ""
        while True:
            resp = await self.scheduler.ListJobs(
                scheduler_pb2.ListJobsRequest(page_size=page_size, page_token=token, state=state), metadata=self.md)  # type: ignore[arg-type]  # protobuf enums are int NewTypes
            out.extend(resp.jobs)
            token = resp.next_page_token
            if not token:
                return out

    async def cancel_job(self, name: str) -> scheduler_pb2.Job:
        return (await self.scheduler.CancelJob(scheduler_pb2.CancelJobRequest(name=name), metadata=self.md)).job

    async def watch_job(self, name: str) -> AsyncIterator[scheduler_pb2.WatchJobResponse]:
        async for update in self.scheduler.WatchJob(scheduler_pb2.WatchJobRequest(name=name), metadata=self.md):
            yield update

    # -- inference --------------------------------------------------------------------------------
    async def generate(self, model: str, prompt: str | list[int], *, max_tokens: int = 64,
                       priority: int = 0) -> AsyncIterator[router_pb2.GenerateResponse]:
        req = router_pb2.GenerateRequest(model=model, max_tokens=max_tokens, priority=priority)
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(prompt)
        async for chunk in self.router.Generate(req, metadata=self.md):
            yield chunk
