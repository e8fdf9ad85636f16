"""Swarm weather stays out of the operator's log: a peer killed mid-run costs the survivors no ERROR line
and only a handful of WARNING lines, while hivemind's internals go to DEBUG in every helper process."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.conftest import TINY_TASK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (\w+) +([\w.]+): (.*)$")
#: Measured on the 2-core development machine (two runs, ~50 s each): 0-2 WARNING lines per
#: survivor ("averaging round failed; applied local gradients instead" for a round that still
#: counted on the killed peer); before the filter hivemind wrote dozens per minute. Room for a
#: slower machine, none for hivemind's chatter.
MAX_WARNINGS = 6
#: Raw stderr that bypassed logging: an uncaught exception in a thread, an unraisable one in __del__.
RAW_TROUBLE = re.compile(r"^(Exception ignored in|Exception in thread)")


def log_counts(path: Path) -> tuple[Counter[str], int, int, int, int]:
    """Lines per level; traceback lines; raw trouble lines; records that hivemind or asyncio logged
    above DEBUG (shown at DEBUG with their original level in parentheses); DEBUG records of hivemind's
    averagers, which run in forked helper processes."""
    levels: Counter[str] = Counter()
    tracebacks = raw = demoted = helpers = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = LINE.match(line)
        if match:
            level, logger, message = match.groups()
            levels[level] += 1
            demoted += level == "DEBUG" and re.match(r"\((INFO|WARNING|ERROR|CRITICAL)\) ", message) is not None
            helpers += level == "DEBUG" and logger.startswith("hivemind.averaging.")
        else:
            tracebacks += line.startswith("Traceback (most recent call last)")
            raw += RAW_TROUBLE.match(line) is not None
    return levels, tracebacks, raw, demoted, helpers


def rounds(status) -> int:
    return status.averaging_rounds_ok_total + status.averaging_rounds_failed_total \
        + status.averaging_rounds_partial_total


def test_a_killed_peer_costs_the_survivors_no_error_lines(make_node) -> None:
    a = make_node("a", task=TINY_TASK)
    a.start()
    join = a.join_addrs()[:1]
    # b runs as with `p2ptrain run --log-level debug`: hivemind's internals must show there, demoted.
    b = make_node("b", task=TINY_TASK, node={"log_level": "DEBUG"})
    c = make_node("c", task=TINY_TASK)
    b.start(join)
    c.start(join)
    for node in (a, b, c):
        node.wait_for(lambda s: s.state == "training" and s.peers_online >= 3, 90, "training with 3 peers")
    first = rounds(a.status())
    a.wait_for(lambda s: rounds(s) >= first + 2, 45, "two rounds with three peers")
    c.kill()  # SIGKILL, helpers included: a machine that crashed mid-round
    deadline = time.monotonic() + 40
    for node in (a, b):
        before = rounds(node.status())
        node.wait_for(lambda s, before=before: rounds(s) >= before + 3, max(5.0, deadline - time.monotonic()),
                      "three rounds after the kill")
    for node in (a, b):
        node.signal(signal.SIGTERM)
    for node in (a, b):
        assert node.wait(60) == 0, node.report()

    counts = {node.name: log_counts(node.log_path) for node in (a, b)}
    report = "; ".join(f"{name}: {levels['ERROR']} ERROR, {levels['WARNING']} WARNING, {levels['INFO']} INFO, "
                       f"{tracebacks} tracebacks, {raw} raw errors, {demoted} demoted hivemind/asyncio records"
                       f", {helpers} DEBUG records of hivemind's averagers"
                       for name, (levels, tracebacks, raw, demoted, helpers) in counts.items())
    print(report)  # the figures behind MAX_WARNINGS (pytest -s)
    for node in (a, b):
        levels, tracebacks, raw, _, _ = counts[node.name]
        assert levels["ERROR"] == levels["CRITICAL"] == raw == 0 and levels["WARNING"] <= MAX_WARNINGS, \
            f"{report}\n--- {node.name}\n{node.log_tail(60)}"
    assert counts["a"][1] == 0, f"{report}: a traceback reached the INFO log\n{a.log_tail(60)}"
    # At DEBUG the detail is all there: hivemind's records, demoted ones with their levels, those of
    # the averagers' helper processes, and tracebacks. (Whether hivemind itself warns about the kill
    # depends on where in a round it lands: some runs see partial reductions, some none.)
    _, tracebacks, _, demoted, helpers = counts["b"]
    assert demoted > 0 and helpers > 0 and tracebacks > 0, f"{report}: hivemind's internals never reached b's DEBUG log"
