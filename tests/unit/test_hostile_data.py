"""Data files built to hurt a reader: each one costs a skipped, counted record or shard, never the node.

The memory checks run the read in a fresh Python process and compare its peak RSS before and after
(``/proc/self/clear_refs``), as ``test_data_memory`` does.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from p2ptrain.data.parquet import MIN_PAGE_BUDGET
from p2ptrain.data.readers import read_block, read_prefix
from p2ptrain.data.sources import ShardRef, discover
from p2ptrain.data.stream import FAILED_RECORDS_LIMIT, ShardStream

torch.set_num_threads(1)

SEQ = 16
MIB = 1 << 20
#: One JSON line nested 100,000 deep: 200 KB, and a RecursionError for ``json.loads``.
DEEP = ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()

CHILD = r"""
import json, re, sys
from pathlib import Path
from p2ptrain.data.readers import read_block
from p2ptrain.data.sources import ShardRef

def peak():
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read())[1]) * 1024

path = Path(sys.argv[1])
shard = ShardRef(path.name, "parquet", path=str(path))
read_block(shard, Path(sys.argv[2]), 0, 64, "text")  # imports and warms pyarrow on a small file
open("/proc/self/clear_refs", "w").write("5")
base = peak()
read = read_block(shard, path, 0, 2 << 20, "text")
print(json.dumps({"growth": peak() - base, "text": len(read.data), "failed": read.failed_records,
                  "reasons": [f.reason for f in read.failures], "next": read.next_offset}))
