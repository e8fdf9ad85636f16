"""Scenario 11 - a hostile peer: plain hivemind in its own process (``tests/chaos/hostile_peer.py``), its own
key, the same run and model, against honest nodes in both modes.

Gradient mode, one swarm for every attack: while newcomers join it, a donor first in line (a bound
record of its own, a priority just above the best honest peer's) serves constant parameters claiming
epoch 5000, another claims 2**40, a forged model fingerprint entry is kept fresh, 5,000 Sybil records
(each bound to an identity of its own, claiming absurd figures) flood the run's records and one is
forged in an honest peer's name; then two more send x100 gradients with an inflated weight and NaN
parts every round.  The honest nodes never adopt the bad state, never exit on the fingerprint, keep
training (healthz 200, samples grow), name and exclude the senders, show no forged or absurd figure,
stop on SIGTERM within the usual bound, and end within 10% of the validation loss of the same run
without the attacker (the same model and global batch, trained by one node to the same optimizer epoch).
DiLoCo gets the state attacks: a donor first in line with NaN outer parameters, epoch 5000 and inner
step -5, and one claiming 2**40.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from p2ptrain.checkpoint import CheckpointStore
from p2ptrain.config import load_config
from p2ptrain.localswarm import LocalNode
from p2ptrain.status import StatusSnapshot
from p2ptrain.waiting import wait_until
from tests.chaos.conftest import REPO
from tests.chaos.helpers import log_text, training
from tests.support.nodeapi import node_client

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

#: Validation every few seconds: the attacked swarm and the run without the attacker are compared at
#: the same optimizer epoch, read from these lines.
VALIDATE = {"validate_every": 2.0}
#: "The usual bound" for a node to stop on SIGTERM (the fixtures allow 20 s per node).
STOP_BOUND = 20.0
#: Figures no honest node of these runs reaches.
ABSURD_EPOCH, ABSURD_RATE = 100_000, 1e5
STATE_OFFENCES = ("bad_state", "implausible_epoch", "bad_model")
PART_OFFENCES = ("nonfinite_part", "oversized_part", "malformed_part", "bad_result")


class Hostile:
    """One hostile process; its output goes to a log file."""

    def __init__(self, log: Path, command: list[str]) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def ready(self, timeout: float) -> str:
        """Waits for its "ready" line; returns its peer ID."""
        def found() -> str | None:
            if self.process.poll() is not None:
                raise RuntimeError(f"hostile exited with {self.process.returncode}:\n{self.text()[-3000:]}")
            match = re.search(r"ready as (\S+)", self.text())
            return match.group(1) if match else None

        return wait_until(found, timeout, "the hostile peer to be in place", interval=0.2,
                          detail=lambda: self.text()[-3000:])

    def stop(self) -> None:
        """SIGKILL for its whole session (its DHT helpers and p2p daemons with it): an attacker that
        vanishes is what honest nodes must cope with anyway, and waiting for a polite exit costs time."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Callable[..., Hostile]]:
    started: list[Hostile] = []

    def start(victim: LocalNode, *args: str) -> Hostile:
        addrs = victim.join_addrs()[:1]
        command = [sys.executable, "-m", "tests.chaos.hostile_peer", *args, "--config", str(victim.config_path),
                   *[arg for addr in addrs for arg in ("--join", addr)]]
        each = Hostile(tmp_path / f"hostile{len(started)}.log", command)
        started.append(each)
        return each

    yield start
    for each in started:
        each.stop()


def healthz(node: LocalNode) -> int:
    return node_client(node, timeout=5).request("GET", "/healthz").status


def sane(status: StatusSnapshot) -> bool:
    return status.local_epoch < ABSURD_EPOCH and status.global_epoch < ABSURD_EPOCH \
        and status.swarm_samples_per_second < ABSURD_RATE


def offences(status: StatusSnapshot, kinds: tuple[str, ...]) -> int:
    return sum(status.peer_offenses_by_kind.get(kind, 0) for kind in kinds)


