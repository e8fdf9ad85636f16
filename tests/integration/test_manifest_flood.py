"""The reordered-manifest flood against real nodes on 127.0.0.1: copies of a signed manifest cannot
hide a newer version from a node that joins later.

A signed manifest with seven option keys has 5,040 orderings of them. Were each a valid file, an
attacker could store more entries of version 1 under the run's key than a reader looks at (and more
bytes than one DHT message carries), and every node that joined afterwards would miss version 2.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from typing import Any

import hivemind
import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils import get_dht_time

from p2ptrain.dhtkeys import manifest_key
from p2ptrain.local.run import create_local_run
from tests.integration.conftest import FAST_TRAINING, TINY_TASK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OPTIONS = {name: index for index, name in enumerate("abcdefg")}
COPIES = 2000  # more than the 1,024 entries a reader once looked at, and more than 2 MiB
BATCH = 100  # copies per store request: each request well under hivemind's message limit
LOOPBACK_DHT = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "nat_port_map": False, "auto_nat": False,
                "check_if_identity_free": False}


def _reordered_copies(raw: bytes, count: int) -> list[bytes]:
    """``count`` files that differ from ``raw`` only in the order of its option keys."""
    line = next(line for line in raw.split(b"\n") if line.startswith(b"options = "))
    copies = []
    for order in itertools.permutations(OPTIONS):
        text = b"options = { " + b", ".join(f"{k} = {OPTIONS[k]}".encode() for k in order) + b" }"
        if text != line:
            copies.append(raw.replace(line, text))
        if len(copies) == count:
            return copies
    raise AssertionError("not enough orderings")


def _entries(raw: bytes) -> list[tuple[str, bytes]]:
    """Each copy under the subkey it would have if its own bytes made it a new entry."""
    return [(f"1:{hashlib.sha256(copy).hexdigest()[:16]}", copy) for copy in _reordered_copies(raw, COPIES)]


async def _store_everywhere(targets: list[str], key: str, raw: bytes, expiration: float,
                            _dht: Any, node: Any) -> dict[str, list[bool]]:
    """In the attacker's DHT process (the copies are made there: the pipe to it takes small messages
    only): every copy in its own storage (it serves them to lookups) and sent straight to each target,
    in batches; what each target answered per copy."""
    from hivemind.p2p import PeerID

    key_id = DHTID.generate(source=key)
    entries = _entries(raw)
    values = [(subkey, node.protocol.serializer.dumps(raw)) for subkey, raw in entries]
    for subkey, value in values:
        node.protocol.storage.store_subkey(key_id, subkey, value, expiration)
    answers: dict[str, list[bool]] = {}
    for target in targets:
        answers[target] = []
        for start in range(0, len(values), BATCH):
            batch = values[start:start + BATCH]
            ok = await node.protocol.call_store(PeerID.from_base58(target), [key_id] * len(batch),
                                                [value for _, value in batch], expiration,
                                                subkeys=[subkey for subkey, _ in batch])
            answers[target] += list(ok) if ok is not None else [False] * len(batch)
    return answers


def test_reordered_copies_of_version_1_cannot_hide_version_2(make_node, tmp_path):
    run = create_local_run(tmp_path / "run", "floodrun", {"task": {**TINY_TASK, "options": OPTIONS},
                                                          "training": FAST_TRAINING}, fingerprint="none")
    owner = make_node("owner", owned=True, args=("--run", str(run.ref), "--manifest", str(run.manifest_path)))
    owner.start()
    join = owner.join_addrs()[:1]
    owner.wait_for(lambda s: s.manifest_version == 1, 60, "manifest version 1")

    raw = run.manifest.to_toml().encode()
    entries = _entries(raw)
    assert len(set(entries)) == COPIES and sum(len(copy) for _, copy in entries) > 2 * 1024 * 1024
    attacker = hivemind.DHT(start=True, initial_peers=join, **LOOPBACK_DHT)
    try:
        honest = owner.peer_id()
        answers = attacker.run_coroutine(functools.partial(
            _store_everywhere, [honest], manifest_key(run.ref.run_id), raw, get_dht_time() + 600), return_future=True
        ).result(timeout=120)
        assert len(answers[honest]) == COPIES and not any(answers[honest]), \
            f"{sum(answers[honest])} of {COPIES} reordered copies stored by an honest node"
        owner.wait_for(lambda s: s.run_entries_refused_total >= COPIES, 30, "every copy refused and counted")

        run.update(training={**run.manifest.training, "lr": 5e-4})  # the owner publishes version 2
        owner.wait_for(lambda s: s.manifest_version == 2, 60, "manifest version 2 at the owner")

        newcomer = make_node("newcomer", owned=True, args=("--run", str(run.ref)))
        newcomer.start(join=join)
        status = newcomer.wait_for(lambda s: s.manifest_version >= 1, 120, "a manifest at the newcomer")
        assert status.manifest_version == 2, f"the newcomer took version {status.manifest_version}"
        for node in (owner, newcomer):  # each caps the versions it holds
            assert "could not cap the manifest versions" not in node.log_path.read_text(), node.report()
    finally:
        attacker.shutdown()
