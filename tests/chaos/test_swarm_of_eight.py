"""Eight real nodes on this machine hold their rounds: the scale benchmark's swarm, kept short.

The nodes run the shipped round settings on the tiny model, each training within 4% of a core (the
benchmark's cap, so that the nodes' own helpers are what loads the machine), and the test reads the
rounds each node ended over a window once every node has averaged.  Eight is the largest swarm whose
rounds hold on two cores with room to spare (``python -m benchmarks.scale``: 100% full rounds at 4
and 8 nodes, the rest in docs/benchmarks.md); 16 saturate the machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scale import parse_args, run_swarm
from p2ptrain.local.forkserver import ForkServer

#: ``alone``: a share of full rounds, measured on a machine nothing else loads.
pytestmark = [pytest.mark.chaos, pytest.mark.alone, pytest.mark.timeout(300)]

NODES = 8
#: Of all rounds the nodes ended in the window, the share whose every part arrived.  Seven quiet runs
#: here: 100% or 97% in five, below 90% in two (67% in one: every node one partial round in three),
#: so the bar is a floor, half: it catches a swarm whose rounds break apart (0-33% of each node's
#: rounds at 16 nodes on this machine), not the wobble of a loaded two-core machine.
FULL_SHARE = 0.5


def test_eight_nodes_hold_most_of_their_rounds_and_their_replicas_agree(
        tmp_path: Path, node_forkserver: ForkServer) -> None:
    args = parse_args(["--nodes", str(NODES), "--seconds", "20", "--idle-seconds", "0", "--join-timeout", "150"])
    result = run_swarm(NODES, args, tmp_path, None, node_forkserver)
    rounds = {key: result[key] for key in ("averaged", "rounds_full", "rounds_partial", "rounds_failed",
                                           "full_share_worst", "full_share_median", "group_min", "group_median",
                                           "group_max", "param_spread_max", "processes_per_node")}
    assert result["averaged"] == NODES, rounds  # every node has averaged at least once
    ended = result["rounds_full"] + result["rounds_partial"] + result["rounds_failed"]
    assert ended >= NODES, rounds  # at least a round per node in the window
    assert result["rounds_full"] >= FULL_SHARE * ended, rounds
    assert result["full_share_worst"] > 0, rounds  # every node had a full round in the window
    assert result["group_max"] == NODES, rounds  # one swarm: some round held all eight
    assert result["param_spread_max"] is not None and result["param_spread_max"] < 0.05, rounds
    assert result["processes_per_node"] <= 5, rounds
