"""Hardened averagers against a plain-hivemind hostile peer, in one process on 127.0.0.1.

Two honest :class:`HardenedAverager` s and one plain hivemind ``DecentralizedAverager`` that lies (the
same schema, so hivemind puts them in one group).  Each test is bounded: every wait has a timeout.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import multiprocessing
import time
import uuid
from collections.abc import Iterator

import hivemind
import pytest
import torch
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.utils import get_dht_time

from p2ptrain.averaging.hardened import HardenedAverager
from p2ptrain.averaging.robust_reduce import ReduceRule, RoundReports
from p2ptrain.averaging.state_download import diloco_state_validator
from p2ptrain.trust.peergate import JUDGED_STRIKES, STRIKE_GAP_SECONDS, PeerGate
from tests.support.processes import shared_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

logger = logging.getLogger(__name__)

LOOPBACK = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False}
SHAPES = [(64, 16), (200,)]
AVERAGER = dict(min_matchmaking_time=2.0, request_timeout=1.0, next_chunk_timeout=5.0, allreduce_timeout=20.0,
                target_group_size=3, part_size_bytes=1024)  # small parts: every peer reduces a few
#: How long a healthy DHT may take to answer a request, on a loaded machine.
DHT_ANSWER = 20.0


def _start_dhts() -> list[hivemind.DHT]:
    started: list[hivemind.DHT] = []
    try:
        first = hivemind.DHT(start=True, **LOOPBACK)
        started.append(first)
        peers = [str(m) for m in first.get_visible_maddrs()]
        for _ in range(2):
            started.append(hivemind.DHT(start=True, initial_peers=peers, **LOOPBACK))
    except BaseException:
        _stop_dhts(started)
        raise
    return started


def _stop_dhts(dhts: list[hivemind.DHT]) -> None:
    for dht in dhts:
        dht.shutdown()


def _answers(dht: hivemind.DHT) -> bool:
    """Whether the DHT's process still answers what a new averager asks it first (its p2p address)."""
    if not dht.is_alive():
        return False
    try:
        dht.run_coroutine(hivemind.DHT._get_p2p_daemon_listen_maddr, return_future=True).result(timeout=DHT_ANSWER)
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def _module_dhts() -> Iterator[list[hivemind.DHT]]:
    with shared_processes():
        dhts = _start_dhts()
    try:
        yield dhts
    finally:
        _stop_dhts(dhts)  # the set in use at the end (``dhts`` may have replaced it)


@pytest.fixture
def dhts(_module_dhts: list[hivemind.DHT]) -> list[hivemind.DHT]:
    """Three DHTs shared by the module's tests (three each would cost more than most tests' own waits).
    A test that failed may have left one of them unable to answer; the next test then gets a fresh set
    instead of waiting on it."""
    if not all(_answers(dht) for dht in _module_dhts):
        logger.warning("a DHT of this module stopped answering: starting a fresh set")
        _stop_dhts(_module_dhts)
        with shared_processes():
            _module_dhts[:] = _start_dhts()
    return _module_dhts


class _Liar(hivemind.DecentralizedAverager):
    """Plain hivemind: averages what it is given and serves whatever state it is told to.  It speaks
    under the RPC names of hivemind's own class, as any peer running plain hivemind does."""

    @classmethod
    def _get_handle_name(cls, namespace, method_name):
        return hivemind.DecentralizedAverager._get_handle_name.__func__(hivemind.DecentralizedAverager, namespace,
                                                                        method_name)

    def __init__(self, *args, state=None, **kwargs):
        self._state = state
        super().__init__(*args, **kwargs)

    def get_current_state(self):
        return self._state


def _tensors(fill: float | None = None, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.full(s, fill) if fill is not None else torch.randn(s, generator=generator) for s in SHAPES]


def _round(averagers, weights, timeout: float = 60.0, alone_after: float = 5.0):
    """One simultaneous step of every averager; returns each one's gathered peers (or the exception).

    A peer the others left out of their group waits alone until its own step times out; once the
    others are done it gets ``alone_after`` seconds more, then its step is cancelled."""
    when = get_dht_time() + 3.0
    controls = [a.step(weight=w, scheduled_time=when, timeout=40.0, wait=False) for a, w in zip(averagers, weights,
                                                                                                   strict=True)]
    results = []
    for control in controls:
        try:
            results.append(control.result(timeout=timeout))
        except concurrent.futures.TimeoutError as exc:
            control.cancel()
            results.append(exc)
        except Exception as exc:  # a failed round is a result too
            results.append(exc)
        if any(isinstance(r, dict) for r in results):
            timeout = alone_after
    return results


