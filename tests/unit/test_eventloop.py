"""The event-loop switch (runtime/eventloop.py): GIGACLUSTER_EVENT_LOOP picks the loop, a bad value fails fast."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from gigacluster.runtime import eventloop
from gigacluster.runtime.config import ConfigError

uvloop = pytest.importorskip("uvloop")


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_runs_the_coroutine_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIGACLUSTER_EVENT_LOOP=uvloop runs the coroutine on uvloop's loop."""
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    assert eventloop.run(_loop_type()) is uvloop.Loop


def test_asyncio_runs_the_coroutine_on_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIGACLUSTER_EVENT_LOOP=asyncio (any case) runs it on the standard library's loop, not uvloop's."""
    monkeypatch.setenv(eventloop.ENV, "AsyncIO")
    got = eventloop.run(_loop_type())
    assert got is not uvloop.Loop and issubclass(got, asyncio.BaseEventLoop)


def test_default_is_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the variable unset (or empty) the default is asyncio's loop, even with uvloop importable."""
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.chosen() == "asyncio"
    monkeypatch.setenv(eventloop.ENV, "")
    assert eventloop.run(_loop_type()) is not uvloop.Loop


def test_a_preference_for_uvloop_applies_when_the_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prefer="uvloop"`` (the router's front ends) runs on uvloop when the variable is unset or empty."""
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.run(_loop_type(), prefer="uvloop") is uvloop.Loop
    monkeypatch.setenv(eventloop.ENV, " ")
    assert eventloop.chosen(prefer="uvloop") == "uvloop"


def test_the_variable_wins_over_a_preference(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIGACLUSTER_EVENT_LOOP=asyncio puts even a process that prefers uvloop on asyncio's loop."""
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.run(_loop_type(), prefer="uvloop") is not uvloop.Loop


def test_a_preference_falls_back_when_uvloop_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preferred uvloop that does not import is asyncio's loop, not an error (only an explicit choice fails);
    an unknown preference is a programming error."""
    monkeypatch.delenv(eventloop.ENV, raising=False)
    monkeypatch.setattr(eventloop, "_uvloop_factory", lambda: None)
    assert eventloop.chosen(prefer="uvloop") == "asyncio"
    with pytest.raises(ValueError, match="prefer must be one of"):
        eventloop.chosen(prefer="trio")


def test_unknown_value_fails_naming_the_allowed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown loop name is a ConfigError that names the variable and both allowed values."""
    monkeypatch.setenv(eventloop.ENV, "trio")
    coro = _loop_type()
    with pytest.raises(ConfigError, match=r"GIGACLUSTER_EVENT_LOOP must be one of asyncio, uvloop, got 'trio'"):
        eventloop.run(coro)
    assert coro.cr_frame is None  # closed, so no "never awaited" warning (filterwarnings = error)


def test_uvloop_asked_for_but_missing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop asked for explicitly but not importable fails rather than silently running asyncio's loop."""
    monkeypatch.setattr(eventloop, "_uvloop_factory", lambda: None)
    with pytest.raises(ConfigError, match="uvloop package is not installed"):
        eventloop.chosen("uvloop")
    assert eventloop.chosen("") == "asyncio"  # the default never needs it


def test_serve_refuses_an_unknown_loop_before_starting() -> None:
    """``gigacluster serve`` with a bad GIGACLUSTER_EVENT_LOOP exits 2 with the message, before serving."""
    proc = subprocess.run([sys.executable, "-m", "gigacluster.cli.main", "serve", "clock", "--port", "0"],
                          env={**os.environ, eventloop.ENV: "tokio"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "must be one of asyncio, uvloop" in proc.stderr
