"""Scenario 6 - bad peers: forged and malformed peer records, and a node
that sends non-finite gradients on purpose (``P2PTRAIN_TEST_FAULTS=nonfinite_grads``): its parts are
refused per sender, it is named and excluded, and the honest nodes never roll back."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch

from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.waiting import wait_until
from tests.chaos.conftest import REPO
from tests.chaos.helpers import log_text, training

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(360)]


def _publish_junk(addrs: list[str], run_id: str, victim_peer_id: str) -> int:
    """Run the hostile publisher as its own process (its DHT and torch helpers die with it)."""
    done = subprocess.run([sys.executable, "-m", "tests.chaos.hostile_records", run_id, victim_peer_id, *addrs],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.strip().splitlines()[-1])


def test_bad_peers_are_counted_and_honest_nodes_stay_finite(make_node, chaos_report):
    a, b = make_node("a"), make_node("b")
    a.start()
    addrs = a.join_addrs()[:1]
    b.start(join=addrs)
    for node in (a, b):
        node.wait_for(lambda s: s.averaging_rounds_ok_total >= 1, 120, "an averaging round")

    # A node that sends overflowing (non-finite once accumulated) gradients.
    bad = make_node("bad", env={"P2PTRAIN_TEST_FAULTS": "nonfinite_grads"})
    bad.start(join=addrs)
    training(bad, 120)
    bad_id = bad.status().peer_id
    poisoned_at = time.monotonic()

    def named(status) -> bool:
        return sum(status.peer_offenses_by_kind.get(kind, 0) for kind in ("nonfinite_part", "oversized_part",
                                                                            "bad_result")) >= 1

    hit = a.wait_for(named, 90, "the poisoning peer named as an offender")
    detect_seconds = time.monotonic() - poisoned_at
    epoch_at_poison = hit.local_epoch

    stored = _publish_junk(addrs, a.run_id, hit.peer_id)
    a.wait_for(lambda s: s.rejected_records_total >= 3, 60, "the junk records to be rejected")

    # The honest nodes keep training while the offender is in the swarm...
    for node in (a, b):
        node.wait_for(lambda s, e=epoch_at_poison: s.local_epoch >= e + 3, 90, "three more epochs")
    # ... and exclude it: at once for NaN parts, on its third refused round for parts that are finite
    # but far too large (a judgement); its latest offence may also be its own state, NaN by now,
    # refused as a donor's.
    def excluded() -> bool:
        view = a.peers()
        offender = view.offender(bad_id) if view is not None else None
        return offender is not None and offender.excluded and offender.kind in (
            "nonfinite_part", "oversized_part", "bad_result", "bad_state")

    wait_until(excluded, 90, "the poisoning peer excluded", interval=1.0,
               detail=lambda: str(a.peers().offenders if a.peers() else None))
    during = {n.name: n.status() for n in (a, b, bad)}
    bad.kill()
    assert bad.wait(10) is not None
    # ... and make clean progress once it is gone (averaged rounds: until its record expires, b, which
    # may not have met it, counts it online, so b's rounds are partial).
    after_kill = {n.name: n.status() for n in (a, b)}
    for node in (a, b):
        node.wait_for(lambda s, n=node.name: s.rounds_averaged >= after_kill[n].rounds_averaged + 2,
                      90, "two clean rounds after the offender left")
    view = a.peers()
    assert view is not None
    names = {p.peer_id for p in view.peers}
    assert not any(name.startswith("junk-") for name in names), names
    impersonation_visible = any(p.epoch == 999_999 for p in view.peers)
    assert not impersonation_visible, view.peers
    rollbacks_late = {n.name: n.status().rollbacks_total - after_kill[n.name].rollbacks_total for n in (a, b)}
    # Its parts never reached the honest average: nothing to roll back.
    assert all(during[n].rollbacks_total == 0 for n in ("a", "b")), {n: during[n].rollbacks_total for n in "ab"}

    for node in (a, b):
        node.signal(signal.SIGTERM)
        assert node.wait(60) == 0, node.report()
        state = CheckpointStore(node.state_dir / "checkpoints", keep=100).load_latest()
        assert state is not None
        for key, tensor in state.state["model"].items():
            assert torch.isfinite(tensor).all(), f"{node.name}.{key} is not finite"
        assert bad_id in log_text(node)  # named in one line
    chaos_report.record(
        "6_bad_peers", seconds_to_name_the_poisoner=round(detect_seconds, 1),
        rollbacks_while_offender_present={k: s.rollbacks_total for k, s in during.items() if s is not None},
        rollbacks_after_offender_left=rollbacks_late, junk_records_stored=stored,
        rejected_records_total={k: s.rejected_records_total for k, s in during.items() if s is not None},
        impersonation_visible=impersonation_visible,
    )