def _restore(averagers, values) -> None:
    """Put each averager's own tensors back, so every round averages the same values: the honest
    nodes' own, and the liar's lies (plain hivemind applies the results it gets; a liar handed an honest
    node's values for a part would next send them back, a plausible part that counts like any other)."""
    for averager, own in zip(averagers, values, strict=True):
        with averager.get_tensors() as tensors:
            for tensor, mine in zip(tensors, own, strict=True):
                tensor.copy_(mine)


def _explain(found: torch.Tensor, candidates: list[torch.Tensor]) -> str:
    """What the elements that are neither the mean nor our own are made of: their least-squares mix of
    the honest values (and the lies, when given)."""
    basis = torch.stack([c.double() for c in candidates], dim=1)
    mix = torch.linalg.lstsq(basis, found.double().unsqueeze(1)).solution.squeeze(1)
    return f"{found.numel()} elements neither the mean nor own; least-squares mix {[round(float(m), 3) for m in mix]}"


def _assert_honest_mean(averagers, values, evil=None) -> None:
    """Every element is the honest pair's mean or (in a share the liar reduced or spoiled, refused,
    or a part that timed out) each node's own value."""
    expected = [(a + b) / 2 for a, b in zip(*values, strict=True)]
    for averager, own in zip(averagers, values, strict=True):
        with averager.get_tensors() as tensors:
            for index, (tensor, mean, mine) in enumerate(zip(tensors, expected, own, strict=True)):
                assert torch.isfinite(tensor).all()
                odd = ~(torch.isclose(tensor, mean, atol=1e-5) | torch.isclose(tensor, mine, atol=1e-5))
                sources = [node[index] for node in (*values, *([evil] if evil is not None else []))
                           if torch.isfinite(node[index]).all()]
                assert not odd.any(), _explain(tensor[odd], [source[odd] for source in sources])


def _mean_share(averagers, values) -> float:
    """The smallest share, over the nodes, of tensor elements that are the honest pair's mean (not a
    node's own value kept)."""
    expected = [(a + b) / 2 for a, b in zip(*values, strict=True)]
    shares = []
    for averager, own in zip(averagers, values, strict=True):
        with averager.get_tensors() as tensors:
            averaged = sum(int((torch.isclose(t, mean, atol=1e-5) & ~torch.isclose(t, mine, atol=1e-5)).sum())
                           for t, mean, mine in zip(tensors, expected, own, strict=True))
            shares.append(averaged / sum(t.numel() for t in tensors))
    return min(shares)


def _shutdown(*averagers):
    """Stop them all at once (each may take its whole grace); none at all when a test failed before its first."""
    if not averagers:
        return
    with concurrent.futures.ThreadPoolExecutor(len(averagers)) as pool:
        list(pool.map(lambda a: a.shutdown(), averagers))


