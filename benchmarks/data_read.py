"""Read throughput of a normal shard, per format: what the checks on hostile data cost honest data.

Not a test (rates on a shared machine are noise, not pass/fail); run it by hand from the repository
root: ``.venv/bin/python -m benchmarks.data_read [--against OTHER_CHECKOUT] [--rounds 4]``.  It writes
one shard of each format (about 40 MiB of word-salad text, 60,000 records of 20-200 words; Parquet as
pyarrow writes it by default, in row groups of 10,000) and reads each whole with ``read_block`` in
blocks of 2 MiB (a lane of the default ``task.buffer_mb``), in a fresh process per measurement, best
of three passes. Rates are MB of text per CPU second of the reading process, which a busy machine
disturbs less than wall time. With ``--against``, the same reads run with another checkout's
``p2ptrain`` (an older commit, say) in alternation with this one's, and the ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = ("text", "jsonl", "parquet")

READER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from p2ptrain.data.readers import first_offset, read_block
from p2ptrain.data.sources import ShardRef

def one_pass(kind, path):
    shard, path = ShardRef("s", kind, path=path), Path(path)
    offset, text = first_offset(shard, path), 0
    start = time.process_time()
    while True:
        block = read_block(shard, path, offset, 2 << 20, "text")
        text += len(block.data)
        if block.at_end or block.next_offset == offset:
            return text / (time.process_time() - start) / 1e6
        offset = block.next_offset

kind, path = sys.argv[2], sys.argv[3]
print(json.dumps({"mb_per_cpu_s": max(one_pass(kind, path) for _ in range(3))}))
"""


def write_shards(folder: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    rows = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 200))) for _ in range(60_000)]
    paths = {kind: folder / f"shard.{kind}" for kind in KINDS}
    paths["text"].write_text("\n".join(rows) + "\n")
    paths["jsonl"].write_text("".join(json.dumps({"id": i, "text": row}) + "\n" for i, row in enumerate(rows)))
    pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}), paths["parquet"], row_group_size=10_000)
    return paths


def measure(code: Path, kind: str, path: Path) -> float:
    result = subprocess.run([sys.executable, "-c", READER, str(code), kind, str(path)], capture_output=True,
                            text=True, check=True)
    return float(json.loads(result.stdout.strip().splitlines()[-1])["mb_per_cpu_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout's root, to compare with")
    parser.add_argument("--rounds", type=int, default=4, help="measurements per format and checkout (best kept)")
    args = parser.parse_args(argv)
    codes = [REPO] + ([args.against.resolve()] if args.against else [])
    with tempfile.TemporaryDirectory() as folder:
        paths = write_shards(Path(folder))
        best = {(code, kind): 0.0 for code in codes for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                for code in codes:  # alternating, so a busy spell hits both alike
                    best[code, kind] = max(best[code, kind], measure(code, kind, paths[kind]))
    print("| format | " + " | ".join(f"{code.name} MB/CPU-s" for code in codes)
          + (" | ratio |" if args.against else " |"))
    print("|---" * (len(codes) + 1 + bool(args.against)) + "|")
    for kind in KINDS:
        rates = [best[code, kind] for code in codes]
        ratio = f" | {rates[0] / rates[1]:.2f}" if args.against else ""
        print(f"| {kind} | " + " | ".join(f"{rate:.0f}" for rate in rates) + ratio + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
