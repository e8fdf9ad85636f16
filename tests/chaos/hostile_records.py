"""Hostile DHT peers that only publish peer records.

* :func:`publish_junk` (scenario 6): forged and malformed records.  Usage:
  ``python -m tests.chaos.hostile_records RUN_ID VICTIM_PEER_ID ADDR...``; prints how many junk records
  it stored.  Run it as its own process so its DHT helpers end with it.
* :class:`CreditSybils`: a freeloader and a helper identity, each with a valid identity-bound record,
  that claim an epoch far ahead and a large number of samples contributed, and vouch for each other in
  their records' ``vouched`` figures; they never train or average.  Test-only.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import hivemind
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from p2ptrain.dhtkeys import peers_key
from p2ptrain.status import PeerRecord
from p2ptrain.swarm.identity import IdentityKey
from p2ptrain.swarm.recordcheck import binding_message
from p2ptrain.swarm.records import to_wire


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


class CreditSybils:
    """Two identities of one process publishing credit claims under ``run_id`` until :meth:`stop`.

    Every ``period`` seconds each stores a record bound to its identity (``fingerprint``: the model it
    says it trains) claiming ``epoch()`` and ``samples`` contributed, and vouching for the other with
    ``samples``.  ``peer_ids``: (freeloader, helper).
    """

    def __init__(self, addrs: list[str], run_id: str, *, epoch: Callable[[], int], samples: int,
                 fingerprint: str = "", period: float = 3.0) -> None:
        from tests.chaos.hostile_peer import ManyKeySigner, sybil_keys

        keys = sybil_keys(2)
        self._signer = ManyKeySigner(keys)
        self._subkeys = list(self._signer._keys)
        self._identities = [IdentityKey(key) for key in keys]
        self.peer_ids = tuple(identity.peer_id for identity in self._identities)
        self._run_id, self._epoch, self._samples, self._fingerprint = run_id, epoch, samples, fingerprint
        self._period, self._stopped = period, threading.Event()
        self.dht = hivemind.DHT(initial_peers=addrs, start=True, record_validators=[self._signer],
                                host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False)
        self._thread = threading.Thread(target=self._run, name="credit-sybils", daemon=True)
        self._thread.start()

    def _record(self, index: int) -> dict:
        identity, other = self._identities[index], self.peer_ids[1 - index]
        record = PeerRecord(peer_id=identity.peer_id, version="0.1.0", state="training", epoch=self._epoch(),
                            samples_per_second=20.0, loss=2.0, reachability="direct", uptime_seconds=600.0,
                            published_at=time.time(), samples_contributed=self._samples)
        value = {**to_wire(record), "vouched": [[other, self._samples]], "identity_key": identity.public_key,
                 "key_proof": identity.sign(binding_message(self._run_id, self._subkeys[index]))}
        return {**value, "model_fingerprint": self._fingerprint} if self._fingerprint else value

    def _run(self) -> None:
        while not self._stopped.is_set():
            for index in range(2):
                self.dht.store(peers_key(self._run_id), self._record(index), expiration_time=get_dht_time() + 20,
                               subkey=self._subkeys[index], return_future=True)
            self._stopped.wait(self._period)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)
        self.dht.shutdown()


if __name__ == "__main__":
    print(publish_junk(sys.argv[3:], sys.argv[1], sys.argv[2]))
