"""A hostile peer for the chaos suite: plain hivemind, its own key, the same run and model as its victims.

Usage::

    python -m tests.chaos.hostile_peer --config NODE.toml --join ADDR [--join ADDR...] ATTACK [ATTACK...] [options]

``--config`` is an honest node's config: the hostile builds the same model (so it speaks under the
same fingerprinted averaging keys) but never touches that node's state directory or identity.  Attacks:

* ``donor``       claims epoch ``--epoch`` (default 5000) in its progress and serves parameters that are
                  all 0.0123 as its state (``--state nan``: NaN parameters, ``--state short``: one tensor
                  missing; ``--inner-step`` for DiLoCo's round position).  Its donor priority is the epoch,
                  or with ``--first-in-line`` one above the best honest peer's (read from their records),
                  and it publishes an identity-bound record of its own: honest nodes then try it first.
                  ``--ahead N`` claims, advertises and serves the best honest peer's epoch + N instead of
                  ``--epoch``: a plausible epoch, so that the state's other checks are what refuse it;
* ``freeze``      the same with epoch 2**40 (``--bound-record``: with an identity-bound record of its own,
                  so that its progress entries are its own lie, not an entry in anyone's name);
* ``fingerprint`` writes a forged, older model fingerprint entry for the run, again and again;
* ``scaled``      averages real gradients scaled by 100 with a weight of 10**6, every round it can join;
* ``nonfinite``   averages NaN gradients every round it can join;
* ``records``     floods ``--flood`` (default 5000) valid records of made-up peers, each bound to an
                  identity of its own (a Sybil crowd), claiming absurd but in-schema figures, and keeps a
                  forged record in the name of ``--victim`` newer than the victim's own.

Several attacks may run in one process (``donor`` and ``freeze`` exclude each other, as do ``scaled``
and ``nonfinite``).  It prints one line ``hostile <attacks> ready as <peer id>`` once they are in place,
then keeps attacking until SIGTERM/SIGINT or ``--duration`` seconds.  With ``--go-file PATH`` the
``scaled``/``nonfinite``/``records`` attacks are prepared (process, DHT, keys, records) and it says it is
ready, but they begin only once PATH exists: a test can start it while another attack is running.  In DiLoCo runs
``donor``/``freeze``/``scaled``/``nonfinite`` act on the DiLoCo averager instead.  Test-only; a process
of its own (the suite forks it from the test process's fork server, which has imported what it imports).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import functools
import itertools
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import hivemind
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.validation import DHTRecord
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.progress_tracker import ProgressTracker
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPublicKey

from p2ptrain import dhtkeys
from p2ptrain.config.schema import NodeConfig, load_config
from p2ptrain.dhtkeys import peers_key
from p2ptrain.model.fingerprint import model_fingerprint
from p2ptrain.optim.inner import ClippedAdamW, warmup_cosine
from p2ptrain.swarm.identity import IdentityKey
from p2ptrain.swarm.recordcheck import binding_message
from p2ptrain.tasks.loader import build_task

ATTACKS = ("donor", "freeze", "fingerprint", "scaled", "nonfinite", "records")
CONSTANT = 0.0123
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


@dataclasses.dataclass
class Target:
    """What the victims train: their run, model, and the keys their averagers use."""

    cfg: NodeConfig
    model: torch.nn.Module
    task: Any
    fingerprint: str

    @property
    def averaging_run_id(self) -> str:
        return dhtkeys.averaging_prefix(self.cfg.swarm.run_id, self.fingerprint)

    @property
    def diloco(self) -> bool:
        return self.cfg.training.mode == "diloco"

    @property
    def diloco_run_id(self) -> str:
        """Where the victims' DiLoCo clock and averager live: their outer step's wire format is part of it."""
        training = self.cfg.training
        return dhtkeys.diloco_outer_prefix(self.averaging_run_id, training.outer_compression,
                                           training.outer_value_bits, training.outer_topk_density)


def load_target(config_path: Path) -> Target:
    cfg = load_config(config_path, environ={})
    task = build_task(cfg.task, cfg.training, peer_seed=987654321)
    return Target(cfg, task.model, task, model_fingerprint(task.model, task.shape_config))


def _plain(cls: type, wire_name: str) -> type:
    """A plain hivemind class speaking under ``wire_name`` (the name the victims' RPCs use)."""

    def handle(klass: type, namespace: str | None, method_name: str) -> str:
        name = f"{wire_name}.{method_name}"
        return name if namespace is None else f"{namespace}::{name}"

    return type(f"Hostile{wire_name}", (cls,), {"_get_handle_name": classmethod(handle), "_rpc_handlers": None})


def _averager_options(target: Target) -> dict[str, Any]:
    """What the victims' averagers use, so that matchmaking puts the hostile in their groups, and the
    timeouts hivemind's optimizer gives them: without these, a round whose reducers refuse the hostile's
    parts could keep its step waiting for their answers for good, and the attack would stop there."""
    training = target.cfg.training
    window = training.matchmaking_time
    return dict(min_matchmaking_time=window, request_timeout=min(3.0, window / 2), next_chunk_timeout=window,
                allreduce_timeout=training.averaging_timeout, start=True)


# ---------------------------------------------------------------------------------------------- state


def claim_state(dht: hivemind.DHT, target: Target, epoch: int, stop: threading.Event, state: str = "constant",
                inner_step: int = 0, first_in_line: bool = False, identity: IdentityKey | None = None,
                ahead: int | None = None) -> list[Any]:
    """Advertise ``epoch`` in progress and serve a bad state: constant parameters, NaN parameters, or one
    tensor short (``state``), with DiLoCo's ``inner_step`` as given.  ``first_in_line``: a donor priority
    just above the best honest peer's.  ``identity``: an identity-bound record of its own.  ``ahead``:
    claim, advertise and serve the best honest peer's epoch + ``ahead`` instead of ``epoch``."""
    claimed = [epoch]  # what it claims and serves now (``ahead`` moves it along with the run)
    fill = float("nan") if state == "nan" else CONSTANT
    params = [torch.nn.Parameter(torch.full_like(p, fill)) for p in target.model.parameters()]
    training = target.cfg.training
    common = _averager_options(target)

    def spoil(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return tensors[:-1] if state == "short" else tensors

    if target.diloco:
        tracker = ProgressTracker(dht, dhtkeys.diloco_clock_prefix(target.diloco_run_id),
                                  training.inner_steps * training.batch_size, start=True)
        served = spoil([p.detach().clone() for p in params] + [torch.zeros_like(p) for p in params])

        class Donor(_plain(hivemind.DecentralizedAverager, "_DiLoCoAverager")):  # type: ignore[misc]
            def get_current_state(self) -> Any:
                return dict(epoch=claimed[0], inner_step=inner_step), served, None

        averager = Donor([torch.zeros_like(p) for p in params], dht,
                         prefix=dhtkeys.diloco_averager_prefix(target.diloco_run_id), **common)
    else:
        tracker = ProgressTracker(dht, target.averaging_run_id, training.target_batch_size, start=True)

        class StateDonor(_plain(TrainingStateAverager, "TrainingStateAverager")):  # type: ignore[misc]
            def get_current_state(self) -> Any:
                metadata, tensors, infos = super().get_current_state()
                return metadata, spoil(list(tensors)), spoil(list(infos))

        averager = StateDonor(
            dht=dht, prefix=dhtkeys.state_averager_prefix(target.averaging_run_id), params=params,
            optimizer=lambda p: ClippedAdamW(p, lr=training.lr, max_grad_norm=training.max_grad_norm),
            scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(
                opt, warmup_cosine(training.warmup_epochs, training.total_epochs)),
            offload_optimizer=True, custom_gradients=True, **common)
        averager.local_epoch = epoch
    averager.state_sharing_priority = float(epoch)
    record_key = RSASignatureValidator().local_public_key  # the key its progress entries are written with

    def keep_claiming() -> None:
        samples = 0
        while not stop.is_set():
            samples = samples % training.target_batch_size + training.batch_size  # looks busy, never done
            best = max(honest_epochs(dht, target, own=claimed[0]), default=0)
            if ahead is not None:
                claimed[0] = best + ahead
                if not target.diloco:
                    averager.local_epoch = claimed[0]
            tracker.report_local_progress(claimed[0], samples)
            if first_in_line or ahead is not None:
                averager.state_sharing_priority = float(claimed[0] if ahead is not None else best + 1)
            if identity is not None:
                publish_own_record(dht, target, identity, record_key, best + 1)
            stop.wait(2.0)

    threading.Thread(target=keep_claiming, daemon=True).start()
    return [tracker, averager]


def honest_epochs(dht: hivemind.DHT, target: Target, own: int | None = None) -> list[int]:
    """The epochs the run's progress entries report (what an honest donor's priority would be): all but
    ``own`` (this hostile's claim) and those beyond the first gap of over 1,000 epochs (other hostiles'
    claims: honest peers of these runs are within a few hundred epochs of each other)."""
    tracker = dhtkeys.diloco_clock_prefix(target.diloco_run_id) if target.diloco else target.averaging_run_id
    key = dhtkeys.progress_key(tracker)
    found = dht.get(key, latest=True)
    entries = found.value if found is not None and isinstance(found.value, dict) else {}
    epochs = []
    for item in list(entries.values())[:300]:
        value = getattr(item, "value", None)
        if isinstance(value, dict) and isinstance(value.get("epoch"), int) and value["epoch"] < 10**6:
            epochs.append(value["epoch"])
    ordered = sorted(e for e in epochs if e != own)
    for index in range(1, len(ordered)):
        if ordered[index] - ordered[index - 1] > 1000:
            return ordered[:index]
    return ordered


def publish_own_record(dht: hivemind.DHT, target: Target, identity: IdentityKey, record_key: bytes,
                       epoch: int) -> None:
    """A valid record bound to the hostile's own identity: it looks like any training peer."""
    value = {**_record(identity.peer_id, epoch, 50.0, time.time()), "model_fingerprint": target.fingerprint,
             "identity_key": identity.public_key,
             "key_proof": identity.sign(binding_message(target.cfg.swarm.run_id, record_key))}
    dht.store(peers_key(target.cfg.swarm.run_id), value, expiration_time=get_dht_time() + 20, subkey=record_key,
              return_future=True)


# ---------------------------------------------------------------------------------------------- averaging


def poison_rounds(dht: hivemind.DHT, target: Target, attack: str, stop: threading.Event,
                  go: threading.Event | None = None) -> list[Any]:
    """Join every averaging round it can find, with gradients x100 (weight 10**6) or NaN (once ``go``)."""
    training = target.cfg.training
    model = target.model
    batch = target.task.train_batches.next()
    target.task.loss_fn(model, batch).backward()
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone() for p in model.parameters()]
    evil = [g * 100 for g in grads] if attack == "scaled" else [torch.full_like(g, float("nan")) for g in grads]
    weight = 1e6 if attack == "scaled" else float(training.batch_size)
    common = _averager_options(target)
    if target.diloco:
        tracker = ProgressTracker(dht, dhtkeys.diloco_clock_prefix(target.diloco_run_id),
                                  training.inner_steps * training.batch_size, start=True)
        averager = _plain(hivemind.DecentralizedAverager, "_DiLoCoAverager")(
            [torch.zeros_like(p) for p in model.parameters()], dht,
            prefix=dhtkeys.diloco_averager_prefix(target.diloco_run_id), **common)
    else:
        tracker = ProgressTracker(dht, target.averaging_run_id, training.target_batch_size, start=True)
        averager = _plain(GradientAverager, "GradientAverager")(
            list(model.parameters()), dht=dht, prefix=dhtkeys.grad_averager_prefix(target.averaging_run_id), **common)

    def keep_averaging() -> None:
        rounds = missed = 0
        _wait_for(go, stop)
        while not stop.is_set():
            with averager.get_tensors() as tensors:
                for tensor, value in zip(tensors, evil, strict=True):
                    tensor.copy_(value)
            tracker.report_local_progress(tracker.global_epoch, training.batch_size)
            try:
                hivemind.DecentralizedAverager.step(averager, weight=weight, timeout=training.averaging_timeout)
                rounds += 1
                print(f"hostile joined averaging round {rounds}", flush=True)
            except Exception as exc:  # no group this time: try again
                missed += 1
                if missed in (1, 10) or missed % 50 == 0:
                    print(f"hostile missed averaging round {missed}: {exc!r}"[:200], flush=True)
                stop.wait(0.2)

    threading.Thread(target=keep_averaging, daemon=True).start()
    return [tracker, averager]


# ---------------------------------------------------------------------------------------------- DHT entries


def forge_fingerprint(dht: hivemind.DHT, target: Target, stop: threading.Event) -> list[Any]:
    forged = "f" * len(target.fingerprint)

    def keep_forging() -> None:
        while not stop.is_set():
            dht.store(dhtkeys.fingerprint_key(target.cfg.swarm.run_id), subkey=forged, value=0.0,
                      expiration_time=get_dht_time() + 600)
            stop.wait(10.0)

    threading.Thread(target=keep_forging, daemon=True).start()
    return []


class ManyKeySigner(RSASignatureValidator):
    """Signs records under any of many RSA keys (hivemind's validator signs under one)."""

    def __init__(self, keys: list[rsa.RSAPrivateKey]) -> None:
        super().__init__()
        self._keys = {self.PUBLIC_KEY_FORMAT.replace(b"_key_", RSAPublicKey(k.public_key()).to_bytes()): k
                      for k in keys}

    def sign_value(self, record: DHTRecord) -> bytes:
        found = self._PUBLIC_KEY_RE.search(record.subkey or b"")  # the subkey arrives msgpack-serialised
        key = self._keys.get(found.group(0)) if found else None
        if key is None:
            return super().sign_value(record)
        signature = base64.b64encode(key.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)), _PSS,
                                              hashes.SHA256()))
        return record.value + self.SIGNATURE_FORMAT.replace(b"_value_", signature)


