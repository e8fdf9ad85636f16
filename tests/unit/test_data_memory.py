"""Memory stays bounded by ``task.buffer_mb``: a pass over a corpus 10x larger than the buffer.

Each format runs in a fresh Python process, which resets its peak RSS (``/proc/self/clear_refs``)
once the task is built and then reads one full pass; the peak growth must stay near the buffer,
far below the corpus size (reading the corpus whole would add at least its size).
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

BUFFER_MB = 2
#: What a reader may hold beside its buffer: the block read ahead, one decoded Parquet batch, and the
#: pages pyarrow's allocator keeps cached, which are more when the machine is busy (as under CI's workers).
READER_SLACK_MB = 6
FILES = 14
ROWS = 10_000
ROW_BYTES = 200

CHILD = r"""
import json, re, sys
import torch
torch.set_num_threads(1)
from p2ptrain.config.schema import TaskSection, TrainingSection
from p2ptrain.tasks import build_task

def peak():
    status = open("/proc/self/status").read()
    return int(re.search(r"VmHWM:\s+(\d+)", status)[1]) * 1024

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

cfg = TaskSection(data_path=sys.argv[1], text_field="body", seq_len=64, buffer_mb=int(sys.argv[2]),
                  d_model=8, n_heads=2, validation_batches=2)
task = build_task(cfg, TrainingSection(batch_size=64), peer_seed=1)
stream = task.train_batches
stream.next()
try:
    open("/proc/self/clear_refs", "w").write("5")  # peak RSS := current RSS
    base = peak()
except OSError:
    base = rss()
high, batches = base, 0
while stream.pass_number == 0:
    stream.next()
    batches += 1
    if batches % 20 == 0:
        high = max(high, rss())
coverage = stream.last_pass_coverage()
print(json.dumps({"growth": max(high, peak()) - base, "batches": batches,
                  "read": len(coverage.consumed), "shards": coverage.shards_total}))
"""


def _rows(seed: int) -> list[str]:
    """Random, hardly compressible text (so Parquet's files are as big as their text), fast to make."""
    blob = base64.b64encode(random.Random(seed).randbytes(ROWS * ROW_BYTES * 3 // 4)).decode()
    return [blob[i : i + ROW_BYTES] for i in range(0, len(blob), ROW_BYTES)]


def _write_corpus(root: Path, kind: str) -> int:
    root.mkdir()
    for i in range(FILES):
        rows = _rows(i)
        if kind == "text":
            (root / f"part-{i}.txt").write_text("\n".join(rows))
        elif kind == "jsonl":
            (root / f"part-{i}.jsonl").write_text("".join(json.dumps({"body": row}) + "\n" for row in rows))
        else:
            pq.write_table(pa.table({"body": rows}), root / f"part-{i}.parquet", row_group_size=1000)
    return sum(path.stat().st_size for path in root.iterdir())


@pytest.mark.parametrize("kind", ["text", "jsonl", "parquet"])
def test_a_pass_over_a_corpus_ten_times_the_buffer_stays_within_it(tmp_path: Path, kind: str) -> None:
    root = tmp_path / kind
    corpus_bytes = _write_corpus(root, kind)
    assert corpus_bytes >= 10 * BUFFER_MB * 2**20
    assert corpus_bytes >= 3 * (BUFFER_MB + READER_SLACK_MB) * 2**20  # reading it whole could not pass
    result = subprocess.run([sys.executable, "-c", CHILD, str(root), str(BUFFER_MB)], capture_output=True,
                            text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["read"] == measured["shards"] and measured["batches"] > 1000  # the whole pass was read
    assert measured["growth"] < (BUFFER_MB + READER_SLACK_MB) * 2**20, measured
