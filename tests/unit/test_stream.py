"""The shard stream: peers share a pass without overlap, restarts resume exactly, bad shards are skipped."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from p2ptrain.config.schema import ConfigError, TaskSection, TrainingSection
from p2ptrain.data.assign import clean_peers, owned_shards
from p2ptrain.data.readers import first_offset, read_block
from p2ptrain.data.sources import discover
from p2ptrain.data.stream import FAILED_RECORDS_LIMIT, Coverage, ShardStream
from p2ptrain.tasks import build_task

torch.set_num_threads(1)

SEQ = 16


def _corpus(root: Path, files: int = 12, lines: int = 40) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"doc{i:02d}.txt").write_text("".join(f"doc {i} line {j} of the corpus\n" for j in range(lines)))
    return root


def _no_index(url: str, sha256: str) -> bytes:
    raise AssertionError("no index expected")


def _stream(root: Path, peer: str = "a", peers: tuple[str, ...] = ("a",), *, block: int = 4096,
            batch: int = 4, peer_seed: int = 7) -> ShardStream:
    shards = discover(str(root), "auto", SEQ, _no_index).shards
    return ShardStream(shards, seq_len=SEQ, batch_size=batch, peer_seed=peer_seed, peer_id=peer,
                       live_peers=lambda: peers, block_bytes=block)


def _run_pass(stream: ShardStream) -> Coverage:
    """Read through pass 0; the coverage it reached."""
    while stream.pass_number == 0:
        stream.next()
    assert stream.coverage().pass_number == 1
    coverage = stream.last_pass_coverage()
    assert coverage is not None and coverage.pass_number == 0
    return coverage


def test_two_peers_read_disjoint_shards_and_cover_the_pass(tmp_path: Path) -> None:
    root = _corpus(tmp_path / "c", files=30)
    a, b = _stream(root, "peer-a", ("peer-a", "peer-b")), _stream(root, "peer-b", ("peer-b", "peer-a"))
    read_a, read_b = set(_run_pass(a).consumed), set(_run_pass(b).consumed)
    total = a.coverage().shards_total
    assert read_a and read_b and not read_a & read_b
    assert len(read_a | read_b) == total == 30
    # The next pass deals the shards out afresh.
    assert set(owned_shards(1, sorted(read_a | read_b), ["peer-a", "peer-b"], "peer-a")) != read_a


def test_a_peer_alone_reads_every_shard_each_pass(tmp_path: Path) -> None:
    stream = _stream(_corpus(tmp_path / "c"))
    coverage = _run_pass(stream)
    assert coverage.fraction == 1.0 and coverage.skipped_total == 0
    assert stream.coverage().to_dict()["pass"] == 1


def test_the_counts_of_past_passes_are_kept_newest_first_and_survive_a_restart(tmp_path: Path) -> None:
    root = _corpus(tmp_path / "c", files=20)
    stream = _stream(root, "peer-a", ("peer-a", "peer-b"))
    counts = []
    for pass_number in range(1, 10):
        while stream.pass_number < pass_number:
            stream.next()
        counts.insert(0, len(stream.last_pass_coverage().consumed))  # type: ignore[union-attr]
    assert stream.past_pass_shards() == tuple(counts[:7])  # a few passes, not the whole history
    assert len(set(counts)) > 1  # shares of a pass differ in size: peers' passes drift apart
    resumed = _stream(root, "peer-a", ("peer-a", "peer-b"))
    resumed.load_state_dict(stream.state_dict())
    assert resumed.past_pass_shards() == stream.past_pass_shards()
    older = {k: v for k, v in stream.state_dict().items() if k != "past_pass_shards"}  # saved before it existed
    resumed.load_state_dict(older)
    assert resumed.past_pass_shards() == () and resumed.pass_number == stream.pass_number
    assert stream.shard_ids == tuple(sorted(stream.shard_ids)) and len(stream.shard_ids) == 20


def test_a_node_passes_behind_its_peers_moves_on_to_their_pass(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    root = _corpus(tmp_path / "c")
    stream = _stream(root, "peer-b", ("peer-a", "peer-b"))
    others: list[tuple[str, int]] = [(stream.source, 1), ("another shard list", 90)]
    stream.swarm_passes = lambda: others
    _run_pass(stream)  # one pass behind is the normal drift: no jump
    assert stream.pass_number == 1
    others[0] = (stream.source, 5)
    with caplog.at_level(logging.INFO):
        while stream.pass_number == 1:
            stream.next()
    assert stream.pass_number == 5
    assert "the other peers are at pass 5: moving on to it" in caplog.text
    assert stream.past_pass_shards()[:3] == (0, 0, 0)  # passes 2-4: nothing read by this node
    assert stream.past_pass_shards()[3] > 0
    stream.swarm_passes = lambda: [(stream.source, 99), (stream.source, 2), (stream.source, 3)]
    while stream.pass_number == 5:
        stream.next()
    assert stream.pass_number == 6  # one peer far ahead is not the swarm (the lower median is)

    def broken() -> list[tuple[str, int]]:
        raise RuntimeError("no swarm view")

    stream.swarm_passes = broken
    while stream.pass_number == 6:
        stream.next()
    assert stream.pass_number == 7


def test_same_peer_same_batches_other_peer_other_batches(tmp_path: Path) -> None:
    root = _corpus(tmp_path / "c")
    one, two, other = _stream(root), _stream(root), _stream(root, peer_seed=8)
    batches = [one.next() for _ in range(20)]
    assert all(torch.equal(x, two.next()) for x in batches)
    assert not all(torch.equal(x, other.next()) for x in batches)
    assert batches[0].shape == (4, SEQ + 1) and batches[0].dtype == torch.int64


@pytest.mark.parametrize("taken", [0, 1, 9, 40, 75])  # 75 batches cross a pass boundary
def test_restart_resumes_the_exact_position(tmp_path: Path, taken: int) -> None:
    root = _corpus(tmp_path / "c")
    original = _stream(root, block=2048)
    for _ in range(taken):
        original.next()
    saved = io.BytesIO()
    torch.save({"data_position": original.state_dict()}, saved)  # as the node's checkpoint does
    saved.seek(0)
    position = torch.load(saved, weights_only=True)["data_position"]
    expected = [original.next() for _ in range(30)]
    resumed = _stream(root, block=2048)
    resumed.load_state_dict(position)
    assert all(torch.equal(x, resumed.next()) for x in expected)
    assert resumed.coverage() == original.coverage()
    assert resumed.state_dict() == original.state_dict()  # the windows count of the pass goes on too


def test_changed_or_old_positions_start_a_fresh_pass(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stream = _stream(_corpus(tmp_path / "c"))
    stream.next()
    position = stream.state_dict()
    with caplog.at_level(logging.WARNING):
        stream.load_state_dict({**position, "source": "0" * 16, "pass": 3})
        assert (stream.pass_number, stream.done) == (4, [])
        assert "training data changed" in caplog.text
        stream.load_state_dict({"epoch": 2, "index": 40, "num_sequences": 999})  # before shard streams
        assert stream.pass_number == 3 and "older format" in caplog.text
    stream.load_state_dict({})
    assert stream.pass_number == 0
    for bad in ({**position, "pass": -1}, {**position, "lanes": [["x", 0, 0]]}, {**position, "done": [1]}):
        with pytest.raises(ValueError, match="bad data position"):
            stream.load_state_dict(bad)


def test_more_peers_than_shards_still_gives_every_peer_data(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _corpus(tmp_path / "c", files=3)
    peers = tuple(f"peer-{i}" for i in range(12))
    idle = next(p for p in peers if not owned_shards(0, [f"doc{i:02d}.txt" for i in range(3)], peers, p))
    with caplog.at_level(logging.INFO):
        batch = _stream(root, idle, peers).next()
    assert batch.shape == (4, SEQ + 1) and "also reading" in caplog.text


def test_live_peer_set_is_cleaned_and_failures_keep_the_last_one(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    assert clean_peers(["b", "", 3, "x" * 500, "b", None], "a") == ("a", "b")
    assert clean_peers("not-a-list", "a") == ("a",)

    def broken() -> list[str]:
        raise RuntimeError("swarm view gone")

    stream = ShardStream(discover(str(_corpus(tmp_path / "c")), "auto", SEQ, _no_index).shards, seq_len=SEQ,
                         batch_size=2, peer_seed=1, peer_id="a", live_peers=broken, block_bytes=4096)
    with caplog.at_level(logging.WARNING):
        assert stream.next().shape == (2, SEQ + 1)
    assert "live peer set unavailable" in caplog.text


def _jsonl(path: Path, docs: list[object]) -> None:
    path.write_text("".join((d if isinstance(d, str) else json.dumps(d)) + "\n" for d in docs))


def _records(tag: str, count: int = 30) -> list[object]:
    return [{"id": i, "text": f"{tag} record {i}: " + "lorem ipsum dolor sit amet " * 3} for i in range(count)]


def test_bad_records_are_skipped_and_unreadable_shards_skipped_each_with_one_line_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "c"
    root.mkdir()
    for i in range(6):
        _jsonl(root / f"good{i}.jsonl", _records(f"good{i}"))
    _jsonl(root / "broken.jsonl", [*_records("broken", 3), "{not json", *_records("after")])
    _jsonl(root / "nofield.jsonl", [{"body": "x" * 80}] * (FAILED_RECORDS_LIMIT + 5))
    _jsonl(root / "nulls.jsonl", [*_records("nulls"), {"text": None}, {"text": 5}])
    (root / "gone.jsonl").write_text(json.dumps({"text": "y" * 100}) + "\n")
    stream = _stream(root)
    (root / "gone.jsonl").unlink()  # vanished after the shards were listed
    with caplog.at_level(logging.WARNING):
        coverage = _run_pass(stream)
    # broken.jsonl loses one record and is read on; nofield.jsonl keeps failing and is given up.
    assert coverage.malformed_total == 1 and coverage.skipped_total == 1 and coverage.bad_records_total == 2
    assert coverage.failed_records_total == 1 + FAILED_RECORDS_LIMIT
    assert set(coverage.skipped_this_pass) == {"nofield.jsonl", "gone.jsonl"}
    assert len(coverage.consumed) == 8
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 4 and all("\n" not in line for line in lines)
    assert any("shard broken.jsonl: record skipped: the line at byte" in line and "not valid JSON" in line
               for line in lines)
    assert any("shard nofield.jsonl: record skipped: no 'text' field in the record at byte 0" in line for line in lines)
    assert any("nofield.jsonl is malformed" in line and f"{FAILED_RECORDS_LIMIT} records did not decode" in line
               and "see task.text_field" in line for line in lines)
    assert any("gone.jsonl skipped this pass" in line for line in lines)


def _small_task(data_path: Path | str, **task: object):
    cfg = TaskSection(data_path=data_path, seq_len=SEQ, d_model=16, n_layers=1, n_heads=2, validation_batches=2,
                      validation_fraction=0.25, buffer_mb=1, **task)
    return build_task(cfg, TrainingSection(batch_size=4), peer_seed=3)


def _train_a_few_steps(task) -> tuple[float, float]:
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = task.loss_fn(task.model, task.train_batches.next())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return sum(losses[:5]) / 5, sum(losses[-5:]) / 5


def test_a_jsonl_dataset_of_several_shards_trains(tmp_path: Path) -> None:
    root = tmp_path / "jsonl"
    root.mkdir()
    for i in range(8):
        _jsonl(root / f"part-{i:03d}.jsonl", _records(f"part{i}", 60))
    task = _small_task(root / "*.jsonl")
    first, last = _train_a_few_steps(task)
    assert last < first
    assert list(task.validation_batches()) and task.train_batches.coverage().shards_total >= 5


def test_a_parquet_dataset_of_several_shards_trains(tmp_path: Path) -> None:
    root = tmp_path / "parquet"
    root.mkdir()
    for i in range(4):
        texts = [f"parquet {i} row {j}: the quick brown fox jumps over the lazy dog" for j in range(200)]
        table = pa.table({"id": list(range(200)), "content": [*texts[:-1], None]})
        pq.write_table(table, root / f"part-{i}.parquet", row_group_size=50)
    task = _small_task(root, text_field="content")
    first, last = _train_a_few_steps(task)
    assert last < first
    assert task.train_batches.coverage().shards_total >= 10  # row groups are shards


def test_a_jsonl_without_the_text_field_is_one_config_error(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    for i in range(4):
        _jsonl(root / f"p{i}.jsonl", [{"body": "text " * 40, "id": j} for j in range(10)])
    with pytest.raises(ConfigError) as info:
        _small_task(root)
    assert str(info.value).startswith("task.text_field: ") and "no 'text' field" in str(info.value)
    assert "(its fields: body, id)" in str(info.value) and "\n" not in str(info.value)
    table = pa.table({"body": ["x" * 50] * 10})
    for i in range(3):
        pq.write_table(table, root / f"q{i}.parquet")
    with pytest.raises(ConfigError, match=r"^task\.text_field: .*no 'content' column \(its columns: body\)$"):
        _small_task(root / "*.parquet", text_field="content")


def test_a_single_jsonl_file_is_cut_into_line_aligned_ranges(tmp_path: Path) -> None:
    path = tmp_path / "all.jsonl"
    _jsonl(path, _records("single", 400))
    shards = discover(str(path), "auto", SEQ, _no_index).shards
    assert len(shards) >= 15 and shards[0].end == shards[1].start
    records = []
    for shard in shards:
        offset, at_end = first_offset(shard, path), False
        while not at_end:
            block = read_block(shard, path, offset, 300, "text")
            records += [line for line in block.data.decode().splitlines() if line]
            offset, at_end = block.next_offset, block.at_end
    # Every record is read once, whole, by the range its line starts in.
    assert records == [record["text"] for record in _records("single", 400)]  # type: ignore[index]