def stop_all(nodes: list[LocalNode]) -> dict[str, float]:
    """SIGTERM every node at once; seconds each took to exit (0 exit code asserted)."""
    began = time.monotonic()
    for node in nodes:
        node.signal(signal.SIGTERM)
    took = {}
    for node in nodes:
        code = node.wait(STOP_BOUND + 10)
        took[node.name] = round(time.monotonic() - began, 1)
        assert code == 0, f"{node.name} exited with {code}:\n{node.log_tail()}"
    return took


def val_loss_at(node: LocalNode, epoch: int) -> tuple[int, float]:
    """(epoch, validation loss) of the node's first validation at ``epoch`` or later (else its last)."""
    found = [(int(e), float(v)) for e, v in re.findall(r"epoch (\d+): validation loss ([\d.]+)", log_text(node))]
    assert found, node.log_tail()
    return next((item for item in found if item[0] >= epoch), found[-1])


def final_val_loss(node: LocalNode) -> tuple[int, float]:
    """(epoch, validation loss) of the node's final checkpoint, evaluated here on the shared validation
    batches (every node evaluates the same ones)."""
    from p2ptrain.tasks.loader import build_task
    from p2ptrain.trainer import validation_loss

    state = CheckpointStore(node.state_dir / "checkpoints", keep=100).load_latest()
    assert state is not None, node.name
    assert all(torch.isfinite(t).all() for t in state.state["model"].values()), node.name
    cfg = load_config(node.config_path, environ={})
    task = build_task(cfg.task, cfg.training, peer_seed=1)
    task.model.load_state_dict(state.state["model"])
    return int(state.state.get("epoch", 0)), round(validation_loss(task), 4)


