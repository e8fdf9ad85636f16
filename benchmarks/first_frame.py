"""Measure how long ``p2ptrain top`` takes to show its first frame in a real terminal (tmux).

Not a test (timings on shared machines are noise, not pass/fail); run it by hand from the
repository root: ``.venv/bin/python -m benchmarks.first_frame [runs]``.  It starts the TUI tests'
fake node on loopback,
launches ``python -m p2ptrain.cli top`` in a private tmux server, and polls the screen.
"""

from __future__ import annotations

import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p2ptrain.waiting import WaitTimeout, wait_until
from tests.tui.fakenode import FakeNode


def one_run(url: str, socket: Path) -> tuple[float, float]:
    tmux = [shutil.which("tmux") or "tmux", "-S", str(socket)]
    command = shlex.join([sys.executable, "-m", "p2ptrain.cli", "top", "--url", url])
    start = time.perf_counter()
    subprocess.run([*tmux, "new-session", "-d", "-s", "m", "-x", "120", "-y", "40",
                    f"env TERM=xterm-256color {command}"], check=True)
    first = 0.0

    def data_on_screen() -> float:
        nonlocal first
        screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", "m"], capture_output=True,
                                text=True).stdout
        now = time.perf_counter() - start
        if not first and "Node" in screen and "Swarm" in screen:
            first = now
        return now if "TRAINING" in screen else 0.0

    try:
        data = wait_until(data_on_screen, 20, "data frame", interval=0.005, clock=time.perf_counter)
    except WaitTimeout:
        data = float("nan")
    subprocess.run([*tmux, "kill-server"], capture_output=True)
    return first, data


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    node = FakeNode().start()
    try:
        results = []
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            for i in range(runs):
                results.append(one_run(node.url, Path(tmp) / f"s{i}"))
    finally:
        node.stop()
    firsts, datas = [r[0] for r in results], [r[1] for r in results]
    print(f"first frame:      median {statistics.median(firsts):.3f}s  max {max(firsts):.3f}s  ({runs} runs)")
    print(f"first data frame: median {statistics.median(datas):.3f}s  max {max(datas):.3f}s")


if __name__ == "__main__":
    main()
