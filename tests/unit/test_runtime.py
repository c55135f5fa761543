"""Unit tests of the runtime pieces every service shares (no sockets)."""

from __future__ import annotations

import time

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from gigacluster import errors as E
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.runtime import config as C
from gigacluster.runtime import convert
from gigacluster.runtime.clock import VirtualClock
from gigacluster.runtime.errors import classify, to_status


def test_virtual_clock_scales_wall_time_by_the_speedup() -> None:
    """At 100x, one wall second after the epoch is 100 virtual seconds; wall_s inverts it."""
    c = VirtualClock(time.time() - 1.0, 100.0)
    assert c.now() == pytest.approx(100.0, abs=1.0)
    assert c.wall_s(50.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        VirtualClock(0.0, 0.0)


async def test_sleep_until_waits_the_scaled_wall_time() -> None:
    """sleep_until(now + 5 virtual s) at 100x takes about 50 ms of wall time, and a past time returns at once."""
    c = VirtualClock.starting_now(100.0)
    t0 = time.monotonic()
    await c.sleep_until(c.now() + 5.0)
    assert time.monotonic() - t0 >= 0.045
    t1 = time.monotonic()
    await c.sleep_until(c.now() - 10.0)
    assert time.monotonic() - t1 < 0.01


def test_config_precedence_is_flags_then_env_then_yaml_then_defaults(tmp_path: object) -> None:
    """A flag beats GIGACLUSTER_CHIP_*, which beats the YAML section, which beats the top level and defaults."""
    import pathlib

    p = pathlib.Path(str(tmp_path)) / "c.yaml"
    p.write_text("speedup: 7\nchip:\n  device_count: 16\n  chip: b200\n")
    cfg = C.load(C.ChipConfig, config_file=str(p), env={"GIGACLUSTER_CHIP_DEVICE_COUNT": "32"},
                 flags={"port": "6000", "chip": None})
    assert (cfg.port, cfg.device_count, cfg.chip, cfg.speedup) == (6000, 32, "b200", 7.0)
    default = C.load(C.SchedulerConfig, env={})
    assert default.port == 50054 and default.broker == "127.0.0.1:50053"


@pytest.mark.parametrize(("cls", "env", "needle"), [
    (C.ChipConfig, {"GIGACLUSTER_CHIP": "tpu-v9"}, "chip must be one of"),
    (C.ChipConfig, {"GIGACLUSTER_SPEEDUP": "fast"}, "speedup from GIGACLUSTER_SPEEDUP must be float"),
    (C.BrokerConfig, {"GIGACLUSTER_BROKER_SHARDS": "nohostport"}, "shards must be"),
    (C.FabricConfig, {"GIGACLUSTER_MQTT": "localhost"}, "mqtt must be HOST:PORT"),
])
def test_bad_config_fails_fast_naming_the_value(cls: type[C.CommonConfig], env: dict[str, str], needle: str) -> None:
    """An invalid value is refused at start-up with a message that names it."""
    with pytest.raises(C.ConfigError, match=needle):
        C.load(cls, env=env)


def test_page_slices_with_opaque_tokens_and_rejects_forged_ones() -> None:
    """Paging returns a token until the end; a token not issued by the call is INVALID_ARGUMENT."""
    items = list(range(25))
    first, tok = convert.page(items, 10, "")
    second, tok2 = convert.page(items, 10, tok)
    third, tok3 = convert.page(items, 10, tok2)
    assert first + second + third == items and tok3 == ""
    for bad in ("x", "-1", "999"):
        with pytest.raises(E.InvalidArgument, match="page_token"):
            convert.page(items, 10, bad)


def test_domain_errors_map_to_codes_with_error_info() -> None:
    """Each error family maps to its canonical code; the status carries an ErrorInfo with reason and field."""
    cases = [
        (E.InvalidArgument("spec.tp", "must divide"), "INVALID_ARGUMENT", "INVALID_FIELD"),
        (E.NotFound("jobs/j-1"), "NOT_FOUND", "NOT_FOUND"),
        (SpecError("model.preset", "unknown"), "INVALID_ARGUMENT", "INVALID_FIELD"),
        (DoesNotFitError("too big", need_bytes=2e11, have_bytes=8e10), "FAILED_PRECONDITION", "DOES_NOT_FIT"),
        (E.ResourceExhausted("full", retry_after_s=1.5), "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"),
        (RuntimeError("boom"), "INTERNAL", "INTERNAL"),
    ]
    for exc, code, reason in cases:
        got_code, got_reason, _msg, _meta = classify(exc)
        assert (got_code, got_reason) == (code, reason)
    st = to_status(E.InvalidArgument("spec.tp", "must divide heads"))
    assert st.code == grpc.StatusCode.INVALID_ARGUMENT
    detail = status_pb2.Status.FromString(dict(st.trailing_metadata)["grpc-status-details-bin"]).details[0]
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info) and info.metadata["field"] == "spec.tp" and info.domain == "gigacluster.dev"
    assert classify(E.ResourceExhausted("full", retry_after_s=1.5))[3]["retry_after_s"] == "1.500"
    trailers = dict(to_status(E.ResourceExhausted("full", retry_after_s=1.5)).trailing_metadata)
    assert trailers["retry-after-s"] == "1.500" and "grpc-status-details-bin" in trailers


