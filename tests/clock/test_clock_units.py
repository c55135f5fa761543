"""The clocks' small parts without a mesh: lag, waiting past a peer's event, calls over HTTP, the loadtest's
timebase."""

from __future__ import annotations

import asyncio
import math

import pytest

from gigacluster.loadtest.drivers import Timebase
from gigacluster.runtime import clock
from gigacluster.runtime.clock import EventClock, VirtualClock, parse_vt, serving, vt_mac


def test_lag_is_wall_time_behind_on_the_wall_clock_and_never_on_the_event_clock() -> None:
    """A wall clock at 10x that is 5 virtual s past t is 0.5 wall s behind it (0 before t); an event clock
    past t is never behind (it moves only once everyone is done with t)."""
    wall = VirtualClock(epoch_unix_s=0.0, speedup=10.0)
    now = wall.now()
    assert wall.lag_wall_s(now - 5.0) == pytest.approx(0.5, abs=0.05)
    assert wall.lag_wall_s(now + 100.0) == 0.0
    ev = EventClock(10.0)
    assert ev.lag_wall_s(5.0) == 0.0 and ev.lag_wall_s(20.0) == 0.0


async def test_waiting_past_an_event_is_the_least_step_of_virtual_time() -> None:
    """wait_past(t) on the event clock is a wake-up just after t (after now if t has passed), which only the
    coordinator's advance ends."""
    ev = EventClock(3.0)
    task = asyncio.ensure_future(ev.wait_past(3.0, poll_wall_s=60.0))
    await asyncio.sleep(0)
    assert ev.next_wake_s() == math.nextafter(3.0, math.inf) and not task.done()
    ev.advance(math.nextafter(3.0, math.inf))
    await asyncio.wait_for(task, 1.0)


def test_a_time_on_a_call_must_be_finite() -> None:
    """parse_vt takes finite numbers only: absent, malformed, inf and nan are None."""
    assert parse_vt("2.5") == 2.5
    assert [parse_vt(v) for v in (None, "", "x", "inf", "-inf", "nan", "1e999")] == [None] * 7


def test_an_http_call_from_a_participant_is_open_while_served() -> None:
    """serving() with a participant's time and its proof under the admin key moves the clock to it and counts
    the call open until it ends; without the proof (another key, none), or with a non-finite time, the call
    is activity only; without an event clock it does nothing."""
    keys = ("ak", "sk")
    with serving("1.0", vt_mac("ak", "1.0"), keys):
        pass  # wall mode: nothing to count
    ev = EventClock(1.0)
    clock.install(ev)
    try:
        with serving("4.0", vt_mac("ak", "4.0"), keys):
            assert (ev.now(), ev.calls_in) == (4.0, 1)
        assert ev.calls_in == 0
        for vt, mac in (("1e300", vt_mac("tenant-key", "1e300")), ("1e300", None), ("9.0", vt_mac("ak", "8.0")),
                        ("inf", vt_mac("ak", "inf"))):
            before = ev.activity
            with serving(vt, mac, keys):
                assert ev.calls_in == 0 and ev.now() == 4.0
            assert ev.activity > before
    finally:
        clock.install(None)


def test_the_loadtest_timebase_stamps_chunks_at_their_virtual_time() -> None:
    """On the event clock a chunk reached the client when the router produced it, and an HTTP request is
    stamped and counted open while it runs; the wall timebase reads the loop's clock."""
    ev = EventClock(7.0)
    tb = Timebase(ev, "ak")
    assert tb.virtual and tb.now() == 7.0 and tb.seen(7.25) == 7.25 and tb.seen(0.0) == 7.0
    headers: dict[str, str] = {}
    with tb.http_call(headers):
        assert headers[clock.VT_KEY] == "7.0" and ev.calls_out == 1
        assert headers[clock.VT_MAC_KEY] == vt_mac("ak", "7.0")
    assert ev.calls_out == 0
    wall_headers: dict[str, str] = {}
    with Timebase().http_call(wall_headers):
        pass
    assert wall_headers == {} and not Timebase().virtual


async def test_a_call_waiting_for_the_first_key_pull_holds_the_mesh_time() -> None:
    """A capability check before the service's first verification-key pull waits for that pull, which is outside
    the clock (clock_wire.UNCOUNTED): it holds the event clock meanwhile, so the mesh cannot look quiet with the
    call open at both ends and move time past the work the call books (the determinism scenario's first step
    of a shard's first job saw time jump 2.8 -> 20 s in about one run in five before this)."""
    from gigacluster.errors import Unauthenticated
    from gigacluster.runtime.auth import CAPABILITY_HEADER, BrokerAuth

    class Ctx:
        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return ((CAPABILITY_HEADER, "not-a-token"),)

    ev = EventClock(1.0)
    clock.install(ev)
    auth = BrokerAuth("127.0.0.1:1", cluster="c", service_key="sk")
    held: list[int] = []

    async def pull(*, force: bool = False) -> None:
        held.append(ev.holds)
        await asyncio.sleep(0)
        auth._verifier = Verifier()

    class Verifier:
        def verify(self, token: str, now: float) -> None:
            raise Unauthenticated("bad token")

    auth.refresh = pull  # type: ignore[method-assign]
    try:
        with pytest.raises(Unauthenticated):
            await auth.capability(Ctx(), "compute.run")  # type: ignore[arg-type]
        assert held == [1] and ev.holds == 0  # held while the pull ran, released after
    finally:
        clock.install(None)
