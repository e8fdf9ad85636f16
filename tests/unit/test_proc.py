"""The /proc readers the leak checks and the benchmarks rely on."""

from __future__ import annotations

import os
import subprocess
import sys

from p2ptrain.proc import cpu_seconds, descendants, state_and_parent


def test_cpu_seconds_counts_work_done_and_is_zero_for_a_vanished_process() -> None:
    # The child says when its 0.3 s of work is done, then waits to be killed.
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                              "while time.process_time() < end: pass\nprint('done', flush=True)\ntime.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.pid in descendants()
        assert state_and_parent(child.pid)[1] == os.getpid()
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        assert cpu_seconds(child.pid) >= 0.25
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert cpu_seconds(child.pid) == 0.0 and state_and_parent(child.pid) is None