def test_a_refusal_carries_grpcs_server_pushback() -> None:
    """gRFC A6 ("gRPC Retry Design", server pushback): a refusal with a retry-after carries
    grpc-retry-pushback-ms equal to its retry-after-ms; a RESOURCE_EXHAUSTED without one carries -1 (a retrying
    channel must not retry it); other statuses carry none."""
    trailers = dict(to_status(E.ResourceExhausted("full", retry_after_s=0.25)).trailing_metadata)
    assert trailers["grpc-retry-pushback-ms"] == trailers["retry-after-ms"] == "250"
    trailers = dict(to_status(E.ResourceExhausted("cannot place 40 replicas")).trailing_metadata)
    assert trailers["grpc-retry-pushback-ms"] == "-1" and "retry-after-ms" not in trailers
    assert "grpc-retry-pushback-ms" not in dict(to_status(E.InvalidArgument("spec.tp", "bad")).trailing_metadata)


def test_work_items_round_trip_through_the_proto() -> None:
    """Work -> WorkItem -> Work is the identity, including shape and the graph flag."""
    from gigacluster.model.roofline import Work
    from gigacluster.wire import chip as chip_wire

    ws = [Work(1e12, 2e9, "fp8", "matmul", 3, (128, 4096, 4096), graph=True), Work(0.0, 1e9, "bf16", "memory")]
    assert chip_wire.works(chip_wire.work_msgs(ws)) == ws


def test_decoded_work_items_are_kept_by_their_bytes_and_invalid_ones_never() -> None:
    """The chip decodes an item it has seen before from its bytes (the same Work value); an invalid item is
    refused with its position every time, however often it comes, and never enters the cache."""
    from gigacluster.chip.v1 import chip_pb2
    from gigacluster.errors import InvalidArgument
    from gigacluster.model.roofline import Work
    from gigacluster.wire import chip as chip_wire

    w = Work(3e12, 1e9, "bf16", "matmul", 1, (64, 8192, 8192))
    msgs = chip_wire.work_msgs([w, w])
    assert msgs[0] is msgs[1]  # one message per Work, copied into each request
    req = chip_pb2.WorkIteration(items=msgs)
    first, again = chip_wire.works(req.items), chip_wire.works(req.items)
    assert first == [w, w] and again[0] is first[0]
    with pytest.raises(InvalidArgument, match=r"items\[0\]\.shape"):
        chip_wire.works([chip_pb2.WorkItem(flops=1.0, shape=[2**63])])  # hostile: an absurd dimension
    bad = chip_pb2.WorkItem(kind="matmul", flops=-1.0)
    before = len(chip_wire._WORKS)
    for _ in range(2):
        with pytest.raises(InvalidArgument, match=r"items\[1\]\.flops"):
            chip_wire.works([req.items[0], bad])
    assert len(chip_wire._WORKS) == before
