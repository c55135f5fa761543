"""The local stack's port picking and start-up diagnostics, without starting a mesh."""

from __future__ import annotations

import os
import pathlib
import socket
import sys

import pytest

from gigacluster.stack import _LOW_PORT, Proc, Stack, StackConfig, _ephemeral_low, free_port


def test_free_ports_come_from_below_the_ephemeral_range_and_are_bindable() -> None:
    """A picked port lies below the kernel's ephemeral range (so an outgoing connection cannot take it
    before its service binds it) and can be bound at once."""
    lo = _ephemeral_low()
    ports = {free_port() for _ in range(50)}
    assert all(_LOW_PORT <= p < lo for p in ports), sorted(ports)[:5]
    assert len(ports) > 40  # random, not one port handed out again and again
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_port_held_by_a_listener_is_never_picked() -> None:
    """free_port skips a port something already listens on."""
    held = []
    try:
        for _ in range(30):
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            s.listen()
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        assert not taken & {free_port() for _ in range(200)}
    finally:
        for s in held:
            s.close()


def test_a_start_up_timeout_quotes_the_service_log(tmp_path: pathlib.Path) -> None:
    """The error for a service that never came up ends with the last lines of its log."""
    st = Stack(StackConfig(cluster="t", chip="h100-sxm", chips=8, shards=1, state_dir=tmp_path))
    log = tmp_path / "router.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)) + "OSError: [Errno 98] Address already in use\n")
    st.procs["router"] = Proc("router", ["true"], {}, log)
    tail = st._log_tail("router")
    assert tail.endswith("OSError: [Errno 98] Address already in use")
    assert "line 39" in tail and "line 20" not in tail


async def test_a_service_that_exits_at_start_up_is_named_with_its_log(tmp_path: pathlib.Path) -> None:
    """A child that dies before it serves: the error names it, its exit status and the last lines of its log (a
    2 GW benchmark run once failed with only "chip-7 exited with 1 during start-up", and nothing left to read)."""
    st = Stack(StackConfig(cluster="t", chip="h100-sxm", chips=8, shards=1, state_dir=tmp_path, restart=False))
    st.ports["router"] = free_port()
    log = tmp_path / "router.log"
    st.procs = {"router": Proc("router", [sys.executable, "-c", "import sys; print('ValueError: bad flag --x', "
                                          "file=sys.stderr); sys.exit(3)"], dict(os.environ), log)}
    await st.procs["router"].start()
    await st.procs["router"].proc.wait()  # type: ignore[union-attr]
    with pytest.raises(RuntimeError) as err:
        await st.wait_healthy(timeout_s=10)
    msg = str(err.value)
    assert msg.startswith("router exited with 3 during start-up") and msg.endswith("ValueError: bad flag --x"), msg