def _record(peer_id: str, epoch: int, rate: float, published_at: float) -> dict[str, Any]:
    return {"peer_id": peer_id, "version": "0.1.0", "state": "training", "epoch": epoch, "samples_per_second": rate,
            "loss": 0.01, "val_loss": 0.01, "reachability": "direct", "uptime_seconds": 1.0, "pause_reason": "",
            "published_at": published_at}


_STAGED: list[tuple[dict[str, Any], bytes]] = []
"""Records handed to the DHT's process, waiting to be stored (it lives in that process)."""


async def _stage(values: list[dict[str, Any]], subkeys: list[bytes], _dht: hivemind.DHT, node: Any) -> int:
    """Runs inside the DHT's process: keep records for :func:`_store_staged` (the pipe into that process
    takes small messages only, a DHT store is fastest with many subkeys at once)."""
    _STAGED.extend(zip(values, subkeys, strict=True))
    return len(_STAGED)


async def _store_staged(key: str, expiration: float, batch: int, _dht: hivemind.DHT, node: Any) -> int:
    """Runs inside the DHT's process: store up to ``batch`` staged records in one go."""
    chunk = _STAGED[:batch]
    del _STAGED[:batch]
    if not chunk:
        return 0
    stored = await node.store_many([key] * len(chunk), [value for value, _ in chunk], expiration,
                                   subkeys=[subkey for _, subkey in chunk])
    return sum(bool(ok) for ok in stored.values())


