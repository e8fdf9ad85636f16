"""Logging setup: journald detection and format, human format, hivemind's records without duplicates."""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.daemon.logsetup import configure_logging, set_log_level, stream_is_journal

HUMAN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (\w+) +([\w.]+): (.*)$")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved_handlers = list(root.handlers)
    names = ("p2ptrain", "__main__", "hivemind")
    saved_levels = {name: logging.getLogger(name).level for name in names}
    saved_root = root.level
    yield
    root.handlers[:] = saved_handlers
    root.setLevel(saved_root)
    for name, level in saved_levels.items():
        logging.getLogger(name).setLevel(level)
    logging.captureWarnings(False)


def journal_env(path: Path) -> dict[str, str]:
    info = os.stat(path)
    return {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}


def test_journal_stream_detection(tmp_path: Path) -> None:
    target, other = tmp_path / "journal", tmp_path / "other"
    target.touch()
    other.touch()
    with target.open("w") as stream:
        assert stream_is_journal(stream, journal_env(target))
        assert not stream_is_journal(stream, journal_env(other))
        assert not stream_is_journal(stream, {})
        assert not stream_is_journal(stream, {"JOURNAL_STREAM": "garbage"})
    assert not stream_is_journal(io.StringIO(), journal_env(target))


def test_journal_format_has_priorities_and_no_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    path.touch()
    with path.open("w") as stream:
        configure_logging("INFO", "auto", environ=journal_env(path), stream=stream, tame_hivemind=False)
        log = logging.getLogger("p2ptrain.test")
        log.debug("hidden at INFO")
        log.info("joined swarm peers=%d", 3)
        log.warning("averaging timed out")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("step failed")
    lines = path.read_text().splitlines()
    assert lines[:3] == ["<6>p2ptrain.test: joined swarm peers=3", "<4>p2ptrain.test: averaging timed out",
                         "<3>p2ptrain.test: step failed"]
    # Every traceback line keeps the error priority, or journald would file it as a separate info entry.
    assert len(lines) > 4 and all(line.startswith("<3>") for line in lines[3:])
    assert lines[-1] == "<3>RuntimeError: boom"


def test_human_format_when_stderr_is_not_the_journal(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.touch()
    stream = io.StringIO()
    configure_logging("DEBUG", "auto", environ=journal_env(other), stream=stream, tame_hivemind=False)
    logging.getLogger("p2ptrain.x").debug("debug line")
    logging.getLogger("p2ptrain.x").warning("warn line")
    lines = stream.getvalue().splitlines()
    parsed = [HUMAN_LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [(m.group(1), m.group(2), m.group(3)) for m in parsed if m] == [
        ("DEBUG", "p2ptrain.x", "debug line"), ("WARNING", "p2ptrain.x", "warn line")]


def test_forced_journal_format_and_third_party_kept_at_warning() -> None:
    stream = io.StringIO()
    configure_logging("DEBUG", "journal", stream=stream, tame_hivemind=False)
    logging.getLogger("urllib3.connectionpool").info("noise")
    logging.getLogger("urllib3.connectionpool").error("real problem")
    assert stream.getvalue() == "<3>urllib3.connectionpool: real problem\n"


def test_extra_handler_gets_records_and_reconfigure_does_not_duplicate() -> None:
    stream, ring = io.StringIO(), LogRing(capacity=10)
    configure_logging("INFO", "human", [ring], stream=stream, tame_hivemind=False)
    configure_logging("INFO", "human", [ring], stream=stream, tame_hivemind=False)
    logging.getLogger("p2ptrain.node").info("once")
    assert stream.getvalue().count("once") == 1
    assert [line.message for line in ring.since(0)] == ["once"]


def test_set_log_level_follows_reload() -> None:
    stream = io.StringIO()
    configure_logging("WARNING", "journal", stream=stream, tame_hivemind=False)
    logging.getLogger("p2ptrain.node").info("before")
    set_log_level("INFO")
    logging.getLogger("p2ptrain.node").info("after")
    assert stream.getvalue() == "<6>p2ptrain.node: after\n"
    with pytest.raises(ValueError, match="unknown log level"):
        set_log_level("LOUD")


def test_hivemind_records_pass_once_through_our_handler() -> None:
    hivemind_logging = pytest.importorskip("hivemind.utils.logging")
    stream = io.StringIO()
    try:
        configure_logging("INFO", "journal", stream=stream)
        hive_log = hivemind_logging.get_logger("hivemind.averaging.averager")
        hive_log.info("hivemind chatter hidden below DEBUG")
        hive_log.warning("averaging round failed")
        assert stream.getvalue() == "<4>hivemind.averaging.averager: averaging round failed\n"
        # hivemind's own coloured handler must not be attached anywhere on the way to the root.
        assert not logging.getLogger("hivemind").handlers
        set_log_level("DEBUG")
        hive_log.debug("matchmaking details")
        assert stream.getvalue().endswith("<7>hivemind.averaging.averager: matchmaking details\n")
    finally:
        hivemind_logging.use_hivemind_log_handler("in_hivemind")
