"""The hardened hivemind subclasses without a network: wire compatibility and robust swarm progress."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import hivemind
import pytest
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from p2ptrain.averaging.diloco import DiLoCoAverager
from p2ptrain.averaging.hardened import HardenedAverager, HardenedGradientAverager
from p2ptrain.averaging.progress import STALE_AFTER, SwarmProgressTracker
from p2ptrain.averaging.state_download import SafeTrainingStateAverager
from p2ptrain.trust.peergate import PeerGate


@pytest.mark.parametrize(("ours", "theirs"), [
    (HardenedAverager, hivemind.DecentralizedAverager),
    (HardenedGradientAverager, GradientAverager),
    (SafeTrainingStateAverager, TrainingStateAverager),
])
def test_hardened_averagers_speak_hivemind_wire_names_and_stream_kinds(ours, theirs):
    """hivemind names RPCs after the class and reads streaming from typing annotations: a subclass must
    keep both, or it silently stops averaging with every node running the class it replaces."""
    theirs._collect_rpc_handlers()  # the parent first: its cached stubs must not leak into ours
    ours._collect_rpc_handlers()
    assert "_rpc_handlers" in ours.__dict__

    def by_name(cls):
        return sorted(cls._rpc_handlers, key=lambda h: h.method_name)

    assert by_name(ours) == by_name(theirs) and len(by_name(ours)) == 3
    for handler in ours._rpc_handlers:
        name = handler.method_name
        assert ours._get_handle_name("run", name) == theirs._get_handle_name("run", name)
    assert ours._stub_type.__name__ == f"{ours.__name__}Stub"  # made for our class, not inherited


def test_diloco_averagers_speak_one_wire_name_whatever_checks_a_node_runs():
    DiLoCoAverager._collect_rpc_handlers()
    assert DiLoCoAverager._get_handle_name("run", "rpc_join_group") == "run::_DiLoCoAverager.rpc_join_group"
    assert len(DiLoCoAverager._rpc_handlers) == 3 and "_rpc_handlers" in DiLoCoAverager.__dict__


def _peer(n: int) -> bytes:
    return PeerID(b"\x12\x20" + bytes([n]) * 32).to_bytes()


class _FakeDht:
    client_mode = False

    def __init__(self) -> None:
        self.peer_id = PeerID(_peer(0))

    def add_validators(self, validators) -> None:
        pass

    def get(self, *args, **kwargs):
        return None


def _entry(peer: int, epoch: int, samples: int = 10, rate: float = 5.0, client: bool = False, time: float = 1.0e12):
    return SimpleNamespace(value={"peer_id": _peer(peer), "epoch": epoch, "samples_accumulated": samples,
                                  "samples_per_second": rate, "time": time, "client_mode": client})


def _tracker(gate: PeerGate | None = None) -> SwarmProgressTracker:
    return SwarmProgressTracker(_FakeDht(), "run", 100, start=False, robust=True, gate=gate)


def test_one_peer_claiming_a_huge_epoch_moves_nothing_and_claims_are_bounded():
    tracker = _tracker()
    tracker.local_progress = tracker._get_local_progress(10, 0)
    metadata = {b"a": _entry(1, 10, samples=40), b"b": _entry(2, 11, samples=30), b"c": _entry(3, 2**40),
                b"d": _entry(4, 11, samples=10**12, rate=1e30)}
    progress = tracker._parse_swarm_progress_data(metadata)
    assert progress.epoch == 11
    assert progress.samples_accumulated == 30 + 100  # peer 4's claim counts at most one target batch
    assert progress.num_peers == 3  # the out-of-range entry is dropped
    assert tracker.peer_epochs == {str(PeerID(_peer(n))): e for n, e in ((1, 10), (2, 11), (4, 11))}


def test_an_entry_not_refreshed_for_a_while_does_not_make_the_round_due():
    # A paused peer's entry, re-published by hivemind with its old time and rate, or a crashed peer's:
    # extrapolated over minutes it would fill the round, so every peer would average at once and read
    # the swarm's progress at the shortest period.
    tracker = _tracker()
    tracker.local_progress = tracker._get_local_progress(3, 0)
    now = get_dht_time()
    stale = {b"a": _entry(1, 3, samples=20, rate=50.0, time=now - STALE_AFTER - 60),
             b"b": _entry(2, 3, samples=20, rate=50.0, time=now - STALE_AFTER - 60)}
    progress = tracker._parse_swarm_progress_data(stale)
    assert progress.eta_next_epoch > now + 1 and progress.next_fetch_time >= now + tracker.default_refresh_period - 1
    fresh = {**stale, b"c": _entry(3, 3, samples=20, rate=10.0, time=now - 1)}
    progress = tracker._parse_swarm_progress_data(fresh)
    assert progress.samples_accumulated == 20  # only the peer that still reports
    assert now + 4 < progress.eta_next_epoch < now + 8  # (100 - 20 - 10 x 1 s) at 10/s, not "due now"


def test_a_ban_takes_effect_without_waiting_for_the_next_fetch():
    gate = PeerGate()
    tracker = _tracker(gate)
    tracker.global_progress = tracker._parse_swarm_progress_data({b"a": _entry(1, 40), b"b": _entry(2, 41)})
    assert tracker.global_epoch == 41
    gate.offend(PeerID(_peer(2)), "implausible_epoch", "test")
    assert tracker.global_epoch == 40
    assert str(PeerID(_peer(2))) not in tracker.peer_epochs


def test_after_a_failed_sync_a_lone_claim_is_not_believed_for_a_while():
    tracker = _tracker()
    tracker.global_progress = tracker._parse_swarm_progress_data({b"a": _entry(1, 5000)})
    assert tracker.global_epoch == 5000  # a run of one: followed, and the download will check it
    tracker.distrust_unsupported(60.0)
    assert tracker.global_epoch == 0
    tracker.global_progress = tracker._parse_swarm_progress_data({b"a": _entry(1, 7), b"b": _entry(2, 8)})
    assert tracker.global_epoch == 8  # agreement is still believed


def test_no_entries_and_two_keys_claiming_one_peer():
    tracker = _tracker()
    assert tracker._parse_swarm_progress_data(None).num_peers == 0
    forged = _entry(1, 7)
    forged.value["time"] = 2.0e12  # newer than the peer's own entry
    progress = tracker._parse_swarm_progress_data({b"a": _entry(1, 5), b"b": forged})
    assert progress.num_peers == 1 and progress.epoch == 5  # one peer; nothing says which is real: the modest claim


def test_with_bound_keys_only_entries_written_with_a_peers_record_key_count():
    """One process with many RSA keys can write entries in any name; only the key a peer's identity-bound
    record names speaks for that peer."""
    honest = {b"k1": str(PeerID(_peer(1))), b"k2": str(PeerID(_peer(2)))}
    tracker = SwarmProgressTracker(_FakeDht(), "run", 100, start=False, robust=True, bound=lambda: honest)
    tracker.local_progress = tracker._get_local_progress(10, 0)
    forged_victim = _entry(1, 5000)
    forged_victim.value["time"] = 2.0e12
    metadata = {b"k1": _entry(1, 10, samples=40), b"k2": _entry(2, 11, samples=30),
                b"x1": forged_victim,                                    # another key in peer 1's name
                b"x2": _entry(7, 5000), b"x3": _entry(8, 5000)}          # a quorum of two made-up peers
    progress = tracker._parse_swarm_progress_data(metadata)
    assert progress.epoch == 11  # the two made-up peers agree on 5000, but have no say
    assert set(tracker.peer_epochs.values()) == {10, 11}
    # They still count as peers to average with (and towards the samples, each bounded).
    assert progress.num_peers == 4


def test_a_bound_peer_claiming_an_impossible_epoch_is_named_and_excluded_an_unbound_one_only_ignored():
    """An epoch outside 0..MAX_EPOCH is never honest.  Written with the key the peer's own record names,
    it is that peer's lie: one offence, and its entries no longer count.  Under a self-declared peer ID
    it could be anyone writing in an honest peer's name: ignored, nobody named."""
    from p2ptrain.trust.verdicts import MAX_EPOCH

    liar, framed = str(PeerID(_peer(3))), str(PeerID(_peer(4)))
    gate = PeerGate()
    tracker = SwarmProgressTracker(_FakeDht(), "run", 100, start=False, robust=True, gate=gate,
                                    bound=lambda: {b"k1": str(PeerID(_peer(1))), b"k3": liar})
    tracker.local_progress = tracker._get_local_progress(10, 0)
    metadata = {b"k1": _entry(1, 10), b"k3": _entry(3, 2**40), b"x4": _entry(4, MAX_EPOCH + 1)}
    progress = tracker._parse_swarm_progress_data(metadata)
    assert progress.epoch == 10 and progress.num_peers == 1  # peer 1 alone: both claims dropped
    assert gate.is_gated(liar) and not gate.is_gated(framed)
    [offender] = gate.offenders()
    assert offender.peer_id == liar and offender.kind == "implausible_epoch" and f"epoch {2**40}" in offender.reason


