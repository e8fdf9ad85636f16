"""Text corpora as byte tensors: loading, the train/validation split, and per-node sampling.

The default corpus is the ``.py`` files of this Python's standard library (no download, present
on every node), capped at :data:`STDLIB_MAX_BYTES` in sorted path order so it loads in well under
a second.  Nodes with different Python versions therefore see different corpora; set
``task.data_path`` for a real run (it is read whole into memory, without a cap; hidden files skipped).

Files are assigned to train or validation by a SHA-256 of their path relative to the corpus
root, so the split is identical on every node and independent of listing order or location.
Each node then walks its own seeded permutation of the training sequences
(:class:`ByteSequenceStream`), whose position is saved in checkpoints.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from p2ptrain.config import ConfigError

log = logging.getLogger(__name__)

STDLIB_MAX_BYTES = 8 * 1024 * 1024
"""Cap on the default corpus: files in sorted relative-path order, each taken while it still fits."""

_STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
_SINGLE_FILE_CHUNK = 16 * 1024
"""A single data file is split into chunks of (at most) this many bytes, keyed ``name#index``."""


@dataclass(frozen=True)
class Corpus:
    """Training and validation text as flat ``uint8`` tensors."""

    train: torch.Tensor
    validation: torch.Tensor
    source: str


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` via SHA-256: the same in every process (unlike ``hash()``)."""
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def is_validation(key: str, fraction: float) -> bool:
    """Whether the unit named ``key`` (a relative path) is held out for validation."""
    score = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return score < fraction


def split_units(units: Iterable[tuple[str, bytes]], fraction: float) -> tuple[bytes, bytes]:
    """Concatenate ``(key, text)`` units into (train, validation) bytes, in sorted key order.

    When the hash puts every unit on one side, the unit with the lowest (highest) score moves
    to validation (train) so both sides have data; still deterministic.
    """
    ordered = sorted(unit for unit in units if unit[1])  # empty files (__init__.py) cannot balance a side
    validation_keys = {key for key, _ in ordered if is_validation(key, fraction)}
    if len(ordered) >= 2 and len(validation_keys) in (0, len(ordered)):
        by_score = sorted(ordered, key=lambda unit: hashlib.sha256(unit[0].encode()).digest())
        if validation_keys:
            validation_keys.discard(by_score[-1][0])
        else:
            validation_keys.add(by_score[0][0])
    train = b"".join(text for key, text in ordered if key not in validation_keys)
    validation = b"".join(text for key, text in ordered if key in validation_keys)
    return train, validation


def _stdlib_files(root: Path) -> list[tuple[str, Path]]:
    """``(relative posix path, path)`` of the stdlib's ``.py`` files, sorted; skipped folders pruned
    during the walk (site-packages alone can hold far more files than the stdlib)."""
    found = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if name not in _STDLIB_SKIP_DIRS]
        relative = Path(folder).relative_to(root)
        found.extend(
            ((relative / name).as_posix(), Path(folder, name)) for name in filenames if name.endswith(".py")
        )
    return sorted(found)


def _stdlib_units(root: Path, max_bytes: int) -> list[tuple[str, bytes]]:
    units: list[tuple[str, bytes]] = []
    total = 0
    for key, path in _stdlib_files(root):
        try:
            text = path.read_bytes()
        except OSError:
            continue  # an unreadable stdlib file only makes the default corpus a little smaller
        if total + len(text) > max_bytes:
            continue  # a big file that does not fit must not end the walk: smaller ones after it may
        units.append((key, text))
        total += len(text)
    return units


def _user_units(path: Path, seq_len: int) -> list[tuple[str, bytes]]:
    if not path.exists():
        raise ConfigError(f"task.data_path: {path} does not exist")
    try:
        if path.is_file():
            text = path.read_bytes()
            chunk = max(seq_len + 1, min(_SINGLE_FILE_CHUNK, len(text) // 20))
            starts = range(0, len(text), chunk)
            return [(f"{path.name}#{i // chunk:08d}", text[i : i + chunk]) for i in starts]
        files = sorted(
            p for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        return [(p.relative_to(path).as_posix(), p.read_bytes()) for p in files]
    except OSError as exc:
        raise ConfigError(f"task.data_path: cannot read {path} ({exc.strerror or exc})") from None


def load_corpus(
    data_path: Path | None,
    validation_fraction: float,
    seq_len: int,
    *,
    max_stdlib_bytes: int = STDLIB_MAX_BYTES,
) -> Corpus:
    """Load ``data_path`` (file or directory) or the stdlib default and split it.

    Raises :class:`ConfigError` naming ``task.data_path`` when the path is missing, unreadable,
    empty, or too small to give both splits two sequences' worth of text.
    """
    if data_path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        units, source = _stdlib_units(root, max_stdlib_bytes), f"stdlib {root}"
    else:
        data_path = data_path.expanduser()
        units, source = _user_units(data_path, seq_len), str(data_path)
    total = sum(len(text) for _, text in units)
    if total == 0:
        what = "has no text files" if data_path is None or data_path.is_dir() else "is empty"
        raise ConfigError(f"task.data_path: {source} {what}")
    train, validation = split_units(units, validation_fraction)
    needed = 2 * seq_len
    if min(len(train), len(validation)) < needed:
        raise ConfigError(
            f"task.data_path: {source} is too small ({total} bytes, split {len(train)}/{len(validation)}); "
            f"training and validation each need at least {needed} bytes (2 x task.seq_len)"
        )
    log.info("corpus %s: %d train bytes, %d validation bytes", source, len(train), len(validation))
    return Corpus(_as_tensor(train), _as_tensor(validation), source)


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class ByteSequenceStream:
    """This node's endless walk over ``(seq_len + 1)``-byte windows of the training text.

    Epoch ``e`` visits every window once in an order (and with a start shift) seeded by
    ``(peer_seed, e)``, so different nodes read different data and the position
    ``(epoch, index)`` is all a checkpoint needs to resume without replay or skip.
    Batches are ``int64`` tensors of shape ``(batch_size, seq_len + 1)``.
    """

    def __init__(self, data: torch.Tensor, seq_len: int, batch_size: int, peer_seed: int) -> None:
        self.data, self.seq_len, self.batch_size, self.peer_seed = data, seq_len, batch_size, peer_seed
        # One window length is reserved for the per-epoch shift, so the count is the same every epoch.
        self.num_sequences = len(data) // seq_len - 1
        if self.num_sequences < 1:
            raise ValueError(f"need at least {2 * seq_len} bytes of training text, got {len(data)}")
        self.epoch, self.index = 0, 0
        self._order: tuple[int, torch.Tensor, int] | None = None

    def _epoch_order(self) -> tuple[torch.Tensor, int]:
        if self._order is None or self._order[0] != self.epoch:
            generator = torch.Generator().manual_seed(stable_seed("train-order", self.peer_seed, self.epoch))
            order = torch.randperm(self.num_sequences, generator=generator)
            shift = int(torch.randint(self.seq_len, (1,), generator=generator))
            self._order = (self.epoch, order, shift)
        return self._order[1], self._order[2]

    def next(self) -> torch.Tensor:
        rows = []
        for _ in range(self.batch_size):
            order, shift = self._epoch_order()
            start = shift + int(order[self.index]) * self.seq_len
            rows.append(self.data[start : start + self.seq_len + 1])
            self.index += 1
            if self.index == self.num_sequences:
                self.epoch, self.index = self.epoch + 1, 0
        return torch.stack(rows).long()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "num_sequences": self.num_sequences}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # no saved position (e.g. an older checkpoint): the very start
            self.epoch, self.index = 0, 0
            return
        epoch, index = state.get("epoch"), state.get("index")
        if not (isinstance(epoch, int) and isinstance(index, int) and epoch >= 0 and index >= 0):
            raise ValueError(f"bad data position {state!r}: expected non-negative 'epoch' and 'index'")
        if state.get("num_sequences") != self.num_sequences:
            # The corpus changed under us: the old index means nothing here, so start the next epoch.
            log.warning("training data changed since the checkpoint (%s -> %d sequences); starting epoch %d",
                        state.get("num_sequences"), self.num_sequences, epoch + 1)
            epoch, index = epoch + 1, 0
        self.epoch, self.index = epoch, index


def validation_windows(data: torch.Tensor, seq_len: int, batch_size: int, batches: int) -> list[torch.Tensor]:
    """Fixed validation batches: up to ``batches * batch_size`` windows spread evenly over ``data``.

    The same on every node; fewer (and a short last batch) when the validation text is small.
    """
    available = (len(data) - 1) // seq_len
    wanted = min(batches * batch_size, available)
    starts: Sequence[int] = [(k * available // wanted) * seq_len for k in range(wanted)]
    rows = [data[start : start + seq_len + 1] for start in starts]
    return [torch.stack(rows[i : i + batch_size]).long() for i in range(0, len(rows), batch_size)]
