"""``make_snapshot``: what a user sees, from plain figures (no node, no clock, no I/O)."""

from __future__ import annotations

from typing import Any

from p2ptrain import __version__
from p2ptrain.daemon.cpushare import CpuShareFigures
from p2ptrain.daemon.snapshot import (
    CheckpointFigures,
    LiveFigures,
    NodeIdentity,
    RunFigures,
    TrainingFigures,
    make_snapshot,
)
from p2ptrain.optim.protocol import GlobalProgress
from p2ptrain.optim.round_stats import RoundFigures
from p2ptrain.optim.swarm_stats import SwarmStatsView
from p2ptrain.status import NodeState, PauseReason, PeerRecord, StatusSnapshot, SwarmView

PEER = "12D3KooWSelf"


def _view(*epochs: int, **kwargs: Any) -> SwarmView:
    peers = tuple(PeerRecord(peer_id=f"peer{i}", epoch=epoch, state="training") for i, epoch in enumerate(epochs))
    return SwarmView(peers=peers, global_epoch=max(epochs, default=0), **kwargs)


def _snapshot(**overrides: Any) -> StatusSnapshot:
    figures: dict[str, Any] = dict(
        state=NodeState.TRAINING, pause_reason=PauseReason.NONE,
        identity=NodeIdentity("run-a", PEER, ("/ip4/127.0.0.1/tcp/4000/p2p/" + PEER,), fingerprint="f" * 16),
        training=TrainingFigures(epoch=5, samples_processed=640, nonfinite_skips=2, rollbacks=1),
        live=LiveFigures(samples_per_second=12.5, loss=3.25, val_loss=3.5, seconds_since_progress=0.2,
                         uptime_seconds=90.0, started_at=1.7e9 - 90),
        progress=GlobalProgress(epoch=6, samples_accumulated=96, num_peers=3, known=True),
        rounds=RoundFigures(), stats=SwarmStatsView(), cpu=CpuShareFigures(0.0, None, 0.0),
        checkpoints=CheckpointFigures(), view=_view(5, 6), target_batch_size=256, taken_at=1.7e9)
    figures.update(overrides)
    return make_snapshot(**figures)


def test_plain_figures_land_in_the_fields_of_the_same_meaning() -> None:
    snap = _snapshot()
    assert (snap.state, snap.pause_reason, snap.version) == ("training", "", __version__)
    assert (snap.peer_id, snap.run_id, snap.model_fingerprint, snap.reachability) == (PEER, "run-a", "f" * 16,
                                                                                       "unknown")
    assert (snap.local_epoch, snap.samples_processed_total, snap.nonfinite_skips_total, snap.rollbacks_total) == \
        (5, 640, 2, 1)
    assert (snap.samples_accumulated, snap.target_batch_size, snap.round_in_flight) == (96, 256, False)
    assert _snapshot(progress=GlobalProgress(round_in_flight=True)).round_in_flight
    assert (snap.local_samples_per_second, snap.loss, snap.val_loss) == (12.5, 3.25, 3.5)
    assert (snap.uptime_seconds, snap.taken_at, snap.seconds_since_progress) == (90.0, 1.7e9, 0.2)


def test_global_epoch_is_the_optimizers_or_our_own_never_the_records() -> None:
    assert _snapshot().global_epoch == 6  # the optimizer's (robust) progress
    # Records are claims: two identities agreeing on an epoch far ahead move the shown epoch not at all.
    assert _snapshot(view=_view(5, 9_006, 9_006)).global_epoch == 6
    assert _snapshot(progress=GlobalProgress(epoch=2, known=True), view=SwarmView()).global_epoch == 5  # we lead
    # Paused, a node does not read the swarm: its own epoch stays a floor.
    assert _snapshot(progress=GlobalProgress(), view=SwarmView(),
                     training=TrainingFigures(epoch=11)).global_epoch == 11


def test_peers_online_are_the_signed_records_then_hivemind_s_progress_count() -> None:
    assert _snapshot(view=_view(5, 6, 6, 7)).peers_online == 4  # records win over progress entries (3)
    # Before any record is read (just joined), hivemind's count of progress entries stands in.
    assert _snapshot(view=SwarmView()).peers_online == 3
    assert _snapshot(view=SwarmView(), progress=GlobalProgress()).peers_online == 0