def _wait_for(go: threading.Event | None, stop: threading.Event) -> None:
    while go is not None and not go.is_set() and not stop.is_set():
        go.wait(0.2)


def forge_victim(dht: hivemind.DHT, target: Target, victim: str, signer: Any, stop: threading.Event,
                 go: threading.Event | None = None) -> None:
    """Keep a forged record in ``victim``'s name newer than the victim's own (it republishes every 5 s):
    signed by a key of ours and bound to an identity of ours, which does not hash to the victim's ID."""
    key, forger = peers_key(target.cfg.swarm.run_id), signer.identities[-1]
    _wait_for(go, stop)
    while not stop.is_set():
        subkey = signer.subkeys[-1]
        value = {**_record(victim, 999_999, 1e6, time.time() + 55), "identity_key": forger.public_key,
                 "key_proof": forger.sign(binding_message(target.cfg.swarm.run_id, subkey))}
        dht.store(key, value, expiration_time=get_dht_time() + 60, subkey=subkey)
        stop.wait(4.0)


def sybil_keys(count: int) -> list[rsa.RSAPrivateKey]:
    """``count`` distinct RSA-1024 keys, fast: every pair of a small pool of primes is a modulus (the
    keys share factors, which matters to nobody here; generating 5000 keys one by one takes minutes)."""
    pool: list[int] = []
    while len(pool) * (len(pool) - 1) // 2 < count:
        numbers = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_numbers()
        pool += [numbers.p, numbers.q]
    keys = []
    for p, q in itertools.islice(itertools.combinations(pool, 2), count):
        d = pow(65537, -1, (p - 1) * (q - 1))
        numbers = rsa.RSAPrivateNumbers(p, q, d, d % (p - 1), d % (q - 1), pow(q, -1, p),
                                        rsa.RSAPublicNumbers(65537, p * q))
        keys.append(numbers.private_key(unsafe_skip_rsa_key_validation=True))
    return keys


