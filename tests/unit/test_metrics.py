"""The collector on a private registry: names, types, values, histogram, and promtool's lint."""

from __future__ import annotations

import dataclasses
import subprocess

from monitoring_fixtures import populated_status, populated_swarm
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from p2ptrain.metrics import P2PTrainCollector, build_registry
from p2ptrain.status import LatestSnapshot, StatusSnapshot

NOW = 1_700_000_000.0


def scrape(status: StatusSnapshot, swarm=None) -> tuple[str, dict[tuple[str, tuple], float]]:
    latest = LatestSnapshot()
    latest.publish(status, swarm)
    registry = CollectorRegistry()
    registry.register(P2PTrainCollector(latest, clock=lambda: NOW))
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def test_populated_snapshot_values_and_types():
    status = populated_status(now=NOW - 2)
    text, m = scrape(status, populated_swarm())
    assert m[("p2ptrain_build_info", (("version", "0.1.0"),))] == 1
    assert m[("p2ptrain_node_state", (("p2ptrain_node_state", "training"),))] == 1
    assert m[("p2ptrain_node_state", (("p2ptrain_node_state", "paused"),))] == 0
    assert m[("p2ptrain_pause_reason", (("p2ptrain_pause_reason", "none"),))] == 1
    assert m[("p2ptrain_samples_processed_total", ())] == 12_345
    assert m[("p2ptrain_local_epoch", ())] == 7 and m[("p2ptrain_global_epoch", ())] == 8
    assert m[("p2ptrain_swarm_peers_online", ())] == 3
    assert m[("p2ptrain_local_samples_per_second", ())] == 41.5
    assert m[("p2ptrain_swarm_samples_per_second", ())] == 120.25
    assert m[("p2ptrain_loss", ())] == 2.75 and m[("p2ptrain_validation_loss", ())] == 2.9
    assert m[("p2ptrain_averaging_rounds_total", (("outcome", "ok"),))] == 9
    assert m[("p2ptrain_averaging_rounds_total", (("outcome", "failed"),))] == 2
    assert m[("p2ptrain_averaging_rounds_total", (("outcome", "partial"),))] == 3
    assert m[("p2ptrain_averaging_group_size", ())] == 3
    assert m[("p2ptrain_averaging_group_coverage_ratio", ())] == 0.75
    assert m[("p2ptrain_averaging_round_peers_online", ())] == 4
    assert m[("p2ptrain_cpu_share_limit_ratio", ())] == 0.25
    assert m[("p2ptrain_cpu_share_used_ratio", ())] == 0.245
    assert m[("p2ptrain_cpu_throttle_seconds_total", ())] == 31.5
    assert m[("p2ptrain_checkpoint_writes_total", (("outcome", "failed"),))] == 1
    assert m[("p2ptrain_network_sent_bytes_total", ())] == 1_000_000
    assert m[("p2ptrain_network_received_bytes_total", ())] == 2_000_000
    assert m[("p2ptrain_state_downloads_total", ())] == 2
    assert m[("p2ptrain_state_download_seconds_total", ())] == 12.5
    assert m[("p2ptrain_last_checkpoint_timestamp_seconds", ())] == NOW - 62
    assert m[("p2ptrain_nonfinite_gradient_skips_total", ())] == 1
    assert m[("p2ptrain_rejected_peer_records_total", ())] == 2
    assert m[("p2ptrain_samples_contributed_total", ())] == 11_904
    assert m[("p2ptrain_samples_not_averaged_total", ())] == 256
    assert m[("p2ptrain_swarm_samples_contributed", ())] == 12_000
    assert m[("p2ptrain_swarm_contributors", ())] == 2
    assert m[("p2ptrain_data_pass", ())] == 2 and m[("p2ptrain_data_shards", ())] == 20
    assert m[("p2ptrain_data_shards_consumed", ())] == 5
    assert m[("p2ptrain_data_records_skipped_total", (("reason", "undecodable"),))] == 3
    assert m[("p2ptrain_data_records_skipped_total", (("reason", "no_text"),))] == 40
    assert m[("p2ptrain_data_shards_skipped_total", ())] == 2
    assert m[("p2ptrain_data_coverage_ratio", ())] == 0.45
    assert m[("p2ptrain_data_last_pass_coverage_ratio", ())] == 1.0
    assert m[("p2ptrain_status_age_seconds", ())] == 2.0
    assert m[("p2ptrain_last_progress_age_seconds", ())] == 2.5  # 0.5 at snapshot time + 2 s since
    assert "# TYPE p2ptrain_samples_processed_total counter" in text
    assert "# TYPE p2ptrain_averaging_round_duration_seconds histogram" in text
    assert "peer_id" not in text and "QmSelf" not in text  # no peer-id labels, ever


def test_offences_by_kind_without_peer_ids():
    from p2ptrain.trust.peergate import OFFENCE_KINDS

    text, m = scrape(populated_status(now=NOW))
    assert m[("p2ptrain_peer_offenses_total", (("kind", "nonfinite_part"),))] == 3
    assert m[("p2ptrain_peer_offenses_total", (("kind", "bad_state"),))] == 1
    assert all(("p2ptrain_peer_offenses_total", (("kind", kind),)) in m for kind in OFFENCE_KINDS)  # 0 included
    assert m[("p2ptrain_peers_excluded", ())] == 2 and m[("p2ptrain_peer_checks_enabled", ())] == 1
    assert "# TYPE p2ptrain_peer_offenses_total counter" in text


