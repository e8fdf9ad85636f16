"""A Prometheus collector that turns the node's latest snapshot into metrics at scrape time.

Nothing is counted here: every family is built fresh from :class:`~p2ptrain.status.LatestSnapshot`
on each scrape (the client_python "custom collector" pattern), so the node loop never touches
Prometheus objects.  Names follow Prometheus conventions: ``p2ptrain_`` prefix, base units,
counters ending in ``_total``; no peer ids as labels (per-peer detail lives in the JSON API).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from p2ptrain import health
from p2ptrain.status import (
    RECEIVED_FRACTION_BUCKETS,
    ROUND_DURATION_BUCKETS,
    LatestSnapshot,
    NodeState,
    PauseReason,
    Reachability,
    StatusSnapshot,
    SwarmView,
)
from p2ptrain.trust.peergate import OFFENCE_KINDS

_P = "p2ptrain_"


def _gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
    """A gauge, or nothing when the value is unknown (absent beats a fake 0 or NaN in PromQL)."""
    if value is not None and math.isfinite(value):
        yield GaugeMetricFamily(_P + name, doc, value=value)


def _g(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(_P + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(_P + name, doc, value=max(0.0, float(value)))


def _counted_by(name: str, doc: str, label: str, counts: Mapping[str, float]) -> Metric:
    """A counter with one series per value of ``label`` (every value given, so rates start at 0)."""
    family = CounterMetricFamily(_P + name, doc, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], max(0.0, float(count)))
    return family


def _outcomes(name: str, doc: str, **counts: float) -> Metric:
    return _counted_by(name, doc, "outcome", counts)


def _histogram(name: str, doc: str, bounds: tuple[float, ...], counts: tuple[int, ...],
               total: float) -> HistogramMetricFamily:
    """Cumulative buckets from a snapshot's per-bucket counts (a malformed list reads as empty)."""
    per_bucket = list(counts)
    if len(per_bucket) != len(bounds) + 1 or any(c < 0 for c in per_bucket):
        per_bucket = [0] * (len(bounds) + 1)
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*bounds, math.inf), per_bucket, strict=True):
        running += count
        buckets.append(("+Inf" if math.isinf(bound) else repr(float(bound)), float(running)))
    return HistogramMetricFamily(_P + name, doc, buckets=buckets, sum_value=total if math.isfinite(total) else 0.0)


def round_duration_histogram(status: StatusSnapshot) -> HistogramMetricFamily:
    return _histogram("averaging_round_duration_seconds", "Duration of finished averaging rounds.",
                      ROUND_DURATION_BUCKETS, status.round_duration_bucket_counts, status.round_duration_sum_seconds)


def received_ratio_histogram(status: StatusSnapshot) -> HistogramMetricFamily:
    return _histogram("averaging_received_ratio",
                      "Share of the expected contributions that completed averaging rounds received.",
                      RECEIVED_FRACTION_BUCKETS, status.received_fraction_bucket_counts,
                      status.received_fraction_sum)


def group_coverage(status: StatusSnapshot) -> float | None:
    """The last round's group size over the peers online then (None before a round or if unknown)."""
    if status.last_round_group_size <= 0 or status.last_round_peers_online <= 0:
        return None
    return min(1.0, status.last_round_group_size / status.last_round_peers_online)


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0


