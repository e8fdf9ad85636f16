"""Shards at http(s) URLs, served by a local ``http.server`` on 127.0.0.1: cache, checksum, retry, skip."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from p2ptrain.config.schema import ConfigError, TaskSection
from p2ptrain.data.readers import ShardUnreadable
from p2ptrain.data.remote import NotDownloaded, ShardFetcher
from p2ptrain.data.sources import discover, url_shard
from p2ptrain.data.text import build_text_data

torch.set_num_threads(1)


class Server:
    """Files by path, per-path forced status codes, and a log of every request."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.status: dict[str, int] = {}
        self.requests: list[str] = []
        #: Paths whose next N answers announce the whole body but send only half, then hang up.
        self.truncate: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                server.requests.append(self.path)
                code = server.status.get(self.path, 200 if self.path in server.files else 404)
                body = server.files.get(self.path, b"") if code == 200 else b"no"
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.truncate.get(self.path, 0) > 0:
                    server.truncate[self.path] -= 1
                    body = body[: len(body) // 2]
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def count(self, path: str) -> int:
        return self.requests.count(path)


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


def _shard_text(i: int) -> bytes:
    return "".join(json.dumps({"text": f"remote shard {i} line {j} " * 2}) + "\n" for j in range(40)).encode()


def _publish(server: Server, count: int, *, corrupt: int | None = None, missing: int | None = None) -> str:
    """Shards /data/part-N.jsonl and a SHA256SUMS index listing them (relative names)."""
    lines = []
    for i in range(count):
        body = _shard_text(i)
        lines.append(f"{hashlib.sha256(body).hexdigest()}  part-{i}.jsonl")
        if i == corrupt:
            body = body.replace(b"remote", b"tamper")
        if i != missing:
            server.files[f"/data/part-{i}.jsonl"] = body
    server.files["/data/SHA256SUMS"] = ("# shards of the test corpus\n" + "\n".join(lines) + "\n").encode()
    return f"{server.url}/data/SHA256SUMS"


def _fetcher(tmp_path: Path, **kwargs: object) -> ShardFetcher:
    waits: list[float] = []
    fetcher = ShardFetcher(tmp_path / "cache", attempts=3, timeout=5.0, sleep=waits.append, **kwargs)  # type: ignore[arg-type]
    fetcher.waits = waits  # type: ignore[attr-defined]
    return fetcher


def _data(url: str, fetcher: ShardFetcher):
    cfg = TaskSection(data_path=url, seq_len=16, d_model=16, n_heads=2, validation_fraction=0.2, buffer_mb=1)
    return build_text_data(cfg, batch_size=4, peer_seed=1, peer_id="a", live_peers=lambda: ["a"], fetcher=fetcher)


def _pass(stream) -> None:
    while stream.pass_number == 0:
        stream.next()


def test_an_index_of_urls_trains_from_a_verified_cache(server: Server, tmp_path: Path) -> None:
    index = _publish(server, 6)
    fetcher = _fetcher(tmp_path)
    data = _data(index, fetcher)
    _pass(data.stream)
    coverage = data.stream.last_pass_coverage()
    assert coverage is not None and coverage.skipped_total == 0
    assert len(coverage.consumed) == coverage.shards_total >= 3
    assert data.validation
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert not any(name.startswith(".part-") for name in cached)
    first = len(server.requests)
    again = _data(index, fetcher)  # a restart: only the index is asked for again
    _pass(again.stream)
    assert server.requests[first:] == ["/data/SHA256SUMS"]


def test_a_failing_url_is_retried_with_backoff_then_skipped(server: Server, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    index = _publish(server, 6)
    fetcher = _fetcher(tmp_path)
    data = _data(index, fetcher)
    victim = next(iter(sorted(data.stream._shards)))
    server.status[f"/data/{victim}"] = 503
    with caplog.at_level(logging.WARNING):
        _pass(data.stream)
    assert server.count(f"/data/{victim}") == 3
    assert fetcher.waits == [1.0, 2.0]  # type: ignore[attr-defined]
    coverage = data.stream.last_pass_coverage()
    assert coverage is not None and coverage.skipped_total == 1 and coverage.skipped_this_pass == (victim,)
    line = next(r.getMessage() for r in caplog.records if victim in r.getMessage())
    assert "skipped this pass: download failed 3 time(s), last: HTTP 503" in line and "\n" not in line


def test_not_found_is_not_retried_and_a_checksum_mismatch_only_once(server: Server, tmp_path: Path) -> None:
    fetcher = _fetcher(tmp_path)
    server.files["/x/good.txt"] = b"hello " * 50
    digest = hashlib.sha256(server.files["/x/good.txt"]).hexdigest()
    assert fetcher.local_path(url_shard(f"{server.url}/x/good.txt#sha256={digest}", "auto")).read_bytes() == (
        b"hello " * 50)
    with pytest.raises(ShardUnreadable, match="HTTP 404"):
        fetcher.local_path(url_shard(f"{server.url}/x/missing.txt", "auto"))
    assert server.count("/x/missing.txt") == 1 and fetcher.waits == []  # type: ignore[attr-defined]
    with pytest.raises(ShardUnreadable, match="checksum mismatch: expected sha256 0000000000000000"):
        fetcher.local_path(url_shard(f"{server.url}/x/good.txt#sha256={'0' * 64}", "auto"))
    assert server.count("/x/good.txt") == 1 + 2  # the mismatch was tried once more, not three times
    assert not any(p.name.startswith(".part-") for p in (tmp_path / "cache").iterdir())


def test_a_download_cut_short_is_retried_not_taken_for_a_whole_shard(server: Server, tmp_path: Path) -> None:
    fetcher = _fetcher(tmp_path)
    whole = b"".join(b"line %d of a shard without a checksum\n" % i for i in range(200))
    server.files["/x/plain.txt"] = server.files["/x/cut.txt"] = whole
    server.truncate["/x/plain.txt"] = 1  # the first answer hangs up half-way
    assert fetcher.local_path(url_shard(f"{server.url}/x/plain.txt", "auto")).read_bytes() == whole
    assert server.count("/x/plain.txt") == 2 and fetcher.waits == [1.0]  # type: ignore[attr-defined]
    server.truncate["/x/cut.txt"] = 99
    with pytest.raises(ShardUnreadable, match=r"download failed 3 time\(s\), last: the body ended after 3"):
        fetcher.local_path(url_shard(f"{server.url}/x/cut.txt", "auto"))
    assert sorted(p.read_bytes() == whole for p in (tmp_path / "cache").iterdir()) == [True]  # nothing partial


def test_a_tampered_shard_is_skipped_and_the_rest_trains(server: Server, tmp_path: Path) -> None:
    index = _publish(server, 8, corrupt=0, missing=1)
    data = _data(index, _fetcher(tmp_path))
    _pass(data.stream)
    coverage = data.stream.last_pass_coverage()
    assert coverage is not None
    lost = {"part-0.jsonl", "part-1.jsonl"} & set(data.stream._shards)
    assert set(coverage.skipped_this_pass) == lost and coverage.skipped_total == len(lost)
    assert len(coverage.consumed) == coverage.shards_total - len(lost)


def test_the_cache_is_trimmed_least_recently_used_first(server: Server, tmp_path: Path) -> None:
    fetcher = _fetcher(tmp_path, max_cache_bytes=2500)
    for name in ("a", "b", "c"):
        server.files[f"/{name}.txt"] = name.encode() * 1000
    paths = [fetcher.local_path(url_shard(f"{server.url}/{name}.txt", "auto")) for name in ("a", "b", "c")]
    assert [p.exists() for p in paths] == [False, True, True]


def test_unreachable_index_is_a_config_error_unless_cached(server: Server, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    fetcher = _fetcher(tmp_path)
    with pytest.raises(ConfigError, match=r"^task\.data_path: cannot download the shard index .*HTTP 404"):
        fetcher.read_index(f"{server.url}/none/SHA256SUMS")
    index = _publish(server, 4)
    fetcher.read_index(index)
    server.status["/data/SHA256SUMS"] = 500
    with caplog.at_level(logging.WARNING):
        assert b"part-0.jsonl" in fetcher.read_index(index)
    assert "using the copy cached" in caplog.text


@pytest.mark.parametrize(
    ("listing", "message"),
    [
        ("", "lists no shards"),
        ("file:///etc/passwd\n", r"line 1: only http\(s\) and object store URLs can be read, got .file:///etc/passwd."),
    ],
)
def test_bad_index_is_one_config_error(listing: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        discover("http://127.0.0.1:9/SHA256SUMS", "auto", 16, lambda url, sha256: listing.encode())


def test_bad_url_fragment_is_one_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^task\.data_path: the URL fragment must be #sha256="):
        url_shard("http://127.0.0.1:9/a.txt#md5=abc", "auto")


def test_an_offline_fetcher_reads_the_cache_and_asks_the_server_nothing(server: Server, tmp_path: Path) -> None:
    """What ``p2ptrain export`` scores the model with: the same validation batches from the cache, or
    NotDownloaded (never a quietly smaller held-out split) when something is missing."""
    index = _publish(server, 6)
    offline = _fetcher(tmp_path, offline=True)
    with pytest.raises(NotDownloaded, match="SHA256SUMS is not downloaded in"):
        _data(index, offline)
    online = _data(index, _fetcher(tmp_path))
    asked = len(server.requests)
    cached = _data(index, offline)
    assert server.requests[asked:] == []
    assert all(torch.equal(a, b) for a, b in zip(online.validation, cached.validation, strict=True))
    for shard in (tmp_path / "cache").iterdir():
        if not shard.name.startswith("index-"):
            shard.unlink()
    with pytest.raises(NotDownloaded, match="is not downloaded in"):
        _data(index, offline)
    assert server.requests[asked:] == []