"""


def _records(tag: str, count: int = 30) -> list[str]:
    return [json.dumps({"text": f"{tag} record {i}: " + "lorem ipsum dolor sit amet " * 3}) for i in range(count)]


def _no_index(url: str, sha256: str) -> bytes:
    raise AssertionError("no index expected")


def _stream(root: Path, block: int = 4 * MIB) -> ShardStream:
    shards = discover(str(root), "auto", SEQ, _no_index).shards
    return ShardStream(shards, seq_len=SEQ, batch_size=4, peer_seed=3, peer_id="a", live_peers=lambda: ["a"],
                       block_bytes=block)


def _pass(stream: ShardStream) -> None:
    while stream.pass_number == 0:
        stream.next()


def _peak_growth(tmp_path: Path, path: Path) -> dict[str, object]:
    small = tmp_path / "small.parquet"
    pq.write_table(pa.table({"text": ["warm up"] * 10}), small)
    result = subprocess.run([sys.executable, "-c", CHILD, str(path), str(small)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_jsonl_line_nested_100000_deep_is_one_skipped_record_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "c"
    root.mkdir()
    for i in range(4):
        (root / f"good{i}.jsonl").write_text("\n".join(_records(f"good{i}")) + "\n")
    before = "\n".join(_records("before", 5)) + "\n"
    (root / "deep.jsonl").write_bytes(before.encode() + DEEP + b"\n" + "\n".join(_records("after")).encode() + b"\n")
    stream = _stream(root)
    with caplog.at_level(logging.WARNING):
        _pass(stream)
    coverage = stream.last_pass_coverage()
    assert coverage is not None and coverage.failed_records_total == 1 and coverage.malformed_total == 0
    assert "deep.jsonl" in coverage.consumed  # the records after it were read
    # One line per pass (the batch that ends pass 0 begins pass 1, which meets the line again).
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert lines and all(line.startswith(f"shard deep.jsonl: record skipped: the line at byte {len(before)} is "
                                         "nested too deep to decode") for line in lines), lines


def test_a_restart_at_the_nested_line_reads_on_past_it(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_bytes(DEEP + b"\n" + "\n".join(_records("after")).encode() + b"\n")
    shard = ShardRef("deep.jsonl", "jsonl", path=str(path))
    read = read_block(shard, path, 0, 4096, "text")  # the position a crash-looping node resumed at
    assert read.failed_records == 1 and b"after record 0" in read.data and read.next_offset > len(DEEP)
    assert b"after record 0" in read_prefix(shard, path, 1024, 4096, "text")


def test_a_shard_whose_records_keep_failing_is_skipped_for_the_pass(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    for i in range(4):
        (root / f"good{i}.jsonl").write_text("\n".join(_records(f"good{i}")) + "\n")
    (root / "deep.jsonl").write_bytes((DEEP + b"\n") * (FAILED_RECORDS_LIMIT + 10))
    stream = _stream(root)
    _pass(stream)
    coverage = stream.last_pass_coverage()
    assert coverage is not None and coverage.skipped_this_pass == ("deep.jsonl",)
    assert coverage.failed_records_total == FAILED_RECORDS_LIMIT and coverage.malformed_total == 1


def test_any_exception_in_a_block_skips_the_shard_not_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "c"
    root.mkdir()
    for i in range(4):
        (root / f"part{i}.parquet").parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"text": [f"part {i} row {j} " * 4 for j in range(40)]}), root / f"part{i}.parquet")
    stream = _stream(root)
    import p2ptrain.data.readers as readers

    real = readers.parquet_block

    def flaky(shard: ShardRef, *args: object) -> object:
        if shard.id == "part2.parquet":
            raise RecursionError("maximum recursion depth exceeded")
        return real(shard, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(readers, "parquet_block", flaky)
    with caplog.at_level(logging.WARNING):
        _pass(stream)
    coverage = stream.last_pass_coverage()
    assert coverage is not None and coverage.skipped_this_pass == ("part2.parquet",)
    assert any("part2.parquet is malformed" in r.getMessage() and "at row 0" in r.getMessage()
               and "RecursionError" in r.getMessage() for r in caplog.records)


def test_a_parquet_bomb_is_skipped_undecoded(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["a" * (96 * MIB)]}), bomb, compression="zstd")
    assert bomb.stat().st_size < 8 * 1024  # 96 MiB of text in a few KB
    measured = _peak_growth(tmp_path, bomb)
    assert measured["text"] == 0 and measured["failed"] == 1 and measured["next"] == 1, measured
    assert "skipped undecoded: a page of their text column decodes to" in str(measured["reasons"])
    assert measured["growth"] < 32 * MIB, measured  # decoding it whole took +593 MiB


def test_a_long_value_repeated_by_its_dictionary_is_decoded_a_few_rows_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "repeat.parquet"
    value = "b" * (MIB - 64)
    column = pa.DictionaryArray.from_arrays(pa.array([0] * 20_000, pa.int32()), pa.array([value]))
    # Without the stored Arrow schema the column reads back as plain strings: every row one copy.
    pq.write_table(pa.table({"text": column}), path, compression="zstd", store_schema=False)
    measured = _peak_growth(tmp_path, path)
    assert measured["failed"] == 0 and measured["text"] >= 2 * MIB, measured
    assert measured["growth"] < 160 * MIB, measured  # 512 rows at a time were 512 MiB


def test_a_parquet_row_over_the_record_budget_is_skipped_by_its_length(tmp_path: Path) -> None:
    path = tmp_path / "long.parquet"
    rows = ["short row one", "x" * (3 * MIB), "short row two", None]
    pq.write_table(pa.table({"text": rows}), path)
    shard = ShardRef("long.parquet", "parquet", path=str(path))
    read = read_block(shard, path, 0, 64 * 1024, "text")  # records up to 128 KiB
    assert bytes(read.data) == b"short row one\nshort row two\n" and read.at_end
    assert read.bad_records == 1 and [f.offset for f in read.failures] == [1]
    assert "row 1 holds 3145728 bytes of text, more than the 131072 a record may have" in read.failures[0].reason
    assert 3 * MIB < MIN_PAGE_BUDGET  # decoded (its page is within the budget) but never made a Python string


@pytest.mark.parametrize(("tail", "message"), [
    (b"\xff\xff\xff\x7fPAR1", "its footer claims 2147483647 bytes"),
    (b"\x00\x00\x00\x00JUNK", "no PAR1 at its end"),
])
def test_a_parquet_footer_is_bounded_before_it_is_parsed(tmp_path: Path, tail: bytes, message: str) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1" + b"\x00" * 100 + tail)
    shard = ShardRef("bad.parquet", "parquet", path=str(path))
    with pytest.raises(Exception, match=message) as info:
        read_block(shard, path, 0, 4096, "text")
    assert type(info.value).__name__ == "ShardMalformed"


def test_a_held_out_shard_names_its_skipped_records(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from p2ptrain.data.corpus import validation_text
    from p2ptrain.data.stream import LocalFiles

    path = tmp_path / "deep.jsonl"
    path.write_bytes(DEEP + b"\n" + "\n".join(_records("after")).encode() + b"\n")
    with caplog.at_level(logging.WARNING):
        text = validation_text([ShardRef("deep.jsonl", "jsonl", path=str(path))], LocalFiles(), 4096, 4 * MIB, "text")
    assert text.startswith(b"after record 0")
    assert [r.getMessage() for r in caplog.records] == [
        "validation shard deep.jsonl: 1 record(s) skipped, the first: the line at byte 0 is nested too deep to decode"]
