"""A real p2p daemon started the node's way serves its relay counters on 127.0.0.1, and the node reads them."""

from __future__ import annotations

import pytest

from p2ptrain.config.schema import SwarmSection
from p2ptrain.daemon.stopper import Stopper
from p2ptrain.proc import processes_matching
from p2ptrain.swarm.daemon_flags import free_loopback_port
from p2ptrain.swarm.dht import start_dht
from p2ptrain.swarm.relay_meter import RelayMeter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_the_daemon_runs_with_the_relay_budget_and_its_counters_are_read(tmp_path):
    cfg = SwarmSection(listen_addrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False,
                       relay_max_reservations=3, relay_max_circuits=2)
    port = free_loopback_port()
    dht = start_dht(cfg, tmp_path, [], [], Stopper(), metrics_port=port)
    try:
        daemons = processes_matching(lambda command: "p2pd" in command and f"-id={tmp_path}" in command)
        assert len(daemons) == 1, daemons
        command = next(iter(daemons.values())).split()
        assert {"-relayService=1", "-relayMaxReservations=3", "-relayMaxCircuits=2",
                f"-metricsAddr=127.0.0.1:{port}"} <= set(command), command
        figures = RelayMeter(port).figures()
        # Read, not guessed: AutoNAT is off on loopback, so libp2p keeps the service off and nothing is relayed.
        assert figures.active is False and figures.bytes_total == 0 and figures.reservations == 0, figures
    finally:
        dht.shutdown()
