"""sd_notify client against a test-owned datagram socket: messages, order, watchdog pacing."""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2ptrain.daemon.systemd import SystemdNotifier
from tests.support.clock import ManualClock


class NotifySocket:
    """What systemd would see: one datagram per notify call."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address

    def messages(self) -> list[str]:
        received: list[str] = []
        while True:
            try:
                received.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return received


@pytest.fixture()
def path_socket() -> Iterator[NotifySocket]:
    # AF_UNIX paths are limited to ~108 bytes, so not pytest's long tmp_path.
    directory = Path(tempfile.mkdtemp(prefix="p2pt-", dir="/tmp"))
    address = str(directory / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.setblocking(False)
    try:
        yield NotifySocket(sock, address)
    finally:
        sock.close()
        os.unlink(address)
        directory.rmdir()


@pytest.fixture()
def abstract_socket() -> Iterator[NotifySocket]:
    name = f"p2ptrain-test-{secrets.token_hex(6)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.setblocking(False)
    try:
        yield NotifySocket(sock, "@" + name)
    finally:
        sock.close()


def test_lifecycle_messages_arrive_in_order(path_socket: NotifySocket) -> None:
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path_socket.address})
    assert notifier.enabled
    assert notifier.status("joining swarm")
    assert notifier.extend_timeout(90)
    assert notifier.ready("training epoch=0 peers=1")
    assert notifier.status("training epoch=12 peers=3 2.5 samples/s")
    assert notifier.stopping("leaving swarm")
    notifier.close()
    assert path_socket.messages() == [
        "STATUS=joining swarm",
        "EXTEND_TIMEOUT_USEC=90000000",
        f"READY=1\nSTATUS=training epoch=0 peers=1\nMAINPID={os.getpid()}",
        "STATUS=training epoch=12 peers=3 2.5 samples/s",
        "STOPPING=1\nSTATUS=leaving swarm",
    ]


def test_abstract_socket_address(abstract_socket: NotifySocket) -> None:
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": abstract_socket.address})
    assert notifier.ready()
    assert notifier.reloading()
    assert notifier.stopping()
    assert abstract_socket.messages() == [f"READY=1\nMAINPID={os.getpid()}", "RELOADING=1", "STOPPING=1"]


def test_status_newlines_cannot_inject_assignments(path_socket: NotifySocket) -> None:
    notifier = SystemdNotifier(path_socket.address)
    notifier.status("line one\nREADY=1")
    assert path_socket.messages() == ["STATUS=line one READY=1"]


def test_without_notify_socket_everything_is_silent() -> None:
    notifier = SystemdNotifier.from_environ({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled
    assert not notifier.ready() and not notifier.status("x") and not notifier.stopping()
    pacer = notifier.watchdog_pacer(clock=ManualClock())
    assert not pacer.enabled and pacer.interval == 0.0
    assert not pacer.progress()


def test_unreachable_socket_warns_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    notifier = SystemdNotifier("/nonexistent/p2ptrain/notify")
    assert not notifier.ready()
    assert not notifier.status("still fine")
    warnings = [r for r in caplog.records if "cannot notify systemd" in r.getMessage()]
    assert len(warnings) == 1


def test_watchdog_pings_at_most_every_half_period(path_socket: NotifySocket) -> None:
    clock = ManualClock()
    notifier = SystemdNotifier.from_environ(
        {"NOTIFY_SOCKET": path_socket.address, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())})
    pacer = notifier.watchdog_pacer(clock=clock)
    assert pacer.enabled and pacer.interval == 5.0
    sent = []
    for _ in range(30):  # a step every second for 30 s
        sent.append(pacer.progress())
        clock.now += 1.0
    assert sent.count(True) == 6  # t = 0, 5, 10, 15, 20, 25
    assert [i for i, s in enumerate(sent) if s] == [0, 5, 10, 15, 20, 25]
    assert path_socket.messages() == ["WATCHDOG=1"] * 6


def test_watchdog_stops_when_progress_stops(path_socket: NotifySocket) -> None:
    clock = ManualClock()
    notifier = SystemdNotifier(path_socket.address, watchdog_usec=2_000_000)
    pacer = notifier.watchdog_pacer(clock=clock)
    pacer.progress()
    clock.now += 60  # a stuck step: nothing calls progress(), so nothing may be sent
    assert path_socket.messages() == ["WATCHDOG=1"]


def test_watchdog_for_another_pid_is_ignored(path_socket: NotifySocket) -> None:
    notifier = SystemdNotifier.from_environ(
        {"NOTIFY_SOCKET": path_socket.address, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}, pid=4242)
    assert notifier.watchdog_usec == 0
    assert not notifier.watchdog_pacer(clock=ManualClock()).progress()
    assert not notifier.watchdog()
    assert path_socket.messages() == []


def test_expect_delay_widens_then_restores_timeout(path_socket: NotifySocket) -> None:
    clock = ManualClock()
    pacer = SystemdNotifier(path_socket.address, watchdog_usec=4_000_000).watchdog_pacer(clock=clock)
    assert pacer.expect_delay(120)
    assert pacer.interval == 60.0
    clock.now += 1  # the long operation finished quickly: the very next step restores the timeout
    assert pacer.progress()
    assert pacer.interval == 2.0
    assert path_socket.messages() == [
        "WATCHDOG=1\nWATCHDOG_USEC=120000000",
        "WATCHDOG=1\nWATCHDOG_USEC=4000000",
    ]
