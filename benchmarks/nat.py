"""Volunteers behind NAT next to volunteers with a forwarded port: what the NAT costs the swarm.

``python -m benchmarks.nat`` builds the topology of ``tests/chaos/test_nat.py`` (a public node at
10.214.0.1 and two volunteers, each behind its own masquerading router; network namespaces made here
and deleted after) for two topologies, in ABBA order over ``--repeats`` pairs:

- ``forwarded``: each router forwards the swarm port to its volunteer, which announces the router's
  address (every peer can be dialled: the all-public swarm);
- ``nat``: no forwarded port and the default swarm settings: the volunteers find out that they cannot
  be dialled and average as clients, through the public node.

Each swarm trains for ``--seconds`` once all three train.  Reported per topology: the volunteers'
reachability, the swarm's samples per second (the three nodes' samples over the window), WAN bytes
per sequence (every byte the four WAN links sent over the window, protocol overhead included, per
sample trained) and the share of the volunteers' rounds that were full (all three peers).  Only the
ratio between the topologies, measured side by side, means anything on a shared machine.
``--rate`` shapes every WAN link (tbf).  Needs root (namespaces, iptables).  Writes ``nat.json``
and ``nat.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.netns import nat_network, nat_unavailable
from p2ptrain.local.swarm import LocalNode
from p2ptrain.status import StatusSnapshot

PORT = 41400
TOPOLOGIES = ("forwarded", "nat")
#: The chaos suite's tiny model, with rounds a few seconds apart.
TASK = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "validation_batches": 2}
TRAINING = {"target_batch_size": 1536, "batch_size": 8, "validate_every": 600.0, "matchmaking_time": 1.0,
            "averaging_timeout": 10.0, "load_state_timeout": 10.0, "warmup_epochs": 1}
#: Three nodes share two cores: each trains within 30% of the machine.
VOLUNTEER = {"max_cpu_percent": 30.0}


def _node(base: Path, name: str, run_id: str, netns: str, **swarm: object) -> LocalNode:
    overrides = {"task": TASK, "training": TRAINING, "volunteer": VOLUNTEER,
                 "swarm": {"listen_addrs": [f"/ip4/0.0.0.0/tcp/{PORT}"], **swarm}}
    node = LocalNode(name, base / name, run_id, overrides)
    node.netns = netns
    return node


def _statuses(nodes: list[LocalNode]) -> list[StatusSnapshot]:
    return [node.status(timeout=5.0) or StatusSnapshot() for node in nodes]


def run_topology(topology: str, seconds: float, rate: str | None, base: Path) -> dict[str, Any]:
    """One swarm of the topology, trained for ``seconds``; its figures."""
    forwarded = topology == "forwarded"
    run_id = f"nat-bench-{uuid.uuid4().hex[:8]}"
    with nat_network(volunteers=2, rate=rate, forward=PORT if forwarded else None) as net:
        public = _node(base, "public", run_id, net.public_ns, nat_port_map=False, auto_nat=False,
                       announce_addrs=[f"/ip4/{net.public_address}/tcp/{PORT}"])
        volunteers = []
        for i, home in enumerate(net.homes):
            announce = [f"/ip4/{net.router_addresses[i]}/tcp/{PORT}"] if forwarded else []
            volunteers.append(_node(base, f"home{i}", run_id, home, nat_port_map=False, announce_addrs=announce))
        nodes = [public, *volunteers]
        try:
            public.start()
            join = [addr for addr in public.join_addrs() if net.public_address in addr]
            for volunteer in volunteers:
                volunteer.start(join=join)
            for node in nodes:
                node.wait_for(lambda s: s.state == "training" and s.peers_online == 3, 180, "three peers training")
            first, wan_first, started = _statuses(nodes), net.wan_tx_bytes(), time.monotonic()
            time.sleep(seconds)
            last, wan_last, window = _statuses(nodes), net.wan_tx_bytes(), time.monotonic() - started
        finally:
            LocalNode.stop_all(nodes, timeout=20)
    samples = sum(b.samples_processed_total - a.samples_processed_total for a, b in zip(first, last, strict=True))
    full = rounds = 0
    for a, b in zip(first[1:], last[1:], strict=True):
        full += b.averaging_rounds_ok_total - a.averaging_rounds_ok_total
        rounds += sum(getattr(b, f) - getattr(a, f) for f in (
            "averaging_rounds_ok_total", "averaging_rounds_partial_total", "averaging_rounds_failed_total"))
    return {"topology": topology, "reachability": [s.reachability for s in last],
            "samples_per_second": samples / window, "wan_bytes_per_sequence": (wan_last - wan_first) / max(samples, 1),
            "volunteer_rounds": rounds, "volunteer_full_share": full / rounds if rounds else 0.0,
            "window_seconds": window}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per topology, and the NAT's ratio to the forwarded swarm."""
    rows = []
    for topology in TOPOLOGIES:
        mine = [run for run in runs if run["topology"] == topology]
        rows.append({"topology": topology, "runs": len(mine),
                     "reachability": mine[-1]["reachability"] if mine else [],
                     **{key: statistics.median(run[key] for run in mine) if mine else 0.0
                        for key in ("samples_per_second", "wan_bytes_per_sequence", "volunteer_full_share")}})
    forwarded = rows[0]
    for row in rows:
        row["samples_per_second_vs_forwarded"] = (row["samples_per_second"] / forwarded["samples_per_second"]
                                                  if forwarded["samples_per_second"] else 0.0)
    return rows


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"NAT benchmark: {args.repeats} pair(s), {args.seconds:.0f} s windows, WAN links "
             f"{args.rate or 'unshaped'}; medians",
             "",
             "| topology | reachability (public, home0, home1) | samples/s | vs forwarded | WAN bytes/sequence "
             "| volunteers' full rounds |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['topology']} | {', '.join(row['reachability'])} | {row['samples_per_second']:.0f} "
                     f"| {row['samples_per_second_vs_forwarded']:.2f} | {row['wan_bytes_per_sequence']:.0f} "
                     f"| {row['volunteer_full_share']:.0%} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="training window per swarm (default 60)")
    parser.add_argument("--repeats", type=int, default=1, help="ABBA pairs (default 1: forwarded, nat)")
    parser.add_argument("--rate", default=None, help="tbf rate of every WAN link, e.g. 20mbit (default: unshaped)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="where nat.json and nat.md go")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.repeats < 1:
        parser.error("--seconds must be positive and --repeats at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = nat_unavailable()
    if reason is not None:
        print(f"benchmarks.nat: cannot build the NAT topology here: {reason}", file=sys.stderr)
        return 69
    order = [TOPOLOGIES[(i + i // 2) % 2] for i in range(2 * args.repeats)]  # forwarded nat nat forwarded ...
    runs = []
    with tempfile.TemporaryDirectory(prefix="p2ptrain-nat-") as tmp:
        for i, topology in enumerate(order):
            print(f"[{i + 1}/{len(order)}] {topology} ...", flush=True)
            runs.append(run_topology(topology, args.seconds, args.rate, Path(tmp) / f"{i}-{topology}"))
            print(f"    {json.dumps({k: v for k, v in runs[-1].items() if k != 'topology'})}", flush=True)
    rows = summarise(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nat.json").write_text(json.dumps({"runs": runs, "summary": rows}, indent=2) + "\n", encoding="utf-8")
    table = markdown(rows, args)
    (args.out / "nat.md").write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
