"""The /proc readers the leak checks and the benchmarks rely on."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from p2ptrain.proc import cpu_seconds, descendants, state_and_parent


def test_cpu_seconds_counts_work_done_and_is_zero_for_a_vanished_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                              "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        assert child.pid in descendants()
        assert state_and_parent(child.pid)[1] == os.getpid()
        for _ in range(100):  # bounded: 10 s at most
            if cpu_seconds(child.pid) >= 0.25:
                break
            time.sleep(0.1)
        assert cpu_seconds(child.pid) >= 0.25
    finally:
        child.kill()
        child.wait()
    assert cpu_seconds(child.pid) == 0.0 and state_and_parent(child.pid) is None
