"""The suite's own process bookkeeping: orphans that exit are reaped, a test's own children are not."""

from __future__ import annotations

import subprocess
import sys

from p2ptrain.waiting import wait_until
from tests.support.processes import SHARED, is_shared, reap_orphans, shared_processes, zombie_children


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


def test_a_shared_process_and_what_it_starts_later_are_not_a_test_s_leftovers():
    # The middle process starts its own child only when told, after the shared block has ended.
    script = ("import subprocess, sys\nsys.stdin.readline()\n"
              "child = subprocess.Popen(['sleep', '30'])\nprint(child.pid, flush=True)\nsys.stdin.readline()\n"
              "child.kill()\n")
    with shared_processes():
        middle = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
    own = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    try:
        assert middle.stdin is not None and middle.stdout is not None
        middle.stdin.write("go\n")
        middle.stdin.flush()
        later = int(middle.stdout.readline())
        assert is_shared(middle.pid) and is_shared(later)
        assert not is_shared(own.pid)
    finally:
        middle.communicate("done\n", timeout=10)
        own.kill()
        own.wait(10)
        SHARED.discard(middle.pid)
