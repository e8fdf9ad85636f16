"""Reading a live node's API as hard as local clients can must cost its training a bounded share.

Eight reader threads pull /metrics, /api/v1/status and /api/v1/peers back to back, ignoring
Retry-After.  Quiet and busy phases alternate (so drift and the neighbours' load hit both alike);
the median training rate of the busy phases must be at least 0.9 of the quiet ones.  The rate
comes from two snapshots' own counters and timestamps, so a cached or delayed answer does not
bend it.
"""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from p2ptrain.nodeclient import NodeClient, NodeError
from p2ptrain.status import StatusSnapshot
from p2ptrain.waiting import wait_until
from tests.integration.conftest import TINY_TASK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

READERS = 8
PAIRS = 3
SETTLE_SECONDS = 1.5  # a phase's first snapshot is taken after the readers have started or stopped
MEASURE_SECONDS = 7.0
PATHS = ("/metrics", "/api/v1/status", "/api/v1/peers")


class Readers:
    """Threads that read the API back to back until stopped; counts what they got."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.answers: dict[int, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._read, daemon=True) for _ in range(READERS)]
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


def _training_rate(client: NodeClient) -> float:
    """Samples per second between two snapshots MEASURE_SECONDS apart, by the snapshots' own clocks."""
    first = _snapshot(client)
    time.sleep(MEASURE_SECONDS)
    second = _snapshot(client)
    elapsed = second.taken_at - first.taken_at
    assert elapsed > MEASURE_SECONDS / 2, (first.taken_at, second.taken_at)
    return (second.samples_processed_total - first.samples_processed_total) / elapsed


def test_busy_local_readers_cost_training_under_a_tenth(make_node):
    node = make_node("a", task=TINY_TASK, checkpoint={"interval": 3600.0})
    node.start()
    node.wait_for(lambda s: s.state == "training" and s.samples_processed_total > 0, 90, "training steps")
    url = node.api_url()
    assert url is not None
    client = NodeClient(url, None, timeout=5.0)
    time.sleep(3.0)  # past the first steps' warm-up

    quiet, busy, answers = [], [], {}
    for _ in range(PAIRS):
        time.sleep(SETTLE_SECONDS)
        quiet.append(_training_rate(client))
        readers = Readers(url)
        try:
            time.sleep(SETTLE_SECONDS)
            busy.append(_training_rate(client))
        finally:
            readers.close()
        for status, count in readers.answers.items():
            answers[status] = answers.get(status, 0) + count
    assert node.running, node.log_tail()

    quiet_rate, busy_rate = statistics.median(quiet), statistics.median(busy)
    figures = (f"median training rate {busy_rate:.1f} samples/s with {READERS} busy readers vs "
               f"{quiet_rate:.1f} without (busy {[round(r, 1) for r in busy]}, quiet {[round(r, 1) for r in quiet]}; "
               f"reader answers by status {dict(sorted(answers.items()))})")
    print(figures)
    assert quiet_rate > 0, figures
    assert sum(answers.values()) > READERS, f"the readers never got through: {figures}"
    assert busy_rate >= 0.9 * quiet_rate, figures
