"""The relay figures read from the p2p daemon's own metrics page: parsed from what p2pd prints, bounded
in size, and counters that never go back when a read fails."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from p2ptrain.swarm.relay_meter import MAX_PAGE_BYTES, RelayFigures, RelayMeter, parse_relay_metrics, read_page

#: The relay service's part of a p2pd metrics page (its format as p2pd serves it), amid others' lines.
PAGE = """\
# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 30
# HELP libp2p_relaysvc_connection_duration_seconds Relay Connection Duration
# TYPE libp2p_relaysvc_connection_duration_seconds histogram
libp2p_relaysvc_connection_duration_seconds_bucket{le="0.005"} 0
libp2p_relaysvc_connection_duration_seconds_sum 12.5
libp2p_relaysvc_connection_duration_seconds_count 3
libp2p_relaysvc_connections_total{type="opened"} 5
libp2p_relaysvc_connections_total{type="closed"} 3
libp2p_relaysvc_connection_rejections_total{reason="no reservation"} 2
libp2p_relaysvc_data_transferred_bytes_total 7.340032e+06
libp2p_relaysvc_reservation_rejections_total{reason="resource limit exceeded"} 1
libp2p_relaysvc_reservations_total{type="opened"} 4
libp2p_relaysvc_reservations_total{type="renewed"} 9
libp2p_relaysvc_reservations_total{type="closed"} 1
libp2p_relaysvc_status 1
"""


def test_a_page_of_the_daemon_gives_what_it_relayed_and_holds():
    assert parse_relay_metrics(PAGE) == RelayFigures(active=True, bytes_total=7_340_032, reservations=3, circuits=2,
                                                     refused_total=3)


def test_a_daemon_with_the_service_off_or_no_page_at_all():
    assert parse_relay_metrics("libp2p_relaysvc_status 0\nlibp2p_relaysvc_data_transferred_bytes_total 0\n") == \
        RelayFigures(active=False)
    assert parse_relay_metrics("go_goroutines 3\n") == RelayFigures(active=None)  # not a libp2p page
    # A daemon started without relays (swarm.use_relay off) has none of the relay service's lines.
    assert parse_relay_metrics("go_goroutines 3\nlibp2p_identify_addrs_count 0\n") == RelayFigures(active=False)
    assert parse_relay_metrics("") == RelayFigures()


@pytest.mark.parametrize("line", [
    "libp2p_relaysvc_data_transferred_bytes_total NaN",
    "libp2p_relaysvc_data_transferred_bytes_total -5",
    "libp2p_relaysvc_data_transferred_bytes_total +Inf",
    "libp2p_relaysvc_data_transferred_bytes_total 1e300",
    "libp2p_relaysvc_data_transferred_bytes_total twelve",
    'libp2p_relaysvc_data_transferred_bytes_total{a="1",b="2"} 9',
    "libp2p_relaysvc_data_transferred_bytes_total",
])
def test_lines_that_are_not_counts_are_skipped(line):
    figures = parse_relay_metrics(f"libp2p_relaysvc_status 1\n{line}\n")
    assert figures == RelayFigures(active=True, bytes_total=0)


def test_more_closed_than_opened_reads_as_none_held():
    page = ('libp2p_relaysvc_status 1\nlibp2p_relaysvc_reservations_total{type="closed"} 4\n'
            'libp2p_relaysvc_connections_total{type="closed"} 1\n')
    assert parse_relay_metrics(page) == RelayFigures(active=True)


class _Pages:
    """A fake fetch: pages (or errors) in turn, counting the reads."""

    def __init__(self, *pages: str | Exception) -> None:
        self.pages, self.reads = list(pages), 0

    def __call__(self, port: int) -> str:
        self.reads += 1
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        return page


def test_the_meter_reads_at_most_every_period_and_keeps_its_counters_past_a_failed_read():
    now = [0.0]
    pages = _Pages(PAGE, ConnectionRefusedError("gone"), "libp2p_relaysvc_status 1\n"
                   "libp2p_relaysvc_data_transferred_bytes_total 8e6\n")
    meter = RelayMeter(4321, every=10.0, fetch=pages, clock=lambda: now[0])
    first = meter.figures()
    assert first.bytes_total == 7_340_032 and first.active is True
    now[0] = 9.0
    assert meter.figures() is first and pages.reads == 1
    now[0] = 10.0
    failed = meter.figures()
    assert failed.active is None and failed.bytes_total == 7_340_032 and failed.refused_total == 3
    assert failed.reservations == 3  # what was last read, not a fake zero
    now[0] = 20.0
    assert meter.figures() == RelayFigures(active=True, bytes_total=8_000_000, refused_total=3)


def test_a_meter_without_a_port_reads_nothing():
    pages = _Pages()
    assert RelayMeter(None, fetch=pages).figures() == RelayFigures() and pages.reads == 0


@pytest.fixture
def page_server() -> Iterator[tuple[int, list[bytes]]]:
    """An HTTP server on 127.0.0.1 that serves the bytes put in its list."""
    served: list[bytes] = [b""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(served[0])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], served
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_is_read_whole_up_to_its_bound_and_refused_beyond(page_server):
    port, served = page_server
    served[0] = PAGE.encode()
    assert parse_relay_metrics(read_page(port)).bytes_total == 7_340_032
    served[0] = b"#" * (MAX_PAGE_BYTES + 10)
    with pytest.raises(ValueError, match="over"):
        read_page(port)
    meter = RelayMeter(port)
    assert meter.figures() == RelayFigures()  # refused: unknown, nothing counted
