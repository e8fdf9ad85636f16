"""``p2ptrain doctor`` against a real DHT peer on 127.0.0.1: the clock offset it measures through the
DHT's ping, the dial-back (a new connection to the probe's port), and a peer that does not answer."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import hivemind
import pytest

from p2ptrain.swarm.dialback import serve_dialback
from p2ptrain.swarm.probe import probe_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


@pytest.fixture(scope="module")
def peer() -> Iterator[str]:
    """A node of the swarm: it answers pings and dial-back checks."""
    dht = hivemind.DHT(host_maddrs=[LOOPBACK], start=True, nat_port_map=False, auto_nat=False)
    serve_dialback(dht)
    try:
        yield str(dht.get_visible_maddrs()[0])
    finally:
        dht.shutdown()


def _gone_peer() -> str:
    """The address of a peer that has left (its DHT shut down, its port closed)."""
    dht = hivemind.DHT(host_maddrs=[LOOPBACK], start=True, nat_port_map=False, auto_nat=False)
    address = str(dht.get_visible_maddrs()[0])
    dht.shutdown()
    return address


def _closed_port() -> int:
    """A loopback port nothing listens on (bound and closed again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_probe_measures_the_clock_and_is_dialled_back(peer: str) -> None:
    probe = probe_swarm([peer, _gone_peer()], [LOOPBACK], timeout=5.0)
    assert probe.error == ""
    live, gone = probe.answers
    assert live.offset is not None and abs(live.offset) < 1.0, live  # the same clock, half a round trip off
    assert live.dialled_back is True
    port = probe.listen[0].split("/")[4]
    assert (probe.dialback.dialable, probe.dialback.address) == (True, f"127.0.0.1:{port}")  # a new connection
    assert gone.offset is None and gone.error


def test_doctor_command_joins_a_peer_and_reports_json(peer: str, tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'[swarm]\nlisten_addrs = ["/ip4/127.0.0.1/tcp/{_closed_port()}"]\n')
    done = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "doctor", "-c", str(config), "--join", peer,
                           "--json", "--timeout", "10s"], capture_output=True, text=True, timeout=90)
    checks = {check["name"]: check for check in json.loads(done.stdout)["checks"]}
    assert checks["clock"]["status"] == "ok", checks["clock"]
    assert "against 1 peer" in checks["clock"]["found"]
    port = checks["port"]
    assert port["status"] == "ok" and "connected to it at 127.0.0.1:" in port["found"], port
    assert done.returncode == 0, done.stderr
