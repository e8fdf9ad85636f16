"""The suite's own process bookkeeping: orphans that exit are reaped, a test's own children are not."""

from __future__ import annotations

import subprocess
import sys

from p2ptrain.waiting import wait_until
from tests.support.processes import reap_orphans, zombie_children


def _wait_for_zombie(pid: int, timeout: float = 10.0) -> None:
    wait_until(lambda: pid in zombie_children(), timeout, f"zombie of pid {pid}", interval=0.05)


def test_orphan_zombie_is_reaped_but_popen_child_keeps_its_exit_code():
    # The middle process starts a grandchild and exits: the grandchild is re-parented to us (the
    # suite is a child subreaper), then exits and waits to be reaped.
    middle = subprocess.run(
        [sys.executable, "-c", "import subprocess; print(subprocess.Popen(['sleep', '0.2']).pid)"],
        capture_output=True, text=True, check=True)
    orphan = int(middle.stdout)
    own = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    _wait_for_zombie(orphan)
    _wait_for_zombie(own.pid)
    assert reap_orphans() >= 1
    assert orphan not in zombie_children()
    assert own.wait(5) == 7
