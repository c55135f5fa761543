"""A scenario file, parsed and checked whole before anything is sent (docs/scenarios.md lists every key).

```yaml
name: gigawatt-small
site: {chip: trainium3, chips: 4096}   # or {preset: 2gw-trainium3}; checked against the running stack
speedup: 20                            # the `up --speedup` the file is tuned for (virtual s per wall s)
duration_s: 2400                       # virtual seconds
tenants: [{name: frontier, weight: 3}, {name: lab, weight: 1}]
jobs:
  - {tenant: frontier, name: pretrain, at_s: 0, file: examples/train-llama3-8b-small.yaml, chips: 512}
  - {tenant: lab, name: sweep, at_s: 60, repeat: 3, every_s: 30, spec: {model: {preset: llama3-8b}, ...}}
inference:
  tenant: serve
  deploy: {deployment_id: chat, preset: llama3-8b, chip: trainium3, tp: 4, replicas: 2}
  streams: [{name: conv, path: loadtest/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv}]
faults:
  - {at_s: 600, kind: chip_failed, job: frontier/pretrain, device_index: 5, clear_after_s: 300}
  - {at_s: 900, kind: link_degraded, target: switches/spine0, capacity_factor: 0.5}
```

Times (``at_s``, ``duration_s``, ...) are virtual seconds from the start of the run. Unknown keys anywhere
are refused with the key named; so are a job larger than the site, a job on another chip, an invalid
tenant name and a fault naming a job the file does not have, each with its field.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from typing import Any

from gigacluster import safeyaml
from gigacluster.errors import InvalidArgument
from gigacluster.loadtest.scenario import DEPLOY_KEYS, Slo
from gigacluster.model import SpecError
from gigacluster.model.training import TrainSpec
from gigacluster.scheduler.spec import job_fields, spec_to_proto, split_job_file
from gigacluster.sites import get_preset

# A tenant id is the name plus "-" and a 4-character run tag (so a scenario can run twice on one stack);
# the broker allows 40 characters of [a-z0-9-] starting with a letter or digit (broker.core.TENANT_ID_RE).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,34}$")
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CHIP_FAULTS = {"chip_failed": "FAILED", "chip_hbm": "HBM", "chip_slow": "SLOW"}
LINK_FAULTS = {"link_down": "DOWN", "link_degraded": "DEGRADED"}
FAULT_KINDS = (*CHIP_FAULTS, *LINK_FAULTS)
TOP_KEYS = {"name", "description", "site", "speedup", "duration_s", "sample_every_s", "seed", "tenants", "jobs",
            "inference", "faults"}
JOB_KEYS = {"tenant", "name", "at_s", "file", "spec", "chips", "steps", "repeat", "every_s", "priority", "queue",
            "checkpoint_interval_steps", "max_restarts"}
INFERENCE_KEYS = {"tenant", "start_s", "duration_s", "trace_speed", "max_wall_qps", "max_in_flight", "drain_s",
                  "deploy", "slo", "streams"}
STREAM_KEYS = {"name", "path", "trace_start_s", "rate_scale", "context_tokens", "rate_per_s", "prompt_tokens",
               "output_tokens"}
FAULT_KEYS = {"at_s", "kind", "job", "device_index", "device", "target", "clock_factor", "capacity_factor",
              "clear_after_s"}


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds on one scenario: what it may create, so a file cannot ask the runner for unbounded work."""

    max_tenants: int = 64
    max_jobs: int = 2000
    max_faults: int = 1000
    max_streams: int = 8
    max_duration_s: float = 30 * 86400.0


DEFAULT_LIMITS = Limits()


@dataclasses.dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class Job:
    """One training job: its tenant, name (unique in the tenant), virtual submit time, spec and job fields."""

    tenant: str
    name: str
    spec: dict[str, Any]
    at_s: float = 0.0
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def chips(self) -> int:
        return int(self.spec["hardware"]["count"])


@dataclasses.dataclass(frozen=True)
class Stream:
    """One Azure trace CSV replayed against the fleet from ``trace_start_s`` (trace seconds), thinned or
    replicated by ``rate_scale`` (loadtest.azure.copies); or, without a ``path``, evenly spaced requests at
    ``rate_per_s`` per virtual second of ``prompt_tokens`` and ``output_tokens`` each (a steady load, so that
    two phases of a run see the same offered load)."""

    name: str
    path: str
    trace_start_s: float = 0.0
    rate_scale: float = 1.0
    context_tokens: int = 8192
    rate_per_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def steady(self) -> bool:
        return not self.path


