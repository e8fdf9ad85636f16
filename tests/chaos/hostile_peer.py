"""A hostile peer for the chaos suite: plain hivemind, its own key, the same run and model as its victims.

Usage::

    python -m tests.chaos.hostile_peer --config NODE.toml --join ADDR [--join ADDR...] ATTACK [options]

``--config`` is an honest node's config: the hostile builds the same model (so it speaks under the
same fingerprinted averaging keys) but never touches that node's state directory or identity.  Attacks:

* ``donor``       claims epoch ``--epoch`` (default 5000) in its progress and its donor priority, and
                  serves parameters that are all 0.0123 as its state (``--state nan``: NaN parameters,
                  ``--state short``: one tensor missing; ``--inner-step`` for DiLoCo's round position);
* ``freeze``      the same with epoch 2**40;
* ``fingerprint`` writes a forged, older model fingerprint entry for the run, again and again;
* ``scaled``      averages real gradients scaled by 100 with a weight of 10**6, every round it can join;
* ``nonfinite``   averages NaN gradients every round it can join;
* ``records``     floods ``--flood`` (default 5000) well-formed, signed records into the run's peer
                  records, and forges one in the name of ``--victim``.

It prints one line ``hostile <attack> ready as <peer id>`` once it is in place, then keeps attacking
until SIGTERM/SIGINT or ``--duration`` seconds.  In DiLoCo runs ``donor``/``freeze``/``scaled``/
``nonfinite`` act on the DiLoCo averager instead.  Test-only; run it as its own process.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import functools
import signal
import sys
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

from p2ptrain.config import NodeConfig, load_config
from p2ptrain.fingerprint import model_fingerprint
from p2ptrain.optim import ClippedAdamW, warmup_cosine
from p2ptrain.records import peers_key
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
        return f"{self.cfg.swarm.run_id}_{self.fingerprint}"

    @property
    def diloco(self) -> bool:
        return self.cfg.training.mode == "diloco"


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
    """What the victims' averagers use, so that matchmaking puts the hostile in their groups."""
    window = target.cfg.training.matchmaking_time
    return dict(min_matchmaking_time=window, request_timeout=min(3.0, window / 2), start=True)


# ---------------------------------------------------------------------------------------------- state


