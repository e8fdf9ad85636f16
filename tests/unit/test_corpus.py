"""Finding shards, the deterministic train/validation split, and the validation windows."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from p2ptrain.config.schema import ConfigError, TaskSection
from p2ptrain.data.corpus import is_validation, split_shards, stable_seed, validation_windows
from p2ptrain.data.sources import ShardRef, stdlib_shards
from p2ptrain.data.text import TextData, build_text_data

torch.set_num_threads(1)


def _write_tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n" + "".join(f"line {i} of {name}\n" for i in range(40)))


NAMES = [f"pkg{i % 3}/mod_{i:03d}.txt" for i in range(60)]


def _text_data(path: Path | str, fraction: float, seq_len: int, **task: object) -> TextData:
    cfg = TaskSection(data_path=path, validation_fraction=fraction, seq_len=seq_len, d_model=8, n_heads=2, **task)
    return build_text_data(cfg, batch_size=4, peer_seed=1, peer_id="me", live_peers=lambda: ["me"])



def _pass_text(data: TextData) -> list[bytes]:
    """Every training window of the first pass, as bytes."""
    stream, windows = data.stream, []
    while stream.pass_number == 0:
        windows.extend(bytes(row.tolist()) for row in stream.next())
    return windows


def test_split_is_deterministic_and_independent_of_location_and_order(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "elsewhere" / "b"
    _write_tree(first, NAMES)
    _write_tree(second, list(reversed(NAMES)))  # different creation order, different absolute path
    one = _text_data(first, 0.2, 16)
    again = _text_data(first, 0.2, 16)
    other = _text_data(second, 0.2, 16)
    first_batch = one.stream.next()
    for data in (again, other):
        assert data.stream.source == one.stream.source
        assert all(torch.equal(x, y) for x, y in zip(one.validation, data.validation, strict=True))
        assert all(torch.equal(x, y) for x, y in zip(first_batch, data.stream.next(), strict=True))
    assert one.validation and one.stream.coverage().shards_total < len(NAMES)


def _shards(keys: list[str]) -> list[ShardRef]:
    return [ShardRef(key, "text", path=key) for key in keys]


def test_split_shards_ignores_input_order() -> None:
    keys = [f"f{i}.py" for i in range(200)]
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    assert split_shards(_shards(keys), 0.1) == split_shards(_shards(shuffled), 0.1)
    held_out = sum(is_validation(key, 0.1) for key in keys)
    assert 5 <= held_out <= 40  # a hash split near the configured fraction
    assert len(split_shards(_shards(keys), 0.1)[1]) == held_out


def test_split_shards_keeps_both_sides_non_empty() -> None:
    train, validation = split_shards(_shards(["only-a", "only-b"]), 1e-9)
    assert len(train) == len(validation) == 1 and train != validation


def test_validation_files_never_reach_training(tmp_path: Path) -> None:
    _write_tree(tmp_path, NAMES)
    data = _text_data(tmp_path, 0.2, 16)
    windows = _pass_text(data)
    validation_text = b"".join(bytes(row.tolist()) for batch in data.validation for row in batch)
    for name in NAMES:
        header = f"# {name}\n".encode()
        if is_validation(name, 0.2):
            assert name not in data.stream._shards
            assert not any(header in window for window in windows)
        else:
            assert name in data.stream._shards
    assert any(f"of {name}".encode() in validation_text for name in NAMES if is_validation(name, 0.2))


def test_default_corpus_is_the_stdlib_within_the_cap() -> None:
    import sysconfig

    shards = stdlib_shards(Path(sysconfig.get_paths()["stdlib"]), 300_000)
    assert 0 < sum(shard.size for shard in shards) <= 300_000
    assert all(shard.id.endswith(".py") and shard.size > 0 for shard in shards)
    default = build_text_data(TaskSection(), batch_size=2, peer_seed=1, peer_id="me", live_peers=lambda: ["me"])
    assert default.source.startswith("stdlib")
    assert any(b"def " in bytes(row.tolist()) for _ in range(20) for row in default.stream.next())


def test_single_file_is_split_into_chunks(tmp_path: Path) -> None:
    path = tmp_path / "book.txt"
    path.write_text("".join(f"sentence number {i}.\n" for i in range(5000)))
    data = _text_data(path, 0.1, 32)
    shards = data.stream._shards
    assert 10 <= len(shards) < 20 and all(key.startswith("book.txt#") for key in shards)
    assert sum(shard.size for shard in shards.values()) < path.stat().st_size  # the rest is validation
    assert data.validation


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda root: root / "missing", "does not exist"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "has no data files"),
        (lambda root: (root / "empty.txt").write_text("") and None or root / "empty.txt", "is empty"),
        (lambda root: (root / "tiny.txt").write_text("x" * 40) and None or root / "tiny.txt", "too small"),
        (lambda root: (root / "one.txt").write_text("x" * 400) and None or root / "*.txt", "is a single shard"),
        (lambda root: str(root / "nothing" / "*.jsonl"), "no files match the glob"),
    ],
    ids=["missing", "empty-dir", "empty-file", "too-small", "one-shard", "glob-matches-nothing"],
)
def test_bad_data_path_is_one_config_error(tmp_path: Path, setup, message: str) -> None:
    path = setup(tmp_path)
    with pytest.raises(ConfigError) as info:
        _text_data(path, 0.1, 32)
    text = str(info.value)
    assert text.startswith("task.data_path: ") and message in text and "\n" not in text


def test_glob_names_shards_relative_to_its_folder(tmp_path: Path) -> None:
    _write_tree(tmp_path / "corpus", NAMES)
    (tmp_path / "corpus" / "pkg0" / "skip.md").write_text("not matched\n" * 50)
    data = _text_data(str(tmp_path / "corpus" / "**" / "*.txt"), 0.2, 16)
    both = set(data.stream._shards) | {name for name in NAMES if is_validation(name, 0.2)}
    assert both == set(NAMES)


def _data(size: int = 4096) -> torch.Tensor:
    return torch.randint(256, (size,), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)


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
    assert torch.equal(_text_data(source, 0.3, 8).validation[0], _text_data(copy, 0.3, 8).validation[0])