@dataclasses.dataclass(frozen=True)
class Inference:
    """The fleet (a router deployment of ``tenant``) and the trace streams replayed against it from ``start_s``
    for ``duration_s`` virtual seconds, ``trace_speed`` trace seconds per virtual second, the total offered rate
    capped at ``max_wall_qps`` requests per wall second (what the load client and router can drive)."""

    tenant: str
    deploy: dict[str, Any]
    streams: tuple[Stream, ...]
    start_s: float = 0.0
    duration_s: float = 1800.0
    trace_speed: float = 1.0
    max_wall_qps: float = 50.0
    max_in_flight: int = 512
    drain_s: float = 30.0
    slo: Slo = dataclasses.field(default_factory=Slo)


@dataclasses.dataclass(frozen=True)
class Fault:
    """A chip fault on a job's ``device_index``-th device (or on ``device``), or a link fault on ``target``
    (``links/<id>`` or ``switches/<id>``), injected at ``at_s`` and cleared ``clear_after_s`` later (0 = never)."""

    at_s: float
    kind: str
    job: str = ""
    device_index: int = 0
    device: int = -1
    target: str = ""
    clock_factor: float = 0.5
    capacity_factor: float = 0.5
    clear_after_s: float = 0.0

    @property
    def is_chip(self) -> bool:
        return self.kind in CHIP_FAULTS


@dataclasses.dataclass(frozen=True)
class Site:
    chip: str
    chips: int
    preset: str = ""


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    site: Site
    tenants: tuple[Tenant, ...]
    jobs: tuple[Job, ...]
    inference: Inference | None
    faults: tuple[Fault, ...]
    duration_s: float
    speedup: float = 0.0  # 0 = whatever the stack runs at
    sample_every_s: float = 0.0  # 0 = duration_s / 60
    seed: int = 0
    description: str = ""
    base_dir: pathlib.Path = pathlib.Path(".")

    def with_overrides(self, *, duration_s: float | None = None, speedup: float | None = None) -> Scenario:
        """The scenario with ``--duration-s`` / ``--speedup`` applied (None keeps the file's)."""
        out = self
        if duration_s is not None:
            out = dataclasses.replace(out, duration_s=_number(duration_s, "duration_s", lo=1e-3))
        if speedup is not None:
            out = dataclasses.replace(out, speedup=_number(speedup, "speedup", lo=1e-6))
        return out

    @property
    def sample_s(self) -> float:
        return self.sample_every_s or self.duration_s / 60.0

    def resolve(self, path: str) -> pathlib.Path:
        """A path in the file: absolute, or existing from the cwd, or relative to the repository root."""
        p = pathlib.Path(path)
        return p if p.is_absolute() or p.exists() else self.base_dir / p


