"""The clock settings: unknown modes and a missing coordinator are refused at start-up, naming the setting."""

from __future__ import annotations

import pytest

from gigacluster.runtime import config as cfgmod
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.server import Service


def test_unknown_clock_mode_lists_the_allowed_modes() -> None:
    """GIGACLUSTER_CLOCK=bogus is a ConfigError listing wall and event."""
    with pytest.raises(cfgmod.ConfigError, match=r"clock must be one of wall, event; got 'bogus'"):
        cfgmod.load(cfgmod.ChipConfig, env={"GIGACLUSTER_CLOCK": "bogus"})


def test_event_mode_needs_a_coordinator() -> None:
    """--clock event without --clock-coordinator fails naming the setting and its variable."""
    with pytest.raises(cfgmod.ConfigError, match=r"clock_coordinator.*GIGACLUSTER_CLOCK_COORDINATOR"):
        cfgmod.load(cfgmod.SchedulerConfig, flags={"clock": "event"}, env={})
    with pytest.raises(cfgmod.ConfigError, match="clock_coordinator must be HOST:PORT"):
        cfgmod.load(cfgmod.SchedulerConfig, flags={"clock": "event", "clock_coordinator": "nowhere"}, env={})


def test_wall_mode_is_the_default_and_unchanged() -> None:
    """Without --clock a service runs today's wall clock (epoch and speed-up from the config)."""
    cfg = cfgmod.load(cfgmod.ChipConfig, env={"GIGACLUSTER_CLOCK_EPOCH": "1000.0", "GIGACLUSTER_SPEEDUP": "50"})
    svc: Service[cfgmod.ChipConfig] = Service(cfg)
    assert cfg.clock == "wall" and type(svc.clock) is VirtualClock
    assert svc.clock == VirtualClock(1000.0, 50.0) and svc.clock_agent is None


def test_event_mode_builds_an_event_clock() -> None:
    """--clock event gives the service an EventClock starting at 0 and an agent for the coordinator."""
    cfg = cfgmod.load(cfgmod.ChipConfig, env={"GIGACLUSTER_CLOCK": "event",
                                              "GIGACLUSTER_CLOCK_COORDINATOR": "127.0.0.1:9"})
    svc: Service[cfgmod.ChipConfig] = Service(cfg)
    try:
        assert isinstance(svc.clock, EventClock) and svc.clock.now() == 0.0
        assert svc.clock_agent is not None and svc.clock_agent.endpoint == "127.0.0.1:9"
        assert svc.clock.wall_s(5.0) == float("inf") and svc.clock.wall_s(-1.0) == float("-inf")
    finally:
        from gigacluster.runtime import clock
        clock.install(None)
