"""The shaped and NAT topologies' namespace names: unique to their maker, and a killed run's are found."""

from __future__ import annotations

import os

from benchmarks.netns import stale_namespaces

#: A process ID no process has (above the kernel's largest, 2**22).
GONE = 2**22 + 7


def test_a_dead_makers_namespaces_and_those_named_before_the_process_id_are_stale():
    listing = "\n".join([
        f"p2pnat{GONE}x0-wan",
        f"p2pnat{GONE}x0-home1 (id: 4)",
        "p2pnat-wan",
        "p2pbench-br",
        f"p2pbench{os.getppid()}x3-br",
        "someone-elses-namespace",
        "p2pnatural",
    ])
    assert stale_namespaces(listing, os.getpid(), set()) == [
        f"p2pnat{GONE}x0-wan", f"p2pnat{GONE}x0-home1", "p2pnat-wan", "p2pbench-br"]


def test_this_process_keeps_its_live_topology_and_drops_a_finished_one_left_behind():
    pid = os.getpid()
    listing = f"p2pnat{pid}x1-wan\np2pnat{pid}x0-rtr0"
    assert stale_namespaces(listing, pid, {f"{pid}x1"}) == [f"p2pnat{pid}x0-rtr0"]
