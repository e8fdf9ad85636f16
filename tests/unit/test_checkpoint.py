"""Checkpoint store: atomic writes, retention, corrupt-file fallback, write failures."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import IO, Any

import pytest
import torch

from p2ptrain.model.checkpoint import CheckpointError, CheckpointStore, torch_writer

torch.set_num_threads(1)


def _state(epoch: int) -> dict[str, Any]:
    return {"format": 1, "epoch": epoch, "model": {"w": torch.full((4,), float(epoch))}, "saved_at": 1.5}


def _files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_round_trip_of_a_real_training_state_with_weights_only(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0 / (epoch + 1))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    state = {
        "format": 1,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": 7,
        "data_position": {"epoch": 0, "index": 12},
        "samples_processed": 96,
        "saved_at": 1700000000.5,
        "fingerprint": "0123456789abcdef",
    }
    store = CheckpointStore(tmp_path / "ckpt", keep=3)
    path = store.save(state)
    assert path.name.startswith("ckpt-00000007-") and path.suffix == ".pt"
    loaded = store.load_latest()  # default opener: torch.load(weights_only=True)
    assert loaded is not None and loaded.path == path
    assert torch.equal(loaded.state["model"]["weight"], model.state_dict()["weight"])
    assert loaded.state["optimizer"]["state"][0]["exp_avg"].shape == (2, 3)
    assert loaded.state["data_position"] == {"epoch": 0, "index": 12}
    assert loaded.state["fingerprint"] == "0123456789abcdef"


def test_retention_keeps_the_newest_k(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for epoch in range(5):
        store.save(_state(epoch))
    assert [int(path.name.split("-")[1]) for path in store.paths()] == [4, 3]
    assert len(_files(tmp_path)) == 2
    loaded = store.load_latest()
    assert loaded is not None and loaded.state["epoch"] == 4


def test_newest_is_the_last_written_even_if_the_clock_steps_back(tmp_path: Path) -> None:
    times = iter([1000.0, 500.0, 500.0])
    store = CheckpointStore(tmp_path, keep=5, clock=lambda: next(times))
    for epoch in (1, 2, 3):
        store.save(_state(epoch))
    assert [path.name.split("-")[1] for path in store.paths()] == ["00000003", "00000002", "00000001"]


def _crashing_writer(exc: BaseException):
    def writer(state: dict[str, Any], file: IO[bytes]) -> None:
        file.write(b"PK\x03\x04 half a checkpoint")
        raise exc

    return writer


def test_crash_mid_write_leaves_previous_checkpoint_and_no_temp_file(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, keep=1).save(_state(1))
    before = _files(tmp_path)
    store = CheckpointStore(tmp_path, keep=1, writer=_crashing_writer(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        store.save(_state(2))
    assert _files(tmp_path) == before
    loaded = CheckpointStore(tmp_path, keep=1).load_latest()
    assert loaded is not None and loaded.state["epoch"] == 1


def test_disk_full_raises_checkpoint_error_and_keeps_previous(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, keep=1).save(_state(1))
    before = _files(tmp_path)
    store = CheckpointStore(
        tmp_path, keep=1, writer=_crashing_writer(OSError(errno.ENOSPC, "No space left on device"))
    )
    with pytest.raises(CheckpointError, match="No space left on device"):
        store.save(_state(2))
    assert _files(tmp_path) == before
    assert store.load_latest().state["epoch"] == 1  # type: ignore[union-attr]


class _FullDisk:
    """A file that accepts ``room`` bytes and then fails like a full disk."""

    def __init__(self, file: IO[bytes], room: int) -> None:
        self._file, self._room = file, room

    def write(self, data: bytes) -> int:
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return self._file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def test_disk_full_inside_torch_save_names_the_real_cause(tmp_path: Path) -> None:
    # torch.save turns a failed write into a vague RuntimeError; the message must still say ENOSPC.
    store = CheckpointStore(
        tmp_path, keep=1, writer=lambda state, file: torch_writer(state, _FullDisk(file, 300))
    )
    with pytest.raises(CheckpointError, match="No space left on device"):
        store.save({"epoch": 0, "model": {"w": torch.zeros(10_000)}})
    assert _files(tmp_path) == []


def test_unwritable_directory_raises_checkpoint_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint directory should be")
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        CheckpointStore(blocker / "checkpoints", keep=2).save(_state(0))


def test_corrupt_newest_falls_back_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    store.save(_state(1))
    newest = store.save(_state(2))
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING, logger="p2ptrain.model.checkpoint"):
        loaded = store.load_latest()
    assert loaded is not None and loaded.state["epoch"] == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and newest.name in warnings[0].getMessage()
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()  # kept, not deleted


def test_all_corrupt_gives_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    for epoch in (1, 2):
        store.save(_state(epoch)).write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="p2ptrain.model.checkpoint"):
        assert store.load_latest() is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    assert len([name for name in _files(tmp_path) if name.endswith(".corrupt")]) == 2


def test_injected_opener_and_non_dict_content(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    store.save(_state(1))
    store.save(_state(2))
    calls: list[str] = []

    def opener(path: Path) -> Any:
        calls.append(path.name)
        return [1, 2] if len(calls) == 1 else torch.load(path, weights_only=True)

    loaded = CheckpointStore(tmp_path, keep=3, opener=opener).load_latest()
    assert loaded is not None and loaded.state["epoch"] == 1 and len(calls) == 2


def test_missing_directory_and_stale_temp_files(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "absent", keep=1).load_latest() is None
    store = CheckpointStore(tmp_path, keep=1)
    store.save(_state(3))
    (tmp_path / ".ckpt-killed.tmp").write_bytes(b"left by a killed process")
    loaded = store.load_latest()
    assert loaded is not None and loaded.state["epoch"] == 3
    assert [name for name in _files(tmp_path) if name.endswith(".tmp")] == []