def flood_records(addrs: list[str], target: Target, count: int, victim: str, stop: threading.Event,
                  go: threading.Event | None = None) -> tuple[hivemind.DHT, Any, threading.Event]:
    """``count`` valid records of made-up peers, each signed with a record key of its own and bound to an
    identity of its own (the largest figures the schema allows), and one key kept for a forgery in
    ``victim``'s name.  They are stored in the background once ``go`` is set (at once without one);
    returns the DHT, the signer, and an event set once all are stored.  It prints
    ``hostile records stored N`` as it goes."""
    keys = sybil_keys(count + 1)
    signer = ManyKeySigner(keys)
    signer.subkeys = list(signer._keys)
    signer.identities = [IdentityKey(key) for key in keys]
    dht = hivemind.DHT(initial_peers=addrs, start=True, record_validators=[signer], **_LOOPBACK)
    run_id = target.cfg.swarm.run_id
    # Published "now + 50 s" (inside the allowed clock skew), so the records stay fresh for a while.
    key, published = peers_key(run_id), time.time() + 50
    values = []
    for identity, subkey in zip(signer.identities[:count], signer.subkeys[:count], strict=True):
        values.append({**_record(identity.peer_id, 999_999_999, 9.9e6, published), "identity_key": identity.public_key,
                       "key_proof": identity.sign(binding_message(run_id, subkey))})
    expiration, stored, done = get_dht_time() + 300, [0], threading.Event()
    step, batch = 16, 500  # the pipe into the DHT process breaks on messages of more than ~20 KiB under load

    def store(begin: int, end: int) -> None:
        for start in range(begin, end, step):
            dht.run_coroutine(functools.partial(_stage, values[start:min(start + step, end)],
                                                signer.subkeys[start:min(start + step, end)]))
        for _ in range(begin, end, batch):
            if stop.is_set():
                return
            with contextlib.suppress(Exception):  # a batch that failed simply did not land
                stored[0] += dht.run_coroutine(functools.partial(_store_staged, key, expiration, batch))
            print(f"hostile records stored {stored[0]}", flush=True)

    def rest() -> None:
        _wait_for(go, stop)
        first = min(count, 300)  # more than a view holds, first
        store(0, first)
        print(f"hostile records stored {stored[0]}", flush=True)
        store(first, count)
        print(f"hostile records stored {stored[0]} (all)", flush=True)
        done.set()

    threading.Thread(target=rest, daemon=True).start()
    return dht, signer, done


