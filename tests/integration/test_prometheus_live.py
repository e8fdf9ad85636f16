"""A real Prometheus scrapes live p2ptrain APIs every second; every dashboard expression returns data.

The nodes here are API servers fed with changing snapshots, so the test exercises exactly what
Prometheus sees: the /metrics wire format, the metric names and the dashboard's PromQL.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from p2ptrain.daemon.api import ApiServer
from p2ptrain.daemon.control import ControlQueue
from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.metrics import build_registry
from p2ptrain.status import LatestSnapshot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "configs" / "grafana" / "dashboards" / "p2ptrain.json"
JOB = "p2ptrain-live"


def _fixtures():
    """The unit tests' snapshot builders and tool lookup (one definition for both suites)."""
    if "monitoring_fixtures" in sys.modules:
        return sys.modules["monitoring_fixtures"]
    path = ROOT / "tests" / "unit" / "monitoring_fixtures.py"
    spec = importlib.util.spec_from_file_location("monitoring_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["monitoring_fixtures"] = module
    return module


class FakeNode:
    """An ApiServer whose snapshot advances like a training node's (counters grow, time moves)."""

    def __init__(self, index: int) -> None:
        self.fx = _fixtures()
        self.latest = LatestSnapshot()
        self.index = index
        self.stop = threading.Event()
        self._tick(0)
        self.server = ApiServer(host="127.0.0.1", port=0, latest=self.latest, logs=LogRing(),
                                control=ControlQueue(), registry=build_registry(self.latest), token="x" * 32)
        self.server.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _tick(self, n: int) -> None:
        base = self.fx.populated_status()
        status = dataclasses.replace(
            base, peer_id=f"QmNode{self.index}",
            samples_processed_total=base.samples_processed_total + 50 * n,
            averaging_rounds_ok_total=9 + n, averaging_rounds_failed_total=2 + n // 4,
            round_duration_bucket_counts=(0, 1 + n, 1, 0, 1, 0, 0, 0, 0, 0),
            round_duration_sum_seconds=4.6 + 0.4 * n, bytes_sent_total=1_000_000 + 5000 * n,
            bytes_received_total=2_000_000 + 7000 * n, checkpoint_writes_ok_total=4 + n // 5)
        self.latest.publish(status, self.fx.populated_swarm())

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(0.5):
            n += 1
            self._tick(n)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.server.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def substitute(expr: str) -> str:
    return (expr.replace("$__rate_interval", "5s").replace("$job", JOB).replace("$instance", ".+"))


def test_prometheus_scrapes_nodes_and_every_dashboard_expression_has_data(tmp_path):
    prometheus = _fixtures().prometheus_tool("prometheus")
    nodes = [FakeNode(i) for i in range(3)]
    proc = None
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed in finally, after Prometheus exits
    try:
        targets = [n.server.url.removeprefix("http://") for n in nodes]
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: {JOB}\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [str(prometheus), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=log)

        deadline = time.monotonic() + 45
        up: list[dict] = []
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                active = get_json(f"{base}/api/v1/targets")["data"]["activeTargets"]
                up = [t for t in active if t["health"] == "up"]
            except OSError:
                up = []
            if len(up) == len(nodes):
                break
            time.sleep(0.5)
        assert len(up) == len(nodes), f"targets not up: {up}"
        time.sleep(4)  # a few more scrapes, so rate() over 5s has two samples everywhere

        dashboard = json.loads(DASHBOARD.read_text())
        panels = [p for p in dashboard["panels"] if p["type"] != "row"]
        exprs = [(p["title"], t["expr"]) for p in panels for t in p["targets"]]
        assert len(exprs) >= 20
        empty: list[str] = []
        for title, expr in exprs:
            query = substitute(expr)
            result: list = []
            for _ in range(10):  # bounded retries: the newest scrape may still be landing
                answer = get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
                assert answer["status"] == "success", (title, query, answer)
                result = answer["data"]["result"]
                if result:
                    break
                time.sleep(0.5)
            if not result:
                empty.append(f"{title}: {query}")
        assert not empty, "dashboard expressions without data:\n" + "\n".join(empty)

        states = get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode(
            {"query": f'count by (p2ptrain_node_state) (p2ptrain_node_state{{job="{JOB}"}} == 1)'}))
        assert states["data"]["result"][0]["metric"] == {"p2ptrain_node_state": "training"}
        assert states["data"]["result"][0]["value"][1] == str(len(nodes))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        log.close()
        for node in nodes:
            node.close()
