"""The one contract between the node, its API, its metrics and the TUI: states and snapshots.

Standard library only, so the TUI can import it without torch or hivemind.  Add fields, never
rename them; bump :data:`SCHEMA_VERSION` when a field's meaning changes.  ``from_dict`` is
lenient (unknown keys ignored, missing ones defaulted) because it reads what other versions
of p2ptrain wrote.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from dataclasses import dataclass, field
from typing import Any, TypeVar

#: 4: ``global_epoch`` is the optimizer's robust view (peer records' epochs no longer raise it), and a
#: swarm view's ``samples_contributed`` is what this node can vouch for, not the peers' claims.
#: 3: ``averaging_rounds_ok_total`` counts only rounds that averaged the whole swarm online with
#: (near) all parts received, as this node's reducer measured them (see :mod:`p2ptrain.optim.round_stats`);
#: in 2 a group of half the peers online was enough and the received share was not measured; in 1
#: it counted every completed round.
SCHEMA_VERSION = 4

#: Upper bounds (seconds) of the averaging-round duration histogram; a last +Inf bucket is implied.
ROUND_DURATION_BUCKETS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: Upper bounds of the histogram of the share of a round's expected contributions that arrived
#: (0..1; groups of 2-4 give halves, thirds and quarters); a last +Inf bucket is implied and empty.
RECEIVED_FRACTION_BUCKETS: tuple[float, ...] = (0.25, 0.5, 0.67, 0.75, 0.9, 0.99, 1.0)


class NodeState(enum.StrEnum):
    """Lifecycle of a node. Order matters only for humans reading logs."""

    STARTING = "starting"
    JOINING = "joining"
    SYNCING = "syncing"
    TRAINING = "training"
    PAUSED = "paused"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


#: States in which /healthz may answer 200 (if the loop also made recent progress).
LIVE_STATES = frozenset({NodeState.STARTING, NodeState.JOINING, NodeState.SYNCING, NodeState.TRAINING})


class PauseReason(enum.StrEnum):
    """Why a node is not contributing right now."""

    NONE = ""
    MANUAL = "manual"
    SCHEDULE = "schedule"
    BUSY = "busy"
    MEMORY = "memory"  # resident memory above volunteer.max_memory_mb


class Reachability(enum.StrEnum):
    #: Dialled at an announced address (a public IP or a forwarded port), or a peer connected back to it.
    PUBLIC = "public"
    #: Older nodes' word for an address seen, not checked; never reported by this version.
    DIRECT = "direct"
    #: Reached through a circuit relay on a public peer.
    RELAYED = "relayed"
    #: Dials out only (set so, or a peer could not connect back): averages through peers others can dial.
    CLIENT = "client"
    #: Nothing has shown either way.
    UNKNOWN = "unknown"


_T = TypeVar("_T")


def _from_dict(cls: type[_T], data: dict[str, Any]) -> _T:
    """Build a dataclass from a dict, keeping only known keys of the right basic type."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        value = data[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        if default is None or value is None or isinstance(value, type(default)):
            kwargs[f.name] = value
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            kwargs[f.name] = float(value)
    return cls(**kwargs)


@dataclass(frozen=True)
class PeerRecord:
    """What one node says about itself in the DHT (signed by its key; see ``p2ptrain.swarm.records``)."""

    peer_id: str = ""
    version: str = ""
    state: str = NodeState.STARTING.value
    epoch: int = 0
    samples_per_second: float = 0.0
    loss: float | None = None
    val_loss: float | None = None
    reachability: str = Reachability.UNKNOWN.value
    uptime_seconds: float = 0.0
    pause_reason: str = ""
    #: Unix time the record was published (filled by the publisher).
    published_at: float = 0.0
    #: Samples of this node's epochs that went into the swarm's model (see :mod:`p2ptrain.trust.credit`);
    #: in a swarm view, the claim as credited (capped at what the run allows for its epoch).
    samples_contributed: int = 0
    #: The node's place in its data stream: its pass over the shards, shards read through this pass and
    #: in the passes before it (newest first, a few), of how many, and which shard list (``data_source``,
    #: empty: no sharded data).
    data_pass: int = 0
    shards_consumed: int = 0
    past_pass_shards: tuple[int, ...] = ()
    shards_total: int = 0
    data_source: str = ""
    #: (peer ID, samples) of the peers this node vouches for most: what their parts carried into its
    #: averaging rounds (see :mod:`p2ptrain.trust.vouching`); signed with the rest of the record.
    vouched: tuple[tuple[str, int], ...] = ()
    #: Where and how the node trains: ``cpu`` or ``cuda:N``, and ``fp32``, ``bf16`` or ``fp16`` (empty: a
    #: node of a version that did not say).
    device: str = ""
    precision: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["vouched"] = [list(pair) for pair in self.vouched]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PeerRecord:
        past = data.get("past_pass_shards") if isinstance(data, dict) else None
        vouched = data.get("vouched") if isinstance(data, dict) else None
        record = _from_dict(cls, {k: v for k, v in data.items() if k != "vouched"} if isinstance(data, dict) else data)
        if isinstance(past, list | tuple) and all(isinstance(c, int) and not isinstance(c, bool) for c in past):
            record = dataclasses.replace(record, past_pass_shards=tuple(past))
        if isinstance(vouched, list | tuple):
            pairs = tuple((pair[0], pair[1]) for pair in vouched
                          if isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)
                          and isinstance(pair[1], int) and not isinstance(pair[1], bool) and pair[1] >= 0)
            record = dataclasses.replace(record, vouched=pairs)
        return record

    @classmethod
    def from_status(cls, status: StatusSnapshot) -> PeerRecord:
        """What a node says about itself, taken from its latest snapshot."""
        return cls(**_credit_fields(status), peer_id=status.peer_id, version=status.version, state=status.state,
                   epoch=status.local_epoch, samples_per_second=status.local_samples_per_second,
                   loss=status.loss, val_loss=status.val_loss, reachability=status.reachability,
                   uptime_seconds=status.uptime_seconds, pause_reason=status.pause_reason,
                   published_at=status.taken_at, vouched=tuple(sorted(status.vouched_samples.items())),
                   device=status.device, precision=status.precision)