def _keys(raw: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    """``raw`` as a dict, refusing a non-mapping or an unknown key (named, with the allowed ones)."""
    if not isinstance(raw, dict):
        raise InvalidArgument(where or "scenario", "must be a mapping")
    unknown = sorted(str(k)[:40] for k in raw if k not in allowed)
    if unknown:
        raise InvalidArgument(f"{where}.{unknown[0]}" if where else unknown[0],
                              f"unknown key; allowed: {', '.join(sorted(allowed))}")
    return dict(raw)


def _number(v: Any, field: str, *, lo: float = 0.0, hi: float = math.inf, integer: bool = False) -> Any:
    """A finite number in [lo, hi] (an integer if asked); anything else is refused naming ``field``."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    if ok and integer and int(v) != v:
        ok = False
    if not ok:
        kind = "an integer" if integer else "a finite number"
        raise InvalidArgument(field, f"must be {kind} in [{lo:g}, {hi:g}], got {str(v)[:40]!r}")
    return int(v) if integer else float(v)


def _text(v: Any, field: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(v, str) or not pattern.match(v):
        raise InvalidArgument(field, f"must be {what}, got {str(v)[:40]!r}")
    return v


def _site(raw: Any) -> Site:
    d = _keys(raw, "site", {"chip", "chips", "preset"})
    if d.get("preset"):
        if set(d) - {"preset"}:
            raise InvalidArgument("site", "give preset, or chip and chips, not both")
        try:
            p = get_preset(str(d["preset"]))
        except SpecError as exc:
            raise InvalidArgument("site.preset", exc.message.partition(": ")[2]) from None
        return Site(p.chip, p.chips(), p.name)
    if not isinstance(d.get("chip"), str) or not d["chip"]:
        raise InvalidArgument("site.chip", "the site needs its chip type (or a preset)")
    return Site(d["chip"][:40], _number(d.get("chips"), "site.chips", lo=1, hi=2**40, integer=True))


def _tenants(raw: Any, limits: Limits) -> tuple[Tenant, ...]:
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("tenants", "must be a non-empty list of {name, weight}")
    if len(raw) > limits.max_tenants:
        raise InvalidArgument("tenants", f"{len(raw)} tenants; at most {limits.max_tenants}")
    out = []
    for i, t in enumerate(raw):
        d = _keys(t, f"tenants[{i}]", {"name", "weight"})
        name = _text(d.get("name"), f"tenants[{i}].name", NAME_RE,
                     "1-35 characters of a-z, 0-9 and '-', starting with a letter or digit")
        out.append(Tenant(name, _number(d.get("weight", 1.0), f"tenants.{name}.weight", lo=1e-3, hi=1e6)))
    names = [t.name for t in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise InvalidArgument("tenants", f"tenant {dup!r} is listed twice")
    return tuple(out)


def _rewrap(exc: InvalidArgument, where: str) -> InvalidArgument:
    """``exc`` (a spec or job-field error) with its field placed under ``where``."""
    field = getattr(exc, "field", "spec").removeprefix("spec.").removeprefix("spec")
    return InvalidArgument(f"{where}.{field}" if field else where, exc.message.partition(": ")[2] or exc.message)


def _job_source(d: dict[str, Any], where: str, sc_dir: pathlib.Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(spec, job fields) of an entry's ``file`` or inline ``spec`` (exactly one of them)."""
    if ("file" in d) == ("spec" in d):
        raise InvalidArgument(where, "give a job file (file: examples/...) or an inline spec (spec: {...}), "
                                     "one of them")
    if "file" in d:
        if not isinstance(d["file"], str) or not d["file"]:
            raise InvalidArgument(f"{where}.file", "must be the path of a job file")
        p = pathlib.Path(d["file"])
        path = p if p.is_absolute() or p.exists() else sc_dir / p
        try:
            data = safeyaml.load_file(path)
        except (OSError, InvalidArgument) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc.message.rpartition(": ")[2]
            raise InvalidArgument(f"{where}.file", f"cannot read {d['file'][:80]!r}: {why}") from None
    else:
        data = d["spec"]
    try:
        spec, fields = split_job_file(data)
    except InvalidArgument as exc:
        raise _rewrap(exc, f"{where}.spec") from None
    return dict(spec), dict(fields)


def _jobs(raw: Any, tenants: tuple[Tenant, ...], site: Site, sc_dir: pathlib.Path, limits: Limits) -> tuple[Job, ...]:
    if not isinstance(raw, list):
        raise InvalidArgument("jobs", "must be a list of job entries")
    names = {t.name for t in tenants}
    out: list[Job] = []
    for i, entry in enumerate(raw):
        where = f"jobs[{i}]"
        d = _keys(entry, where, JOB_KEYS)
        if d.get("tenant") not in names:
            raise InvalidArgument(f"{where}.tenant", f"must be one of the tenants ({', '.join(sorted(names))}), "
                                                     f"got {str(d.get('tenant'))[:40]!r}")
        spec, fields = _job_source(d, where, sc_dir)
        name = _text(d.get("name", fields.get("name", "")), f"{where}.name", JOB_NAME_RE,
                     "1-100 characters of letters, digits, '.', '_' and '-'")
        where = f"jobs.{d['tenant']}/{name}"
        if "chips" in d:
            spec["hardware"] = {**(spec.get("hardware") or {}),
                                "count": _number(d["chips"], f"{where}.chips", lo=1, hi=2**40, integer=True)}
        if "steps" in d:
            spec.pop("tokens", None)
            spec["steps"] = _number(d["steps"], f"{where}.steps", lo=1, hi=2**40, integer=True)
        fields.update({k: d[k] for k in ("priority", "queue", "checkpoint_interval_steps", "max_restarts") if k in d})
        hw_raw = spec.get("hardware")
        hw: dict[str, Any] = hw_raw if isinstance(hw_raw, dict) else {}
        chip, count = str(hw.get("chip", ""))[:40], hw.get("count", 0)
        if chip != site.chip:
            raise InvalidArgument(f"{where}.hardware.chip", f"{chip!r}, but the site is {site.chip}")
        if isinstance(count, int) and count > site.chips:
            raise InvalidArgument(f"{where}.chips", f"{count:,} chips, but the site has {site.chips:,}")
        try:
            fields = job_fields(fields)
            spec_to_proto(spec)
            TrainSpec.from_dict(spec)
        except InvalidArgument as exc:
            raise _rewrap(exc, where) from None
        repeat = _number(d.get("repeat", 1), f"{where}.repeat", lo=1, hi=limits.max_jobs, integer=True)
        at_s = _number(d.get("at_s", 0.0), f"{where}.at_s", hi=limits.max_duration_s)
        every_s = _number(d.get("every_s", 0.0), f"{where}.every_s", hi=limits.max_duration_s)
        for k in range(repeat):
            jname = name if repeat == 1 else f"{name}-{k}"
            out.append(Job(d["tenant"], jname, spec, at_s + k * every_s, {**fields, "name": jname}))
        if len(out) > limits.max_jobs:
            raise InvalidArgument("jobs", f"more than {limits.max_jobs} jobs")
    keys = [j.key for j in out]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise InvalidArgument("jobs", f"job {dup!r} is defined twice (names are unique within a tenant)")
    return tuple(out)


def _inference(raw: Any, tenants: tuple[Tenant, ...], limits: Limits) -> Inference | None:
    if raw is None:
        return None
    d = _keys(raw, "inference", INFERENCE_KEYS)
    names = {t.name for t in tenants}
    if d.get("tenant") not in names:
        raise InvalidArgument("inference.tenant", f"must be one of the tenants ({', '.join(sorted(names))})")
    deploy = _keys(d.get("deploy"), "inference.deploy", set(DEPLOY_KEYS))
    if not isinstance(deploy.get("deployment_id"), str) or not deploy["deployment_id"]:
        raise InvalidArgument("inference.deploy.deployment_id", "the fleet needs a deployment id")
    streams_raw = d.get("streams")
    if not isinstance(streams_raw, list) or not 1 <= len(streams_raw) <= limits.max_streams:
        raise InvalidArgument("inference.streams", f"must be a list of 1 to {limits.max_streams} trace streams")
    streams = []
    for i, s in enumerate(streams_raw):
        w = f"inference.streams[{i}]"
        sd = _keys(s, w, STREAM_KEYS)
        streams.append(_stream(sd, w))
    slo = _keys(d.get("slo") or {}, "inference.slo", {"ttft_s", "tpot_s"})
    kw = {k: _number(d[k], f"inference.{k}", lo=lo, hi=hi, integer=k == "max_in_flight")
          for k, lo, hi in (("start_s", 0, limits.max_duration_s), ("duration_s", 1e-3, limits.max_duration_s),
                            ("trace_speed", 1e-6, 1e6), ("max_wall_qps", 1e-3, 1e5), ("max_in_flight", 1, 1 << 16),
                            ("drain_s", 0, 3600)) if k in d}
    return Inference(d["tenant"], deploy, tuple(streams), slo=Slo(**slo), **kw)


def _stream(sd: dict[str, Any], w: str) -> Stream:
    """A trace stream (``path``) or a steady one (``rate_per_s``, ``prompt_tokens``, ``output_tokens``)."""
    steady = ("rate_per_s", "prompt_tokens", "output_tokens")
    if not isinstance(sd.get("name"), str) or not sd["name"] or isinstance(sd.get("path"), str) == any(
            k in sd for k in steady):
        raise InvalidArgument(w, "a stream needs a name and either the path of an Azure trace CSV or rate_per_s, "
                                 "prompt_tokens and output_tokens (a steady load)")
    ctx = _number(sd.get("context_tokens", 8192), f"{w}.context_tokens", lo=2, hi=1 << 20, integer=True)
    if "path" in sd:
        return Stream(sd["name"][:40], sd["path"], _number(sd.get("trace_start_s", 0.0), f"{w}.trace_start_s"),
                      _number(sd.get("rate_scale", 1.0), f"{w}.rate_scale", lo=1e-6, hi=1e3), ctx)
    prompt = _number(sd.get("prompt_tokens"), f"{w}.prompt_tokens", lo=1, hi=ctx - 1, integer=True)
    return Stream(sd["name"][:40], "", context_tokens=ctx,
                  rate_per_s=_number(sd.get("rate_per_s"), f"{w}.rate_per_s", lo=1e-6, hi=1e5),
                  prompt_tokens=prompt,
                  output_tokens=_number(sd.get("output_tokens"), f"{w}.output_tokens", lo=1, hi=ctx - prompt,
                                        integer=True))


def _faults(raw: Any, jobs: tuple[Job, ...], site: Site, limits: Limits) -> tuple[Fault, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > limits.max_faults:
        raise InvalidArgument("faults", f"must be a list of at most {limits.max_faults} faults")
    by_key = {j.key: j for j in jobs}
    out = []
    for i, f in enumerate(raw):
        w = f"faults[{i}]"
        d = _keys(f, w, FAULT_KEYS)
        if d.get("kind") not in FAULT_KINDS:
            raise InvalidArgument(f"{w}.kind",
                                  f"must be one of {', '.join(FAULT_KINDS)}, got {str(d.get('kind'))[:40]!r}")
        fault = Fault(
            at_s=_number(d.get("at_s", 0.0), f"{w}.at_s", hi=limits.max_duration_s), kind=d["kind"],
            job=str(d.get("job", ""))[:200], target=str(d.get("target", ""))[:200],
            device_index=_number(d.get("device_index", 0), f"{w}.device_index", hi=2**40, integer=True),
            device=_number(d.get("device", -1), f"{w}.device", lo=-1, hi=site.chips - 1, integer=True),
            clock_factor=_number(d.get("clock_factor", 0.5), f"{w}.clock_factor", lo=1e-3, hi=0.999),
            capacity_factor=_number(d.get("capacity_factor", 0.5), f"{w}.capacity_factor", lo=1e-3, hi=0.999),
            clear_after_s=_number(d.get("clear_after_s", 0.0), f"{w}.clear_after_s", hi=limits.max_duration_s))
        if fault.is_chip:
            if bool(fault.job) == (fault.device >= 0):
                raise InvalidArgument(w, "a chip fault names a job (job: tenant/name) or a device id, one of them")
            if fault.job and fault.job not in by_key:
                raise InvalidArgument(f"{w}.job", f"no job {fault.job[:60]!r} in this scenario (tenant/name)")
            if fault.job and fault.device_index >= by_key[fault.job].chips:
                raise InvalidArgument(f"{w}.device_index", f"the job has {by_key[fault.job].chips} chips")
        elif not fault.target.startswith(("links/", "switches/")):
            raise InvalidArgument(f"{w}.target", "a link fault names links/<id> or switches/<id>")
        out.append(fault)
    return tuple(out)


def parse(data: Any, *, base_dir: pathlib.Path | None = None, limits: Limits = DEFAULT_LIMITS) -> Scenario:
    """A validated :class:`Scenario` from a parsed YAML mapping; the first bad field is refused by name."""
    d = _keys(data, "", TOP_KEYS)
    base = base_dir or pathlib.Path(".")
    name = d.get("name")
    if not isinstance(name, str) or not JOB_NAME_RE.match(name):
        raise InvalidArgument("name", "the scenario needs a name of letters, digits, '.', '_' and '-'")
    if "site" not in d:
        raise InvalidArgument("site", "say which site the file expects: {preset: NAME} or {chip: C, chips: N}")
    site = _site(d["site"])
    tenants = _tenants(d.get("tenants"), limits)
    jobs = _jobs(d.get("jobs") or [], tenants, site, base, limits)
    inference = _inference(d.get("inference"), tenants, limits)
    if not jobs and inference is None:
        raise InvalidArgument("jobs", "a scenario needs jobs, an inference fleet or both")
    return Scenario(
        name=name, site=site, tenants=tenants, jobs=jobs, inference=inference,
        faults=_faults(d.get("faults"), jobs, site, limits),
        duration_s=_number(d.get("duration_s"), "duration_s", lo=1e-3, hi=limits.max_duration_s),
        speedup=_number(d.get("speedup", 0.0), "speedup", hi=1e6),
        sample_every_s=_number(d.get("sample_every_s", 0.0), "sample_every_s", hi=limits.max_duration_s),
        seed=_number(d.get("seed", 0), "seed", hi=2**32 - 1, integer=True),
        description=str(d.get("description", ""))[:2000], base_dir=base)


def load(path: str | pathlib.Path, *, limits: Limits = DEFAULT_LIMITS) -> Scenario:
    """Read (bounded) and validate a scenario file; relative paths inside resolve against the repository root
    (the parent of the file's directory when it sits in examples/) or the file's directory."""
    p = pathlib.Path(path)
    base = p.resolve().parent
    if base.name == "examples":
        base = base.parent
    return parse(safeyaml.load_file(p), base_dir=base, limits=limits)