def test_a_flood_of_entries_is_filtered_and_merged_before_it_is_capped():
    from p2ptrain.averaging.robust_progress import MAX_PROGRESS_ENTRIES

    gate = PeerGate()
    tracker = _tracker(gate)
    tracker.local_progress = tracker._get_local_progress(3, 0)
    flood = {bytes([n % 256, n // 256]) + b"f": _entry(9, 1, rate=1.0) for n in range(2 * MAX_PROGRESS_ENTRIES)}
    gate.offend(PeerID(_peer(9)), "nonfinite_part", "test")  # the flooder is banned: none of it counts
    honest = {b"h": _entry(1, 4), b"i": _entry(2, 4)}
    progress = tracker._parse_swarm_progress_data({**flood, **honest})  # honest entries come last
    assert progress.num_peers == 2 and progress.epoch == 4


def _refusing_state_averager() -> SimpleNamespace:
    """A hardened state averager (its real load_state_from_peers) whose every download rejects a donor."""
    averager = SimpleNamespace(last_download_rejections=[], local_epoch=0, _peer_checks=True)

    def download_state(timeout: float | None = None) -> None:
        averager.last_download_rejections = [("QmLiar", "tensor 0 has NaN")]

    averager.download_state = download_state
    averager.load_state_from_peers = lambda **kwargs: SafeTrainingStateAverager.load_state_from_peers(averager,
                                                                                                      **kwargs)
    return averager


def test_a_gradient_mode_download_says_once_that_every_donor_was_rejected(caplog):
    """Normal weather is one line: a fresh node that finds only bad donors says it trains from its own
    initialisation once per download, not once per attempt."""
    from p2ptrain.averaging.optimizer import HardenedOptimizer
    from p2ptrain.optim.swarm_stats import SwarmStats

    stats = SwarmStats()
    optimizer = SimpleNamespace(state_averager=_refusing_state_averager(), _retry_sync_after=30.0,
                                _last_failed_sync=-math.inf, _load_state_attempts=3,
                                _wait=lambda seconds: False, tracker=None, local_epoch=0, _adopted=False,
                                _state_marker=lambda: (0, 0.0), on_download_started=stats.download_started,
                                on_download_finished=stats.download_finished)
    HardenedOptimizer._bound_state_download(optimizer)
    with caplog.at_level(logging.INFO, logger="p2ptrain"):
        optimizer.state_averager.load_state_from_peers()
    said = [r for r in caplog.records if "every donor's state was rejected" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert all(r.levelno <= logging.WARNING for r in caplog.records)


def test_a_state_that_cannot_be_applied_is_a_warning_not_an_error(caplog):
    from p2ptrain.averaging.hardened import StateDownload

    def broken(metadata, tensors):
        raise RuntimeError("size mismatch")

    averager = SimpleNamespace(download_state=lambda timeout: StateDownload("QmDonor", {}, []), _apply=broken,
                               _peer_checks=True)
    with caplog.at_level(logging.INFO, logger="p2ptrain"):
        assert SafeTrainingStateAverager.load_state_from_peers(averager) is False
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "QmDonor" in caplog.text


def test_a_gradient_round_is_not_pre_scheduled_while_the_last_one_still_looks_for_its_group():
    """hivemind pre-schedules the next round once the last was triggered; when that one is still
    looking for its group, the averager queues the new one behind it ("Another look_for_group is
    already in progress"), and groups then split: in a three-node demo swarm 51 of 67 groups were pairs."""
    from hivemind.averaging.control import AveragingStage
    from hivemind.utils import get_dht_time

    from p2ptrain.optim.gradient import GradientOptimizer

    scheduled: list[float] = []
    optimizer = object.__new__(GradientOptimizer)  # just the scheduling: no DHT, no averagers
    optimizer._parent_pid = -1  # hivemind's __del__ shuts down an optimizer its process started
    optimizer.tracker = SimpleNamespace(global_progress=SimpleNamespace(num_peers=3),
                                        estimated_next_update_time=get_dht_time() + 0.1)
    optimizer.grad_averager = SimpleNamespace(matchmaking_kwargs={"min_matchmaking_time": 0.5},
                                              schedule_step=lambda timeout: scheduled.append(timeout) or "next")
    optimizer.matchmaking_time, optimizer.averaging_timeout, optimizer.status_loglevel = 0.5, 15.0, logging.DEBUG
    last = SimpleNamespace(triggered=True, stage=AveragingStage.LOOKING_FOR_GROUP, done=lambda: False)
    optimizer.scheduled_grads = last
    optimizer._maybe_schedule_gradient_averaging()
    assert scheduled == [] and optimizer.scheduled_grads is last
    last.stage = AveragingStage.RUNNING_ALLREDUCE  # its group found: the next round may look for its own
    optimizer._maybe_schedule_gradient_averaging()
    assert scheduled == [15.0] and optimizer.scheduled_grads == "next"


def test_an_epoch_whose_last_round_still_runs_begins_a_round_of_its_own():
    """hivemind skips an epoch's round when the control it holds is the last epoch's, already triggered
    ("Not using pre-scheduled group"), and applies local gradients: a fifth of the epochs in a three-node
    swarm with short epochs. The epoch gets a round of its own instead."""
    from p2ptrain.optim.gradient import GradientOptimizer
    from p2ptrain.optim.swarm_stats import SwarmStats

    steps: list[object] = []
    optimizer = object.__new__(GradientOptimizer)
    optimizer._parent_pid = -1  # hivemind's __del__ shuts down an optimizer its process started
    optimizer.tracker = SimpleNamespace(global_progress=SimpleNamespace(num_peers=3))
    optimizer.grad_averager = SimpleNamespace(
        local_samples_accumulated=64,
        step=lambda control, reset_accumulators, wait: steps.append(control) or "this epoch's round")
    optimizer.stats, optimizer._rounds_begun, optimizer.status_loglevel = SwarmStats(), 0, logging.DEBUG
    optimizer.state_averager = SimpleNamespace(local_epoch=7)
    optimizer.scheduled_grads = SimpleNamespace(triggered=True, done=lambda: False)  # the last epoch's
    assert optimizer._begin_averaging_gradients(None) is True
    assert steps == [None] and optimizer.scheduled_grads == "this epoch's round" and optimizer._rounds_begun == 1
    assert optimizer._round_epoch == 7  # the epoch the round is for, once it averages (see below)


def test_one_epoch_behind_with_the_last_epoch_averaged_joins_the_swarm_s_round_instead_of_downloading():
    """Peers end an epoch a second or so apart; hivemind's once-an-epoch exact check then has the later
    one download the whole state, throwing its epoch's gradients away (a fast peer lost one epoch in two
    of three heterogeneous runs).  A peer whose last epoch averaged holds the swarm's parameters: it
    ends its epoch with the swarm's round instead.  Further behind, or not averaged, it downloads."""
    import threading

    from p2ptrain.optim.gradient import GradientOptimizer

    optimizer = object.__new__(GradientOptimizer)
    optimizer._parent_pid = -1  # hivemind's __del__ shuts down an optimizer its process started
    fetched = threading.Event()
    optimizer.tracker = SimpleNamespace(global_epoch=5, fetched_global_progress_this_epoch=fetched)
    optimizer.state_averager = SimpleNamespace(local_epoch=4)
    optimizer._last_failed_sync, optimizer._retry_sync_after = -math.inf, 30.0

    def check(averaged: int, swarm: int) -> bool:
        optimizer._averaged_epoch, optimizer.tracker.global_epoch = averaged, swarm
        optimizer._should_check_synchronization_on_update = True
        return optimizer._should_load_state_from_peers()

    fetched.set()
    assert check(averaged=3, swarm=5) is False  # one behind, epoch 3 averaged: join the round
    assert optimizer._should_check_synchronization_on_update is False  # the exact check is spent
    assert optimizer._should_load_state_from_peers() is False  # and hivemind's own rule: not two behind
    assert check(averaged=2, swarm=5) is True  # the last epoch did not average: our parameters may differ
    assert check(averaged=-1, swarm=5) is True  # a newcomer never averaged: download
    assert check(averaged=3, swarm=6) is True  # two behind
    assert check(averaged=3, swarm=4) is False  # level: nothing to do
    fetched.clear()
    assert check(averaged=3, swarm=5) is False  # the swarm's progress not read yet this epoch
    assert optimizer._should_check_synchronization_on_update is True