@dataclass(frozen=True)
class OffenderEntry:
    """A peer this node caught misbehaving (``p2ptrain.trust.peergate``): what it did, when, and whether it is
    excluded from this node's groups and donor lists right now."""

    peer_id: str = ""
    #: What it did last (an offence kind: ``nonfinite_part``, ``oversized_part``, ``bad_state``, ...).
    kind: str = ""
    reason: str = ""
    offences: int = 0
    #: Unix time of its last offence.
    last_at: float = 0.0
    #: Unix time its exclusion ends; None: for the rest of the run.
    banned_until: float | None = None
    excluded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OffenderEntry:
        return _from_dict(cls, data)


@dataclass(frozen=True)
class SwarmView:
    """Every live peer record of the run, as one node sees it, and the peers it caught misbehaving."""

    peers: tuple[PeerRecord, ...] = ()
    swarm_samples_per_second: float = 0.0
    global_epoch: int = 0
    #: Credit and coverage over the records (:func:`p2ptrain.trust.swarm_credit.credited_view`): the peers'
    #: samples contributed as credited, the swarm's pass over the data (the lower median of the peers'
    #: passes), the share of that pass and of the one before that the peers report read (None: no
    #: sharded data in view, or no pass before), and the shard count they agree on.
    samples_contributed: int = 0
    #: The same peers' own claims, each clipped at the run's pace: claims, not vouched for.
    samples_claimed: int = 0
    data_pass: int = 0
    data_coverage: float | None = None
    data_last_pass_coverage: float | None = None
    shards_total: int = 0
    slowest_peer: str = ""
    fastest_peer: str = ""
    rejected_records_total: int = 0
    #: Offenders, newest first (a peer may be listed here without a record: plain hivemind peers have none).
    offenders: tuple[OffenderEntry, ...] = ()

    @property
    def peers_online(self) -> int:
        return len(self.peers)

    def offender(self, peer_id: str) -> OffenderEntry | None:
        return next((o for o in self.offenders if o.peer_id == peer_id), None)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["peers"] = [p.to_dict() for p in self.peers]
        data["offenders"] = [o.to_dict() for o in self.offenders]
        data["peers_online"] = self.peers_online
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SwarmView:
        view = _from_dict(cls, {k: v for k, v in data.items() if k not in ("peers", "offenders")})
        peers = tuple(PeerRecord.from_dict(p) for p in data.get("peers", []) if isinstance(p, dict))
        listed = data.get("offenders", [])
        offenders = tuple(OffenderEntry.from_dict(o) for o in (listed if isinstance(listed, list) else [])
                          if isinstance(o, dict))
        return dataclasses.replace(view, peers=peers, offenders=offenders)


