"""The repository's Prometheus scrape configuration, re-pointed at a local stack, and a bounded
Prometheus server (Debian's ``prometheus`` package) to run it.

``local_config`` keeps everything of ``deploy/prometheus/prometheus.yml`` (jobs, intervals, the
``service`` label per target group) and only swaps each group's container targets for the local
metrics ports of the same service, so a test scrapes exactly what the compose file scrapes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from gigacluster.stack import free_port as _free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
COMPOSE_CONFIG = PROM_DIR / "prometheus.yml"
LOCAL_CONFIG = PROM_DIR / "prometheus-local.yml"
#: ``gigacluster up``'s metrics ports (``--metrics-port`` 9464): chip, fabric, broker, scheduler, router.
UP_METRICS_PORTS = {"chip": 9464, "fabric": 9465, "broker": 9466, "scheduler": 9467, "router": 9468}


def service_of(name: str) -> str:
    """``chip-3`` -> ``chip``: the service a stack process (shard) belongs to."""
    return name.split("-")[0]


def local_config(metrics_ports: Mapping[str, int], *, base: dict[str, Any] | None = None,
                 scrape_interval: str = "") -> dict[str, Any]:
    """``base`` (default: the compose scrape config) with each target group aimed at the local ports of
    its ``service`` label; ``scrape_interval`` overrides the global one (tests use 1s)."""
    cfg = copy.deepcopy(base if base is not None else yaml.safe_load(COMPOSE_CONFIG.read_text()))
    by_service: dict[str, list[str]] = {}
    for name, port in sorted(metrics_ports.items()):
        by_service.setdefault(service_of(name), []).append(f"127.0.0.1:{port}")
    for job in cfg["scrape_configs"]:
        for group in job.get("static_configs", []):
            svc = group.get("labels", {}).get("service")
            if svc not in by_service:
                raise ValueError(f"no local metrics port for service {svc!r} (have {sorted(by_service)})")
            group["targets"] = by_service[svc]
    if scrape_interval:
        cfg["global"]["scrape_interval"] = scrape_interval
        cfg["global"]["evaluation_interval"] = scrape_interval
    return dict(cfg)


class PrometheusApi:
    """The HTTP API of the Prometheus server at ``url`` (one started here, or the compose stack's)."""

    def __init__(self, url: str) -> None:
        self._url = url

    @property
    def url(self) -> str:
        return self._url

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; returns ``data`` (raises on an error status)."""
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{q}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant PromQL query; the result vector."""
        return list(self.api("query", query=expr)["result"])


class PrometheusServer(PrometheusApi):
    """``prometheus`` on a loopback port with a temporary TSDB, stopped (and its data removed) on exit."""

    def __init__(self, config: dict[str, Any], exe: str = "") -> None:
        self.exe = exe or shutil.which("prometheus") or "/usr/bin/prometheus"
        self.config = config
        self.port = _free_port()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="gc-prometheus-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 30.0) -> None:
        conf = self.dir / "prometheus.yml"
        conf.write_text(yaml.safe_dump(self.config, sort_keys=False))
        argv = [self.exe, f"--config.file={conf}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
                "--log.level=warn"]
        self.log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready in {ready_timeout_s}s: {self.tail()}")
            time.sleep(0.2)

    def tail(self) -> str:
        p = self.dir / "prometheus.log"
        return p.read_bytes()[-1500:].decode(errors="replace") if p.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "log", None) is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def prometheus(config: dict[str, Any]) -> Iterator[PrometheusServer]:
    server = PrometheusServer(config)
    try:
        server.start()
        yield server
    finally:
        server.stop()
