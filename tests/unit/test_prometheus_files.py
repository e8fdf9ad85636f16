"""The shipped Prometheus and Grafana files: promtool accepts them, the dashboard matches the metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from p2ptrain.metrics import build_registry

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "configs" / "prometheus"
DASHBOARD = ROOT / "configs" / "grafana" / "dashboards" / "p2ptrain.json"
PROVISIONING = ROOT / "configs" / "grafana" / "provisioning"
#: Series Prometheus itself adds to every target.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def run(tool: Path, *args: str, cwd: Path) -> str:
    result = subprocess.run([str(tool), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_promtool_check_config(promtool, tmp_path):
    # Copied so the check does not depend on /etc/prometheus/p2ptrain.d existing on this machine.
    for name in ("prometheus.yml", "rules.yml"):
        shutil.copy(PROM_DIR / name, tmp_path / name)
    assert "SUCCESS" in run(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)


def test_promtool_check_and_test_rules(promtool):
    out = run(promtool, "check", "rules", "rules.yml", cwd=PROM_DIR)
    assert "SUCCESS: 13 rules found" in out
    assert "SUCCESS" in run(promtool, "test", "rules", "rules_test.yml", cwd=PROM_DIR)


def test_every_alert_named_in_the_issue_is_tested():
    rules = yaml.safe_load((PROM_DIR / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert {"P2PTrainNoProgress", "P2PTrainNodeAlone", "P2PTrainAveragingFailing", "P2PTrainCheckpointTooOld",
            "P2PTrainPeerOffences", "P2PTrainParameterRollback", "P2PTrainManifestVersionSkew"} <= alerts
    tests = yaml.safe_load((PROM_DIR / "rules_test.yml").read_text())
    firing = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert firing == alerts


def test_every_alert_has_a_runbook_section_in_the_monitoring_doc():
    rules = yaml.safe_load((PROM_DIR / "rules.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    # GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped.
    anchors = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
               for line in doc.splitlines() if line.startswith("#")}
    for alert in alerts:
        url = alert["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page == "docs/monitoring.md" and anchor in anchors, (alert["alert"], url)


def emitted_series_names(latest) -> set[str]:
    text = generate_latest(build_registry(latest)).decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def dashboard_panels() -> list[dict]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (not functions, labels or keywords)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_grouping = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_labels)
    names = set()
    for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*(?:\{|\[|\)|$|\s))", without_grouping):
        if not re.search(rf"\b{re.escape(token)}\s*\(", without_grouping):
            names.add(token)
    return names - {"and", "or", "unless", "bool", "offset"}


def test_metric_name_extraction():
    expr = ('histogram_quantile(0.9, sum by (le, instance) (rate(foo_bucket{job=~"$job", a="b c"}'
            '[$__rate_interval]))) / time() - bar_total')
    assert metric_names(expr) == {"foo_bucket", "bar_total"}


def test_dashboard_queries_only_metrics_the_collector_emits(populated_latest):
    emitted = emitted_series_names(populated_latest) | PROMETHEUS_OWN
    used = set()
    for panel in dashboard_panels():
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            unknown = names - emitted
            assert not unknown, f"panel {panel['title']!r} uses metrics nobody emits: {sorted(unknown)}"
            used |= names
    for required in ("p2ptrain_swarm_peers_online", "p2ptrain_samples_processed_total", "p2ptrain_loss",
                     "p2ptrain_validation_loss", "p2ptrain_local_epoch", "p2ptrain_averaging_rounds_total",
                     "p2ptrain_averaging_round_duration_seconds_bucket", "p2ptrain_network_sent_bytes_total",
                     "p2ptrain_network_received_bytes_total", "p2ptrain_last_checkpoint_timestamp_seconds",
                     "p2ptrain_node_state", "p2ptrain_samples_contributed_total", "p2ptrain_data_coverage_ratio"):
        assert required in used, required


def test_dashboard_uses_datasource_variable_and_rate_interval():
    text = DASHBOARD.read_text()
    assert "DS_PROMETHEUS" not in text and "__inputs" not in text
    dashboard = json.loads(text)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    assert "$job" in variables["instance"]["query"]["query"]
    # One run at a time: the nodes offered are those of the chosen run, and every panel filters by node.
    assert variables["run"]["type"] == "query" and not variables["run"]["multi"]
    assert "run_id" in variables["run"]["query"]["query"] and "$run" in variables["instance"]["query"]["query"]
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names.index("run") < names.index("instance")  # Grafana resolves variables in order
    assert "allValue" not in variables["instance"]  # "All" nodes = all of the run's, not ".+"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            expr = target["expr"]
            # Every query is held to the chosen run's nodes: totals of two runs mean nothing.
            assert 'instance=~"$instance"' in expr, (panel["title"], expr)
            for window in re.findall(r"\brate\([^\[]*\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", (panel["title"], expr)


@pytest.mark.parametrize("path", sorted(PROVISIONING.rglob("*.yaml")), ids=lambda p: p.name)
def test_grafana_provisioning_files_parse(path):
    data = yaml.safe_load(path.read_text())
    assert data["apiVersion"] == 1
    # A Grafana that already has a default data source refuses a second one at start-up.
    assert all("isDefault" not in source for source in data.get("datasources", []))
    assert data.get("datasources") or data.get("providers")
