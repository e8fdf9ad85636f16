"""A real Prometheus scrapes two real nodes every second; every dashboard expression returns data.

The nodes are ``p2ptrain run`` processes in one swarm, so the test covers what an operator's
Prometheus sees: the /metrics wire format of a live node (also linted by ``promtool check
metrics``), the metric names and the dashboard's PromQL.  A renamed metric leaves a panel
without data and fails the test.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from p2ptrain.swarm.daemon_flags import free_loopback_port
from p2ptrain.waiting import WaitTimeout, wait_until
from tests.integration.conftest import TINY_TASK
from tests.support.nodeapi import node_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "configs" / "grafana" / "dashboards" / "p2ptrain.json"
JOB = "p2ptrain-live"
#: What Grafana's $__rate_interval becomes for a 1 s scrape, with room for a late scrape on a busy machine.
RATE_INTERVAL = "10s"


def _fixtures():
    """The unit tests' tool lookup (one definition for both suites)."""
    if "monitoring_fixtures" in sys.modules:
        return sys.modules["monitoring_fixtures"]
    path = ROOT / "tests" / "unit" / "monitoring_fixtures.py"
    spec = importlib.util.spec_from_file_location("monitoring_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["monitoring_fixtures"] = module
    return module


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def substitute(expr: str) -> str:
    """Grafana's variables as the dashboard's "All" selection would expand them."""
    query = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$job", JOB).replace("$instance", ".+")
    assert "$" not in query, f"unknown variable left in {query!r}"
    return query


def query(base: str, promql: str) -> list:
    answer = get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert answer["status"] == "success", (promql, answer)
    return answer["data"]["result"]


def query_until(base: str, promql: str, timeout: float) -> list:
    """Bounded retries: the newest scrape may still be landing (an empty result after the timeout)."""
    try:
        return wait_until(lambda: query(base, promql), timeout, promql, interval=0.5)
    except WaitTimeout:
        return []


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


@pytest.fixture
def prometheus(tmp_path):
    binary = _fixtures().prometheus_tool("prometheus")
    procs = []
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below, after Prometheus exits

    def start(targets: list[str]) -> str:
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: {JOB}\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n")
        port = free_loopback_port()
        procs.append(subprocess.Popen(
            [str(binary), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=log))
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:  # a throwaway TSDB: no graceful shutdown (it can take 15 s) is needed
        proc.kill()
        proc.wait(timeout=10)
    log.close()


def promtool_check_metrics(text: bytes) -> None:
    promtool = _fixtures().prometheus_tool("promtool")
    result = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""  # not even lint warnings


def test_prometheus_scrapes_real_nodes_and_every_dashboard_expression_has_data(make_node, prometheus):
    """Also: ``promtool check metrics`` passes on a live node's /metrics."""
    exprs = dashboard_expressions()
    assert len(exprs) >= 20
    a = make_node("a", task=TINY_TASK, checkpoint={"interval": 3.0})
    a.start()
    b = make_node("b", task=TINY_TASK, checkpoint={"interval": 3.0})
    b.start(join=a.join_addrs()[:1])
    nodes = (a, b)
    for node in nodes:
        node.wait_for(lambda s: s.state == "training" and s.last_checkpoint_time is not None, 90,
                      "training and a checkpoint")
    text = node_client(a).request("GET", "/metrics").body
    assert b"p2ptrain_loss " in text and b"p2ptrain_last_checkpoint_timestamp_seconds " in text
    promtool_check_metrics(text)
    base = prometheus([node.api_url().removeprefix("http://") for node in nodes])

    def targets_up() -> list[dict]:
        try:
            active = get_json(f"{base}/api/v1/targets")["data"]["activeTargets"]
        except OSError:
            return []
        up = [t for t in active if t["health"] == "up"]
        return up if len(up) == len(nodes) else []

    wait_until(targets_up, 45, "every target up in Prometheus", interval=0.5)
    time.sleep(3)  # a few more scrapes, so every rate() window holds two samples

    empty = [f"{title}: {substitute(expr)}" for title, expr in exprs
             if not query_until(base, substitute(expr), 5)]
    assert not empty, "dashboard expressions without data:\n" + "\n".join(empty)

    # The data is the nodes' real state, not just present.
    states = query(base, f'count by (p2ptrain_node_state) (p2ptrain_node_state{{job="{JOB}"}} == 1)')
    assert [(r["metric"], r["value"][1]) for r in states] == [({"p2ptrain_node_state": "training"}, "2")]
    # A minute's window: an averaging round on a busy machine can hold a node's steps for seconds.
    growing = f'increase(p2ptrain_samples_processed_total{{job="{JOB}"}}[1m]) > 0'
    wait_until(lambda: len(query(base, growing)) == 2, 30, "samples growing on both nodes")
    swarm = query_until(base, f'max(p2ptrain_swarm_peers_online{{job="{JOB}"}}) == 2', 30)
    assert swarm, "the nodes never saw each other"
