"""Count a node's DHT operations by key: what its DHT process asks for and what it answers.

Installed at interpreter start (``benchmarks.startup``), :func:`install` wraps hivemind 1.1.12's
``DHTNode.get_many`` and ``store_many`` (this node's own reads and writes, counted per key) and
``DHTProtocol.rpc_find`` and ``rpc_store`` (requests it answers for other peers, counted per key
asked for).  Every process of the node (the DHT process does the work) writes its counts to
``<out>/<pid>.json`` at most every :data:`WRITE_EVERY` seconds; :func:`read_counts` sums them.

Keys are named by their kind: the run id, the model fingerprint and a group's bits are masked, so a
kind reads ``peers``, ``progress``, ``grad_averager.<group>``, ``state_averager.all_averagers``.
Answers count the requests, not the keys in them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

WRITE_EVERY = 2.0
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}_")
_GROUP = re.compile(r"\.0b[01]*$")


def key_kind(key: Any, run_id: str) -> str:
    text = str(key)
    if run_id and text.startswith(run_id + "_"):
        text = text[len(run_id) + 1:]
    return _GROUP.sub(".<group>", _FINGERPRINT.sub("", text))[:64]


def read_counts(out: Path) -> collections.Counter[str]:
    """The counts of every process written so far, summed."""
    total: collections.Counter[str] = collections.Counter()
    for path in out.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            total.update(json.loads(path.read_text(encoding="utf-8")))
    return total


def install(out: str, run_id: str) -> None:
    """Wrap hivemind's DHT so that this process counts its operations into ``out``."""
    from hivemind.dht import node as dht_node
    from hivemind.dht import protocol

    counts: collections.Counter[str] = collections.Counter()
    written = [0.0]

    def count(name: str) -> None:
        counts[name] += 1
        now = time.monotonic()
        if now - written[0] >= WRITE_EVERY:
            written[0] = now
            with contextlib.suppress(OSError):
                Path(out, f"{os.getpid()}.json").write_text(json.dumps(counts), encoding="utf-8")

    def own(kind: str, original: Any) -> Any:
        @functools.wraps(original)
        async def wrapped(self: Any, keys: Any, *args: Any, **kwargs: Any) -> Any:
            for key in keys:
                count(f"{kind} {key_kind(key, run_id)}")
            return await original(self, keys, *args, **kwargs)
        return wrapped

    def answered(kind: str, original: Any) -> Any:
        @functools.wraps(original)  # hivemind finds its handlers' request types by their annotations
        async def wrapped(self: Any, request: Any, context: Any) -> Any:
            count(f"answered {kind}")
            return await original(self, request, context)
        return wrapped

    dht_node.DHTNode.get_many = own("get", dht_node.DHTNode.get_many)
    dht_node.DHTNode.store_many = own("store", dht_node.DHTNode.store_many)
    protocol.DHTProtocol.rpc_find = answered("find", protocol.DHTProtocol.rpc_find)
    protocol.DHTProtocol.rpc_store = answered("store", protocol.DHTProtocol.rpc_store)
