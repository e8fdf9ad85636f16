"""Measure what reading a live node's API as hard as local clients can costs its training.

Not a test (a rate ratio on a shared machine is noise, not pass/fail; the mechanism that bounds the
cost, the API's one-second answer cache and per-client pacing, is tested in
``tests/unit/test_api_load.py`` and ``tests/integration/test_api_deadlines.py``).  Run it from the repository root:
``.venv/bin/python -m benchmarks.api_readers [--readers 8] [--pairs 3] [--seconds 7]``.

One tiny node trains on 127.0.0.1.  ``--readers`` threads pull /metrics, /api/v1/status and
/api/v1/peers back to back, ignoring Retry-After.  Quiet and busy phases alternate, so drift and
the neighbours' load hit both alike; the figure is the median training rate of the busy phases
over that of the quiet ones (target: at least 0.9).  Rates come from two snapshots' own counters
and timestamps, so a cached or delayed answer does not bend them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from p2ptrain.client.http import NodeClient, NodeError
from p2ptrain.local.swarm import LocalNode
from p2ptrain.status import StatusSnapshot
from p2ptrain.waiting import wait_until

TARGET = 0.9
SETTLE_SECONDS = 1.5  # a phase's first snapshot is taken after the readers have started or stopped
PATHS = ("/metrics", "/api/v1/status", "/api/v1/peers")
TINY_TASK = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32}


class BackToBackReaders:
    """Threads that read the API back to back until closed; counts the answers by HTTP status."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.stop = threading.Event()
        self.answers: dict[int, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _read(self) -> None:
        client = NodeClient(self.url, None, timeout=5.0)
        while not self.stop.is_set():
            for path in PATHS:
                try:
                    status = client.request("GET", path).status
                except NodeError:
                    status = 0
                with self.lock:
                    self.answers[status] = self.answers.get(status, 0) + 1

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def _snapshot(client: NodeClient) -> StatusSnapshot:
    """The node's status, retried while a busy phase's readers use up this machine's request budget."""

    def read() -> StatusSnapshot | None:
        try:
            return client.status()
        except NodeError:
            return None

    return wait_until(read, 15, "a status answer", interval=0.1)


def training_rate(client: NodeClient, seconds: float) -> float:
    """Samples per second between two snapshots ``seconds`` apart, by the snapshots' own clocks."""
    first = _snapshot(client)
    time.sleep(seconds)
    second = _snapshot(client)
    elapsed = second.taken_at - first.taken_at
    if elapsed <= seconds / 2:
        raise RuntimeError(f"snapshots only {elapsed:.1f}s apart: the node's status is not moving")
    return (second.samples_processed_total - first.samples_processed_total) / elapsed


def measure(workdir: Path, readers: int, pairs: int, seconds: float) -> dict[str, object]:
    node = LocalNode("a", workdir / "a", f"bench-{uuid.uuid4().hex[:8]}",
                     {"task": TINY_TASK, "checkpoint": {"interval": 3600.0}})
    node.start()
    try:
        node.wait_for(lambda s: s.state == "training" and s.samples_processed_total > 0, 90, "training steps")
        url = node.api_url()
        if url is None:
            raise RuntimeError("the node wrote no api.url")
        client = NodeClient(url, None, timeout=5.0)
        time.sleep(3.0)  # past the first steps' warm-up
        quiet: list[float] = []
        busy: list[float] = []
        answers: dict[int, int] = {}
        for _ in range(pairs):
            time.sleep(SETTLE_SECONDS)
            quiet.append(training_rate(client, seconds))
            phase = BackToBackReaders(url, readers)
            try:
                time.sleep(SETTLE_SECONDS)
                busy.append(training_rate(client, seconds))
            finally:
                phase.close()
            for status, count in phase.answers.items():
                answers[status] = answers.get(status, 0) + count
    finally:
        LocalNode.stop_all([node])
    ratio = statistics.median(busy) / statistics.median(quiet) if statistics.median(quiet) > 0 else float("nan")
    return {"readers": readers, "quiet": quiet, "busy": busy, "ratio": ratio, "answers": answers}


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.api_readers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=3, help="quiet/busy phase pairs")
    parser.add_argument("--seconds", type=float, default=7.0, help="length of one measuring window")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="p2ptrain-readers-") as tmp:
        result = measure(Path(tmp), args.readers, args.pairs, args.seconds)
    ratio = result["ratio"]
    print(f"training rate with {args.readers} busy readers vs without: {ratio:.3f} of quiet "
          f"({'met' if ratio >= TARGET else 'MISSED'}: target >= {TARGET})")
    print(f"  quiet {[round(r, 1) for r in result['quiet']]} samples/s, busy {[round(r, 1) for r in result['busy']]}")
    print(f"  reader answers by HTTP status: {dict(sorted(result['answers'].items()))}")


if __name__ == "__main__":
    main()
