"""The scrape configurations Prometheus loads, and ``up``'s metrics ports (no processes)."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
import yaml

from gigacluster.cli.main import build_parser
from gigacluster.cli.up import stack_config
from gigacluster.stack import Stack, StackConfig
from tests.conftest import required_exe

from .prometheus import COMPOSE_CONFIG, LOCAL_CONFIG, UP_METRICS_PORTS, local_config


def test_local_config_is_the_compose_config_aimed_at_ups_ports() -> None:
    """deploy/prometheus/prometheus-local.yml is prometheus.yml with each service's targets swapped for
    ``up``'s default metrics ports, nothing else changed."""
    assert yaml.safe_load(LOCAL_CONFIG.read_text()) == local_config(UP_METRICS_PORTS)
    base = yaml.safe_load(COMPOSE_CONFIG.read_text())
    local = yaml.safe_load(LOCAL_CONFIG.read_text())
    strip = [[{k: v for k, v in g.items() if k != "targets"} for g in j["static_configs"]]
             for j in base["scrape_configs"]]
    assert strip == [[{k: v for k, v in g.items() if k != "targets"} for g in j["static_configs"]]
                     for j in local["scrape_configs"]]


def test_local_config_lists_every_shard_and_refuses_a_missing_service() -> None:
    """Every chip shard is a target of the chip group; a service without a local port is an error."""
    cfg = local_config({"chip": 1, "chip-1": 2, "fabric": 3, "broker": 4, "scheduler": 5, "router": 6})
    groups = {g["labels"]["service"]: g["targets"] for g in cfg["scrape_configs"][0]["static_configs"]}
    assert groups["chip"] == ["127.0.0.1:1", "127.0.0.1:2"]
    with pytest.raises(ValueError, match="router"):
        local_config({"chip": 1, "fabric": 3, "broker": 4, "scheduler": 5})


@pytest.mark.parametrize("path", [COMPOSE_CONFIG, LOCAL_CONFIG], ids=lambda p: pathlib.Path(p).name)
def test_promtool_accepts_the_scrape_configs(path: pathlib.Path) -> None:
    """``promtool check config`` (Debian's prometheus package) accepts both scrape configurations."""
    promtool = required_exe("promtool", "prometheus")
    r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, timeout=30, check=False)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_up_serves_metrics_from_9464_by_default_and_the_flag_moves_or_disables_it(tmp_path: pathlib.Path) -> None:
    """``up`` turns metrics on from 9464 (the compose files' port); ``--metrics-port -1`` turns them off,
    ``0`` picks free ports; the demo serves none unless asked."""
    p = build_parser()
    cfg = stack_config(p.parse_args(["up"]), state=tmp_path)
    assert (cfg.metrics, cfg.metrics_base_port) == (True, 9464)
    cfg = stack_config(p.parse_args(["up", "--metrics-port", "-1"]), state=tmp_path)
    assert cfg.metrics is False
    cfg = stack_config(p.parse_args(["up", "--metrics-port", "0"]), state=tmp_path)
    assert (cfg.metrics, cfg.metrics_base_port) == (True, 0)
    assert stack_config(p.parse_args(["demo"]), state=tmp_path).metrics is False
    with pytest.raises(SystemExit):
        stack_config(p.parse_args(["up", "--metrics-port", "-2"]), state=tmp_path)


def test_metrics_ports_follow_the_base_services_first_then_shards() -> None:
    """From a base port the five services take base..base+4 whatever the shard count, shards 1.. follow."""
    st = Stack(StackConfig(chips=24, shards=3, metrics=True, metrics_base_port=9464))
    ports = {n: st.metrics_port_of(n) for n in ("chip", "fabric", "broker", "scheduler", "router", "chip-1",
                                                 "chip-2")}
    assert ports == {"chip": 9464, "fabric": 9465, "broker": 9466, "scheduler": 9467, "router": 9468,
                     "chip-1": 9469, "chip-2": 9470}
    assert {k: ports[k] for k in UP_METRICS_PORTS} == UP_METRICS_PORTS
    free = Stack(StackConfig(chips=8, metrics=True))
    picked = [free.metrics_port_of(n) for n in ("chip", "fabric", "broker", "scheduler", "router")]
    assert len(set(picked)) == 5 and all(p > 0 for p in picked)