@pytest.mark.parametrize("attack", ["scaled", "nonfinite"])
def test_a_lying_sender_is_rejected_named_excluded_and_the_honest_average_survives(dhts, attack):
    prefix = f"robust{uuid.uuid4().hex[:6]}"
    gates, reports = [PeerGate(), PeerGate()], [RoundReports(), RoundReports()]
    honest_values = [_tensors(seed=1), _tensors(seed=2)]
    evil = [t * 100 for t in _tensors(seed=3)] if attack == "scaled" else _tensors(fill=math.nan)
    averagers = []
    try:
        for dht, gate, report, values in zip(dhts[:2], gates, reports, honest_values, strict=True):
            averagers.append(HardenedAverager([t.clone() for t in values], dht, prefix=prefix, start=True, gate=gate,
                                              reduce_rule=ReduceRule.for_gradients(max_weight=32.0),
                                              round_reports=report, **AVERAGER))
        # A copy: hivemind moves the tensors it is given to shared memory in place and averages into them,
        # so ``evil`` itself would become the liar's current values and restoring it would restore nothing.
        liar = _Liar([t.clone() for t in evil], dhts[2], prefix=prefix, start=True, **AVERAGER)
        averagers.append(liar)
        liar_id = str(dhts[2].peer_id)

        # NaN parts exclude the liar at once; parts far larger than the others' are a judgement,
        # refused every round and excluding on the liar's third round with them.  A gate counts a
        # round only if the liar's parts or results reached it in time (on a loaded machine some
        # time out): allow a few more, each still checked for an honest average.  Once one honest
        # node excludes the liar, it leaves the liar out of its groups, so the other may never see
        # enough rounds to exclude it too: one exclusion ends the attack.  A loaded machine's
        # matchmaking may also split the three (two in a group, one alone) before that: such a round
        # is not the one this test is about and is tried again, a bounded number of times.
        wanted = 1 if attack == "nonfinite" else JUDGED_STRIKES + 5
        full_reports, splits = [], []
        for attempt in range(wanted + 3):
            if len(full_reports) >= wanted or any(gate.is_gated(liar_id) for gate in gates):
                break
            if attempt:
                time.sleep(1.5 * STRIKE_GAP_SECONDS)  # a new round, for the gate too (late results included)
                _restore(averagers, [*honest_values, evil])
            results = _round(averagers, [16.0, 16.0, 1e9])
            drained = reports[0].drain()
            if not all(isinstance(r, dict) and len(r) == 3 for r in results[:2]):
                splits.append(results)
                continue
            full_reports.extend(drained)
            _assert_honest_mean(averagers[:2], honest_values, evil)
        assert full_reports, f"the three never met in one group: {splits}"
        assert len(full_reports) >= JUDGED_STRIKES or attack == "nonfinite", "excluded before its third round"
        for gate in gates:  # every honest node refused the liar's parts or results, and named it
            kinds = {o.kind for o in gate.offenders() if o.peer_id == liar_id}
            assert kinds & {"oversized_part", "nonfinite_part", "bad_result"}, gate.offenders()
        assert any(gate.is_gated(liar_id) for gate in gates), [gate.offenders() for gate in gates]
        assert all(r.ok and r.senders == 3 for r in full_reports), full_reports
        # The first full round, before any exclusion: the liar's third of the parts arrived and was refused.
        first = full_reports[0]
        assert first.contributions_expected > 0
        assert first.received_fraction == pytest.approx(2 / 3)
        assert {peer for peer, _, _ in first.rejected} == {liar_id}

        # Then the honest pair averages despite the liar.  A node that excluded it leaves it out of the
        # groups it leads.  One that has not excluded it yet may still lead a group with it in (the other,
        # a follower, cannot refuse the group, only the liar's parts); either its own refusals exclude it
        # within a few more rounds, or the liar's round breaks on the other's refusal first, so it sends
        # nothing more to judge and only the parts it reduces stay each node's own.  Either way every
        # round is an honest mean and most of the tensors are the pair's average.
        results: list[object] = []
        for _ in range(JUDGED_STRIKES + 3):
            time.sleep(1.5 * STRIKE_GAP_SECONDS)
            _restore(averagers, [*honest_values, evil])
            results = _round(averagers, [16.0, 16.0, 1e9])
            _assert_honest_mean(averagers[:2], honest_values, evil)
            without_liar = all(isinstance(r, dict) and len(r) == 2 and liar_id not in {str(p) for p in r}
                               for r in results[:2])
            if without_liar or _mean_share(averagers[:2], honest_values) >= 0.5:
                break
        else:
            raise AssertionError(f"the honest pair never averaged most of its tensors: {results}, "
                                 f"{_mean_share(averagers[:2], honest_values):.2f} of them the mean, "
                                 f"{[gate.offenders() for gate in gates]}")
    finally:
        _shutdown(*averagers)


def _diloco_state(epoch: int, inner_step: int, fill: float | None, count: int = 4):
    params = _tensors(fill=fill) if fill is not None else _tensors(seed=7)
    tensors = [*params, *[torch.zeros(s) for s in SHAPES]][:count]
    return dict(epoch=epoch, inner_step=inner_step), tensors, None


