"""Data in object stores (s3://, gs://, hf://...) through fsspec, with the rules of http(s) downloads.

No store is reached: fsspec's in-memory filesystem stands in for S3 under the ``s3`` protocol, so the
code path is the one a real bucket takes (fsspec's ``url_to_fs``, ``size``, ``open``), and the store's
client is the only part replaced.
"""

from __future__ import annotations

import gzip
import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from p2ptrain.config.schema import ConfigError, TaskSection, parse_config
from p2ptrain.data import object_store
from p2ptrain.data.blocks import ShardUnreadable
from p2ptrain.data.remote import ShardFetcher
from p2ptrain.data.sources import discover, index_shards, join_url
from p2ptrain.data.text import build_text_data, make_fetcher
from p2ptrain.run.manifest import is_data_url

torch.set_num_threads(1)


class FakeS3(MemoryFileSystem):
    """An in-memory bucket store under the s3 protocol (its own store, not the memory:// one)."""

    protocol = "s3"
    store: dict[str, Any] = {}
    pseudo_dirs = [""]
    opened = 0
    fail_next = 0

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(path.removeprefix("s3://")))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        type(self).opened += 1
        if type(self).fail_next:
            type(self).fail_next -= 1
            raise RuntimeError("SlowDown: please reduce your request rate")
        return super()._open(path, mode, **kwargs)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> type[FakeS3]:
    registry = sys.modules["fsspec.registry"]
    monkeypatch.setitem(registry._registry, "s3", FakeS3)  # type: ignore[attr-defined]
    FakeS3.store.clear()
    FakeS3.opened = FakeS3.fail_next = 0
    FakeS3.clear_instance_cache()
    return FakeS3


def _put(path: str, data: bytes) -> str:
    with FakeS3().open(path, "wb") as out:
        out.write(data)
    return hashlib.sha256(data).hexdigest()


def _corpus() -> str:
    """Three shards (one gzipped) and their index in s3://bucket/corpus/."""
    lines = []
    for i in range(3):
        text = "".join(f"object {i} line {j} abcdefgh\n" for j in range(80)).encode()
        name, body = (f"part-{i}.txt.gz", gzip.compress(text)) if i == 2 else (f"part-{i}.txt", text)
        lines.append(f"{_put(f'bucket/corpus/{name}', body)}  {name}")
    _put("bucket/corpus/SHA256SUMS", ("\n".join(lines) + "\n").encode())
    return "s3://bucket/corpus/SHA256SUMS"


def _no_sleep(_: float) -> None:
    pass


def test_a_corpus_in_a_bucket_trains_through_its_index(s3, tmp_path: Path) -> None:
    index = _corpus()
    task = TaskSection(data_path=index, seq_len=16, buffer_mb=1, validation_batches=1)
    data = build_text_data(task, batch_size=4, peer_seed=1, peer_id="me", live_peers=lambda: ["me"],
                           cache_dir=tmp_path / "cache")
    text = b"".join(bytes(row.to(torch.uint8).tolist()) for _ in range(30) for row in data.stream.next())
    assert set(text) <= set(b"object line abcdefgh0123456789\n") and b"abcdefgh" in text  # text, not gzip bytes
    shards = discover(index, "auto", 16, make_fetcher(task, tmp_path / "cache").read_index).shards
    assert [s.url for s in shards] == [f"s3://bucket/corpus/part-{i}.txt" + (".gz" if i == 2 else "")
                                       for i in range(3)]
    assert all(len(s.sha256) == 64 for s in shards)