class P2PTrainCollector(Collector):
    """Reads ``latest`` on every ``collect()``; ``clock`` is injectable for ages computed at scrape time."""

    def __init__(self, latest: LatestSnapshot, clock: Callable[[], float] = time.time) -> None:
        self._latest = latest
        self._clock = clock

    def describe(self) -> list[Metric]:
        # Describing would call collect() on registration; an empty list keeps registration cheap.
        return []

    def collect(self) -> Iterator[Metric]:
        s = self._latest.status()
        swarm = self._latest.swarm()
        now = self._clock()

        yield InfoMetricFamily(_P + "build", "p2ptrain build information.",
                               value={"version": s.version or "unknown"})
        yield StateSetMetricFamily(_P + "node_state", "Lifecycle state of the node.",
                                   {state.value: s.state == state.value for state in NodeState})
        yield StateSetMetricFamily(_P + "reachability", "How peers reach this node (public, relayed, client, "
                                   "unknown).", {r.value: s.reachability == r.value for r in Reachability
                                                 if r != Reachability.DIRECT})
        reason = s.pause_reason if s.state == NodeState.PAUSED else ""
        yield StateSetMetricFamily(_P + "pause_reason", "Why the node is paused (none while not paused).",
                                   {(r.value or "none"): reason == r.value for r in PauseReason})
        yield _g("node_start_time_seconds", "Unix time the node started.", s.started_at)
        yield _g("uptime_seconds", "Seconds since the node started.", s.uptime_seconds)
        if s.taken_at > 0:
            yield _g("status_age_seconds", "Age of the status snapshot behind these metrics.",
                     max(0.0, now - s.taken_at))
        yield from _gauge("last_progress_age_seconds",
                          "Seconds since the last completed local training step.",
                          health.progress_age(s, now))

        if s.device:
            yield InfoMetricFamily(_P + "training_device", "Where this node trains: its device and precision.",
                                   value={"device": s.device, "precision": s.precision or "unknown"})
        yield from _gauge("device_memory_bytes", "Device (GPU) memory torch holds for the training; absent on a CPU.",
                          None if s.device_memory_bytes is None else float(s.device_memory_bytes))
        yield from _relay(s)

        yield _g("local_epoch", "Epoch this node's parameters are at.", s.local_epoch)
        yield _g("global_epoch", "Highest epoch seen in the swarm.",
                 max(s.global_epoch, swarm.global_epoch))
        yield _g("samples_accumulated", "Samples the swarm accumulated towards the next epoch.",
                 s.samples_accumulated)
        yield _g("target_batch_size", "Samples per epoch (global batch size).", s.target_batch_size)
        yield _g("round_in_flight", "1 while this node's averaging round is running.", float(s.round_in_flight))
        yield _counter("samples_processed", "Training samples this node has processed.",
                       s.samples_processed_total)
        yield _g("local_samples_per_second", "This node's training throughput.", s.local_samples_per_second)
        yield _g("swarm_samples_per_second", "Sum of the throughputs the swarm's peers report.",
                 s.swarm_samples_per_second)
        yield _g("swarm_peers_online", "Peers of this run with a live record (self included).",
                 s.peers_online)
        yield from _gauge("loss", "Latest training loss.", s.loss)
        yield from _gauge("validation_loss", "Latest validation loss.", s.val_loss)
        yield _counter("nonfinite_gradient_skips", "Steps skipped because gradients were NaN or infinite.",
                       s.nonfinite_skips_total)
        yield _counter("parameter_rollbacks", "Rollbacks to the last good parameters after averaging made them "
                       "non-finite.", s.rollbacks_total)

        yield _outcomes("averaging_rounds", "Averaging rounds by outcome: ok (completed, its group held every "
                        "online peer, 95% of them with 20 or more online, and at least 95% of the expected "
                        "contributions arrived), partial (completed but missed one of those), failed (did not "
                        "complete).",
                        ok=s.averaging_rounds_ok_total, partial=s.averaging_rounds_partial_total,
                        failed=s.averaging_rounds_failed_total)
        yield round_duration_histogram(s)
        yield received_ratio_histogram(s)
        yield _g("averaging_group_size", "Peers in the last averaging group.", s.last_round_group_size)
        yield _g("averaging_round_peers_online", "Peers online (self included) when the last averaging group "
                 "formed.", s.last_round_peers_online)
        yield from _gauge("averaging_group_coverage_ratio",
                          "Last averaging group's size over the peers online at the time.", group_coverage(s))
        yield _counter("network_sent_bytes", "Bytes sent to peers.", s.bytes_sent_total)
        yield _counter("network_received_bytes", "Bytes received from peers.", s.bytes_received_total)

        yield _counter("state_downloads", "Downloads of the training state from peers (all attempts).",
                       s.state_downloads_total)
        yield _counter("state_downloads_failed", "Downloads of the training state from peers that failed.",
                       s.state_downloads_failed_total)
        yield _counter("state_download_seconds", "Seconds spent downloading state from peers.",
                       s.state_download_seconds_total)
        yield from _gauge("state_download_progress_ratio", "Progress (0..1) of the running state download.",
                          s.state_download_progress)

        yield _outcomes("checkpoint_writes", "Local checkpoint writes by outcome.",
                        ok=s.checkpoint_writes_ok_total, failed=s.checkpoint_writes_failed_total)
        yield from _gauge("last_checkpoint_timestamp_seconds",
                          "Unix time of the last complete local checkpoint.", s.last_checkpoint_time)
        limit = s.cpu_limit_percent if 0 < s.cpu_limit_percent < 100 else 100.0
        yield _g("cpu_share_limit_ratio", "volunteer.max_cpu_percent as a share of the machine (1: no limit).",
                 limit / 100.0)
        yield from _gauge("cpu_share_used_ratio", "CPU use of the node's own process (training; not the swarm's "
                          "helper processes) over the last seconds, as a share of the machine.",
                          _ratio(s.cpu_used_percent))
        yield _counter("cpu_throttle_seconds", "Seconds the node idled between steps to stay within its CPU share.",
                       s.cpu_idle_seconds_total)
        yield _counter("rejected_peer_records", "Peer records dropped as forged, malformed or oversized.",
                       max(s.rejected_records_total, swarm.rejected_records_total))
        yield from _offences(s)
        yield from _run(s)
        yield from _credit(s, swarm)


