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
  - name: conv                                 # the Azure LLM inference trace 2023 (CSV), 10x faster, half the rows
    kind: generate
    arrival: {type: azure_csv, path: loadtest/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv,
              speed: 10, rate_scale: 0.5, start_s: 0}
slo: {ttft_s: 0.25, tpot_s: 0.1}              # goodput counts requests meeting both (DistServe, OSDI 2024)
```

Unknown keys anywhere (scenario, deploy, stream, arrival, slo) are refused with the key named.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

from gigacluster import safeyaml
from gigacluster.errors import InvalidArgument

KINDS = ("generate", "http_completions", "submit_job")
ARRIVALS = ("poisson", "uniform", "trace", "azure_csv")
_CSV_ONLY = ("speed", "start_s", "window_s", "rate_scale", "target_qps")
#: The fields of ``deploy`` (a router DeployModel request, built by the runner).
DEPLOY_KEYS = frozenset({"deployment_id", "preset", "chip", "tp", "replicas", "max_batch", "policy", "max_queue",
                         "ep", "precision"})


@dataclasses.dataclass(frozen=True)
class Slo:
    """Per-request latency objectives: a request meets the SLO when its TTFT <= ``ttft_s`` and its TPOT (time
    per output token after the first) <= ``tpot_s``. The defaults are DistServe's chatbot SLOs (Zhong et al.,
    "DistServe", OSDI 2024, Table 1: TTFT 0.25 s, TPOT 0.1 s for OPT-13B on ShareGPT, the model size
    closest to the 8B models served here)."""

    ttft_s: float = 0.25
    tpot_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InvalidArgument(f"slo.{name}", f"must be a finite number of seconds > 0, got {v!r}"[:120])


@dataclasses.dataclass(frozen=True)
class Arrival:
    """An arrival process: Poisson or evenly spaced at ``rate_per_s``, or replayed from a trace file."""

    type: str = "poisson"
    rate_per_s: float = 1.0
    path: str = ""  # trace: JSON lines with arrival_s (and optionally prompt_tokens, output_tokens); azure_csv: CSV
    time_scale: float = 1.0  # trace: multiply trace times by this (0.5 = twice as fast)
    # azure_csv (TIMESTAMP, ContextTokens, GeneratedTokens; see loadtest.azure):
    speed: float = 1.0  # trace seconds per wall second (10 = ten times faster)
    start_s: float = 0.0  # offset into the trace (trace seconds) where replay begins
    window_s: float = math.inf  # trace seconds replayed from start_s (also cut at the scenario's duration)
    rate_scale: float = 1.0  # keep (<1) or replicate (>1) arrivals, evenly and without randomness
    target_qps: float = 0.0  # instead of rate_scale: the window's mean offered rate, requests per wall second

    def __post_init__(self) -> None:
        if self.type not in ARRIVALS:
            raise InvalidArgument("arrival.type", f"must be one of {', '.join(ARRIVALS)}, got {self.type!r}"[:160])
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "float" and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                          and (math.isfinite(v) or f.name == "window_s")):
                raise InvalidArgument(f"arrival.{f.name}", f"must be a finite number, got {v!r}"[:120])
        if self.type != "azure_csv":
            used = [k for k in _CSV_ONLY if getattr(self, k) != getattr(Arrival, k)]
            if used:
                raise InvalidArgument(f"arrival.{used[0]}", "applies only to arrival type azure_csv")
        if self.type in ("trace", "azure_csv"):
            if not self.path:
                raise InvalidArgument("arrival.path", f"a {self.type} arrival needs the path of its trace file")
            if not self.time_scale > 0:
                raise InvalidArgument("arrival.time_scale", "must be > 0")
            for name in ("speed", "window_s", "rate_scale"):
                if not getattr(self, name) > 0:
                    raise InvalidArgument(f"arrival.{name}", f"must be > 0, got {getattr(self, name)}")
            if self.start_s < 0 or self.target_qps < 0:
                raise InvalidArgument("arrival.start_s" if self.start_s < 0 else "arrival.target_qps", "must be >= 0")
            if self.target_qps and self.rate_scale != 1.0:
                raise InvalidArgument("arrival.target_qps", "give rate_scale or target_qps, not both")
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
    # Trace prompts are cut to what the router accepts: its max_prompt_bytes (131,072 = 32,768 ids at 4 bytes
    # an id) and the model's context (Llama 3 8B: 8,192 = prompt + max_tokens).
    max_prompt_tokens: int = 32768
    context_tokens: int = 8192
    slo: Slo | None = None  # this stream's SLO; None = the scenario's

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidArgument("streams[].name", "every stream needs a name")
        if self.kind not in KINDS:
            raise InvalidArgument(f"streams.{self.name}.kind", f"must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.prompt_tokens < 1 or self.max_tokens < 1:
            raise InvalidArgument(f"streams.{self.name}", "prompt_tokens and max_tokens must be >= 1")
        if self.max_prompt_tokens < 1 or self.context_tokens < 2:
            raise InvalidArgument(f"streams.{self.name}", "max_prompt_tokens must be >= 1 and context_tokens >= 2")
        if self.kind == "submit_job" and not self.job:
            raise InvalidArgument(f"streams.{self.name}.job", "a submit_job stream needs a job file")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A whole load test: its streams, how long arrivals last, tenants, the deployment and the SLO."""

    name: str
    streams: tuple[Stream, ...]
    duration_s: float = 30.0
    seed: int = 0
    tenants: int = 1
    max_in_flight: int = 256
    drain_s: float = 60.0  # after the last arrival, wait this long for in-flight requests
    deploy: dict[str, Any] | None = None
    slo: Slo = Slo()
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

    def slo_of(self, stream: Stream) -> Slo:
        return stream.slo or self.slo

    def model_of(self, stream: Stream) -> str:
        return stream.model or str((self.deploy or {})["deployment_id"])

    def with_duration(self, duration_s: float) -> Scenario:
        return dataclasses.replace(self, duration_s=duration_s)

    def with_slo(self, ttft_s: float | None = None, tpot_s: float | None = None) -> Scenario:
        """The scenario with its SLO's given objectives replaced (streams with their own SLO keep it)."""
        return dataclasses.replace(self, slo=Slo(ttft_s=self.slo.ttft_s if ttft_s is None else ttft_s,
                                                 tpot_s=self.slo.tpot_s if tpot_s is None else tpot_s))


def _fields(cls: type, exclude: tuple[str, ...] = ()) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - set(exclude)


def _check_keys(raw: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    """``raw`` as a dict, refusing a non-mapping or an unknown key (named, with the allowed ones)."""
    if not isinstance(raw, dict):
        raise InvalidArgument(where, "must be a mapping")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise InvalidArgument(f"{where}.{unknown[0][:40]}" if where else unknown[0][:40],
                              f"unknown key; allowed: {', '.join(sorted(allowed))}")
    return dict(raw)


def _slo(raw: Any, where: str) -> Slo:
    return Slo(**_check_keys(raw, where, _fields(Slo)))


def parse(data: dict[str, Any], *, base_dir: pathlib.Path | None = None) -> Scenario:
    """A validated :class:`Scenario` from a parsed YAML mapping; an unknown key anywhere is refused by name."""
    known = _fields(Scenario, ("streams", "base_dir"))
    data = _check_keys(data, "", known | {"streams", "description"}) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise InvalidArgument("scenario", "must be a mapping")
    if not isinstance(data.get("streams") or [], list):
        raise InvalidArgument("streams", "must be a list of streams")
    streams = []
    for i, raw in enumerate(data.get("streams") or []):
        where = f"streams[{i}]"
        raw = _check_keys(raw, where, _fields(Stream))
        if isinstance(raw.get("name"), str) and raw["name"]:
            where = f"streams.{raw['name'][:40]}"
        arrival = _check_keys(raw.pop("arrival", {}) or {}, f"{where}.arrival", _fields(Arrival))
        if raw.get("slo") is not None:
            raw["slo"] = _slo(raw["slo"], f"{where}.slo")
        try:
            streams.append(Stream(arrival=Arrival(**arrival), **raw))
        except TypeError as exc:
            raise InvalidArgument(where, str(exc)[:160]) from exc
    kwargs = {k: v for k, v in data.items() if k in known}
    if kwargs.get("deploy") is not None:
        kwargs["deploy"] = _check_keys(kwargs["deploy"], "deploy", set(DEPLOY_KEYS))
    if "slo" in kwargs:
        kwargs["slo"] = _slo(kwargs["slo"] or {}, "slo")
    try:
        return Scenario(streams=tuple(streams), base_dir=base_dir or pathlib.Path("."), **kwargs)
    except TypeError as exc:
        raise InvalidArgument("scenario", str(exc)[:160]) from exc


def load(path: str | pathlib.Path) -> Scenario:
    """Read (bounded, :mod:`gigacluster.safeyaml`) and validate a scenario file; relative paths inside resolve
    against the repository root (the file's directory's parent when the file sits in loadtest/) or the file's
    directory."""
    p = pathlib.Path(path)
    data = safeyaml.load_file(p)
    base = p.resolve().parent
    if base.name == "loadtest":
        base = base.parent
    return parse(data, base_dir=base)