def test_one_swarm_against_every_attack_in_gradient_mode(make_node, hostile, chaos_report):
    began = time.monotonic()
    a = make_node("a", training=VALIDATE)
    base = make_node("base", run_id=f"base-{uuid.uuid4().hex[:8]}", training=VALIDATE)
    a.start()
    a.wait_for(lambda s: s.state == "training" and s.local_epoch >= 2, 120, "a few epochs")
    victim = a.peer_id()

    # (a)-(c) State and DHT attacks, in place before anyone else joins: a donor first in line serving
    # constant parameters as epoch 5000, another claiming 2**40, a forged model fingerprint entry.
    state = hostile(a, "donor", "fingerprint", "--first-in-line")
    freeze = hostile(a, "freeze")
    donor_id, freeze_id = state.ready(90), freeze.ready(90)
    b, c = make_node("b", training=VALIDATE), make_node("c", training=VALIDATE)
    b.start(join=a.join_addrs()[:1])
    c.start(join=a.join_addrs()[:1])
    honest = [a, b, c]
    for node in (b, c):
        training(node, 120)  # a forged fingerprint entry stops nobody
    # Each newcomer adopts an honest state (a donor may be busy: it retries within the sync bound).
    joined = {n.name: n.wait_for(lambda s: s.state_downloads_total >= 1, 90, "an adopted state") for n in (b, c)}
    for node in honest:
        node.wait_for(lambda s: s.rounds_averaged >= 1, 90, "averaging with the newcomers")
    for node in honest:
        status = node.status()
        assert status is not None and sane(status) and healthz(node) == 200, (node.name, status)
    for node in (b, c):
        adopted = [int(e) for e in re.findall(r"adopted the state of \S+: now at epoch (\d+)", log_text(node))]
        assert adopted and all(0 < e < ABSURD_EPOCH for e in adopted), (node.name, adopted)
    # The donor first in line was tried and refused (by a newcomer, or by a when its claim arrived).
    named_donor = {n.name for n in honest if any(o.peer_id == donor_id and o.kind in STATE_OFFENCES
                                                 for o in n.peers().offenders)}
    assert named_donor, {n.name: n.peers().offenders for n in honest}
    phases = {"state_attacks": round(time.monotonic() - began, 1)}
    fingerprint_warned = all("ignoring model fingerprint" in log_text(n) for n in (b, c))
    freeze_named = sorted(n.name for n in honest if freeze_id in {o.peer_id for o in n.peers().offenders})
    state.stop()
    freeze.stop()

    # The same run without the attacker, for the loss comparison at the end: one node, the same model
    # and global batch (alone, it gets through optimizer epochs faster: it has time to catch up).
    base.start()
    # (d), (e) Averaging attacks, one poisoner at a time: NaN parts every round, then x100 gradients
    # with a weight of 10**6.  Two hostiles that are always looking for a group pair up with each other
    # once the honest nodes refuse one of them, and the other then hides behind it.
    before = {n.name: n.status() for n in honest}
    poisoners: dict[str, str] = {}
    named_after: dict[str, float] = {}  # seconds from a poisoner in place to it named

    def named_by() -> dict[str, set[str]]:
        listed = {n.name: {o.peer_id: o for o in n.peers().offenders} for n in honest}
        return {peer: {name for name, found in listed.items() if peer in found and found[peer].excluded
                       and found[peer].kind in PART_OFFENCES} for peer in poisoners.values()}

    # Named and excluded by the nodes that averaged with it.  Once one node excludes a sender, the
    # groups it is in leave that sender out, so the others may never meet it again: one is enough.
    # NaN parts are refused and named in the first round with them; parts far too large are a judgement,
    # named on the sender's JUDGED_STRIKES-th round, and a loaded machine runs few rounds a minute.
    for attack, within in (("nonfinite", 90), ("scaled", 150)):
        poisoner = hostile(a, attack)
        peer = poisoners[attack] = poisoner.ready(90)
        in_place = time.monotonic()
        wait_until(lambda peer=peer: named_by()[peer], within, f"the {attack} poisoner named", interval=0.5,
                   detail=lambda poisoner=poisoner: f"{named_by()}; the poisoner said: {poisoner.text()[-800:]}")
        named_after[attack] = round(time.monotonic() - in_place, 1)
        poisoner.stop()
    poisoners_named_by = {k: sorted(v) for k, v in named_by().items()}
    rounds_to_name = {n.name: n.status().rounds_averaged - before[n.name].rounds_averaged for n in honest}
    for node in honest:
        for peer, names in named_by().items():
            assert node.name not in names or peer in log_text(node)  # named in one line
    # With the offenders out, the honest nodes go on averaging and training.
    for node in honest:
        node.wait_for(lambda s, n=node.name: s.samples_processed_total > before[n].samples_processed_total
                      and s.rounds_averaged >= before[n].rounds_averaged + rounds_to_name[n] + 2, 90,
                      "rounds after the offenders were excluded")
    rollbacks = {n.name: n.status().rollbacks_total for n in honest}
    phases["averaging_attacks"] = round(time.monotonic() - began, 1)

    # (f) 5,000 Sybil records, each bound to an identity of its own, claiming epoch 999,999,999 at
    # 9.9M samples/s, and a record forged in a's name claiming epoch 999,999 (after the averaging
    # attacks: the flood's signature checks load every DHT node, which is not what those measure).
    # All of it sent, far more than a view holds (256) stored (the honest DHT nodes take at most 4 x 256
    # records of a run each and refuse the rest), then two record periods for every view to read it.
    flood = hostile(a, "records", "--victim", victim)
    flood.ready(90)
    def stored() -> int:
        return max([0, *map(int, re.findall(r"hostile records stored (\d+)", flood.text()))])

    wait_until(lambda: "(all)" in flood.text() and stored() >= 512, 90, "the whole flood sent, 512 stored",
               interval=0.5, detail=lambda: flood.text()[-2000:])
    during = {n.name: n.status() for n in honest}
    time.sleep(12)
    for node in honest:
        view, status = node.peers(), node.status()
        assert view is not None and len(view.peers) <= 256
        assert all(p.epoch < ABSURD_EPOCH and p.samples_per_second < ABSURD_RATE for p in view.peers), node.name
        assert view.global_epoch < ABSURD_EPOCH and view.swarm_samples_per_second < ABSURD_RATE
        assert sane(status) and healthz(node) == 200, (node.name, status)
        assert status.samples_processed_total > during[node.name].samples_processed_total, node.name
    rejected = {n.name: n.status().rejected_records_total for n in honest}
    victim_shown = {n.name: [p.epoch for p in n.peers().peers if p.peer_id == victim] for n in (b, c)}

    phases["flood"] = round(time.monotonic() - began, 1)
    took = stop_all(honest)
    assert max(took.values()) <= STOP_BOUND, took
    flood.stop()
    # Each honest node's final model (finite, asserted there) against the run without the attacker
    # at the same optimizer epoch: its first validation at that epoch or later.
    losses = {n.name: final_val_loss(n) for n in honest}
    reached = max(epoch for epoch, _ in losses.values())
    wait_until(lambda: val_loss_at(base, reached)[0] >= reached, 120, f"the baseline at epoch {reached}",
               interval=1.0, detail=base.log_tail)
    stop_all([base])
    baseline = {name: val_loss_at(base, epoch) for name, (epoch, _) in losses.items()}
    assert all(loss <= 1.10 * baseline[name][1] for name, (_, loss) in losses.items()), (losses, baseline)
    chaos_report.record(
        "11_hostile_gradient", seconds=round(time.monotonic() - began, 1), phases_ended_at_seconds=phases,
        sybil_records_stored=stored(),
        records_rejected=rejected, victim_record_epochs_shown=victim_shown, donor_named_by=sorted(named_donor),
        fingerprint_ignored=fingerprint_warned, freeze_peer_named_by=freeze_named,
        joiner_epochs={k: v.local_epoch for k, v in joined.items()}, poisoners_named_after_seconds=named_after,
        rounds_until_named=rounds_to_name, poisoners_named_by=poisoners_named_by, rollbacks=rollbacks,
        sigterm_exit_seconds=took,
        val_loss_with_attacker={k: v[1] for k, v in losses.items()},
        epochs_compared={k: v[0] for k, v in losses.items()},
        val_loss_without_attacker={k: v[1] for k, v in baseline.items()},
        offenses_before_poisoners={n: s.peer_offenses_by_kind for n, s in before.items()},
    )


