"""Pure pieces of the hardened edge: short error quotes, config bounds, device timing reset, fair shedding."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import pytest

from gigacluster.chip.shard import ChipShard
from gigacluster.errors import InvalidArgument, NotFound
from gigacluster.hw.catalog import get_chip, get_system
from gigacluster.model.roofline import Work
from gigacluster.runtime import config as C
from gigacluster.runtime.errors import MAX_MESSAGE_CHARS, error_info, preview, to_status
from gigacluster.runtime.server import DecodeErrorInterceptor, FairShareInterceptor, credential_key
from gigacluster.security.ratelimit import BucketSpec, RateLimitSpec, TenantRateLimiter


def test_preview_keeps_short_text_and_cuts_long_text_with_its_length() -> None:
    """A short string is unchanged; a long one keeps its prefix, an ellipsis and its full length."""
    assert preview("abc") == "abc"
    cut = preview("x" * 10_000, 20)
    assert cut == "x" * 20 + "... (10000 chars)"


def test_status_truncates_message_and_every_metadata_value() -> None:
    """An error quoting a 1 MB field becomes a status whose message and ErrorInfo values are short."""
    huge = "y" * 1_000_000
    st = to_status(NotFound(huge, f"no such thing {huge}"))
    assert st.code == grpc.StatusCode.NOT_FOUND
    assert len(st.details) <= MAX_MESSAGE_CHARS + 30
    from google.rpc import error_details_pb2, status_pb2

    detail = dict(st.trailing_metadata)["grpc-status-details-bin"]
    info = error_details_pb2.ErrorInfo()
    status_pb2.Status.FromString(detail).details[0].Unpack(info)
    assert max(len(v) for v in info.metadata.values()) <= 230


@pytest.mark.parametrize(("cls", "field", "value"), [
    (C.ChipConfig, "max_device_ranges", 0), (C.ChipConfig, "not_before_horizon_s", float("inf")),
    (C.FabricConfig, "max_collective_ranks", -1), (C.FabricConfig, "max_flow_bytes", float("nan")),
    (C.CommonConfig, "rate_max_wait_s", -1.0),
])
def test_bounds_must_be_finite_and_positive(cls: type[C.CommonConfig], field: str, value: Any) -> None:
    """Every size bound fails fast at start-up when not a finite number > 0, naming the field."""
    with pytest.raises(C.ConfigError) as exc:
        C.load(cls, flags={field: value}, env={})
    assert field in str(exc.value)


def _shard() -> ChipShard:
    return ChipShard(get_chip("h100-sxm"), get_system("hgx"), offset=0, count=8, start_s=0.0)


def test_reset_timing_cancels_work_booked_ahead() -> None:
    """Work a tenant booked far ahead is cancelled on release: the devices are free after the scrub, books unchanged."""
    s = _shard()
    idx = np.arange(8)
    w = Work(flops=1e20, bytes_=1e9, precision="bf16", kind="matmul", count=1000)
    res = s.execute(idx, [w], not_before_s=3000.0, now_s=10.0)
    assert res.end_s > 1e5
    s.reset_timing(idx, now_s=20.0, scrub_s=0.5)
    assert np.all(s.busy_until_s == 20.5)
    assert np.allclose(s.accrued(20.0)[0], 0.0) and np.allclose(s.accrued(20.0)[1], 0.0)
    nxt = s.execute(idx, [Work(flops=1e12, bytes_=1e9, precision="bf16", kind="matmul")], not_before_s=0.0,
                    now_s=20.0)
    assert nxt.start_s == 20.5


def test_credential_key_depends_on_both_credentials_only() -> None:
    """The digest changes with either credential, ignores other metadata, and is None without credentials."""
    a = credential_key((("authorization", "Bearer k"), ("x-request-id", "1")))
    assert a == credential_key((("authorization", "Bearer k"),))
    assert a != credential_key((("authorization", "Bearer k2"),))
    assert credential_key((("x-request-id", "1"),)) is None


async def _server(limiter: TenantRateLimiter, calls: list[bytes]) -> tuple[grpc.aio.Server, int]:
    def decode(raw: bytes) -> bytes:
        calls.append(raw)
        if raw == b"bad":
            raise ValueError("not a message")
        return raw

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        md = dict(context.invocation_metadata() or ())
        limiter.check(md["tenant"], asyncio.get_running_loop().time())
        return request

    handler = grpc.method_handlers_generic_handler("t.T", {"Echo": grpc.unary_unary_rpc_method_handler(
        echo, request_deserializer=decode, response_serializer=lambda b: b)})
    server = grpc.aio.server(interceptors=[FairShareInterceptor(limiter, 0.05), DecodeErrorInterceptor()])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_known_tenant_over_its_rate_is_refused_before_decoding() -> None:
    """Once a credential is known, calls past the rate plus max_wait are refused RESOURCE_EXHAUSTED undecoded;
    a bad body is INVALID_ARGUMENT, and another tenant's credential is served."""
    limiter = TenantRateLimiter(RateLimitSpec(ops=BucketSpec(size=2, refill_time_s=1000.0)))
    calls: list[bytes] = []
    server, port = await _server(limiter, calls)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            echo = ch.unary_unary("/t.T/Echo")
            a = (("authorization", "Bearer a"), ("tenant", "a"))
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await echo(b"bad", metadata=a)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Echo" in (exc.value.details() or "")
            assert await echo(b"1", metadata=a) == b"1"
            assert await echo(b"2", metadata=a) == b"2"
            n = len(calls)
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await echo(b"3", metadata=a)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len(calls) == n  # refused before its body was decoded
            assert error_info(exc.value) is not None
            assert await echo(b"4", metadata=(("authorization", "Bearer b"), ("tenant", "b"))) == b"4"
    finally:
        await server.stop(None)


def test_invalid_argument_names_field() -> None:
    """Sanity: the field a bound names is the first word of the message (clients grep it)."""
    assert str(InvalidArgument("ranks", "x")).startswith("ranks:")


def test_every_service_charges_an_rpc_limiter() -> None:
    """Each of the five services sets the tenant limiter the server paces (a service that forgot would run unpaced):
    four through Service.broker_auth(), the broker with its own."""
    import inspect

    from gigacluster.broker.service import BrokerService
    from gigacluster.chip.service import ChipService
    from gigacluster.fabric.service import FabricService
    from gigacluster.router.service import RouterService
    from gigacluster.scheduler.service import SchedulerService

    for cls in (ChipService, FabricService, RouterService, SchedulerService):
        assert "self.broker_auth()" in inspect.getsource(cls.__init__), cls.__name__
    assert "self.limiter = rate_limiter(" in inspect.getsource(BrokerService.__init__)
