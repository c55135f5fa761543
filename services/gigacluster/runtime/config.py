"""Service configuration: one frozen dataclass per service, read from (highest first) CLI flags,
``GIGACLUSTER_<SERVICE>_<FIELD>`` / ``GIGACLUSTER_<FIELD>`` environment variables, a YAML file
(top-level keys for every service, a ``<service>:`` section for one), then defaults.

Validation happens at start-up in ``__post_init__``; a bad value fails fast naming the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from gigacluster import registry, safeyaml
from gigacluster.errors import InvalidArgument
from gigacluster.hw.catalog import chip_names, system_names
from gigacluster.runtime.clock import CLOCK_MODES

T = TypeVar("T", bound="CommonConfig")


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names it and its source."""


def _f(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class CommonConfig:
    """Settings every service shares."""

    service: typing.ClassVar[str] = "common"

    cluster: str = _f("local", "cluster name; the MQTT topic root is gigacluster/<cluster>/")
    host: str = _f("127.0.0.1", "address to bind")
    port: int = _f(0, "port to bind (0 = any free port)")
    mqtt: str = _f("", "MQTT broker HOST:PORT for telemetry; empty disables telemetry")
    mqtt_username: str = _f("", "MQTT user name")
    mqtt_password: str = _f("", "MQTT password")
    clock_epoch: float = _f(0.0, "wall time (unix s) of virtual time 0, shared by the mesh; 0 = now")
    speedup: float = _f(1.0, "virtual seconds per wall second (1 = real time; wall clock only)")
    clock: str = _f("wall", "virtual clock: wall (virtual time = wall time x speedup) or event (time jumps to the "
                            "next event once the whole mesh is idle; needs clock_coordinator)")
    clock_coordinator: str = _f("", "event clock coordinator HOST:PORT (gigacluster serve clock)")
    clock_connect_timeout_s: float = _f(10.0, "wall seconds a service in event mode waits for the clock "
                                              "coordinator at start before it fails")
    log_format: str = _f("json", "json or console")
    log_level: str = _f("info", "debug, info, warning or error")
    broker: str = _f("127.0.0.1:50053", "isolation broker HOST:PORT")
    admin_key: str = _f("", "admin API key (the broker hashes it at start)")
    service_key: str = _f("", "key the services use to call each other")
    state_dir: str = _f("", "directory for durable state (empty = in memory)")
    telemetry_interval_s: float = _f(1.0, "wall seconds between telemetry publications")
    grace_s: float = _f(5.0, "grace period for in-flight calls on SIGTERM")
    metrics_port: int = _f(-1, "Prometheus /metrics port (-1 = off, 0 = any free port)")
    rate_ops_per_s: float = _f(500.0, "per-tenant RPC token bucket per service: size and refill per wall second "
                                        "(0 = off); a quarter of what one service process serves (docs/performance.md)")
    rate_ops_burst: float = _f(0.0, "per-tenant one-time burst on top of the RPC bucket (Firecracker one_time_burst)")
    rate_max_wait_s: float = _f(0.25, "a call over its tenant's RPC rate waits up to this long for a token "
                                      "(paced), and beyond it is refused RESOURCE_EXHAUSTED")

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not -1 <= self.metrics_port < 65536:
            raise ConfigError(f"metrics_port must be -1 (off) or in 0..65535, got {self.metrics_port}")
        if not self.speedup > 0:
            raise ConfigError(f"speedup must be > 0, got {self.speedup}")
        check_clock(self.clock, self.clock_coordinator, self.clock_connect_timeout_s, agent=self.service != "clock")
        if self.log_format not in ("json", "console"):
            raise ConfigError(f"log_format must be json or console, got {self.log_format!r}")
        if self.mqtt and not _is_endpoint(self.mqtt):
            raise ConfigError(f"mqtt must be HOST:PORT, got {self.mqtt!r}")
        if not _is_endpoint(self.broker):
            raise ConfigError(f"broker must be HOST:PORT, got {self.broker!r}")
        if self.telemetry_interval_s <= 0:
            raise ConfigError("telemetry_interval_s must be > 0")
        if self.rate_ops_per_s < 0 or self.rate_ops_burst < 0 or self.rate_max_wait_s < 0:
            raise ConfigError("rate_ops_per_s, rate_ops_burst and rate_max_wait_s must be >= 0")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def check_clock(mode: str, coordinator: str, connect_timeout_s: float, *, agent: bool = True) -> None:
    """Fail fast on an unknown clock mode (listing the allowed ones), or event mode without a coordinator
    (``agent``: a service that must report to one; the coordinator itself does not)."""
    if mode not in CLOCK_MODES:
        raise ConfigError(f"clock must be one of {', '.join(CLOCK_MODES)}; got {mode[:40]!r}")
    if mode == "event" and agent and not coordinator:
        raise ConfigError("clock event needs the coordinator's HOST:PORT in clock_coordinator "
                          "(--clock-coordinator or GIGACLUSTER_CLOCK_COORDINATOR; started by gigacluster serve clock)")
    if coordinator and not _is_endpoint(coordinator):
        raise ConfigError(f"clock_coordinator must be HOST:PORT, got {coordinator[:80]!r}")
    if not 0 < connect_timeout_s < float("inf"):
        raise ConfigError(f"clock_connect_timeout_s must be a finite number > 0, got {connect_timeout_s!r}")


def _positive(cfg: CommonConfig, *names: str) -> None:
    """Fail fast unless every named bound is a finite number > 0."""
    for name in names:
        v = getattr(cfg, name)
        if not 0 < v < float("inf"):
            raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")


def _registered(family: str, name: str) -> None:
    """Fail fast unless ``name`` is a policy of ``family`` (registered, installed as an entry point,
    or an import path ``pkg.module:Object``, which this imports and registers); see docs/extending.md."""
    try:
        registry.check(family, name)
    except InvalidArgument as exc:
        raise ConfigError(exc.message) from exc


def _is_endpoint(s: str) -> bool:
    host, _, port = s.rpartition(":")
    return bool(host) and port.isdigit()


@dataclasses.dataclass(frozen=True)
class ChipConfig(CommonConfig):
    service: typing.ClassVar[str] = "chip"
    port: int = _f(50051, "port to bind")
    chip: str = _f("h100-sxm", "chip type from the catalog")
    system: str = _f("", "scale-up system (empty = the chip's default)")
    device_offset: int = _f(0, "global id of this shard's first device")
    device_count: int = _f(64, "devices hosted by this shard")
    virtualization: str = _f("none", "isolation layer cost: none (bare metal) or nitro (security/overhead.py)")
    max_device_ranges: int = _f(1024, "device ranges one chip request may name (more: RESOURCE_EXHAUSTED)")
    max_io_bytes: int = _f(4 * 1024 * 1024, "bytes one ReadMemory/WriteMemory call may move (more: RESOURCE_EXHAUSTED)")
    not_before_horizon_s: float = _f(3600.0, "virtual seconds ahead of now a not_before_s may lie (further: "
                                             "INVALID_ARGUMENT), so no start can hold devices for ever")
    max_report_iterations: int = _f(4096, "batch iterations one ReportWork call may book (more: RESOURCE_EXHAUSTED)")
    max_window_repeat: int = _f(100_000, "repetitions one ExecuteWindow may book (more: RESOURCE_EXHAUSTED)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "max_device_ranges", "max_io_bytes", "not_before_horizon_s", "max_report_iterations",
                  "max_window_repeat")
        if self.chip not in chip_names():
            raise ConfigError(f"chip must be one of {', '.join(chip_names())}; got {self.chip!r}")
        if self.system and self.system not in system_names():
            raise ConfigError(f"system must be one of {', '.join(system_names())}; got {self.system!r}")
        if self.device_offset < 0 or self.device_count <= 0:
            raise ConfigError("device_offset must be >= 0 and device_count > 0")
        if self.device_count > 4_000_000:
            raise ConfigError("device_count must be <= 4,000,000 per shard")
        if self.virtualization not in ("none", "nitro"):
            raise ConfigError(f"virtualization must be none or nitro, got {self.virtualization!r}")


@dataclasses.dataclass(frozen=True)
class FabricConfig(CommonConfig):
    service: typing.ClassVar[str] = "fabric"
    port: int = _f(50052, "port to bind")
    chip: str = _f("h100-sxm", "accelerator type the topology connects")
    count: int = _f(64, "accelerators in the topology")
    system: str = _f("", "scale-up system (empty = the chip's default)")
    nic: str = _f("", "NIC type: nic400 or thor-ultra (empty = the chip's own, from the catalog)")
    switch: str = _f("", "scale-out switch: tomahawk5, tomahawk6 or tomahawk-ultra (empty = chosen from the size)")
    tiers: int = _f(0, "scale-out fat-tree tiers: 2 or 3 (0 = the smallest tree that holds count)")
    oversubscription: float = _f(1.0, "leaf downlink:uplink ratio (1 = non-blocking)")
    routing: str = _f("ecmp", "ecmp (hash per flow), spray (packet spraying) or adaptive (least-loaded path)")
    inference_priority: str = _f("weighted", "strict or weighted sharing between inference and training")
    inference_weight: float = _f(4.0, "weight of inference flows against training flows (weighted mode)")
    rate_bytes_per_s: float = _f(0.0, "per-tenant fabric bandwidth bucket: bytes per virtual second (0 = off)")
    max_collective_ranks: int = _f(1_048_576, "ranks one StartCollective may name, over all its groups "
                                              "(more: RESOURCE_EXHAUSTED)")
    max_rank_ranges: int = _f(1024, "rank ranges one StartCollective may name (more: RESOURCE_EXHAUSTED)")
    max_collective_groups: int = _f(100_000, "groups one StartCollective may start (more: RESOURCE_EXHAUSTED)")
    max_flow_bytes: float = _f(1e15, "bytes per rank (collective) or per transfer (more: INVALID_ARGUMENT)")
    not_before_horizon_s: float = _f(3600.0, "virtual seconds ahead of now a not_before_s may lie "
                                             "(further: INVALID_ARGUMENT)")
    backdate_s: float = _f(0.25, "wall seconds the simulator lags the clock, so a call that arrives that late "
                                 "still starts its flows at its not_before_s (wall-clock mode)")
    max_window_steps: int = _f(100_000, "steps one ReserveWindow may reserve (more: RESOURCE_EXHAUSTED)")
    max_window_collectives: int = _f(256, "collectives in one window's step pattern (more: RESOURCE_EXHAUSTED)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(self, "max_collective_ranks", "max_rank_ranges", "max_collective_groups", "max_flow_bytes",
                  "not_before_horizon_s", "backdate_s", "max_window_steps", "max_window_collectives")
        if self.chip not in chip_names():
            raise ConfigError(f"chip must be one of {', '.join(chip_names())}; got {self.chip!r}")
        if self.count <= 0:
            raise ConfigError("count must be > 0")
        if self.inference_priority not in ("strict", "weighted"):
            raise ConfigError("inference_priority must be strict or weighted")
        _registered("fabric_routing", self.routing)
        if self.tiers not in (0, 2, 3):
            raise ConfigError(f"tiers must be 2, 3 or 0 (the smallest tree that holds count), got {self.tiers!r}")


@dataclasses.dataclass(frozen=True)
class BrokerConfig(CommonConfig):
    service: typing.ClassVar[str] = "broker"
    port: int = _f(50053, "port to bind")
    shards: str = _f("127.0.0.1:50051", "comma-separated chip shard endpoints")
    fabric: str = _f("127.0.0.1:50052", "fabric service HOST:PORT")
    capability_ttl_s: float = _f(900.0, "wall seconds a capability token lives")
    audit_log: str = _f("", "path of the JSON-lines audit log (empty = <state_dir>/audit.jsonl or none)")
    mqtt_files: str = _f("", "directory for the generated Mosquitto passwd and acl files (empty = <state_dir>/mqtt)")
    mqtt_admin_password: str = _f("", "MQTT password of the admin user, who reads every topic (empty = none)")
    db_path: str = _f("", "SQLite database of tenants, keys, instances (empty = <state_dir>/broker.db or memory)")
    audit_anchor_interval_s: float = _f(10.0, "wall seconds between signed anchors of the audit head")
    audit_denied_per_s: float = _f(50.0, "denied calls audited per second at most (the rest counted in one record)")
    max_instance_devices: int = _f(1 << 20, "devices one instance may hold (AllocateInstance count and ranges)")
    max_device_ranges: int = _f(4096, "device ranges one AllocateInstance may name")
    max_text_chars: int = _f(200, "characters of a display name or an instance purpose")

    def __post_init__(self) -> None:
        super().__post_init__()
        for ep in self.shard_endpoints:
            if not _is_endpoint(ep):
                raise ConfigError(f"shards must be comma-separated HOST:PORT, got {ep!r}")
        if not 0 < self.capability_ttl_s < float("inf"):
            raise ConfigError("capability_ttl_s must be a finite number > 0")
        if not 0 < self.audit_anchor_interval_s < float("inf"):
            raise ConfigError("audit_anchor_interval_s must be a finite number > 0")
        if not 0 <= self.audit_denied_per_s < float("inf"):
            raise ConfigError("audit_denied_per_s must be a finite number >= 0")
        if min(self.max_instance_devices, self.max_device_ranges, self.max_text_chars) < 1:
            raise ConfigError("max_instance_devices, max_device_ranges and max_text_chars must be >= 1")

    @property
    def shard_endpoints(self) -> list[str]:
        return [s.strip() for s in self.shards.split(",") if s.strip()]


@dataclasses.dataclass(frozen=True)
class SchedulerConfig(CommonConfig):
    service: typing.ClassVar[str] = "scheduler"
    port: int = _f(50054, "port to bind")
    placement: str = _f("topology", "placement policy: binpack, spread, topology, an installed one or "
                                    "pkg.module:Class (docs/extending.md)")
    progress_interval_steps: int = _f(1, "publish job progress every N steps")
    preemption: bool = _f(True, "higher-priority gangs evict lower-priority ones")
    backfill: bool = _f(True, "small jobs start in holes that do not delay the head job's reserved start")
    repair_s: float = _f(3600.0, "virtual seconds a chip or host taken out by a modelled fault (StepFailed.modelled) "
                                 "stays out; faults injected through the chips are out until the chip is healthy")
    max_queued_per_tenant: int = _f(10_000, "queued jobs one tenant may have; more is RESOURCE_EXHAUSTED")
    max_job_chips: int = _f(1 << 20, "largest spec.hardware.count a job may ask for")
    max_global_batch: int = _f(1 << 24, "largest spec.batch.global_batch (sequences)")
    max_job_steps: int = _f(100_000_000, "largest number of steps a job may run")
    peer_wait_s: float = _f(600.0, "wall seconds a running job waits for an unavailable chip/fabric/broker "
                            "before it is requeued from its checkpoint (never charged to max_restarts)")
    peer_backoff_max_s: float = _f(5.0, "longest wait between retries while a peer service is unavailable")
    dispatch_interval_s: float = _f(10.0, "wall seconds between dispatch passes when nothing has changed")
    dispatch_debounce_s: float = _f(0.2, "wall seconds a dispatch pass waits after a change, to batch a burst")
    max_window_steps: int = _f(5000, "most steps a job runs as one steady-state window (scheduler/window.py; a "
                                     "watcher's queue holds 10,000 updates: a window's steps and checkpoints fit); "
                                     "0 = every step through the per-step path")
    wall_clock_windows: bool = _f(False, "use steady-state windows on the wall clock too (they always run in "
                                         "event mode); off keeps a live run's progress step by step")
    event_dispatch_interval_s: float = _f(10.0, "event-clock mode: virtual seconds between dispatch passes while "
                                                "jobs wait in the queue (none while it is empty; a change dispatches "
                                                "at once, with no wall-time debounce)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _registered("placement", self.placement)
        if self.max_window_steps < 0:
            raise ConfigError(f"max_window_steps must be >= 0 (0 = no windows), got {self.max_window_steps}")


@dataclasses.dataclass(frozen=True)
class RouterConfig(CommonConfig):
    service: typing.ClassVar[str] = "router"
    port: int = _f(50055, "port to bind")
    http_port: int = _f(-1, "OpenAI-compatible HTTP port (-1 = off)")
    max_prompt_bytes: int = _f(131072, "largest prompt a request may send (UTF-8 bytes of text, 4 per token id); "
                                       "checked before tokenising")
    default_max_tokens: int = _f(16, "max_tokens of a request that leaves it out or sends null (OpenAI's default)")
    max_tokens_limit: int = _f(8192, "largest max_tokens a request may ask for")
    max_queue_limit: int = _f(16384, "largest max_queue a deployment may ask for")
    max_batch_limit: int = _f(4096, "largest max_batch a deployment may ask for")
    max_replicas: int = _f(1024, "largest number of replicas in one deployment")
    http_max_body_bytes: int = _f(4 * 1024 * 1024, "largest HTTP request body (413 above)")
    http_max_json_depth: int = _f(32, "deepest nesting of arrays and objects in an HTTP body (400 above)")
    http_max_header_bytes: int = _f(64 * 1024, "longest HTTP request line or header value the parser reads; a longer "
                                               "one is refused by the HTTP parser itself, before any handler")
    heal_backoff_max_s: float = _f(0.5, "longest wait between probes of a replica's restarted chips")
    max_streams: int = _f(8192, "open Generate streams (gRPC and HTTP) one router process holds; more are refused "
                                "RESOURCE_EXHAUSTED (HTTP 429) with overload_retry_after_s, before any work")
    max_loop_lag_s: float = _f(0.25, "a router process whose event loop runs this far behind refuses new requests "
                                     "RESOURCE_EXHAUSTED (HTTP 429) until it catches up")
    overload_retry_after_s: float = _f(0.2, "retry-after the router's own overload refusals carry (at least the lag)")
    accept_probe_interval_s: float = _f(0.05, "wall seconds between probes of how long new Generate calls wait in "
                                              "gRPC's core before the router sees them (runtime/accept_probe.py); "
                                              "over accept_target_s, a fraction of new calls is refused; 0: no probe")
    accept_target_s: float = _f(0.25, "how long new Generate calls may wait in gRPC's core before the router sees "
                                      "them; beyond, it refuses a fraction of new requests RESOURCE_EXHAUSTED (as PIE, "
                                      "RFC 8033) to hold the wait near this")
    grpc_max_pending_calls: int = _f(20000, "calls gRPC's core queues for the router before its event loop picks them "
                                            "up; beyond, the core itself cancels them (CANCELLED)")
    coalesce_lag_s: float = _f(0.005, "a stream whose tokens go out more than this (wall s) behind their virtual time "
                                      "holds each message after the first coalesce_hold_s for the tokens behind it")
    coalesce_hold_s: float = _f(0.01, "how long such a message waits for more tokens (0 = never hold)")
    stream_messages_per_s: float = _f(4000.0, "stream messages (gRPC responses, SSE writes) a second the router "
                                              "aims to send: a stream's tokens after its first wait up to "
                                              "open streams / this after its last message, to leave together "
                                              "(0 = every token its own message); first and last never wait")
    stream_max_hold_s: float = _f(0.2, "longest a stream message waits for more tokens under that budget (binds "
                                       "past budget x this open streams: 800 at the defaults; docs/performance.md "
                                       "'Router: a longer hold under load')")
    report_max_iterations: int = _f(1024, "batch iterations a replica books on its chips per ReportWork call "
                                          "(at most the shards' max_report_iterations)")
    report_interval_s: float = _f(0.05, "wall seconds between a replica's ReportWork calls at the most: under load "
                                        "each carries the iterations of this long (wall clock only)")
    run_ahead_iterations: int = _f(4096, "event clock only: batch iterations a replica may complete in one go "
                                         "ahead of the clock, while each next one forms before the coordinator's "
                                         "horizon (no request can reach it before then); 0 = one clock round "
                                         "per iteration")
    routing_policies: str = _f("", "comma-separated import paths (pkg.module:Class) of extra routing policies "
                                   "to register at start; a deployment names one by its path (docs/extending.md)")
    frontends: int = _f(0, "front-end processes sharing the router's gRPC and HTTP ports (SO_REUSEPORT): each "
                           "handles client streams, auth, parsing, token streaming and overload refusal, and forwards "
                           "requests over one link to this process (the core: deployments, replicas, batching); "
                           "0 = one process does everything")
    frontend_link_interval_s: float = _f(0.1, "how often the core sends its front ends the deployments' state "
                                              "when it changed (for /v1/models and health)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_prompt_bytes", "default_max_tokens", "max_tokens_limit", "max_queue_limit",
                     "max_batch_limit", "max_replicas", "http_max_body_bytes", "http_max_json_depth",
                     "http_max_header_bytes", "report_max_iterations", "max_streams", "grpc_max_pending_calls"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ConfigError("default_max_tokens must be <= max_tokens_limit")
        if not self.heal_backoff_max_s > 0:
            raise ConfigError("heal_backoff_max_s must be > 0")
        if not (self.max_loop_lag_s > 0 and self.overload_retry_after_s > 0):  # also refuses NaN
            raise ConfigError("max_loop_lag_s and overload_retry_after_s must be > 0")
        if not 0 <= self.accept_probe_interval_s <= 60:  # also refuses NaN
            raise ConfigError("accept_probe_interval_s must be in [0, 60] (0: no probe)")
        if not 0 < self.accept_target_s <= 60:
            raise ConfigError("accept_target_s must be in (0, 60]")
        if not (self.coalesce_lag_s >= 0 and 0 <= self.coalesce_hold_s <= 1):
            raise ConfigError("coalesce_lag_s must be >= 0 and coalesce_hold_s in [0, 1]")
        if not 0 <= self.run_ahead_iterations <= 1_000_000:
            raise ConfigError(f"run_ahead_iterations must be in [0, 1000000], got {self.run_ahead_iterations}")
        if not 0 <= self.report_interval_s <= 10:
            raise ConfigError(f"report_interval_s must be in [0, 10], got {self.report_interval_s}")
        if not (self.stream_messages_per_s >= 0 and 0 <= self.stream_max_hold_s <= 1):
            raise ConfigError("stream_messages_per_s must be >= 0 and stream_max_hold_s in [0, 1]")
        if not 0 <= self.frontends <= 64:
            raise ConfigError(f"frontends must be in [0, 64], got {self.frontends}")
        if self.frontends and self.clock == "event":
            raise ConfigError("frontends needs the wall clock: the event clock counts a router's calls in flight in "
                              "one process")
        _positive(self, "frontend_link_interval_s")
        for path in self.routing_policy_paths:
            if ":" not in path:
                raise ConfigError(f"routing_policies must be import paths pkg.module:Class, got {path[:64]!r}")
            _registered("routing", path)

    @property
    def routing_policy_paths(self) -> list[str]:
        return [s.strip() for s in self.routing_policies.split(",") if s.strip()]


CONFIGS: dict[str, type[CommonConfig]] = {
    c.service: c for c in (ChipConfig, FabricConfig, BrokerConfig, SchedulerConfig, RouterConfig)
}


@dataclasses.dataclass(frozen=True)
class ClockConfig(CommonConfig):
    """The event clock's coordinator (``gigacluster serve clock``; clock/service.py)."""

    service: typing.ClassVar[str] = "clock"
    port: int = _f(50056, "port to bind")
    expect: int = _f(0, "service processes of the mesh: virtual time holds while fewer are registered (0 = any)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.expect < 0:
            raise ConfigError(f"expect must be >= 0, got {self.expect}")


#: Everything ``gigacluster serve`` runs: the five services, and the event clock's coordinator (a process of
#: the mesh only in event-clock mode, so not one of the services every deployment has).
SERVE_CONFIGS: dict[str, type[CommonConfig]] = {**CONFIGS, ClockConfig.service: ClockConfig}


def _field_type(cls: type, name: str) -> type:
    hints = typing.get_type_hints(cls)
    t = hints[name]
    if isinstance(t, types.UnionType):
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return t  # type: ignore[no-any-return]


def _convert(cls: type, name: str, raw: Any, source: str) -> Any:
    t = _field_type(cls, name)
    try:
        if t is bool:
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return t(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} from {source} must be {t.__name__}, got {raw!r}") from exc


def add_arguments(parser: argparse.ArgumentParser, cls: type[CommonConfig]) -> None:
    """One ``--flag`` per config field (default None, so unset flags fall through)."""
    parser.add_argument("--config", metavar="FILE", help="YAML config file")
    for f in dataclasses.fields(cls):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=f"{f.metadata.get('help', '')} (default: {f.default!r})",
        )


def load(
    cls: type[T],
    *,
    flags: Mapping[str, Any] | None = None,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
) -> T:
    """Build and validate a config; precedence flags > env > YAML > defaults."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(cls)}
    config_file = config_file or env.get("GIGACLUSTER_CONFIG") or None
    if config_file:
        path = pathlib.Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file {config_file} does not exist")
        try:
            data = safeyaml.load_file(path) or {}
        except safeyaml.YamlError as exc:
            raise ConfigError(f"config file {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {config_file} must be a mapping")
        section = data.get(cls.service, {}) or {}
        for scope, mapping in (("top level", data), (cls.service, section)):
            for k, v in mapping.items():
                key = k.replace("-", "_")
                if key in names and not isinstance(v, dict):
                    values[key] = _convert(cls, key, v, f"{config_file} ({scope})")
    for name in names:
        for var in (f"GIGACLUSTER_{name.upper()}", f"GIGACLUSTER_{cls.service.upper()}_{name.upper()}"):
            if var in env:
                values[name] = _convert(cls, name, env[var], var)
    for name, v in (flags or {}).items():
        if name in names and v is not None:
            values[name] = _convert(cls, name, v, "--" + name.replace("_", "-"))
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
