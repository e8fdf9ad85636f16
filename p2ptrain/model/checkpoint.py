"""Local checkpoints: atomic writes, retention of the last ``keep``, fallback past corrupt files.

A checkpoint is written to a temp file in the same directory, flushed and fsynced, renamed to
``ckpt-<epoch:08d>-<unix ms>.pt`` and the directory fsynced; only then are the oldest beyond
``keep`` deleted, so a crash at any moment leaves the previous checkpoint loadable.  Loading
tries the newest first; a file that does not load is renamed to ``*.corrupt`` (kept for a
human to look at, never silently deleted) and the one before it is tried.

The store does not interpret the state beyond ``state["epoch"]`` (for the file name).  The
node's layout is ``{"format": 1, "model", "optimizer", "scheduler", "epoch", "data_position",
"samples_processed", "saved_at", "fingerprint"}``: dicts of tensors, numbers, strings and
lists, which ``torch.load(weights_only=True)`` accepts, so loading never runs pickled code.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from p2ptrain.atomicfile import fsync_path

log = logging.getLogger(__name__)

Writer = Callable[[dict[str, Any], IO[bytes]], None]
"""Serialises a state into an open binary file (default: ``torch.save``)."""
Opener = Callable[[Path], Any]
"""Reads a checkpoint file back (default: ``torch.load(weights_only=True)`` onto the CPU)."""

_NAME = re.compile(r"ckpt-(\d{8,})-(\d+)\.pt")
_TEMP_PREFIX, _TEMP_SUFFIX = ".ckpt-", ".tmp"


class CheckpointError(Exception):
    """Writing a checkpoint failed; the previous one is intact and no temp file is left."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    path: Path
    state: dict[str, Any]


def torch_writer(state: dict[str, Any], file: IO[bytes]) -> None:
    torch.save(state, file)