def claim_state(dht: hivemind.DHT, target: Target, epoch: int, stop: threading.Event, state: str = "constant",
                inner_step: int = 0) -> list[Any]:
    """Advertise ``epoch`` (progress and donor priority) and serve a bad state: constant parameters,
    NaN parameters, or one tensor short (``state``), with DiLoCo's ``inner_step`` as given."""
    fill = float("nan") if state == "nan" else CONSTANT
    params = [torch.nn.Parameter(torch.full_like(p, fill)) for p in target.model.parameters()]
    training = target.cfg.training
    common = _averager_options(target)

    def spoil(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return tensors[:-1] if state == "short" else tensors

    if target.diloco:
        tracker = ProgressTracker(dht, f"{target.averaging_run_id}_diloco", training.inner_steps * training.batch_size,
                                  start=True)
        served = spoil([p.detach().clone() for p in params] + [torch.zeros_like(p) for p in params])

        class Donor(_plain(hivemind.DecentralizedAverager, "_DiLoCoAverager")):  # type: ignore[misc]
            def get_current_state(self) -> Any:
                return dict(epoch=epoch, inner_step=inner_step), served, None

        averager = Donor([torch.zeros_like(p) for p in params], dht, prefix=f"{target.averaging_run_id}_diloco_avg",
                         **common)
    else:
        tracker = ProgressTracker(dht, target.averaging_run_id, training.target_batch_size, start=True)

        class StateDonor(_plain(TrainingStateAverager, "TrainingStateAverager")):  # type: ignore[misc]
            def get_current_state(self) -> Any:
                metadata, tensors, infos = super().get_current_state()
                return metadata, spoil(list(tensors)), spoil(list(infos))

        averager = StateDonor(
            dht=dht, prefix=f"{target.averaging_run_id}_state_averager", params=params,
            optimizer=lambda p: ClippedAdamW(p, lr=training.lr, max_grad_norm=training.max_grad_norm),
            scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(
                opt, warmup_cosine(training.warmup_epochs, training.total_epochs)),
            offload_optimizer=True, custom_gradients=True, **common)
        averager.local_epoch = epoch
    averager.state_sharing_priority = float(epoch)

    def keep_claiming() -> None:
        samples = 0
        while not stop.is_set():
            samples = samples % training.target_batch_size + training.batch_size  # looks busy, never done
            tracker.report_local_progress(epoch, samples)
            stop.wait(5.0)

    threading.Thread(target=keep_claiming, daemon=True).start()
    return [tracker, averager]


# ---------------------------------------------------------------------------------------------- averaging


def poison_rounds(dht: hivemind.DHT, target: Target, attack: str, stop: threading.Event) -> list[Any]:
    """Join every averaging round it can find, with gradients x100 (weight 10**6) or NaN."""
    training = target.cfg.training
    model = target.model
    batch = target.task.train_batches.next()
    target.task.loss_fn(model, batch).backward()
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone() for p in model.parameters()]
    evil = [g * 100 for g in grads] if attack == "scaled" else [torch.full_like(g, float("nan")) for g in grads]
    weight = 1e6 if attack == "scaled" else float(training.batch_size)
    common = _averager_options(target)
    if target.diloco:
        tracker = ProgressTracker(dht, f"{target.averaging_run_id}_diloco", training.inner_steps * training.batch_size,
                                  start=True)
        averager = _plain(hivemind.DecentralizedAverager, "_DiLoCoAverager")(
            [torch.zeros_like(p) for p in model.parameters()], dht, prefix=f"{target.averaging_run_id}_diloco_avg",
            **common)
    else:
        tracker = ProgressTracker(dht, target.averaging_run_id, training.target_batch_size, start=True)
        averager = _plain(GradientAverager, "GradientAverager")(
            list(model.parameters()), dht=dht, prefix=f"{target.averaging_run_id}_grad_averager", **common)

    def keep_averaging() -> None:
        rounds = 0
        while not stop.is_set():
            with averager.get_tensors() as tensors:
                for tensor, value in zip(tensors, evil, strict=True):
                    tensor.copy_(value)
            tracker.report_local_progress(tracker.global_epoch, training.batch_size)
            try:
                hivemind.DecentralizedAverager.step(averager, weight=weight, timeout=training.averaging_timeout)
                rounds += 1
                print(f"hostile joined averaging round {rounds}", flush=True)
            except Exception:  # no group this time: try again
                stop.wait(0.2)

    threading.Thread(target=keep_averaging, daemon=True).start()
    return [tracker, averager]


# ---------------------------------------------------------------------------------------------- DHT entries