@dataclass(frozen=True)
class StatusSnapshot:
    """Everything known about the node at one instant. Produced by the node loop only."""

    schema_version: int = SCHEMA_VERSION
    version: str = ""
    state: str = NodeState.STARTING.value
    pause_reason: str = ""
    peer_id: str = ""
    visible_maddrs: tuple[str, ...] = ()
    reachability: str = Reachability.UNKNOWN.value
    run_id: str = ""
    model_fingerprint: str = ""
    #: An owned run's reference (NAME@hash), its manifest version and admission policy ("open",
    #: "invite"), and the model fingerprint its manifest records; empty/0 in a plain run.
    run_ref: str = ""
    manifest_version: int = 0
    admission_policy: str = ""
    manifest_fingerprint: str = ""
    local_epoch: int = 0
    global_epoch: int = 0
    samples_accumulated: int = 0
    target_batch_size: int = 0
    #: Whether this node's averaging round is running now (in the background of its training).
    round_in_flight: bool = False
    samples_processed_total: int = 0
    local_samples_per_second: float = 0.0
    swarm_samples_per_second: float = 0.0
    peers_online: int = 0
    loss: float | None = None
    val_loss: float | None = None
    #: Rounds that completed AND averaged a meaningful share of the swarm ("full" rounds; the rule is
    #: :func:`p2ptrain.optim.round_stats.classify`).  Schema 1: every completed round.
    averaging_rounds_ok_total: int = 0
    averaging_rounds_failed_total: int = 0
    #: Durations of every finished averaging round so far (seconds), newest last, capped in length.
    recent_round_durations: tuple[float, ...] = ()
    last_round_duration_seconds: float | None = None
    #: Per-bucket (not cumulative) counts of round durations, len(ROUND_DURATION_BUCKETS) + 1 entries.
    round_duration_bucket_counts: tuple[int, ...] = ()
    round_duration_sum_seconds: float = 0.0
    last_round_group_size: int = 0
    bytes_sent_total: int = 0
    bytes_received_total: int = 0
    state_downloads_total: int = 0
    state_downloads_failed_total: int = 0
    state_download_seconds_total: float = 0.0
    #: 0..1 while a state download runs, else None.
    state_download_progress: float | None = None
    checkpoint_writes_ok_total: int = 0
    checkpoint_writes_failed_total: int = 0
    last_checkpoint_time: float | None = None
    last_checkpoint_error: str = ""
    #: The newest checkpoint this node wrote since it started ("" before the first) and its epoch.
    last_checkpoint_path: str = ""
    last_checkpoint_epoch: int | None = None
    nonfinite_skips_total: int = 0
    #: Times the parameters turned non-finite after averaging and were restored to the last good state.
    rollbacks_total: int = 0
    rejected_records_total: int = 0
    #: Rounds that completed but averaged too little of the swarm to count as ok (schema 2).
    averaging_rounds_partial_total: int = 0
    #: Peers online (self included) when the last round finished; its group size is last_round_group_size.
    last_round_peers_online: int = 0
    #: Share (0..1) of the expected contributions the last completed round actually received.
    last_round_received_fraction: float | None = None
    #: Per-bucket counts of received fractions of completed rounds, len(RECEIVED_FRACTION_BUCKETS) + 1.
    received_fraction_bucket_counts: tuple[int, ...] = ()
    received_fraction_sum: float = 0.0
    #: Median received fraction over the recent completed rounds (up to the last 100).
    median_received_fraction: float | None = None
    #: volunteer.max_cpu_percent in force (percent of the machine); 0: no limit.
    cpu_limit_percent: float = 0.0
    #: CPU use of the node's own process (the training; the swarm's helper processes are not
    #: counted) over the last seconds, percent of the machine.
    cpu_used_percent: float | None = None
    #: Seconds the node idled between steps to stay within cpu_limit_percent.
    cpu_idle_seconds_total: float = 0.0
    #: Credit (:mod:`p2ptrain.trust.credit`): samples of this node's epochs that went into the swarm's model,
    #: and those of epochs whose round failed (applied on this node only); restored from checkpoints.
    samples_contributed_total: int = 0
    samples_not_averaged_total: int = 0
    #: Samples other peers carried into this node's averaging rounds, for the few it vouches for most
    #: (peer ID -> samples; :mod:`p2ptrain.trust.vouching`); its peer record carries them.
    vouched_samples: dict[str, int] = field(default_factory=dict)
    #: This node's walk over sharded training data (all 0/"" for data that is not sharded): its pass,
    #: shards read through this pass and in the passes before it (newest first, a few), of how many, and
    #: which shard list.
    data_pass: int = 0
    data_shards_consumed: int = 0
    data_past_pass_shards: tuple[int, ...] = ()
    data_shards_total: int = 0
    data_source: str = ""
    #: What the training data cost this node since it started (the counts live in its checkpoints): records
    #: skipped because they did not decode or were too large, records without text (null, not a string),
    #: and shard reads given up for a pass (unreadable, download refused or failed, malformed, or records
    #: failing one after another).
    data_records_failed_total: int = 0
    data_records_without_text_total: int = 0
    data_shards_skipped_total: int = 0
    #: The loss curve, oldest first: (epoch, training loss) as each epoch was reached and (epoch,
    #: validation loss) at each validation; bounded, thinned evenly over the run when full.
    loss_history_epochs: tuple[int, ...] = ()
    loss_history: tuple[float, ...] = ()
    val_loss_history_epochs: tuple[int, ...] = ()
    val_loss_history: tuple[float, ...] = ()
    #: Owned runs: manifests ignored (bad signature, another owner, older), invalid member invites,
    #: DHT entries refused (forged manifests; unsigned fingerprint entries counted apart), DHT and
    #: averaging/state requests of non-admitted peers refused, records of non-admitted peers in view.
    manifests_ignored_total: int = 0
    invalid_members_total: int = 0
    run_entries_refused_total: int = 0
    fingerprint_entries_refused_total: int = 0
    dht_requests_refused_total: int = 0
    averaging_refused_total: int = 0
    records_not_admitted: int = 0
    #: An invite run: when this node's own invite expires (Unix time; 0: no invite). The node warns a
    #: day ahead (less for short invites) and stops with exit 78 when it does.
    invite_expires_at: float = 0.0
    #: Whether this node checks what peers send (swarm.peer_checks); False: it trusts every peer.
    peer_checks: bool = False
    #: Offences by peers since start, by kind (see p2ptrain.trust.peergate.OFFENCE_KINDS), and in total.
    peer_offenses_by_kind: dict[str, int] = field(default_factory=dict)
    peer_offenses_total: int = 0
    #: Peers excluded from this node's groups and donor lists right now.
    peers_excluded: int = 0
    #: The device the node trains on (``cpu``, ``cuda:N``; empty before its model is built), its precision
    #: (``fp32``, ``bf16``, ``fp16``), and the device memory torch holds for it (None on a CPU: no
    #: device memory to count; the process's memory is the volunteer controls' business).
    device: str = ""
    precision: str = ""
    device_memory_bytes: int | None = None
    #: The circuit relay this node's p2p daemon serves for the run's peers behind NAT, by the daemon's own
    #: counters: whether libp2p has it on (it does while AutoNAT finds the node reachable; None: the
    #: counters could not be read), bytes relayed since the node started, relay slots held and relayed
    #: connections open now, and requests refused by the budget (swarm.relay_max_*).
    relay_active: bool | None = None
    relay_bytes_total: int = 0
    relay_reservations: int = 0
    relay_circuits: int = 0
    relay_refused_total: int = 0
    #: Monotonic-clock age of the last completed local step; None before the first step.
    seconds_since_progress: float | None = None
    uptime_seconds: float = 0.0
    started_at: float = 0.0
    taken_at: float = 0.0

    @property
    def rounds_averaged(self) -> int:
        """Rounds that averaged this node's update with at least one other peer, full or partial (in a
        swarm of three or more, a full round needs every peer online in one group)."""
        return self.averaging_rounds_ok_total + self.averaging_rounds_partial_total

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in _LIST_FIELDS:
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StatusSnapshot:
        lists: dict[str, Any] = {k: tuple(data.get(k) or ()) for k in _LIST_FIELDS}
        base = _from_dict(cls, {k: v for k, v in data.items() if k not in lists})
        kinds = {k: v for k, v in base.peer_offenses_by_kind.items()
                 if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}
        vouched = {k: v for k, v in base.vouched_samples.items()
                   if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}
        return dataclasses.replace(base, **lists, peer_offenses_by_kind=kinds, vouched_samples=vouched)


_LIST_FIELDS = ("visible_maddrs", "recent_round_durations", "round_duration_bucket_counts",
                "received_fraction_bucket_counts", "loss_history_epochs", "loss_history",
                "val_loss_history_epochs", "val_loss_history", "data_past_pass_shards")


def _credit_fields(status: StatusSnapshot) -> dict[str, Any]:
    """What a node's record says about its contribution and its data, from its snapshot."""
    return dict(samples_contributed=status.samples_contributed_total, data_pass=status.data_pass,
                shards_consumed=status.data_shards_consumed, past_pass_shards=status.data_past_pass_shards,
                shards_total=status.data_shards_total, data_source=status.data_source)


@dataclass
class LatestSnapshot:
    """Thread-safe holder: the node loop publishes, API/metrics/records readers take the newest."""

    _status: StatusSnapshot = field(default_factory=StatusSnapshot)
    _swarm: SwarmView = field(default_factory=SwarmView)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, status: StatusSnapshot, swarm: SwarmView | None = None) -> None:
        with self._lock:
            self._status = status
            if swarm is not None:
                self._swarm = swarm

    def status(self) -> StatusSnapshot:
        with self._lock:
            return self._status

    def swarm(self) -> SwarmView:
        with self._lock:
            return self._swarm