@pytest.mark.parametrize(("lie", "kind"), [
    (dict(epoch=5000, inner_step=0, fill=0.0123), "implausible_epoch"),
    (dict(epoch=12, inner_step=0, fill=math.nan), "bad_state"),
    (dict(epoch=12, inner_step=-5, fill=0.5), "bad_state"),
    (dict(epoch=12, inner_step=0, fill=0.5, count=3), "short_state"),
])
def test_a_bad_donor_is_banned_and_the_next_donor_is_used(dhts, lie, kind):
    prefix = f"donor{uuid.uuid4().hex[:6]}"
    gate = PeerGate()
    honest_state = _diloco_state(12, 2, None)
    averagers = []
    try:
        liar = _Liar(_tensors(), dhts[2], prefix=prefix, start=True, state=_diloco_state(**lie), **AVERAGER)
        liar.state_sharing_priority = 5000.0 if lie["epoch"] == 5000 else 100.0  # first in line
        honest = _Liar(_tensors(), dhts[1], prefix=prefix, start=True, state=honest_state, **AVERAGER)
        honest.state_sharing_priority = 12.0
        averagers += [liar, honest]
        liar_id, honest_id = str(dhts[2].peer_id), str(dhts[1].peer_id)
        params = [torch.zeros(s) for s in SHAPES]
        validator = diloco_state_validator(params, 5, own_epoch=lambda: 0,
                                           peer_epochs=lambda: {liar_id: lie["epoch"], honest_id: 12})
        joiner = HardenedAverager(_tensors(), dhts[0], prefix=prefix, start=True, gate=gate,
                                  state_validator=validator, **AVERAGER)
        averagers.append(joiner)
        time.sleep(2.0)  # the donors declare themselves in the DHT
        started = time.monotonic()
        download = joiner.download_state(timeout=60.0)
        assert time.monotonic() - started < 60.0
        assert download is not None and download.donor == honest_id, joiner.last_download_rejections
        assert download.metadata == {"epoch": 12, "inner_step": 2}
        assert all(torch.equal(a, b) for a, b in zip(download.tensors, honest_state[1], strict=True))
        [offender] = gate.offenders()
        assert (offender.peer_id, offender.kind) == (liar_id, kind)
        if kind == "short_state":
            # A stream that ends early may be a cut connection (hivemind cannot tell): a judgement,
            # excluding on the donor's third download with it, each download still the honest state.
            for _ in range(JUDGED_STRIKES - 1):
                assert not gate.is_gated(liar_id)
                time.sleep(1.5 * STRIKE_GAP_SECONDS)
                again = joiner.download_state(timeout=60.0)
                assert again is not None and again.donor == honest_id, joiner.last_download_rejections
            assert gate.is_gated(liar_id)
            [offender] = gate.offenders()
        # A malformed state is the donor's own doing: banned for the run.  An implausible epoch is judged
        # against other peers' reports, which may be forged: banned for a while only.
        if kind == "bad_state":
            assert offender.banned_until is None
        else:
            assert offender.banned_until is not None and offender.banned_until - time.time() < gate.default_ban_seconds
        # The next download goes straight to the honest donor.
        again = joiner.load_state_from_peers(timeout=30.0)
        assert again is not None and again[0]["epoch"] == 12
        assert joiner.last_download_rejections == []
    finally:
        _shutdown(*averagers)


def test_only_bad_donors_means_no_state_and_no_exception(dhts):
    prefix = f"bad{uuid.uuid4().hex[:6]}"
    gate = PeerGate()
    averagers = []
    try:
        liar = _Liar(_tensors(), dhts[2], prefix=prefix, start=True, state=_diloco_state(3, 0, math.inf),
                     **AVERAGER)
        liar.state_sharing_priority = 3.0
        absurd = _Liar(_tensors(), dhts[1], prefix=prefix, start=True, state=_diloco_state(3, 0, 0.5), **AVERAGER)
        absurd.state_sharing_priority = float(2**40)  # an implausible priority: never even asked
        averagers += [liar, absurd]
        validator = diloco_state_validator([torch.zeros(s) for s in SHAPES], 5, own_epoch=lambda: 0)
        joiner = HardenedAverager(_tensors(), dhts[0], prefix=prefix, start=True, gate=gate,
                                  state_validator=validator, **AVERAGER)
        averagers.append(joiner)
        time.sleep(2.0)
        assert joiner.load_state_from_peers(timeout=30.0) is None
        assert [peer for peer, _ in joiner.last_download_rejections] == [str(dhts[2].peer_id)]
        assert not gate.is_gated(str(dhts[1].peer_id))
    finally:
        _shutdown(*averagers)


