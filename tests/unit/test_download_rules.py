"""What a data host may do to a volunteer's downloads: size caps, redirect schemes, address rules, a pinned index.

Servers run on 127.0.0.1 only.  A test that needs a *public* data host injects an address policy
that calls one server's address public (everything else keeps its real class), so "a public host
redirects to loopback" is a redirect from that server to another port on 127.0.0.1.  No test
connects anywhere but 127.0.0.1: a socket that tries is refused and recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from p2ptrain.config.schema import ConfigError, TaskSection
from p2ptrain.data.addresses import LINK_LOCAL, LOOPBACK, PRIVATE, PUBLIC, AddressPolicy, Refused, address_class
from p2ptrain.data.readers import ShardUnreadable
from p2ptrain.data.remote import ShardFetcher
from p2ptrain.data.sources import ShardRef
from p2ptrain.data.text import build_text_data, make_fetcher

torch.set_num_threads(1)

MIB = 1 << 20
METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"


class Server:
    """Files by path, redirects by path, bodies sent without a length, and a log of every request."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.redirects: dict[str, str] = {}
        self.no_length: set[str] = set()
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                server.requests.append(self.path)
                if self.path in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = server.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                if self.path in server.no_length:
                    self.send_header("Connection", "close")
                else:
                    self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client hung up, as it should past a size cap
                    self.wfile.write(body or b"")
                if self.path in server.no_length:
                    self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    """A data host and another service on this machine."""
    running = (Server(), Server())
    yield running
    for server in running:
        server.httpd.shutdown()
        server.httpd.server_close()


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every address a socket tried to connect to; anything but 127.0.0.1 is refused without a packet sent."""
    attempts: list[tuple[str, int]] = []

    class Recording(socket.socket):
        def connect(self, address: object) -> None:
            attempts.append(address)  # type: ignore[arg-type]
            if not (isinstance(address, tuple) and address[0] == "127.0.0.1"):
                raise ConnectionRefusedError(f"the test allows 127.0.0.1 only, not {address}")
            super().connect(address)

    monkeypatch.setattr(socket, "socket", Recording)
    return attempts


def _public(server: Server) -> AddressPolicy:
    """Treat ``server`` as a public host; every other address keeps its real class."""
    return AddressPolicy(lambda ip, port: PUBLIC if (ip, port) == ("127.0.0.1", server.port)
                         else address_class(ip, port))


def _fetcher(tmp_path: Path, **kwargs: object) -> ShardFetcher:
    return ShardFetcher(tmp_path / "cache", attempts=3, timeout=5.0, sleep=lambda _: None, **kwargs)  # type: ignore[arg-type]


def _jsonl(tag: str, count: int = 40) -> bytes:
    return "".join(json.dumps({"text": f"{tag} line {j} " * 3}) + "\n" for j in range(count)).encode()


def _shard(url: str, origin: str = "") -> ShardRef:
    return ShardRef(url.rsplit("/", 1)[-1], "jsonl", url=url, origin=origin)


# ---------------------------------------------------------------------- the address rule itself


@pytest.mark.parametrize(("ip", "kind"), [
    ("8.8.8.8", PUBLIC), ("2001:4860:4860::8888", PUBLIC), ("10.1.2.3", PRIVATE), ("192.168.0.9", PRIVATE),
    ("100.64.0.1", PRIVATE), ("fd00:ec2::254", PRIVATE), ("127.0.0.1", LOOPBACK), ("::1", LOOPBACK),
    ("0.0.0.0", LOOPBACK), ("::ffff:127.0.0.1", LOOPBACK), ("169.254.169.254", LINK_LOCAL),
    ("fe80::1%eth0", LINK_LOCAL),
])
def test_address_classes(ip: str, kind: str) -> None:
    assert address_class(ip) == kind


@pytest.mark.parametrize(("reach", "ip", "allowed"), [
    (None, "10.0.0.5", True), (None, "127.0.0.1", True), (None, "169.254.169.254", False),
    ("public", "8.8.4.4", True), ("public", "10.0.0.5", False), ("public", "127.0.0.1", False),
    ("public", "169.254.169.254", False), ("private", "10.0.0.6", True), ("private", "8.8.4.4", True),
    ("private", "127.0.0.1", False), ("loopback", "127.0.0.1", True), ("loopback", "10.0.0.5", False),
])
def test_a_chain_reaches_public_addresses_or_stays_in_its_own_network(reach: str | None, ip: str,
                                                                       allowed: bool) -> None:
    policy = AddressPolicy()
    if allowed:
        policy.check(reach, "host", ip, 80)
    else:
        with pytest.raises(Refused):
            policy.check(reach, "host", ip, 80)


# ---------------------------------------------------------------------- the size cap


def test_a_shard_announced_larger_than_the_cap_is_refused_before_its_body(servers: tuple[Server, Server],
                                                                          tmp_path: Path) -> None:
    host, _ = servers
    host.files["/big.jsonl"] = b"x" * (3 * MIB)
    fetcher = _fetcher(tmp_path, max_shard_bytes=MIB)
    with pytest.raises(ShardUnreadable, match=r"^3145728 bytes announced, more than the 1048576 bytes allowed "
                                              r"\(task\.max_shard_mb\)$"):
        fetcher.local_path(_shard(f"{host.url}/big.jsonl"))
    with pytest.raises(ShardUnreadable, match="refused earlier"):  # the next pass asks nobody
        fetcher.local_path(_shard(f"{host.url}/big.jsonl"))
    assert host.requests == ["/big.jsonl"] and list((tmp_path / "cache").iterdir()) == []


def test_a_shard_that_streams_past_the_cap_is_cut_off(servers: tuple[Server, Server], tmp_path: Path) -> None:
    host, _ = servers
    host.files["/big.jsonl"] = b"x" * (3 * MIB)
    host.no_length.add("/big.jsonl")
    fetcher = _fetcher(tmp_path, max_shard_bytes=MIB)
    with pytest.raises(ShardUnreadable, match=r"larger than announced: more than the 1048576 bytes allowed"):
        fetcher.local_path(_shard(f"{host.url}/big.jsonl"))
    assert host.requests == ["/big.jsonl"] and list((tmp_path / "cache").iterdir()) == []


def test_the_cap_is_task_max_shard_mb(tmp_path: Path) -> None:
    assert make_fetcher(TaskSection(max_shard_mb=3), tmp_path).max_shard_bytes == 3 * MIB
    assert TaskSection().max_shard_mb == 1024


# ---------------------------------------------------------------------- redirects


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1:9/part.jsonl", "gopher://x/1"])
def test_redirects_are_followed_over_http_only(servers: tuple[Server, Server], tmp_path: Path,
                                               location: str) -> None:
    host, _ = servers
    host.redirects["/part.jsonl"] = location
    scheme = location.split(":", 1)[0]
    with pytest.raises(ShardUnreadable, match=rf"^refused: redirected to a {scheme} URL .*; only http\(s\) "
                                              r"redirects are followed$"):
        _fetcher(tmp_path).local_path(_shard(f"{host.url}/part.jsonl"))
    assert host.requests == ["/part.jsonl"]  # refused, not retried


def test_a_public_host_cannot_redirect_to_this_machine_or_its_metadata_service(
    servers: tuple[Server, Server], tmp_path: Path, connections: list[tuple[str, int]]
) -> None:
    host, local = servers
    local.files["/secret"] = b"only for this machine"
    host.redirects["/a.jsonl"] = f"{local.url}/secret"
    host.redirects["/b.jsonl"] = METADATA
    fetcher = _fetcher(tmp_path, policy=_public(host))
    with pytest.raises(ShardUnreadable, match=r"^refused: 127\.0\.0\.1 is a loopback address, reached from a "
                                              r"public one; a data host there may send a download on to public "
                                              r"addresses only$"):
        fetcher.local_path(_shard(f"{host.url}/a.jsonl"))
    with pytest.raises(ShardUnreadable, match=r"^refused: 169\.254\.169\.254 is a link-local address, reached "
                                              r"from a public one"):
        fetcher.local_path(_shard(f"{host.url}/b.jsonl"))
    assert local.requests == [] and all(address[0] == "127.0.0.1" for address in connections)
    assert host.requests == ["/a.jsonl", "/b.jsonl"]


def test_a_host_may_redirect_within_its_own_network(servers: tuple[Server, Server], tmp_path: Path) -> None:
    host, mirror = servers  # both loopback: a data host on this machine (or a LAN) moving a file next door
    mirror.files["/part.jsonl"] = _jsonl("mirror")
    host.redirects["/part.jsonl"] = f"{mirror.url}/part.jsonl"
    path = _fetcher(tmp_path).local_path(_shard(f"{host.url}/part.jsonl"))
    assert path.read_bytes() == _jsonl("mirror")


def test_the_data_path_may_not_name_a_link_local_address(tmp_path: Path,
                                                         connections: list[tuple[str, int]]) -> None:
    with pytest.raises(ShardUnreadable, match=r"^refused: 169\.254\.169\.254 is a link-local address .*; data "
                                              r"is never read from one$"):
        _fetcher(tmp_path).local_path(_shard(METADATA + "x.jsonl"))
    assert connections == []


# ---------------------------------------------------------------------- index lines


def test_index_lines_from_a_public_host_cannot_name_this_machine_or_its_metadata_service(
    servers: tuple[Server, Server], tmp_path: Path, connections: list[tuple[str, int]],
    caplog: pytest.LogCaptureFixture
) -> None:
    host, local = servers
    lines = []
    for i in range(6):
        body = _jsonl(f"part{i}")
        host.files[f"/data/part-{i}.jsonl"] = body
        lines.append(f"{hashlib.sha256(body).hexdigest()}  part-{i}.jsonl")
    local.files["/admin.jsonl"] = _jsonl("admin")
    lines += [f"{local.url}/admin.jsonl", METADATA + "role.jsonl"]
    host.files["/data/SHA256SUMS"] = ("\n".join(lines) + "\n").encode()
    fetcher = _fetcher(tmp_path, policy=_public(host))
    cfg = TaskSection(data_path=f"{host.url}/data/SHA256SUMS", seq_len=16, d_model=16, n_heads=2,
                      validation_fraction=0.2, buffer_mb=1)
    with caplog.at_level(logging.WARNING):
        data = build_text_data(cfg, batch_size=4, peer_seed=1, peer_id="a", live_peers=lambda: ["a"],
                               fetcher=fetcher)
        while data.stream.pass_number == 0:
            data.stream.next()
    assert local.requests == [] and all(address[0] == "127.0.0.1" for address in connections)
    refused = [r.getMessage() for r in caplog.records if "refused: " in r.getMessage()]
    assert any("admin.jsonl" in line and "loopback address, reached from a public one" in line for line in refused)
    assert any("role.jsonl" in line and "169.254.169.254 is a link-local address" in line for line in refused)
    coverage = data.stream.last_pass_coverage()
    # Every good training shard read, the bad ones skipped (either may land in the validation split: its
    # name holds the local server's port, which the split hashes).
    assert coverage is not None and coverage.skipped_this_pass
    assert not any("admin" in name or "role" in name for name in coverage.consumed)
    assert len(coverage.consumed) + len(coverage.skipped_this_pass) == coverage.shards_total


# ---------------------------------------------------------------------- the index pin


def _index(host: Server) -> bytes:
    body = _jsonl("pinned")
    host.files["/data/part-0.jsonl"] = host.files["/data/part-1.jsonl"] = body
    listing = "".join(f"{hashlib.sha256(body).hexdigest()}  part-{i}.jsonl\n" for i in range(2)).encode()
    host.files["/data/SHA256SUMS"] = listing
    return listing


def test_a_pin_on_the_index_url_is_checked(servers: tuple[Server, Server], tmp_path: Path) -> None:
    host, _ = servers
    listing = _index(host)
    good, bad = hashlib.sha256(listing).hexdigest(), "0" * 64
    cfg = TaskSection(data_path=f"{host.url}/data/SHA256SUMS#sha256={bad}", seq_len=16, d_model=16, n_heads=2,
                      buffer_mb=1)
    with pytest.raises(ConfigError, match=rf"^task\.data_path: cannot download the shard index {host.url}/data/"
                                          rf"SHA256SUMS: checksum mismatch: expected sha256 0000000000000000\.\.\., "
                                          rf"got {good[:16]}\.\.\.$"):
        build_text_data(cfg, batch_size=4, peer_seed=1, peer_id="a", live_peers=lambda: ["a"],
                        fetcher=_fetcher(tmp_path))
    pinned = cfg.model_copy(update={"data_path": f"{host.url}/data/SHA256SUMS#sha256={good}"})
    data = build_text_data(pinned, batch_size=4, peer_seed=1, peer_id="a", live_peers=lambda: ["a"],
                           fetcher=_fetcher(tmp_path))
    assert data.source == f"{host.url}/data/SHA256SUMS"


def test_a_cached_index_must_match_its_pin_too(servers: tuple[Server, Server], tmp_path: Path) -> None:
    host, _ = servers
    listing = _index(host)
    fetcher = _fetcher(tmp_path)
    good = hashlib.sha256(listing).hexdigest()
    fetcher.read_index(f"{host.url}/data/SHA256SUMS", good)
    cached = next((tmp_path / "cache").glob("index-*"))
    cached.write_bytes(listing + b"part-9.jsonl\n")  # changed on disk since
    host.files.pop("/data/SHA256SUMS")  # and the server is gone
    with pytest.raises(ConfigError, match=rf"has sha256 [0-9a-f]{{64}}, not {good} as pinned$"):
        fetcher.read_index(f"{host.url}/data/SHA256SUMS", good)
