"""The event loop every gigacluster process runs on: asyncio's own, or uvloop on request.

One place picks it, for the services (``gigacluster serve``), the router's front ends, the event
clock, the faults driver and the load client: ``run(coro)`` replaces ``asyncio.run(coro)``.
``GIGACLUSTER_EVENT_LOOP`` chooses, so the two can be compared on the same build:

* ``asyncio`` (the default): the standard library's selector loop;
* ``uvloop``: libuv's loop (MagicStack's uvloop, the optional extra ``gigacluster[uvloop]``). grpc
  aio runs on any loop that can watch a file descriptor: its poller thread wakes the loop through a
  socket pair the loop reads (grpc/grpc PR #22258, which measured its asyncio-to-asyncio benchmark at
  4,322 QPS on the default loop and 7,010 on uvloop; PR #22311 made the one completion queue serve
  any loop). Here it cut grpc aio's CPU per streamed call by 10-20% and the router's by 20-30%, but
  under overload on a 2-core machine its router also ended calls CANCELLED and reset HTTP
  connections where the asyncio router refused them RESOURCE_EXHAUSTED / 429 (docs/performance.md,
  "Router on uvloop"), so it is not the default until a quiet machine says which.

An unknown value fails at start-up with a message naming the allowed ones; ``uvloop`` asked for but
not installed fails the same way rather than silently running the other loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gigacluster.runtime.config import ConfigError

ENV = "GIGACLUSTER_EVENT_LOOP"
CHOICES = ("asyncio", "uvloop")

T = TypeVar("T")


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def chosen(value: str | None = None) -> str:
    """The loop's name from ``value`` (default: the environment), checked: ``uvloop`` or ``asyncio``."""
    raw = os.environ.get(ENV, "") if value is None else value
    name = raw.strip().lower()
    if not name:
        return "asyncio"
    if name not in CHOICES:
        raise ConfigError(f"{ENV} must be one of {', '.join(CHOICES)}, got {raw[:40]!r}")
    if name == "uvloop" and _uvloop_factory() is None:
        raise ConfigError(f"{ENV}=uvloop but the uvloop package is not installed "
                          f"(pip install 'gigacluster[uvloop]', or set {ENV}=asyncio)")
    return name


def loop_factory(value: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops of the chosen kind (for ``asyncio.Runner``)."""
    if chosen(value) == "uvloop":
        factory = _uvloop_factory()
        assert factory is not None  # chosen() checked it
        return factory
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], *, loop: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop (``loop`` overrides the environment)."""
    try:
        factory = loop_factory(loop)
    except ConfigError:
        main.close()  # never awaited: close it so no "coroutine was never awaited" warning follows the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
