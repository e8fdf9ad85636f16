"""Shared data for the monitoring tests: a snapshot with every field filled, and the Prometheus tools."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from p2ptrain.status import LatestSnapshot, PeerRecord, StatusSnapshot, SwarmView

DEFAULT_PROMETHEUS_BIN_DIR = "/opt/prometheus-deb/usr/bin"


def populated_status(now: float | None = None) -> StatusSnapshot:
    """A training node with every optional field set, so every metric family is emitted."""
    now = time.time() if now is None else now
    return StatusSnapshot(
        version="0.1.0", state="training", peer_id="QmSelf", visible_maddrs=("/ip4/127.0.0.1/tcp/41400",),
        reachability="direct", run_id="demo", model_fingerprint="abc123", run_ref="demo@" + "a" * 26,
        manifest_version=3, admission_policy="invite", manifest_fingerprint="abc123", local_epoch=7, global_epoch=8,
        samples_accumulated=96, target_batch_size=256, samples_processed_total=12_345,
        local_samples_per_second=41.5, swarm_samples_per_second=120.25, peers_online=3, loss=2.75,
        val_loss=2.9, averaging_rounds_ok_total=9, averaging_rounds_failed_total=2,
        recent_round_durations=(0.4, 1.2, 3.0), last_round_duration_seconds=3.0,
        round_duration_bucket_counts=(0, 1, 1, 0, 1, 0, 0, 0, 0, 0), round_duration_sum_seconds=4.6,
        last_round_group_size=3, bytes_sent_total=1_000_000, bytes_received_total=2_000_000,
        state_downloads_total=2, state_downloads_failed_total=1, state_download_seconds_total=12.5,
        state_download_progress=0.25, checkpoint_writes_ok_total=4, checkpoint_writes_failed_total=1,
        last_checkpoint_time=now - 60, nonfinite_skips_total=1, rejected_records_total=2,
        manifests_ignored_total=1, invalid_members_total=1, run_entries_refused_total=4,
        fingerprint_entries_refused_total=1, dht_requests_refused_total=6, averaging_refused_total=2,
        records_not_admitted=1,
        seconds_since_progress=0.5, uptime_seconds=600.0, started_at=now - 600, taken_at=now,
        averaging_rounds_partial_total=3, last_round_peers_online=4, last_round_received_fraction=2 / 3,
        received_fraction_bucket_counts=(0, 1, 2, 0, 0, 0, 9, 0), received_fraction_sum=10.8333,
        median_received_fraction=1.0, cpu_limit_percent=25.0, cpu_used_percent=24.5, cpu_idle_seconds_total=31.5,
        peer_checks=True, peer_offenses_by_kind={"nonfinite_part": 3, "bad_state": 1}, peer_offenses_total=4,
        peers_excluded=2,
        samples_contributed_total=11_904, samples_not_averaged_total=256, data_pass=2, data_shards_consumed=5,
        data_past_pass_shards=(9, 11), data_shards_total=20, data_source="0123456789abcdef",
        data_records_failed_total=3, data_records_without_text_total=40, data_shards_skipped_total=2,
    )


def populated_swarm() -> SwarmView:
    peers = (PeerRecord(peer_id="QmA", state="training", epoch=8, samples_per_second=40.0, samples_contributed=4000),
             PeerRecord(peer_id="QmB", state="training", epoch=7, samples_per_second=80.25,
                        samples_contributed=8000))
    return SwarmView(peers=peers, swarm_samples_per_second=120.25, global_epoch=8, slowest_peer="QmA",
                     fastest_peer="QmB", rejected_records_total=2, samples_contributed=12_000, data_pass=2,
                     data_coverage=0.45, data_last_pass_coverage=1.0, shards_total=20)


@pytest.fixture
def populated_latest() -> LatestSnapshot:
    latest = LatestSnapshot()
    latest.publish(populated_status(), populated_swarm())
    return latest


def prometheus_tool(name: str) -> Path:
    """Path of ``promtool``/``prometheus``; skip outside CI when missing, fail in CI."""
    path = Path(os.environ.get("P2PTRAIN_PROMETHEUS_BIN_DIR", DEFAULT_PROMETHEUS_BIN_DIR)) / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    found = shutil.which(name)
    if found:
        return Path(found)
    message = (f"{name} not found in $P2PTRAIN_PROMETHEUS_BIN_DIR ({path.parent}); "
               "run .ci/install-prometheus.sh")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def promtool() -> Path:
    return prometheus_tool("promtool")
