"""The API under load, in-process on 127.0.0.1: the limits that need no clock, or a clock of the test's.

A burst of connections waits in the backlog; over a client's connection cap only ``/healthz`` is
served; answers are rendered at most once per snapshot and second; every loopback address shares
one request budget.  (What waits out real deadlines is in ``tests/integration/test_api_deadlines.py``.)
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from monitoring_fixtures import populated_status, populated_swarm
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from p2ptrain.waiting import wait_until
from tests.support.apiserver import make_server
from tests.support.clock import ManualClock
from tests.support.rawhttp import HEALTHZ, STATUS, exchange, flood, status_of, timed_healthz

pytestmark = [pytest.mark.timeout(120)]



def test_a_burst_of_connections_waits_in_the_backlog_not_dropped() -> None:
    api = make_server(max_connections=1024, max_client_connections=1024, client_rate=1e6, client_burst=10**6)
    try:
        codes = asyncio.run(flood(api.port, 300))
    finally:
        api.stop()
    assert codes.count(200) == 300, sorted(set(codes))


def test_over_the_per_client_cap_only_healthz_is_served() -> None:
    api = make_server(max_client_connections=4)
    hogs = [socket.create_connection(("127.0.0.1", api.port)) for _ in range(4)]
    try:
        wait_until(lambda: api.open_connections >= 4, 10, "the four connections taken", interval=0.01)
        refused = exchange(api.port, STATUS)
        assert status_of(refused) == 503 and b"too many open connections from 127.0.0.1" in refused
        assert b"Retry-After: 1" in refused
        assert timed_healthz(api.port)[0] == 200
    finally:
        for sock in hogs:
            sock.close()
        api.stop()


class CountingCollector:
    def __init__(self) -> None:
        self.collects = 0

    def collect(self):
        self.collects += 1
        yield GaugeMetricFamily("p2ptrain_test_collects", "collect() calls", value=self.collects)


def test_answers_are_rendered_at_most_once_per_snapshot_and_second() -> None:
    registry, counter, clock = CollectorRegistry(), CountingCollector(), ManualClock()
    registry.register(counter)
    api = make_server(registry=registry, monotonic=clock, client_rate=1e6, client_burst=10**6)
    try:
        for _ in range(25):
            assert status_of(exchange(api.port, b"GET /metrics HTTP/1.0\r\n\r\n")) == 200
            assert status_of(exchange(api.port, STATUS)) == 200
            assert status_of(exchange(api.port, b"GET /api/v1/peers HTTP/1.0\r\n\r\n")) == 200
        assert counter.collects == 1 and api.cache.renders == 3
        clock.now += 1.5  # older than a second: rendered again
        exchange(api.port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert counter.collects == 2
        # A newer snapshot is never hidden behind the cache.
        api.latest.publish(populated_status(time.time() + 1), populated_swarm())
        exchange(api.port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert counter.collects == 3
    finally:
        api.stop()


def test_loopback_in_any_spelling_is_one_client_other_addresses_their_own() -> None:
    from p2ptrain.daemon.httpserver import client_group

    assert {client_group(a) for a in ("127.0.0.1", "127.3.2.1", "127.255.255.254", "::1")} == {"loopback"}
    assert [client_group(a) for a in ("192.168.1.5", "fe80::1", "?")] == ["192.168.1.5", "fe80::1", "?"]


@pytest.mark.parametrize("payload", [STATUS, HEALTHZ], ids=["reads", "healthz"])
def test_every_loopback_address_shares_one_request_budget(payload: bytes) -> None:
    """A local program that connects from a new 127.x address for every request must not get a new
    budget each time: loopback is one client for the rate limits as for the connection cap.  The
    limiters' clock stands still: the budget is the burst of 2, however slowly the requests come."""
    rates = dict(client_rate=2.0, client_burst=2, health_rate=2.0, health_burst=2, max_queue_wait=0.0)
    api = make_server(monotonic=ManualClock(), **rates)
    try:
        spread = [status_of(exchange(api.port, payload, source=f"127.0.9.{i}")) for i in range(1, 21)]
        assert spread == [200, 200] + [429] * 18, spread
    finally:
        api.stop()
