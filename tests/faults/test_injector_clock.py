"""The fault injector's calls carry its virtual time with the mesh's proof, so a fault strikes at its own time."""

from __future__ import annotations

import grpc

from gigacluster.faults.driver import FaultsConfig, event_clock
from gigacluster.runtime.clock import EventClock
from gigacluster.runtime.clock_wire import ClockServerInterceptor, client_interceptors


def _same(b: bytes) -> bytes:
    return b


async def test_an_injected_fault_runs_at_the_injectors_time_not_the_shards_last_one() -> None:
    """A shard that last heard of t=171,313 s (a repair) takes an InjectFault drawn at t=200,192 s at that time:
    the injector signs its time with the service key the shard accepts. (Unsigned, the shard ran the fault at its
    own stale time and cut its windows 28,878 s early: the gap of the 140-hour Llama 3 run.)"""
    shard_clock = EventClock(171_313.0, sign_key="svc-key", wire_keys=("svc-key", "admin-key"))
    seen: list[float] = []

    async def inject(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen.append(shard_clock.now())
        return b"ok"

    server = grpc.aio.server(interceptors=[ClockServerInterceptor(shard_clock)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Chip", {"InjectFault": grpc.unary_unary_rpc_method_handler(inject, _same, _same)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        injector = event_clock(FaultsConfig(clock="event", clock_coordinator="127.0.0.1:1", service_key="svc-key"))
        injector.advance(200_192.0)  # the coordinator woke it at the fault's time
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=client_interceptors(injector)) as ch:
            assert await ch.unary_unary("/test.Chip/InjectFault", _same, _same)(b"") == b"ok"
        assert seen == [200_192.0]
        assert injector.calls_out == 0 and shard_clock.calls_in == 0  # counted open at both ends, then closed
    finally:
        await server.stop(None)