def test_an_owned_run_s_figures_are_copied_and_a_plain_run_has_them_empty() -> None:
    plain = _snapshot()
    assert (plain.run_ref, plain.manifest_version, plain.admission_policy, plain.records_not_admitted) == \
        ("", 0, "", 0)
    owned = _snapshot(run=RunFigures(run_ref="run-a@abc", manifest_version=3, admission_policy="invite",
                                     averaging_refused_total=4, records_not_admitted=2))
    assert (owned.run_ref, owned.manifest_version, owned.admission_policy) == ("run-a@abc", 3, "invite")
    assert (owned.averaging_refused_total, owned.records_not_admitted) == (4, 2)


def test_round_figures_say_how_much_of_the_swarm_the_last_round_averaged() -> None:
    rounds = RoundFigures(rounds_ok=7, rounds_partial=2, rounds_failed=1, last_duration=1.5, last_group_size=2,
                          last_peers_online=3, last_received_fraction=0.5, recent_durations=(1.0, 1.5),
                          median_received_fraction=1.0)
    snap = _snapshot(rounds=rounds)
    assert (snap.averaging_rounds_ok_total, snap.averaging_rounds_partial_total,
            snap.averaging_rounds_failed_total) == (7, 2, 1)
    assert (snap.last_round_group_size, snap.last_round_peers_online, snap.last_round_received_fraction) == \
        (2, 3, 0.5)
    assert snap.last_round_duration_seconds == 1.5 and snap.recent_round_durations == (1.0, 1.5)
    assert snap.median_received_fraction == 1.0
    assert _snapshot().last_round_received_fraction is None  # no round yet is not "0% received"


def test_traffic_cpu_and_checkpoint_figures() -> None:
    snap = _snapshot(stats=SwarmStatsView(bytes_sent=10, bytes_received=20, state_downloads=1,
                                          state_download_seconds=4.0, state_download_progress=0.5),
                     cpu=CpuShareFigures(25.0, 24.0, 30.0),
                     checkpoints=CheckpointFigures(ok=3, failed=1, last_time=1.7e9 - 5, last_error="disk full"))
    assert (snap.bytes_sent_total, snap.bytes_received_total, snap.state_downloads_total) == (10, 20, 1)
    assert (snap.state_download_seconds_total, snap.state_download_progress) == (4.0, 0.5)
    assert (snap.cpu_limit_percent, snap.cpu_used_percent, snap.cpu_idle_seconds_total) == (25.0, 24.0, 30.0)
    assert (snap.checkpoint_writes_ok_total, snap.checkpoint_writes_failed_total) == (3, 1)
    assert (snap.last_checkpoint_time, snap.last_checkpoint_error) == (1.7e9 - 5, "disk full")


def test_reachability_follows_the_addresses_and_the_dial_back() -> None:
    assert _snapshot(identity=NodeIdentity(client_mode=True)).reachability == "client"
    relayed = NodeIdentity(maddrs=("/ip4/127.0.0.1/tcp/1/p2p/R/p2p-circuit/p2p/" + PEER,))
    assert _snapshot(identity=relayed).reachability == "relayed"
    assert _snapshot(identity=NodeIdentity()).reachability == "unknown"
    public = "/ip4/203.0.113.9/tcp/41400"
    announced = NodeIdentity(maddrs=(f"{public}/p2p/{PEER}",), announce=(public,))
    assert _snapshot(identity=announced).reachability == "public"
    assert _snapshot(identity=NodeIdentity(dialable=True, dialed="198.51.100.7:41400")).reachability == "public"
    assert _snapshot(identity=NodeIdentity(dialable=False, dialed="198.51.100.7")).reachability == "client"


def test_the_snapshot_round_trips_through_its_dict() -> None:
    snap = _snapshot(rounds=RoundFigures(rounds_ok=1, last_received_fraction=1.0))
    assert StatusSnapshot.from_dict(snap.to_dict()) == snap


def test_the_api_doc_names_every_status_field() -> None:
    """docs/api.md is where users look up what a field means: a new field comes with its line."""
    import dataclasses
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    assert [f.name for f in dataclasses.fields(StatusSnapshot) if f"`{f.name}`" not in doc] == []
