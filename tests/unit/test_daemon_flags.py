"""p2pd's flags beyond what hivemind passes: appended while a DHT starts, hivemind's method put back after,
and every one of them known to the p2pd that hivemind bundles."""

from __future__ import annotations

import os
import re
import subprocess

import hivemind
from hivemind.p2p.p2p_daemon import P2P

from p2ptrain.config.schema import SwarmSection
from p2ptrain.swarm.daemon_flags import extra_daemon_flags, free_loopback_port, relay_flags


def test_the_relay_budget_and_metrics_address_are_appended_only_while_inside():
    flags = relay_flags(SwarmSection(relay_max_reservations=8, relay_max_circuits=2), 4321)
    before = P2P._make_process_args("p2pd", relay=True, natPortMap=False)
    with extra_daemon_flags(flags):
        inside = P2P._make_process_args("p2pd", relay=True, natPortMap=False)
    assert inside == [*before, "-relayService=1", "-relayMaxReservations=8", "-relayMaxCircuits=2",
                      "-metricsAddr=127.0.0.1:4321"]
    assert P2P._make_process_args("p2pd", relay=True, natPortMap=False) == before


def test_no_relay_service_without_relays_and_no_metrics_address_without_a_port():
    assert relay_flags(SwarmSection(use_relay=False), None)["relayService"] is False
    assert relay_flags(SwarmSection(relay_service=False), None)["relayService"] is False
    assert "metricsAddr" not in relay_flags(SwarmSection(), None)


def test_hivemind_s_method_is_back_even_when_the_start_fails():
    original = P2P.__dict__["_make_process_args"]
    try:
        with extra_daemon_flags({"relayService": False}):
            raise RuntimeError("the DHT did not start")
    except RuntimeError:
        pass
    assert P2P.__dict__["_make_process_args"] is original


def test_the_bundled_p2pd_knows_every_flag_we_add():
    daemon = os.path.join(os.path.dirname(hivemind.__file__), "hivemind_cli", "p2pd")
    usage = subprocess.run([daemon, "-h"], capture_output=True, text=True, timeout=30)
    known = set(re.findall(r"^\s+-(\w+)", usage.stdout + usage.stderr, flags=re.MULTILINE))
    assert set(relay_flags(SwarmSection(), 1)) <= known, sorted(set(relay_flags(SwarmSection(), 1)) - known)


def test_a_free_loopback_port_is_one_that_can_be_bound():
    import socket

    port = free_loopback_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
