"""Scenario files: what to send, how often, for how long, as which tenants.

```yaml
name: smoke
duration_s: 20          # wall seconds of arrivals (the run then drains in-flight requests)
seed: 7
tenants: 1              # >1 creates tenants lt-<run>-<i> with the admin key
max_in_flight: 256      # an arrival beyond this is counted as dropped, never delayed
deploy: {deployment_id: lt-llama3-8b, preset: llama3-8b, chip: h100-sxm, tp: 1, replicas: 2}
streams:
  - {name: chat, kind: generate, arrival: {type: poisson, rate_per_s: 4}, prompt_tokens: 256, max_tokens: 64}
  - {name: chat-http, kind: http_completions, arrival: {type: poisson, rate_per_s: 1}}
  - {name: agents, kind: generate, arrival: {type: trace, path: examples/infer-trace-agents.jsonl}}
  - {name: train, kind: submit_job, arrival: {type: poisson, rate_per_s: 0.1}, job: examples/demo-train-h100.yaml}
```
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import yaml

from gigacluster.errors import InvalidArgument

KINDS = ("generate", "http_completions", "submit_job")
ARRIVALS = ("poisson", "uniform", "trace")


@dataclasses.dataclass(frozen=True)
class Arrival:
    """An arrival process: Poisson or evenly spaced at ``rate_per_s``, or replayed from a trace file."""

    type: str = "poisson"
    rate_per_s: float = 1.0
    path: str = ""  # trace: JSON lines with arrival_s (and optionally prompt_tokens, output_tokens)
    time_scale: float = 1.0  # trace: multiply trace times by this (0.5 = twice as fast)

    def __post_init__(self) -> None:
        if self.type not in ARRIVALS:
            raise InvalidArgument("arrival.type", f"must be one of {', '.join(ARRIVALS)}, got {self.type!r}")
        if self.type == "trace":
            if not self.path:
                raise InvalidArgument("arrival.path", "a trace arrival needs the path of a JSON-lines trace")
            if not self.time_scale > 0:
                raise InvalidArgument("arrival.time_scale", "must be > 0")
        elif not self.rate_per_s > 0:
            raise InvalidArgument("arrival.rate_per_s", f"must be > 0, got {self.rate_per_s}")


@dataclasses.dataclass(frozen=True)
class Stream:
    """One kind of traffic with its own arrival process."""

    name: str
    kind: str
    arrival: Arrival
    model: str = ""  # deployment id; empty = the scenario's deployment
    prompt_tokens: int = 128
    max_tokens: int = 32
    priority: int = 0
    job: str = ""  # submit_job: job file
    weight_tenants: bool = True  # spread requests over the scenario's tenants round-robin

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidArgument("streams[].name", "every stream needs a name")
        if self.kind not in KINDS:
            raise InvalidArgument(f"streams.{self.name}.kind", f"must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.prompt_tokens < 1 or self.max_tokens < 1:
            raise InvalidArgument(f"streams.{self.name}", "prompt_tokens and max_tokens must be >= 1")
        if self.kind == "submit_job" and not self.job:
            raise InvalidArgument(f"streams.{self.name}.job", "a submit_job stream needs a job file")


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    streams: tuple[Stream, ...]
    duration_s: float = 30.0
    seed: int = 0
    tenants: int = 1
    max_in_flight: int = 256
    drain_s: float = 60.0  # after the last arrival, wait this long for in-flight requests
    deploy: dict[str, Any] | None = None
    base_dir: pathlib.Path = pathlib.Path(".")  # relative paths (trace, job) resolve against this

    def __post_init__(self) -> None:
        if not self.streams:
            raise InvalidArgument("streams", "a scenario needs at least one stream")
        if not self.duration_s > 0:
            raise InvalidArgument("duration_s", f"must be > 0, got {self.duration_s}")
        if self.tenants < 1:
            raise InvalidArgument("tenants", "must be >= 1")
        if self.max_in_flight < 1:
            raise InvalidArgument("max_in_flight", "must be >= 1")
        names = [s.name for s in self.streams]
        if len(set(names)) != len(names):
            raise InvalidArgument("streams", f"stream names must be unique: {names}")
        needs_model = any(s.kind != "submit_job" and not s.model for s in self.streams)
        if needs_model and not (self.deploy and self.deploy.get("deployment_id")):
            raise InvalidArgument("deploy.deployment_id", "inference streams without a model need deploy.deployment_id")

    def resolve(self, path: str) -> pathlib.Path:
        """A scenario-relative path (absolute paths and paths that exist from the cwd win)."""
        p = pathlib.Path(path)
        if p.is_absolute() or p.exists():
            return p
        return self.base_dir / p

    def model_of(self, stream: Stream) -> str:
        return stream.model or str((self.deploy or {})["deployment_id"])

    def with_duration(self, duration_s: float) -> Scenario:
        return dataclasses.replace(self, duration_s=duration_s)


def parse(data: dict[str, Any], *, base_dir: pathlib.Path | None = None) -> Scenario:
    """A validated :class:`Scenario` from a parsed YAML mapping."""
    if not isinstance(data, dict):
        raise InvalidArgument("scenario", "must be a mapping")
    known = {f.name for f in dataclasses.fields(Scenario)} - {"streams", "base_dir"}
    unknown = set(data) - known - {"streams", "description"}
    if unknown:
        raise InvalidArgument(sorted(unknown)[0], f"unknown scenario key; allowed: {', '.join(sorted(known))}")
    streams = []
    for i, raw in enumerate(data.get("streams") or []):
        if not isinstance(raw, dict):
            raise InvalidArgument(f"streams[{i}]", "must be a mapping")
        raw = dict(raw)
        arrival = raw.pop("arrival", {}) or {}
        try:
            streams.append(Stream(arrival=Arrival(**arrival), **raw))
        except TypeError as exc:
            raise InvalidArgument(f"streams[{i}]", str(exc)) from exc
    kwargs = {k: v for k, v in data.items() if k in known}
    return Scenario(streams=tuple(streams), base_dir=base_dir or pathlib.Path("."), **kwargs)


def load(path: str | pathlib.Path) -> Scenario:
    """Read and validate a scenario file; relative paths inside resolve against the repository root
    (the file's directory's parent when the file sits in loadtest/) or the file's directory."""
    p = pathlib.Path(path)
    data = yaml.safe_load(p.read_text())
    base = p.resolve().parent
    if base.name == "loadtest":
        base = base.parent
    return parse(data, base_dir=base)
