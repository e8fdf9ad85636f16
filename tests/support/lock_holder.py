"""``python -m tests.support.lock_holder hold|take``: a process forked as a node is, holding hivemind's
process-wide locks until it is killed (``hold``), or exiting 0 only if it can take every one of them
within a few seconds (``take``)."""

from __future__ import annotations

import sys
import threading

from p2ptrain.averaging.lifecycle import hivemind_locks

TAKE_TIMEOUT = 5.0


def main(mode: str) -> int:
    locks = hivemind_locks()
    if mode == "hold":
        for lock in locks:
            lock.acquire()
        print("holding", flush=True)
        threading.Event().wait()
    taken = [lock.acquire(timeout=TAKE_TIMEOUT) for lock in locks]
    print(f"taken: {taken}", flush=True)
    return 0 if all(taken) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
