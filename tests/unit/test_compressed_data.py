"""gzip and zstd shards: read through a decompressed copy, bounded against bombs; config check reads the data."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from p2ptrain.config.schema import ConfigError, TaskSection
from p2ptrain.data.compressed import compression_of, without_suffix
from p2ptrain.data.readers import ShardMalformed, ShardUnreadable
from p2ptrain.data.remote import ShardFetcher
from p2ptrain.data.sources import ShardRef, discover
from p2ptrain.data.text import build_text_data, data_problems
from p2ptrain.errors import EX_CONFIG

torch.set_num_threads(1)
SEQ = 16
MIB = 1024 * 1024


def _records(i: int, field: str = "text") -> bytes:
    return "".join(json.dumps({field: f"shard {i} line {j} abcdefgh"}) + "\n" for j in range(60)).encode()


def _zstd(data: bytes) -> bytes:
    zstandard = pytest.importorskip("zstandard")
    return bytes(zstandard.ZstdCompressor().compress(data))


def _no_index(url: str, sha256: str) -> bytes:
    raise AssertionError("no index here")


def _train(task: TaskSection, cache: Path) -> bytes:
    data = build_text_data(task, batch_size=4, peer_seed=1, peer_id="me", live_peers=lambda: ["me"],
                           cache_dir=cache)
    batches = [data.stream.next() for _ in range(20)]
    return b"".join(bytes(row.to(torch.uint8).tolist()) for batch in batches for row in batch)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_compressed_corpus_trains_on_its_text_not_its_bytes(tmp_path: Path, suffix: str) -> None:
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(6):
        body = _records(i)
        (root / f"part-{i}{suffix}").write_bytes(gzip.compress(body) if suffix.endswith("gz") else _zstd(body))
    shards = discover(str(root), "auto", SEQ, _no_index).shards
    assert {(s.kind, s.compression) for s in shards} == {("jsonl", "gzip" if suffix.endswith("gz") else "zstd")}
    task = TaskSection(data_path=str(root), seq_len=SEQ, buffer_mb=1, validation_batches=1)
    text = _train(task, tmp_path / "cache")
    assert set(text) <= set(b"shard line abcdefgh0123456789\n")  # text only: no JSON, no compressed bytes
    assert b"abcdefgh" in text


def test_data_compression_overrides_the_suffix(tmp_path: Path) -> None:
    assert compression_of("a.jsonl.gz", "auto") == "gzip" and compression_of("a.ZST", "auto") == "zstd"
    assert compression_of("a.jsonl.gz", "none") == "" and compression_of("a.bin", "gzip") == "gzip"
    assert compression_of("a.jsonl", "auto") == "" and without_suffix("a.jsonl.gz") == "a.jsonl"
    path = tmp_path / "c" / "book.dat"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(b"x" * 100))
    (path.parent / "other.dat").write_bytes(gzip.compress(b"y" * 100))
    assert {s.compression for s in discover(str(path.parent), "auto", SEQ, _no_index, compression="gzip").shards} \
        == {"gzip"}
    assert {s.compression for s in discover(str(path.parent), "auto", SEQ, _no_index).shards} == {""}


def test_a_decompression_bomb_is_refused_within_the_shard_cap(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.txt.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (4 * MIB)))  # ~4 KiB that would grow a thousandfold
    fetcher = ShardFetcher(tmp_path / "cache", max_shard_bytes=1 * MIB)
    shard = ShardRef("bomb.txt.gz", "text", path=str(bomb), compression="gzip")
    with pytest.raises(ShardUnreadable, match="decompression bomb"):
        fetcher.local_path(shard)
    assert not [p for p in (tmp_path / "cache").iterdir()], "nothing of it is left in the cache"


def test_a_corrupt_stream_is_malformed_and_a_good_copy_is_made_once(tmp_path: Path) -> None:
    broken = tmp_path / "broken.txt.gz"
    broken.write_bytes(gzip.compress(b"hello world " * 1000)[:-40])
    fetcher = ShardFetcher(tmp_path / "cache")
    with pytest.raises(ShardMalformed, match="does not decompress as gzip"):
        fetcher.local_path(ShardRef("broken.txt.gz", "text", path=str(broken), compression="gzip"))
    good = tmp_path / "good.txt.gz"
    good.write_bytes(gzip.compress(b"hello world " * 1000))
    shard = ShardRef("good.txt.gz", "text", path=str(good), compression="gzip")
    copy = fetcher.local_path(shard)
    assert copy.read_bytes() == b"hello world " * 1000
    assert fetcher.local_path(shard) == copy
    good.write_bytes(gzip.compress(b"changed " * 999))  # a changed file is decompressed again
    assert fetcher.local_path(shard).read_bytes() == b"changed " * 999


def test_a_compressed_url_shard_is_checked_then_kept_decompressed(tmp_path: Path) -> None:
    body = gzip.compress(_records(0))
    served: list[str] = []

    class Response:
        def __init__(self) -> None:
            self.headers = {"Content-Length": str(len(body))}
            self._left = body

        def read(self, size: int) -> bytes:
            chunk, self._left = self._left[:size], self._left[size:]
            return chunk

        def __enter__(self) -> Response:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def opener(url: str, **kwargs: object) -> Response:
        served.append(url)
        return Response()

    fetcher = ShardFetcher(tmp_path / "cache", opener=opener)
    url = "https://data.example/part-0.jsonl.gz"
    shard = ShardRef("part-0.jsonl.gz", "jsonl", url=url, sha256=hashlib.sha256(body).hexdigest(),
                     compression="gzip")
    assert fetcher.local_path(shard).read_bytes() == _records(0)
    assert fetcher.local_path(shard).read_bytes() == _records(0)
    assert served == [url], "the plain copy is the cache: no second download"
    assert [p.name.startswith("plain-") for p in (tmp_path / "cache").iterdir()] == [True]


def test_a_missing_zstandard_is_one_config_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now raises ImportError
    root = tmp_path / "c"
    root.mkdir()
    for i in range(2):
        (root / f"{i}.txt.zst").write_bytes(b"not read")
    with pytest.raises(ConfigError, match=r"^task.data_path: zstd shards need the zstandard package"):
        discover(str(root), "auto", SEQ, _no_index)


def _corpus(root: Path, field: str) -> Path:
    root.mkdir()
    for i in range(4):
        (root / f"part-{i}.jsonl.gz").write_bytes(gzip.compress(_records(i, field)))
    return root


def test_data_problems_names_the_text_field_as_the_node_does(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wrong = TaskSection(data_path=str(_corpus(tmp_path / "wrong", "content")), seq_len=SEQ)
    problems = data_problems(wrong, tmp_path / "cache")
    assert len(problems) == 1
    assert re.fullmatch(r"task.text_field: part-\d.jsonl.gz: no 'text' field in the record at byte 0 \(its fields: "
                        r"content\)", problems[0])
    with pytest.raises(ConfigError) as started, caplog.at_level(logging.WARNING):
        build_text_data(wrong, batch_size=2, peer_seed=1, peer_id="me", live_peers=lambda: ["me"],
                        cache_dir=tmp_path / "cache")
    assert [str(started.value)] == problems, "config check says what the node would"
    good = TaskSection(data_path=str(_corpus(tmp_path / "good", "text")), seq_len=SEQ)
    assert data_problems(good, tmp_path / "cache") == []
    assert data_problems(TaskSection(data_path=str(tmp_path / "good" / "part-0.jsonl.gz")), tmp_path / "cache")[0] \
        .startswith("task.data_path: ")


def test_config_check_fails_on_a_corpus_with_the_wrong_field(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", "content")
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[task]\ndata_path = "{corpus}"\n')
    result = subprocess.run([sys.executable, "-m", "p2ptrain.cli", "config", "check", str(config)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == EX_CONFIG, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert re.search(r"task.text_field: part-\d.jsonl.gz: no 'text' field", result.stderr)
