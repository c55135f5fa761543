"""The event loop every gigacluster process runs on: asyncio's own, or uvloop.

One place picks it, for the services (``gigacluster serve``), the router's front ends, the event
clock, the faults driver and the load client: ``run(coro)`` replaces ``asyncio.run(coro)``.
``GIGACLUSTER_EVENT_LOOP`` chooses for every process, so the two can be compared on the same build:

* ``asyncio``: the standard library's selector loop, the default of every process but the router's
  front ends;
* ``uvloop``: libuv's loop (MagicStack's uvloop, a dependency on Linux and macOS). grpc aio runs on
  any loop that can watch a file descriptor: its poller thread wakes the loop through a socket pair
  the loop reads (grpc/grpc PR #22258, which measured its asyncio-to-asyncio benchmark at 4,322 QPS
  on the default loop and 7,010 on uvloop; PR #22311 made the one completion queue serve any loop).

With the variable unset, a process may *prefer* uvloop (``run(coro, prefer="uvloop")``), and gets it
when the package imports. The router's front ends do: past their saturation they keep serving as
many requests as at it, where on asyncio's loop the served rate falls by a fifth to a third
(docs/performance.md, "Router front ends on uvloop"). The one-process router stays on asyncio's loop:
there uvloop let more calls in than the process could serve (p99 of seconds, connections reset) where
asyncio's loop refused them RESOURCE_EXHAUSTED / 429 ("Router on uvloop").

An unknown value fails at start-up with a message naming the allowed ones; ``uvloop`` asked for but
not installed fails the same way rather than silently running the other loop (a preference falls back).
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


def chosen(value: str | None = None, *, prefer: str = "asyncio") -> str:
    """The loop's name from ``value`` (default: the environment), checked: ``uvloop`` or ``asyncio``.

    When neither names one, ``prefer``: ``uvloop`` if it imports, else ``asyncio``."""
    raw = os.environ.get(ENV, "") if value is None else value
    name = raw.strip().lower()
    if not name:
        if prefer not in CHOICES:
            raise ValueError(f"prefer must be one of {CHOICES}, got {prefer!r}")
        return "uvloop" if prefer == "uvloop" and _uvloop_factory() is not None else "asyncio"
    if name not in CHOICES:
        raise ConfigError(f"{ENV} must be one of {', '.join(CHOICES)}, got {raw[:40]!r}")
    if name == "uvloop" and _uvloop_factory() is None:
        raise ConfigError(f"{ENV}=uvloop but the uvloop package is not installed "
                          f"(pip install uvloop, or set {ENV}=asyncio)")
    return name


def loop_factory(value: str | None = None, *, prefer: str = "asyncio") -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops of the chosen kind (for ``asyncio.Runner``)."""
    if chosen(value, prefer=prefer) == "uvloop":
        factory = _uvloop_factory()
        assert factory is not None  # chosen() checked it
        return factory
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], *, loop: str | None = None, prefer: str = "asyncio") -> T:
    """``asyncio.run(main)`` on the chosen loop (``loop`` overrides the environment; ``prefer`` applies when
    neither names one)."""
    try:
        factory = loop_factory(loop, prefer=prefer)
    except ConfigError:
        main.close()  # never awaited: close it so no "coroutine was never awaited" warning follows the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