def test_owned_run_metrics_and_a_plain_run_s():
    _, m = scrape(populated_status(now=NOW))
    assert m[("p2ptrain_run_info", (("admission", "invite"), ("run_id", "demo"), ("run_ref", "demo@" + "a" * 26)))] == 1
    assert m[("p2ptrain_manifest_version", ())] == 3
    assert m[("p2ptrain_refused_requests_total", (("layer", "dht"),))] == 6
    assert m[("p2ptrain_refused_requests_total", (("layer", "averaging"),))] == 2
    assert m[("p2ptrain_run_entries_refused_total", ())] == 4
    assert m[("p2ptrain_fingerprint_entries_refused_total", ())] == 1
    assert m[("p2ptrain_manifests_ignored_total", ())] == 1 and m[("p2ptrain_peers_not_admitted", ())] == 1
    plain = dataclasses.replace(populated_status(now=NOW), run_ref="", manifest_version=0, admission_policy="")
    _, m = scrape(plain)
    assert m[("p2ptrain_run_info", (("admission", "none"), ("run_id", "demo"), ("run_ref", "")))] == 1
    assert m[("p2ptrain_manifest_version", ())] == 0


def test_round_duration_histogram_is_cumulative():
    _, m = scrape(populated_status(now=NOW))
    bucket = {dict(labels)["le"]: v for (name, labels), v in m.items()
              if name == "p2ptrain_averaging_round_duration_seconds_bucket"}
    assert bucket["0.25"] == 0 and bucket["0.5"] == 1 and bucket["1.0"] == 2 and bucket["5.0"] == 3
    assert bucket["+Inf"] == 3 == m[("p2ptrain_averaging_round_duration_seconds_count", ())]
    assert m[("p2ptrain_averaging_round_duration_seconds_sum", ())] == 4.6


def test_received_ratio_histogram_is_cumulative():
    _, m = scrape(populated_status(now=NOW))
    bucket = {dict(labels)["le"]: v for (name, labels), v in m.items()
              if name == "p2ptrain_averaging_received_ratio_bucket"}
    assert bucket == {"0.25": 0, "0.5": 1, "0.67": 3, "0.75": 3, "0.9": 3, "0.99": 3, "1.0": 12, "+Inf": 12}
    assert m[("p2ptrain_averaging_received_ratio_count", ())] == 12
    assert m[("p2ptrain_averaging_received_ratio_sum", ())] == 10.8333


def test_cpu_share_and_coverage_absent_when_unknown_or_unlimited():
    for limit in (0.0, 100.0):
        _, m = scrape(StatusSnapshot(cpu_limit_percent=limit, last_round_group_size=2, taken_at=NOW))
        assert m[("p2ptrain_cpu_share_limit_ratio", ())] == 1.0  # no limit: the whole machine
        assert ("p2ptrain_cpu_share_used_ratio", ()) not in m  # not measured yet: absent, not a fake 0
        assert m[("p2ptrain_averaging_round_peers_online", ())] == 0
        assert ("p2ptrain_averaging_group_coverage_ratio", ()) not in m  # peers online unknown
        assert m[("p2ptrain_cpu_throttle_seconds_total", ())] == 0
    _, m = scrape(StatusSnapshot(last_round_group_size=3, last_round_peers_online=2, taken_at=NOW))
    assert m[("p2ptrain_averaging_group_coverage_ratio", ())] == 1.0  # a lagging swarm view is capped


def test_unknowns_are_absent_not_zero_and_bad_buckets_are_empty():
    status = StatusSnapshot(state="paused", pause_reason="schedule", loss=float("nan"),
                            round_duration_bucket_counts=(1, 2), received_fraction_bucket_counts=(0, -1, 2),
                            received_fraction_sum=float("nan"), taken_at=NOW)
    _, m = scrape(status)
    for absent in ("p2ptrain_loss", "p2ptrain_validation_loss", "p2ptrain_last_checkpoint_timestamp_seconds",
                   "p2ptrain_last_progress_age_seconds", "p2ptrain_state_download_progress_ratio",
                   # Data that is not sharded has no pass and no coverage.
                   "p2ptrain_data_pass", "p2ptrain_data_shards", "p2ptrain_data_coverage_ratio",
                   "p2ptrain_data_last_pass_coverage_ratio"):
        assert (absent, ()) not in m
    assert m[("p2ptrain_pause_reason", (("p2ptrain_pause_reason", "schedule"),))] == 1
    assert m[("p2ptrain_averaging_round_duration_seconds_count", ())] == 0
    assert m[("p2ptrain_averaging_received_ratio_count", ())] == 0
    assert m[("p2ptrain_averaging_received_ratio_sum", ())] == 0
    assert m[("p2ptrain_build_info", (("version", "unknown"),))] == 1


def test_collector_reads_the_newest_snapshot_on_every_scrape():
    latest = LatestSnapshot()
    registry = build_registry(latest, clock=lambda: NOW)
    latest.publish(dataclasses.replace(populated_status(NOW), samples_processed_total=1))
    first = generate_latest(registry).decode()
    latest.publish(dataclasses.replace(populated_status(NOW), samples_processed_total=2))
    second = generate_latest(registry).decode()
    assert "p2ptrain_samples_processed_total 1.0" in first
    assert "p2ptrain_samples_processed_total 2.0" in second
    assert "process_resident_memory_bytes" in second and "process_cpu_seconds_total" in second


def test_promtool_check_metrics_passes(promtool, populated_latest):
    text = generate_latest(build_registry(populated_latest))
    result = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""  # not even lint warnings


def test_reachability_is_a_state_set():
    import dataclasses

    _, m = scrape(dataclasses.replace(populated_status(now=NOW - 2), reachability="relayed"))
    assert m[("p2ptrain_reachability", (("p2ptrain_reachability", "relayed"),))] == 1
    assert m[("p2ptrain_reachability", (("p2ptrain_reachability", "public"),))] == 0
    assert ("p2ptrain_reachability", (("p2ptrain_reachability", "direct"),)) not in m
