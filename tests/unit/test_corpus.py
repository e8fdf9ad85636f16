"""Corpus loading, the deterministic train/validation split and per-node data streams."""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import pytest
import torch

from p2ptrain.config import ConfigError
from p2ptrain.tasks.corpus import (
    ByteSequenceStream,
    is_validation,
    load_corpus,
    split_units,
    stable_seed,
    validation_windows,
)

torch.set_num_threads(1)


def _write_tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n" + "".join(f"line {i} of {name}\n" for i in range(40)))


NAMES = [f"pkg{i % 3}/mod_{i:03d}.txt" for i in range(60)]


def test_split_is_deterministic_and_independent_of_location_and_order(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "elsewhere" / "b"
    _write_tree(first, NAMES)
    _write_tree(second, list(reversed(NAMES)))  # different creation order, different absolute path
    one = load_corpus(first, 0.2, 16)
    again = load_corpus(first, 0.2, 16)
    other = load_corpus(second, 0.2, 16)
    for corpus in (again, other):
        assert torch.equal(one.train, corpus.train)
        assert torch.equal(one.validation, corpus.validation)
    assert len(one.train) > 0 and len(one.validation) > 0


def test_split_units_ignores_input_order() -> None:
    units = [(f"f{i}.py", f"text {i}\n".encode()) for i in range(200)]
    shuffled = units[:]
    random.Random(7).shuffle(shuffled)
    assert split_units(units, 0.1) == split_units(shuffled, 0.1)
    held_out = sum(is_validation(key, 0.1) for key, _ in units)
    assert 5 <= held_out <= 40  # a hash split near the configured fraction


def test_split_units_keeps_both_sides_non_empty() -> None:
    train, validation = split_units([("only-a", b"aaaa"), ("only-b", b"bbbb")], 1e-9)
    assert train and validation and train != validation


def test_validation_files_never_reach_training(tmp_path: Path) -> None:
    _write_tree(tmp_path, NAMES)
    corpus = load_corpus(tmp_path, 0.2, 16)
    train_text, validation_text = bytes(corpus.train.tolist()), bytes(corpus.validation.tolist())
    for name in NAMES:
        header = f"# {name}\n".encode()
        assert (header in validation_text) == is_validation(name, 0.2)
        assert (header in train_text) != (header in validation_text)


def test_default_corpus_is_the_stdlib_within_the_cap() -> None:
    corpus = load_corpus(None, 0.05, 128, max_stdlib_bytes=300_000)
    assert corpus.source.startswith("stdlib")
    assert len(corpus.train) + len(corpus.validation) <= 300_000
    assert b"def " in bytes(corpus.train[:300_000].tolist())


def test_single_file_is_split_into_chunks(tmp_path: Path) -> None:
    path = tmp_path / "book.txt"
    path.write_text("".join(f"sentence number {i}.\n" for i in range(5000)))
    corpus = load_corpus(path, 0.1, 32)
    assert len(corpus.train) + len(corpus.validation) == path.stat().st_size
    assert len(corpus.validation) > 0 and len(corpus.train) > len(corpus.validation)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda root: root / "missing", "does not exist"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "has no text files"),
        (lambda root: (root / "empty.txt").write_text("") and None or root / "empty.txt", "is empty"),
        (lambda root: (root / "tiny.txt").write_text("x" * 40) and None or root / "tiny.txt", "too small"),
    ],
    ids=["missing", "empty-dir", "empty-file", "too-small"],
)
def test_bad_data_path_is_one_config_error(tmp_path: Path, setup, message: str) -> None:
    path = setup(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_corpus(path, 0.1, 32)
    text = str(info.value)
    assert text.startswith("task.data_path: ") and message in text and "\n" not in text


def _data(size: int = 4096) -> torch.Tensor:
    return torch.randint(256, (size,), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)


def _take(stream: ByteSequenceStream, count: int) -> list[torch.Tensor]:
    return [stream.next() for _ in range(count)]


def test_same_peer_same_batches_other_peer_other_batches() -> None:
    data = _data()
    a, b, c = (ByteSequenceStream(data, 16, 4, seed) for seed in (11, 11, 12))
    batches_a, batches_b, batches_c = _take(a, 30), _take(b, 30), _take(c, 30)
    assert all(torch.equal(x, y) for x, y in zip(batches_a, batches_b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(batches_a, batches_c, strict=True))
    assert batches_a[0].shape == (4, 17) and batches_a[0].dtype == torch.int64


def test_each_epoch_visits_every_window_once() -> None:
    stream = ByteSequenceStream(_data(), 16, 5, 1)
    count = stream.num_sequences
    rows = torch.cat(_take(stream, 200))
    first_epoch = {tuple(row.tolist()) for row in rows[:count]}
    second_epoch = {tuple(row.tolist()) for row in rows[count : 2 * count]}
    assert len(first_epoch) == count and len(second_epoch) == count
    assert stream.state_dict()["epoch"] == 200 * 5 // count


@pytest.mark.parametrize("taken", [0, 7, 50, 51])  # 51 x 5 crosses the epoch boundary mid-batch
def test_restored_stream_continues_without_replay_or_skip(taken: int) -> None:
    data = _data()
    original = ByteSequenceStream(data, 16, 5, 99)
    _take(original, taken)
    position = original.state_dict()
    expected = _take(original, 12)
    resumed = ByteSequenceStream(data, 16, 5, 99)
    resumed.load_state_dict(dict(position))
    assert all(torch.equal(x, y) for x, y in zip(expected, _take(resumed, 12), strict=True))


def test_changed_corpus_restarts_at_next_epoch(caplog: pytest.LogCaptureFixture) -> None:
    stream = ByteSequenceStream(_data(), 16, 2, 5)
    with caplog.at_level(logging.WARNING):
        stream.load_state_dict({"epoch": 3, "index": 40, "num_sequences": 999})
    assert (stream.epoch, stream.index) == (4, 0)
    assert "training data changed" in caplog.text
    stream.load_state_dict({})
    assert (stream.epoch, stream.index) == (0, 0)
    with pytest.raises(ValueError, match="bad data position"):
        stream.load_state_dict({"epoch": -1, "index": 0, "num_sequences": stream.num_sequences})


def test_validation_windows_are_fixed_and_bounded() -> None:
    data = _data(2000)
    batches = validation_windows(data, 16, 4, 3)
    again = validation_windows(data.clone(), 16, 4, 3)
    assert len(batches) == 3 and all(b.shape == (4, 17) for b in batches)
    assert all(torch.equal(x, y) for x, y in zip(batches, again, strict=True))
    few = validation_windows(data[:100], 16, 4, 3)  # only 6 windows fit
    assert [len(b) for b in few] == [4, 2]


def test_stable_seed_is_stable_and_spread() -> None:
    assert stable_seed("peer", 1) == stable_seed("peer", 1)
    assert stable_seed("peer", 1) != stable_seed("peer", 2)
    assert 0 <= stable_seed("x") < 2**63


def test_stdlib_copy_gives_same_split(tmp_path: Path) -> None:
    # The same files under another root (another node's install path) split the same way.
    source = tmp_path / "src"
    _write_tree(source, NAMES[:20])
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    assert torch.equal(load_corpus(source, 0.3, 8).validation, load_corpus(copy, 0.3, 8).validation)