_LOOPBACK = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hostile_peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("attacks", nargs="+", choices=ATTACKS, metavar="ATTACK")
    parser.add_argument("--config", type=Path, required=True, help="an honest node's config (run id, model)")
    parser.add_argument("--join", action="append", default=[], required=True)
    parser.add_argument("--epoch", type=int, default=5000)
    parser.add_argument("--state", choices=("constant", "nan", "short"), default="constant",
                        help="donor/freeze: the state served")
    parser.add_argument("--inner-step", type=int, default=0, help="donor/freeze in DiLoCo runs: the round position")
    parser.add_argument("--first-in-line", action="store_true",
                        help="donor: a plausible priority and a bound record of its own, so it is tried first")
    parser.add_argument("--ahead", type=int, default=None,
                        help="donor: claim, advertise and serve the best honest epoch + AHEAD instead of --epoch")
    parser.add_argument("--bound-record", action="store_true",
                        help="donor/freeze: an identity-bound record of its own (its progress is then its own lie)")
    parser.add_argument("--flood", type=int, default=5000)
    parser.add_argument("--victim", default="")
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--go-file", type=Path, default=None,
                        help="scaled/nonfinite/records: prepared at once, begun only once this file exists")
    args = parser.parse_args(argv)
    attacks = list(dict.fromkeys(args.attacks))
    if {"donor", "freeze"} <= set(attacks) or {"scaled", "nonfinite"} <= set(attacks):
        parser.error("donor/freeze and scaled/nonfinite each need a process of their own")
    target = load_target(args.config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    helpers: list[Any] = []
    dhts: list[hivemind.DHT] = []
    go = None
    if args.go_file is not None:
        go = threading.Event()

        def watch() -> None:
            while not stop.is_set() and not args.go_file.exists():
                stop.wait(0.2)
            go.set()

        threading.Thread(target=watch, daemon=True).start()
    if "records" in attacks:
        flood_dht, signer, _ = flood_records(args.join, target, args.flood, args.victim, stop, go)
        dhts.append(flood_dht)
        if args.victim:
            threading.Thread(target=forge_victim, args=(flood_dht, target, args.victim, signer, stop, go),
                             daemon=True).start()
    others = [attack for attack in attacks if attack != "records"]
    if others or not dhts:
        identity = None
        options: dict[str, Any] = {}
        if args.first_in_line or args.bound_record:  # an identity of its own, so that its record can be bound
            identity = IdentityKey.generate()
            path = Path(tempfile.mkdtemp(prefix="hostile-")) / "identity.key"
            identity.write(path)
            options["identity_path"] = str(path)
        dht = hivemind.DHT(initial_peers=args.join, start=True, **_LOOPBACK, **options)
        dhts.insert(0, dht)
        for attack in others:
            if attack in ("donor", "freeze"):
                helpers += claim_state(dht, target, 2**40 if attack == "freeze" else args.epoch, stop, args.state,
                                       args.inner_step, args.first_in_line, identity,
                                       args.ahead if attack == "donor" else None)
            elif attack == "fingerprint":
                helpers += forge_fingerprint(dht, target, stop)
            else:
                helpers += poison_rounds(dht, target, attack, stop, go)
    print(f"hostile {' '.join(attacks)} ready as {dhts[0].peer_id}", flush=True)
    stop.wait(args.duration)
    for helper in helpers:
        try:
            helper.shutdown()
        except Exception as exc:  # leaving is best effort; the process ends anyway
            print(f"hostile: shutdown of {type(helper).__name__}: {exc!r}", file=sys.stderr)
    for each in dhts:
        each.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