def _relay(s: StatusSnapshot) -> Iterator[Metric]:
    """The circuit relay this node's p2p daemon serves for peers behind NAT, by the daemon's own counters."""
    yield from _gauge("relay_active", "1 while libp2p has this node's circuit relay service on (while AutoNAT "
                      "finds the node reachable); absent when the p2p daemon's counters cannot be read.",
                      None if s.relay_active is None else float(s.relay_active))
    yield _counter("relay_bytes_total", "Bytes this node's p2p daemon relayed for peers behind NAT (both "
                   "directions).", s.relay_bytes_total)
    yield _g("relay_reservations", "Relay slots this node holds for peers behind NAT now "
             "(swarm.relay_max_reservations).", s.relay_reservations)
    yield _g("relay_circuits", "Relayed connections open through this node now.", s.relay_circuits)
    yield _counter("relay_refused_total", "Relay slots and relayed connections refused (swarm.relay_max_* "
                   "budget, or no slot held).", s.relay_refused_total)


def _credit(s: StatusSnapshot, swarm: SwarmView) -> Iterator[Metric]:
    """Contribution and data coverage: this node's own counters, and the swarm's figures over its
    records (each peer's claim bounded, see p2ptrain.trust.swarm_credit); per-peer detail is in the JSON API."""
    yield _counter("samples_contributed", "Samples of this node's epochs that went into the swarm's model "
                   "(averaged with another peer, or trained alone).", s.samples_contributed_total)
    yield _counter("samples_not_averaged", "Samples of this node's epochs whose averaging round failed "
                   "(applied on this node only).", s.samples_not_averaged_total)
    yield _g("swarm_samples_contributed", "Samples the swarm's live peers contributed, as far as this node "
             "can vouch for them.", swarm.samples_contributed)
    yield _g("swarm_contributors", "Live peers with contributed samples this node can vouch for.",
             sum(1 for p in swarm.peers if p.samples_contributed > 0))
    if s.data_shards_total > 0:
        yield _g("data_pass", "This node's pass over its share of the training shards.", s.data_pass)
        yield _g("data_shards", "Training shards in the dataset.", s.data_shards_total)
        yield _g("data_shards_consumed", "Shards this node has read through in its current pass.",
                 s.data_shards_consumed)
        yield _counted_by("data_records_skipped", "Records of the training data this node skipped, by reason: "
                          "undecodable (not decodable or too large) or no_text.", "reason",
                          {"undecodable": s.data_records_failed_total,
                           "no_text": s.data_records_without_text_total})
        yield _counter("data_shards_skipped", "Shard reads this node gave up for a pass: unreadable, download "
                       "refused or failed, malformed, or failing record after record.", s.data_shards_skipped_total)
    yield from _gauge("data_coverage_ratio", "Share of the swarm's current pass over the training shards that "
                      "its peers report read.", swarm.data_coverage)
    yield from _gauge("data_last_pass_coverage_ratio", "Share of the swarm's previous pass over the training "
                      "shards that its peers report read.", swarm.data_last_pass_coverage)


def _offences(s: StatusSnapshot) -> Iterator[Metric]:
    """What peers did that this node's checks refused, by kind (every kind, so rates start at 0)."""

    yield _counted_by("peer_offenses", "Offences by peers (bad states, averaging parts, implausible claims) "
                      "caught by this node's checks, by kind.", "kind",
                      {kind: s.peer_offenses_by_kind.get(kind, 0) for kind in OFFENCE_KINDS})
    yield _g("peers_excluded", "Peers excluded now from this node's averaging groups and donor lists.",
             s.peers_excluded)
    yield _g("peer_checks_enabled", "1 when this node checks what peers send (swarm.peer_checks), else 0.",
             float(s.peer_checks))


def _run(s: StatusSnapshot) -> Iterator[Metric]:
    """The run: an owned run's reference (empty for a plain run) and how it admits peers ("none": a
    plain run, nobody to ask), its manifest version (0: none), and what its gates turned away."""
    yield InfoMetricFamily(_P + "run", "The run this node takes part in.",
                           value={"run_id": s.run_id, "run_ref": s.run_ref,
                                  "admission": s.admission_policy if s.run_ref else "none"})
    yield _g("manifest_version", "Version of the owned run's signed manifest this node holds (0: a plain run).",
             s.manifest_version)
    yield _counter("manifests_ignored", "Run manifests ignored: bad signature, another owner, or not newer.",
                   s.manifests_ignored_total)
    yield _counter("run_entries_refused", "Forged manifest or invite entries the DHT refused to store or return.",
                   s.run_entries_refused_total)
    yield _counter("fingerprint_entries_refused", "Unsigned model fingerprint entries refused (owned runs keep "
                   "the fingerprint in the manifest).", s.fingerprint_entries_refused_total)
    yield _counter("invalid_member_invites", "Member invites in the DHT that did not verify.",
                   s.invalid_members_total)
    yield _counted_by("refused_requests", "Requests of peers the run does not admit, refused.", "layer",
                      {"dht": s.dht_requests_refused_total, "averaging": s.averaging_refused_total})
    yield _g("peers_not_admitted", "Peer records in view from peers the run does not admit (left out of the "
             "swarm view).", s.records_not_admitted)


def build_registry(latest: LatestSnapshot, *, process: bool = True,
                   clock: Callable[[], float] = time.time) -> CollectorRegistry:
    """A private registry with the p2ptrain collector (and process CPU/memory metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(P2PTrainCollector(latest, clock=clock))
    if process:
        ProcessCollector(registry=registry)
    return registry