def test_both_hardened_honest_round_is_the_exact_weighted_mean(dhts):
    prefix = f"honest{uuid.uuid4().hex[:6]}"
    values = [_tensors(seed=4), _tensors(seed=5)]
    reports = RoundReports()
    averagers = []
    try:
        for dht, own, report in zip(dhts[:2], values, (reports, None), strict=True):
            averagers.append(HardenedAverager([t.clone() for t in own], dht, prefix=prefix, start=True,
                                              reduce_rule=ReduceRule.for_gradients(max_weight=64.0),
                                              round_reports=report, **AVERAGER))
        assert all(isinstance(r, dict) for r in _round(averagers, [8.0, 24.0]))
        expected = [(8 * a + 24 * b) / 32 for a, b in zip(*values, strict=True)]
        for averager in averagers:
            with averager.get_tensors() as tensors:
                assert all(torch.allclose(t, e, atol=1e-5) for t, e in zip(tensors, expected, strict=True))
        [report] = reports.drain()
        assert report.rejected == () and report.received_fraction == 1.0
        assert report.results_received == report.results_expected
    finally:
        _shutdown(*averagers)


def test_without_the_checks_a_round_is_still_measured_and_averages_as_hivemind_does(dhts):
    prefix = f"plain{uuid.uuid4().hex[:6]}"
    values = [_tensors(seed=8), _tensors(seed=9)]
    reports = RoundReports()
    averagers = []
    try:
        averagers.append(HardenedAverager([t.clone() for t in values[0]], dhts[0], prefix=prefix, start=True,
                                          peer_checks=False, round_reports=reports, **AVERAGER))
        averagers.append(HardenedAverager([t.clone() for t in values[1]], dhts[1], prefix=prefix, start=True,
                                          reduce_rule=ReduceRule.for_gradients(max_weight=64.0), **AVERAGER))
        assert all(isinstance(r, dict) for r in _round(averagers, [8.0, 24.0]))
        expected = [(8 * a + 24 * b) / 32 for a, b in zip(*values, strict=True)]
        for averager in averagers:
            with averager.get_tensors() as tensors:
                assert all(torch.allclose(t, e, atol=1e-5) for t, e in zip(tensors, expected, strict=True))
        [report] = reports.drain()
        assert report.ok and report.senders == 2 and report.contributions_expected > 0
        assert report.received_fraction == 1.0 and report.results_received == report.results_expected
    finally:
        _shutdown(*averagers)


def _training_averager(cls, dht, prefix, seed, **extra):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return cls(dht=dht, prefix=prefix, start=True, params=model.parameters(),
               optimizer=lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
               scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (1 + e)),
               min_matchmaking_time=2.0, request_timeout=1.0, next_chunk_timeout=5.0, **extra)


class _LyingTrainingStateAverager(TrainingStateAverager):
    """Plain hivemind's state averager that claims an absurd epoch for a state of the right shape."""

    @classmethod
    def _get_handle_name(cls, namespace, method_name):
        return TrainingStateAverager._get_handle_name.__func__(TrainingStateAverager, namespace,
                                                                        method_name)

    def get_current_state(self):
        metadata, tensors, infos = super().get_current_state()
        return dict(metadata, epoch=2**40), tensors, infos