def forge_fingerprint(dht: hivemind.DHT, target: Target, stop: threading.Event) -> list[Any]:
    forged = "f" * len(target.fingerprint)

    def keep_forging() -> None:
        while not stop.is_set():
            dht.store(f"{target.cfg.swarm.run_id}_model_fingerprint", subkey=forged, value=0.0,
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


async def _store_many(key: str, values: list[dict[str, Any]], subkeys: list[bytes], expiration: float,
                      _dht: hivemind.DHT, node: Any) -> int:
    """Runs inside the DHT's process (``DHT.run_coroutine``): one batched store of many subkeys."""
    stored = await node.store_many([key] * len(values), values, expiration, subkeys=subkeys)
    return sum(bool(ok) for ok in stored.values())


def forge_victim(dht: hivemind.DHT, target: Target, victim: str, subkey: bytes, stop: threading.Event) -> None:
    """Keep a forged record in ``victim``'s name newer than the victim's own (it republishes every 5 s)."""
    key = peers_key(target.cfg.swarm.run_id)
    while not stop.is_set():
        dht.store(key, _record(victim, 999_999, 1e9, time.time() + 55), expiration_time=get_dht_time() + 60,
                  subkey=subkey)
        stop.wait(4.0)


def flood_records(addrs: list[str], target: Target, count: int, victim: str) -> tuple[hivemind.DHT, int, bytes]:
    """``count`` signed records of made-up peers (the largest numbers the schema allows) and one forged
    record in ``victim``'s name; returns the DHT, how many stores the swarm accepted, and the record
    key kept for the victim's forgery."""
    keys = [rsa.generate_private_key(public_exponent=65537, key_size=1024) for _ in range(count + 1)]
    signer = ManyKeySigner(keys)
    dht = hivemind.DHT(initial_peers=addrs, start=True, record_validators=[signer], **_LOOPBACK)
    subkeys = list(signer._keys)
    # Published "now + 50 s" (inside the allowed clock skew), so the records stay fresh for a while;
    # the victim's forgery is also newer than the victim's own record, which a view keeping the
    # newest record per peer then shows instead.
    key, published = peers_key(target.cfg.swarm.run_id), time.time() + 50
    values = [_record(f"12D3KooWFake{i:05d}", 9_223_372_036_854_775_807, 1.7e308, published) for i in range(count)]
    if victim:
        values.append(_record(victim, 999_999, 1e9, published))
    expiration, stored = get_dht_time() + 300, 0
    step = 40  # hivemind's DHT pipe breaks on messages much over its 64 KiB buffer
    for start in range(0, len(values), step):
        batch = functools.partial(_store_many, key, values[start:start + step], subkeys[start:start + step], expiration)
        with contextlib.suppress(Exception):  # a batch that failed simply did not land
            stored += dht.run_coroutine(batch)
    return dht, stored, subkeys[count]


_LOOPBACK = dict(host_maddrs=["/ip4/127.0.0.1/tcp/0"], nat_port_map=False, auto_nat=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hostile_peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("attack", choices=ATTACKS)
    parser.add_argument("--config", type=Path, required=True, help="an honest node's config (run id, model)")
    parser.add_argument("--join", action="append", default=[], required=True)
    parser.add_argument("--epoch", type=int, default=5000)
    parser.add_argument("--state", choices=("constant", "nan", "short"), default="constant",
                        help="donor/freeze: the state served")
    parser.add_argument("--inner-step", type=int, default=0, help="donor/freeze in DiLoCo runs: the round position")
    parser.add_argument("--flood", type=int, default=5000)
    parser.add_argument("--victim", default="")
    parser.add_argument("--duration", type=float, default=3600.0)
    args = parser.parse_args(argv)
    target = load_target(args.config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    helpers: list[Any] = []
    if args.attack == "records":
        dht, accepted, victim_key = flood_records(args.join, target, args.flood, args.victim)
        print(f"hostile records stored {accepted}", flush=True)
        if args.victim:
            threading.Thread(target=forge_victim, args=(dht, target, args.victim, victim_key, stop),
                             daemon=True).start()
    else:
        dht = hivemind.DHT(initial_peers=args.join, start=True, **_LOOPBACK)
        if args.attack in ("donor", "freeze"):
            helpers = claim_state(dht, target, 2**40 if args.attack == "freeze" else args.epoch, stop, args.state,
                                  args.inner_step)
        elif args.attack == "fingerprint":
            helpers = forge_fingerprint(dht, target, stop)
        else:
            helpers = poison_rounds(dht, target, args.attack, stop)
    print(f"hostile {args.attack} ready as {dht.peer_id}", flush=True)
    stop.wait(args.duration)
    for helper in helpers:
        try:
            helper.shutdown()
        except Exception as exc:  # leaving is best effort; the process ends anyway
            print(f"hostile: shutdown of {type(helper).__name__}: {exc!r}", file=sys.stderr)
    dht.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
