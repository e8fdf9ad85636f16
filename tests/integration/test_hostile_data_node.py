"""A real node fed hostile training data by a data host on 127.0.0.1 keeps training, in bounded memory.

The shard index lists good JSONL shards next to three attacks: a JSONL line nested 100,000 deep (a
RecursionError for the JSON decoder), a Parquet file of a few KB holding one zstd-compressed row of
96 MiB, and a shard larger than ``task.max_shard_mb``.  The node's RSS is read from /proc before its
data is built (its first status, while it joins) and its peak RSS once it has trained on past all of
them; the log must name each bad shard.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.integration.conftest import TINY_TASK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MIB = 1 << 20
BAD = ("deep.jsonl", "bomb.parquet", "big.jsonl")


@pytest.fixture
def data_host(tmp_path: Path) -> Iterator[str]:
    """The URL of a SHA256SUMS index of good shards and the three bad ones, served from 127.0.0.1."""
    files: dict[str, bytes] = {}
    rng = random.Random(0)
    words = ("def", "return", "self", "value", "index", "shard", "swarm", "peer", "epoch", "round", "data", "node")
    for i in range(10):
        lines = (json.dumps({"text": " ".join(rng.choice(words) for _ in range(12)), "id": j}) for j in range(60))
        files[f"part-{i:02d}.jsonl"] = ("\n".join(lines) + "\n").encode()
    files["deep.jsonl"] = ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n").encode() + files["part-00.jsonl"]
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["a" * (96 * MIB)]}), bomb, compression="zstd")
    files["bomb.parquet"] = bomb.read_bytes()
    files["big.jsonl"] = files["part-01.jsonl"] * (2 * MIB // len(files["part-01.jsonl"]) + 1)  # > 1 MiB
    files["SHA256SUMS"] = "".join(f"{hashlib.sha256(body).hexdigest()}  {name}\n"
                                  for name, body in sorted(files.items())).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            body = files.get(self.path.lstrip("/"))
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            with contextlib.suppress(OSError):  # a client refusing the body hangs up
                self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/SHA256SUMS"
    server.shutdown()
    server.server_close()


def _memory(pid: int) -> tuple[int, int]:
    """(RSS, peak RSS) of a process, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return tuple(int(re.search(rf"{key}:\s+(\d+)", status)[1]) * 1024 for key in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def test_a_node_fed_hostile_shards_keeps_training_in_bounded_memory_and_names_each(make_node, data_host):
    node = make_node("victim", task={**TINY_TASK, "data_path": data_host, "max_shard_mb": 1})
    node.start()
    node.wait_for(lambda s: True, 60, "a first status")  # answering, its data not built yet
    assert node.process is not None
    before, _ = _memory(node.process.pid)
    named: dict[str, str] = {}

    def all_named(status) -> bool:
        for line in node.log_path.read_text(errors="replace").splitlines():
            for shard in BAD:
                if shard in line and ("skipped" in line or "left out" in line or "malformed" in line):
                    named.setdefault(shard, line)
        return len(named) == len(BAD) and status.state == "training"

    status = node.wait_for(all_named, 150, "a line naming each bad shard")
    trained = status.samples_processed_total
    later = node.wait_for(lambda s: s.samples_processed_total >= trained + 64, 90, "more training")
    _, peak = _memory(node.process.pid)
    assert node.running
    assert "nested too deep to decode" in named["deep.jsonl"], named
    assert "skipped undecoded: a page of their text column decodes to" in named["bomb.parquet"], named
    assert "more than the 1048576 bytes allowed (task.max_shard_mb)" in named["big.jsonl"], named
    assert peak - before < 300 * MIB, (before, peak, named)
    assert later.data_shards_skipped_total + later.data_records_failed_total >= 1
    print(f"RSS before its data {before / MIB:.0f} MiB, peak after {peak / MIB:.0f} MiB "
          f"(+{(peak - before) / MIB:.0f} MiB)")