def test_state_attacks_in_diloco_mode(make_node, hostile, chaos_report):
    began = time.monotonic()
    diloco = {"mode": "diloco", "inner_steps": 8}
    a = make_node("a", training=diloco)
    a.start()
    a.wait_for(lambda s: s.state == "training" and s.local_epoch >= 2, 120, "a few rounds")
    donor = hostile(a, "donor", "--first-in-line", "--state", "nan", "--inner-step", "-5")
    freeze = hostile(a, "freeze")
    donor_id, _ = donor.ready(90), freeze.ready(90)
    b = make_node("b", training=diloco)
    b.start(join=a.join_addrs()[:1])
    synced = training(b, 120)
    assert synced.state_downloads_total >= 1 and 1 <= synced.local_epoch < ABSURD_EPOCH, b.log_tail()
    for node in (a, b):
        node.wait_for(lambda s: s.averaging_rounds_ok_total + s.averaging_rounds_partial_total >= 1, 90,
                      "a DiLoCo round together")
    named = {n.name: [o for o in n.peers().offenders if o.peer_id == donor_id] for n in (a, b)}
    assert any(o.kind in STATE_OFFENCES for found in named.values() for o in found), named
    before = {n.name: n.status() for n in (a, b)}
    for node in (a, b):
        node.wait_for(lambda s, n=node.name: s.samples_processed_total > before[n].samples_processed_total
                      and s.local_epoch > before[n].local_epoch, 60, "training on")
        assert healthz(node) == 200 and sane(node.status()), node.name
    took = stop_all([a, b])
    assert max(took.values()) <= STOP_BOUND, took
    losses = {n.name: final_val_loss(n) for n in (a, b)}  # finite parameters, asserted there
    chaos_report.record(
        "11_hostile_diloco", seconds=round(time.monotonic() - began, 1), joiner_round=synced.local_epoch,
        donor_offences={k: [o.kind for o in v] for k, v in named.items()}, sigterm_exit_seconds=took,
        val_loss={k: v[1] for k, v in losses.items()},
    )
