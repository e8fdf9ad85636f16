"""A hostile DHT peer for scenario 6: joins a swarm and stores forged and malformed peer records.

Usage: ``python -m tests.chaos.hostile_records RUN_ID VICTIM_PEER_ID ADDR...``; prints how many junk
records it stored.  Test-only; run as its own process so its DHT helpers end with it.
"""

from __future__ import annotations

import sys
import time

import hivemind
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.dhtkeys import peers_key


def _good_fields(peer_id: str) -> dict:
    return {"peer_id": peer_id, "version": "0.1.0", "state": "training", "epoch": 1, "samples_per_second": 1.0,
            "loss": 1.0, "val_loss": None, "reachability": "direct", "uptime_seconds": 1.0, "pause_reason": "",
            "published_at": time.time()}


def publish_junk(addrs: list[str], run_id: str, victim_peer_id: str) -> int:
    """Join the swarm as a hostile DHT peer and store bad records under the run's peers key."""
    key = RSAPrivateKey()
    other_key = RSAPrivateKey()
    dht = hivemind.DHT(initial_peers=addrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True, nat_port_map=False,
                       auto_nat=False, record_validators=[RSASignatureValidator(key)])
    try:
        own = RSASignatureValidator(key).local_public_key
        stolen = RSASignatureValidator(other_key).local_public_key
        expiration = get_dht_time() + 60
        junk = [
            (own, {"peer_id": "junk-schema", "epoch": -5, "loss": "NaN"}),       # schema: negative epoch, wrong types
            (own + b"x", {**_good_fields("junk-badkey")}),                         # subkey is not a public key
            (stolen, {**_good_fields("junk-stolen-key")}),                         # someone else's key: cannot sign
            (own, {**_good_fields("junk-big"), "version": "v" * 4000}),            # oversized
            (b"not-a-key", "just a string"),                                        # not even a map
        ]
        stored = 0
        for subkey, value in junk:
            dht.store(peers_key(run_id), value, expiration_time=expiration, subkey=subkey)
            stored += 1
        # A well-formed record, signed by our own key, claiming to be the victim (impersonation).
        dht.store(peers_key(run_id), {**_good_fields(victim_peer_id), "epoch": 999_999}, expiration_time=expiration,
                  subkey=own)
        return stored
    finally:
        dht.shutdown()


if __name__ == "__main__":
    print(publish_junk(sys.argv[3:], sys.argv[1], sys.argv[2]))