def test_safe_training_state_averager_rejects_a_huge_epoch_and_adopts_tensors_not_hyperparameters(dhts):
    from p2ptrain.averaging.state_download import SafeTrainingStateAverager

    prefix = f"tsa{uuid.uuid4().hex[:6]}"
    gate = PeerGate()
    averagers = []
    try:
        liar = _training_averager(_LyingTrainingStateAverager, dhts[2], prefix, seed=1)
        liar.state_sharing_priority = 13.0  # plausible priority, absurd state
        honest = _training_averager(TrainingStateAverager, dhts[1], prefix, seed=2)
        honest.local_epoch = 12
        honest.state_sharing_priority = 12.0
        for group in honest.optimizer.param_groups:
            group["weight_decay"], group["lr"] = 5.0, 1e9  # a donor's hyperparameters are not ours
        averagers += [liar, honest]
        joiner = _training_averager(SafeTrainingStateAverager, dhts[0], prefix, seed=3, gate=gate)
        averagers.append(joiner)
        time.sleep(2.0)
        started = time.monotonic()
        assert joiner.load_state_from_peers(timeout=60.0) is True
        assert time.monotonic() - started < 60.0
        assert joiner.local_epoch == 12 and joiner.scheduler.last_epoch == 12
        group = joiner.optimizer.param_groups[0]
        assert group["lr"] == pytest.approx(0.01 / 13) and group["weight_decay"] == 0.1
        honest_params = [p for g in honest.optimizer.param_groups for p in g["params"]]
        joined_params = [p for g in joiner.optimizer.param_groups for p in g["params"]]
        assert all(torch.equal(a, b) for a, b in zip(joined_params, honest_params, strict=True))
        [offender] = gate.offenders()
        # Caught by the epoch it serves against the priority it advertised, or by the epoch check itself.
        assert offender.peer_id == str(dhts[2].peer_id) and offender.kind in ("implausible_epoch", "bad_state")
        assert f"epoch {2**40}" in offender.reason
    finally:
        _shutdown(*averagers)


def test_banned_peers_may_still_download_but_peers_not_admitted_may_not(dhts):
    prefix = f"serve{uuid.uuid4().hex[:6]}"
    # The predicate runs in the averager's forked process too: what it reads must be process-shared.
    admitted = multiprocessing.get_context("fork").Value("b", 1)
    gate = PeerGate(admission=lambda peer: bool(admitted.value))
    averagers = []
    try:
        server = HardenedAverager(_tensors(seed=9), dhts[0], prefix=prefix, start=True, gate=gate, **AVERAGER)
        client = _Liar(_tensors(), dhts[2], prefix=prefix, start=True, **AVERAGER)
        averagers += [server, client]
        gate.offend(str(dhts[2].peer_id), "bad_result", "test")  # banned: still served (it may be a drifted peer)
        time.sleep(2.0)
        served = client.load_state_from_peers(timeout=20.0)
        assert served is not None and torch.equal(served[1][0], _tensors(seed=9)[0])
        admitted.value = 0  # an invite run that does not admit it: never served
        assert client.load_state_from_peers(timeout=20.0) is None
    finally:
        _shutdown(*averagers)


def test_sparse_parts_average_through_the_checked_all_reduce(dhts):
    """topk mode's parts (each peer's own index set, 2-bit values) through the hardened all-reduce:
    every peer ends with the weighted mean of the dense tensors, to the 8-bit step of the reply."""
    from p2ptrain.averaging.sparse_codec import CHUNK, SparseChunkCodec, chunk_topk

    prefix = f"sparse{uuid.uuid4().hex[:6]}"
    generator = torch.Generator().manual_seed(11)
    values = [[chunk_topk(torch.randn(shape, generator=generator), 0.02, 2) for shape in ((2 * CHUNK,), (300,))]
              for _ in range(2)]
    reports = RoundReports()
    averagers = []
    try:
        for dht, own, report in zip(dhts[:2], values, (reports, None), strict=True):
            averagers.append(HardenedAverager([t.clone() for t in own], dht, prefix=prefix, start=True,
                                              compression=SparseChunkCodec(2), round_reports=report,
                                              reduce_rule=ReduceRule.for_gradients(max_weight=64.0),
                                              **dict(AVERAGER, part_size_bytes=4 * CHUNK)))  # a chunk a part
        assert all(isinstance(r, dict) for r in _round(averagers, [8.0, 24.0]))
        expected = [(8 * a + 24 * b) / 32 for a, b in zip(*values, strict=True)]
        for averager, own in zip(averagers, values, strict=True):
            with averager.get_tensors() as tensors:
                for tensor, mean, mine in zip(tensors, expected, own, strict=True):
                    step = float((mean - mine).abs().max()) / 200
                    assert torch.allclose(tensor, mean, atol=step), float((tensor - mean).abs().max())
        [report] = reports.drain()
        assert report.rejected == () and report.received_fraction == 1.0
    finally:
        _shutdown(*averagers)