def test_an_object_is_checked_capped_and_cached_like_a_download(s3, tmp_path: Path) -> None:
    body = b"abc\n" * 1000
    digest = _put("bucket/one.txt", body)
    fetcher = ShardFetcher(tmp_path / "cache", sleep=_no_sleep)
    [shard] = index_shards(f"{digest}  one.txt\n", "s3://bucket/SHA256SUMS", "auto")
    assert fetcher.local_path(shard).read_bytes() == body
    opened = s3.opened
    assert fetcher.local_path(shard).read_bytes() == body and s3.opened == opened  # from the cache
    [wrong] = index_shards(f"{'0' * 64}  one.txt\n", "s3://bucket/SHA256SUMS", "auto")
    with pytest.raises(ShardUnreadable, match="checksum mismatch"):
        ShardFetcher(tmp_path / "other", sleep=_no_sleep).local_path(wrong)
    capped = ShardFetcher(tmp_path / "capped", max_shard_bytes=1000, sleep=_no_sleep)
    opened = s3.opened
    with pytest.raises(ShardUnreadable, match=r"4000 bytes announced, more than the 1000 bytes allowed"):
        capped.local_path(shard)
    assert list((tmp_path / "capped").iterdir()) == []  # nothing kept, not even a part
    assert s3.opened == opened + 1  # opened to learn its size, never read past the cap


def test_a_missing_object_is_not_retried_and_a_store_hiccup_is(s3, tmp_path: Path) -> None:
    waits: list[float] = []
    fetcher = ShardFetcher(tmp_path / "cache", sleep=waits.append)
    [missing] = index_shards("gone.txt\n", "s3://bucket/SHA256SUMS", "auto")
    with pytest.raises(ShardUnreadable, match="FileNotFoundError"):
        fetcher.local_path(missing)
    assert waits == []
    _put("bucket/flaky.txt", b"xyz\n" * 10)
    [flaky] = index_shards("flaky.txt\n", "s3://bucket/SHA256SUMS", "auto")
    s3.fail_next = 1
    assert fetcher.local_path(flaky).read_bytes() == b"xyz\n" * 10
    assert len(waits) == 1  # one retry after the throttled try


def test_an_index_lists_only_what_is_within_its_reach() -> None:
    with pytest.raises(ConfigError, match=r"line 1: s3://victim/private\.txt is out of this index's reach"):
        index_shards("s3://victim/private.txt\n", "https://data.example.org/SHA256SUMS", "auto")
    with pytest.raises(ConfigError, match=r"line 2: gs://bucket/x\.txt is out of this index's reach"):
        index_shards("a.txt\ngs://bucket/x.txt\n", "s3://bucket/SHA256SUMS", "auto")
    with pytest.raises(ConfigError, match=r"line 1: s3://other/x\.txt is out of this index's reach"):
        index_shards("s3://other/x.txt\n", "s3://bucket/SHA256SUMS", "auto")
    assert join_url("s3://bucket/a/b/SHA256SUMS", "../c/d.txt") == "s3://bucket/a/c/d.txt"
    assert join_url("s3://bucket/SHA256SUMS", "../../d.txt") == "s3://bucket/d.txt"  # never above the bucket


def test_a_missing_store_client_is_one_config_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    def missing(protocol: str) -> Any:
        raise ImportError(f"Install s3fs to access {protocol}")

    monkeypatch.setattr(fsspec, "get_filesystem_class", missing)
    with pytest.raises(ConfigError) as info:
        discover("s3://bucket/corpus/SHA256SUMS", "auto", 16, lambda url, sha: b"")
    assert str(info.value) == "task.data_path: s3:// URLs need fsspec and s3fs: pip install 'p2ptrain[cloud]'"


def test_store_urls_are_data_urls_and_other_schemes_are_refused_in_one_line() -> None:
    assert parse_config({"task": {"data_path": "gs://bucket/corpus/SHA256SUMS"}}, "n.toml").task.data_path
    assert is_data_url("hf://datasets/someone/corpus/train.jsonl") and not is_data_url("/data/corpus")
    with pytest.raises(ConfigError, match=r"task\.data_path: cannot read a ftp:// URL \(these can be read: "
                                          r"http://, https://, s3://, gs://, gcs://, hf://, az://, abfs://\)"):
        parse_config({"task": {"data_path": "ftp://host/corpus.txt"}}, "n.toml")
    assert object_store.CLIENT_PACKAGES["hf"] == "huggingface_hub"