def torch_opener(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


class _FirstError:
    """File proxy that remembers the first OSError of ``write``: torch.save reports a failed write
    as a vague RuntimeError ("unexpected pos ..."), and the real cause (ENOSPC) belongs in the message."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._file.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class CheckpointStore:
    """Checkpoints of one node in ``directory``, newest ``keep`` retained."""

    def __init__(
        self,
        directory: Path,
        keep: int,
        *,
        writer: Writer = torch_writer,
        opener: Opener = torch_opener,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory, self.keep = Path(directory), keep
        self._writer, self._opener, self._clock = writer, opener, clock

    def paths(self) -> list[Path]:
        """Complete checkpoints, newest first (by write time in the name, then epoch)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = [(int(m[2]), int(m[1]), name) for name in names if (m := _NAME.fullmatch(name))]
        return [self.directory / name for *_, name in sorted(found, reverse=True)]

    def save(self, state: dict[str, Any]) -> Path:
        """Write ``state`` atomically and prune old checkpoints; raises :class:`CheckpointError`."""
        epoch = int(state["epoch"])
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, temp_name = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=self.directory)
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint in {self.directory}: {_describe(exc)}") from exc
        temp = Path(temp_name)
        try:
            with os.fdopen(fd, "wb") as raw:
                file = _FirstError(raw)
                try:
                    self._writer(state, file)  # type: ignore[arg-type]
                    raw.flush()
                    os.fsync(raw.fileno())
                except Exception as exc:
                    cause = file.error or exc
                    raise CheckpointError(f"cannot write checkpoint {temp}: {_describe(cause)}") from exc
            final = self.directory / self._next_name(epoch)
            os.replace(temp, final)
        except BaseException as exc:
            # Also on KeyboardInterrupt or a crash in the writer: never leave a half file behind.
            temp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise CheckpointError(f"cannot write checkpoint {temp}: {_describe(exc)}") from exc
            raise
        try:
            fsync_path(self.directory)
        except OSError as exc:
            # The file is complete but its rename may not be durable yet: keep the older ones.
            raise CheckpointError(
                f"cannot fsync {self.directory} after writing {final.name}: {_describe(exc)}"
            ) from exc
        self._prune()
        return final

    def _next_name(self, epoch: int) -> str:
        # Strictly after every existing checkpoint, even if the wall clock stepped back, so
        # "newest" is always the one written last.
        now_ms = int(self._clock() * 1000)
        existing = self.paths()
        if existing:
            match = _NAME.fullmatch(existing[0].name)
            assert match is not None
            now_ms = max(now_ms, int(match[2]) + 1)
        return f"ckpt-{epoch:08d}-{now_ms}.pt"

    def _prune(self) -> None:
        for old in self.paths()[self.keep :]:
            try:
                old.unlink()
            except OSError as exc:
                log.warning("cannot delete old checkpoint %s: %s", old, _describe(exc))

    def remove_stale_temp_files(self) -> int:
        """Delete temp files a killed process left behind; returns how many."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        removed = 0
        for name in names:
            if name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX):
                try:
                    (self.directory / name).unlink()
                    removed += 1
                except OSError as exc:
                    log.warning("cannot delete stale temp file %s: %s", self.directory / name, _describe(exc))
        return removed

    def load_latest(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that loads, or ``None``; corrupt ones are renamed to ``*.corrupt``."""
        removed = self.remove_stale_temp_files()
        if removed:
            log.info("removed %d unfinished checkpoint temp file(s) in %s", removed, self.directory)
        for path in self.paths():
            try:
                state = self._opener(path)
                if not isinstance(state, dict):
                    raise TypeError(f"holds a {type(state).__name__}, not a dict")
            except Exception as exc:
                corrupt = path.with_name(path.name + ".corrupt")
                try:
                    os.replace(path, corrupt)
                    kept = f"kept as {corrupt.name}"
                except OSError as rename_exc:
                    kept = f"could not rename it: {_describe(rename_exc)}"
                log.warning("checkpoint %s does not load (%s); %s; trying the previous one",
                            path, load_failure(exc), kept)
                continue
            return LoadedCheckpoint(path, state)
        return None

    def read_latest(self) -> tuple[LoadedCheckpoint | None, list[tuple[Path, str]]]:
        """The newest checkpoint that loads, and the newer ones that did not (path, reason).

        For tools that only read (export, eval): unlike :meth:`load_latest` it renames and
        deletes nothing, so it is safe next to a running node.
        """
        failed: list[tuple[Path, str]] = []
        for path in self.paths():
            try:
                return LoadedCheckpoint(path, read_checkpoint(path, self._opener)), failed
            except Exception as exc:
                failed.append((path, load_failure(exc)))
        return None, failed


def read_checkpoint(path: Path, opener: Opener = torch_opener) -> dict[str, Any]:
    """One checkpoint file's state (raises whatever the opener raises, or TypeError if not a dict)."""
    state = opener(path)
    if not isinstance(state, dict):
        raise TypeError(f"holds a {type(state).__name__}, not a dict")
    return state


def load_failure(exc: BaseException) -> str:
    """Why a checkpoint file did not load, in words: torch reports a cut-off file as a bare
    ``OSError: [Errno 22] Invalid argument`` or a zip reader's error, which say nothing of the file."""
    text = _first_line(exc)
    if isinstance(exc, OSError) and exc.filename is None and not isinstance(exc, FileNotFoundError | PermissionError):
        return f"truncated or corrupt: {type(exc).__name__}: {text}"
    if isinstance(exc, RuntimeError) and "zip archive" in text:
        detail = text.split("zip archive:", 1)[1].split(".", 1)[0].strip()
        return f"truncated or corrupt: not a whole checkpoint ({detail})"
    if isinstance(exc, pickle.UnpicklingError):  # torch's text suggests weights_only=False: not advice to pass on
        lines = [line.strip() for line in str(exc).split("WeightsUnpickler error:", 1)[-1].splitlines() if line.strip()]
        return f"truncated or corrupt: not a checkpoint ({lines[0] if lines else 'it does not unpickle'})"
    if isinstance(exc, EOFError):
        return f"truncated or corrupt: {type(exc).__name__}: {text}"
    return f"{type(exc).__name__}: {text}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.strerror} ({exc.filename})"
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
