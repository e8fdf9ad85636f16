"""Logging setup: journald detection and format, human format, hivemind's records without duplicates."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from p2ptrain.daemon.logbuffer import LogRing
from p2ptrain.daemon.logsetup import configure_logging, noise_filter, set_log_level, stream_is_journal
from p2ptrain.daemon.logsfilter import DEMOTED_FROM, SwarmNoiseFilter, error_name

HUMAN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (\w+) +([\w.]+): (.*)$")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved_handlers = list(root.handlers)
    names = ("p2ptrain", "__main__", "hivemind")
    saved_levels = {name: logging.getLogger(name).level for name in names}
    saved_root = root.level
    saved_noise = noise_filter().level
    yield
    noise_filter().set_level(saved_noise)
    noise_filter().flush()  # nothing a test hid may surface in a later test's stream
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


def test_json_format_is_one_object_per_line_with_structured_fields() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream, environ={"JOURNAL_STREAM": "1:2"}, tame_hivemind=False)
    log = logging.getLogger("p2ptrain.test.json")
    log.info("epoch %d done", 3, extra={"peer_id": "QmPeer", "epoch": 3})
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("step failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "INFO" and first["logger"] == "p2ptrain.test.json" and first["message"] == "epoch 3 done"
    assert first["peer_id"] == "QmPeer" and first["epoch"] == 3 and first["time"].endswith("Z")
    assert "args" not in first and "msg" not in first and "exception" not in first
    assert second["level"] == "ERROR" and "ValueError: bad" in second["exception"]


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


def test_hivemind_records_pass_once_through_our_handler_and_only_at_debug() -> None:
    hivemind_logging = pytest.importorskip("hivemind.utils.logging")
    stream = io.StringIO()
    try:
        configure_logging("INFO", "journal", stream=stream)
        hive_log = hivemind_logging.get_logger("hivemind.averaging.averager")
        hive_log.info("hivemind chatter hidden below DEBUG")
        hive_log.warning("All-reduce group did not finish.")
        assert stream.getvalue() == ""
        # hivemind's own coloured handler must not be attached anywhere on the way to the root.
        assert not logging.getLogger("hivemind").handlers
        set_log_level("DEBUG")
        hive_log.debug("matchmaking details")
        hive_log.warning("All-reduce group did not finish.")
        assert stream.getvalue() == ("<7>hivemind.averaging.averager: matchmaking details\n"
                                     "<7>hivemind.averaging.averager: (WARNING) All-reduce group did not finish.\n")
    finally:
        hivemind_logging.use_hivemind_log_handler("in_hivemind")


def _swarm_weather(hivemind_logging) -> None:
    """What hivemind and asyncio log when a peer vanishes mid-round."""
    hivemind_logging.get_logger("hivemind.averaging.partition").warning("Reducer: received 33.3% of input tensors")
    hivemind_logging.get_logger("hivemind.averaging.partition").warning("Reducer: received 66.7% of input tensors")
    try:
        raise RuntimeError("Averaging step failed: could not find a group")
    except RuntimeError as error:
        hivemind_logging.get_logger("hivemind.averaging.averager").exception(error)
    logging.getLogger("asyncio").error("Task was destroyed but it is pending!")
    hivemind_logging.get_logger("hivemind.averaging.averager").warning("Averager could not load state from peers")


def test_swarm_weather_is_hidden_at_info_counted_and_summarised_in_one_line() -> None:
    hivemind_logging = pytest.importorskip("hivemind.utils.logging")
    stream, ring = io.StringIO(), LogRing(capacity=10)
    try:
        configure_logging("INFO", "human", [ring], stream=stream)
        _swarm_weather(hivemind_logging)
        logging.getLogger("p2ptrain.optim.build").warning("averaging round failed; applied local gradients instead")
        assert [m.group(1, 2, 3) for m in map(HUMAN_LINE.match, stream.getvalue().splitlines()) if m] == [
            ("WARNING", "p2ptrain.optim.build", "averaging round failed; applied local gradients instead")]
        assert "Traceback" not in stream.getvalue()
        assert [line.level for line in ring.since(0)] == ["WARNING"]  # the API's log view: the same lines
        summary = noise_filter().flush()
        assert summary == ("hivemind: 2 partial reductions (median 50% received), 1 warning and 2 errors hidden "
                           "in the last 1 min (--log-level debug shows them); errors: "
                           '1x "Averaging step failed: could not find a group", 1x "Task was destroyed but it is '
                           'pending!"')
        last = HUMAN_LINE.match(stream.getvalue().splitlines()[-1])
        assert last is not None and last.group(1, 2, 3) == ("INFO", "p2ptrain.swarmlog", summary)
        assert noise_filter().flush() is None  # nothing hidden since
    finally:
        hivemind_logging.use_hivemind_log_handler("in_hivemind")


def test_python_warnings_from_hivemind_code_are_internals_too() -> None:
    import warnings

    stream = io.StringIO()
    configure_logging("INFO", "human", stream=stream, tame_hivemind=False)
    hivemind_file = os.path.join("site-packages", "hivemind", "optim", "state_averager.py")
    warnings.warn_explicit("Detected call of `lr_scheduler.step()` before `optimizer.step()`", UserWarning,
                           hivemind_file, 704)
    warnings.warn_explicit("a warning of our own", UserWarning, os.path.join("p2ptrain", "trainer.py"), 10)
    lines = [m.group(1, 2) for m in map(HUMAN_LINE.match, stream.getvalue().splitlines()) if m]
    assert lines == [("WARNING", "py.warnings")]
    assert "a warning of our own" in stream.getvalue() and "lr_scheduler" not in stream.getvalue()
    assert noise_filter().flush() is not None


def test_debug_shows_every_internal_record_with_its_traceback() -> None:
    hivemind_logging = pytest.importorskip("hivemind.utils.logging")
    stream, ring = io.StringIO(), LogRing(capacity=20)
    try:
        configure_logging("DEBUG", "journal", [ring], stream=stream)
        _swarm_weather(hivemind_logging)
        lines = stream.getvalue().splitlines()
        assert all(line.startswith("<7>") for line in lines), lines  # nothing above DEBUG ...
        assert "<7>hivemind.averaging.partition: (WARNING) Reducer: received 33.3% of input tensors" in lines
        assert "<7>asyncio: (ERROR) Task was destroyed but it is pending!" in lines
        assert "<7>Traceback (most recent call last):" in lines  # ... and the full detail
        assert "<7>RuntimeError: Averaging step failed: could not find a group" in lines
        assert {line.level for line in ring.since(0)} == {"DEBUG"}
    finally:
        hivemind_logging.use_hivemind_log_handler("in_hivemind")


def _child_logs_swarm_weather() -> None:
    hivemind_logging = __import__("hivemind.utils.logging", fromlist=["get_logger"])
    _swarm_weather(hivemind_logging)
    logging.getLogger("p2ptrain.test").info("child still logs its own lines")
    noise_filter().flush()  # a helper that lives long enough reports on a timer


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_forked_helper_processes_inherit_the_quiet(tmp_path: Path, level: str) -> None:
    """hivemind's averagers and DHT are forked children: they log through the inherited setup."""
    hivemind_logging = pytest.importorskip("hivemind.utils.logging")
    import multiprocessing

    path = tmp_path / "stderr"
    try:
        with path.open("w") as stream:
            configure_logging(level, "human", [LogRing(capacity=10)], stream=stream)
            logging.getLogger("hivemind.averaging.partition").warning("Reducer: received 50.0% of input tensors")
            child = multiprocessing.get_context("fork").Process(target=_child_logs_swarm_weather)
            child.start()
            child.join(30)
            assert child.exitcode == 0
        lines = path.read_text().splitlines()
        levels = [m.group(1) for m in map(HUMAN_LINE.match, lines) if m]
        assert "WARNING" not in levels and "ERROR" not in levels, lines
        messages = [m.group(3) for m in map(HUMAN_LINE.match, lines) if m]
        assert "child still logs its own lines" in messages
        # The child's summary counts the child's records only (the parent's one is its own to report).
        assert ("hivemind: 2 partial reductions (median 50% received), 1 warning and 2 errors hidden in the last "
                "1 min (--log-level debug shows them); errors: 1x \"Averaging step failed: could not find a group\", "
                "1x \"Task was destroyed but it is pending!\"") in messages
        if level == "DEBUG":
            assert "(WARNING) Reducer: received 33.3% of input tensors" in messages
            assert any(line == "RuntimeError: Averaging step failed: could not find a group" for line in lines)
        else:
            assert not any("Reducer" in message or "Traceback" in message for message in messages)
    finally:
        hivemind_logging.use_hivemind_log_handler("in_hivemind")


@contextmanager
def _captured(name: str) -> Iterator[list[str]]:
    """The messages logged to ``name`` inside the block."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield said
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_noise_filter_tallies_one_window_at_a_time() -> None:
    now = [100.0]
    noise = SwarmNoiseFilter(every=300.0, clock=lambda: now[0])
    threads_before = threading.active_count()

    def record(name: str, level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    ours = record("p2ptrain.node", logging.WARNING, "ours")
    assert noise.filter(ours) and ours.levelno == logging.WARNING and not hasattr(ours, DEMOTED_FROM)
    assert noise.filter(record("hivemindish.x", logging.WARNING, "not hivemind"))
    hidden = record("hivemind.dht", logging.ERROR, "boom")
    assert not noise.filter(hidden)
    assert (hidden.levelno, hidden.levelname, getattr(hidden, DEMOTED_FROM)) == (logging.DEBUG, "DEBUG", "ERROR")
    assert not noise.filter(hidden)  # a second handler: same verdict, not counted again
    for _ in range(3):
        noise.filter(record("hivemind.averaging.partition", logging.WARNING,
                            "Reducer: received 66.7% of input tensors"))
    assert threading.active_count() == threads_before  # a filter never starts a thread
    assert noise.flush_if_due() is None  # the window is not over yet
    now[0] += 610.0
    assert noise.flush_if_due() == ("hivemind: 3 partial reductions (median 67% received) and 1 error hidden in "
                                    'the last 10 min (--log-level debug shows them); errors: 1x "boom"')
    assert noise.flush() is None  # one summary per window, however much was hidden
    noise.filter(record("asyncio", logging.WARNING, "slow callback"))
    now[0] += 301.0
    with _captured("p2ptrain.swarmlog") as said:
        noise.filter(record("asyncio", logging.WARNING, "the next hidden record reports the due window"))
    assert said == ["hivemind: 2 warnings hidden in the last 5 min (--log-level debug shows them)"]
    noise.after_fork()  # a forked child starts with nothing to report
    assert noise.flush() is None
    noise.set_level(logging.DEBUG)
    assert noise.filter(record("asyncio", logging.ERROR, "shown at DEBUG"))


def _record(name: str, level: int, message: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    return record


def test_the_summary_names_the_most_frequent_hidden_errors_whatever_varies_in_them() -> None:
    noise = SwarmNoiseFilter(every=300.0, clock=lambda: 0.0)
    peer = "12D3KooWGb7BPVkdJqRTLoyMp6Sxns5ktfHmfXRSDEpnH5XjwEqQ"
    for n in range(3):  # one kind, whichever peer and whatever numbers it names
        noise.filter(_record("hivemind.averaging.averager", logging.ERROR,
                             f"Failed to download state from {peer[:-n or None]}x - TimeoutError({n + 1}.5)"))
    noise.filter(_record("hivemind.averaging.averager", logging.ERROR,
                         RuntimeError("Averaging step failed: could not find a group")))
    noise.filter(_record("asyncio", logging.ERROR, "Task was destroyed but it is pending!\ntask: <Task ...>"))
    noise.filter(_record("asyncio", logging.ERROR, "Task was destroyed but it is pending!\ntask: <Task other>"))
    noise.filter(_record("hivemind.dht", logging.WARNING, "a warning is not an error"))
    assert noise.flush() == ("hivemind: 1 warning and 6 errors hidden in the last 1 min (--log-level debug shows "
                             'them); errors: 3x "Failed to download state from N - TimeoutError(N)", '
                             '2x "Task was destroyed but it is pending!"')
    long = "x" * 200
    assert error_name(_record("asyncio", logging.ERROR, long)) == "x" * 57 + "..."


def test_hivemind_conditions_an_operator_must_act_on_are_said_at_error_once_per_window() -> None:
    hivemind_logging = pytest.importorskip("hivemind.utils.logging")
    stream = io.StringIO()
    try:
        configure_logging("INFO", "human", stream=stream)
        p2pd = hivemind_logging.get_logger("hivemind.p2p.p2p_daemon")
        for _ in range(2):  # what hivemind makes of a go-log FATAL from p2pd
            p2pd.critical("failed to listen on any addresses: no space left on device", extra={"caller": "p2pd"})
        averager = hivemind_logging.get_logger("hivemind.averaging.averager")
        averager.error("Averager shutdown has no effect: the process is already not alive")
        p2pd.critical("a CRITICAL line that is not p2pd's own (no caller) is weather")
        averager.error("Averaging step failed: could not find a group")  # weather: hidden, counted
        lines = [m.group(1, 2, 3) for m in map(HUMAN_LINE.match, stream.getvalue().splitlines()) if m]
        assert lines == [
            ("ERROR", "p2ptrain.swarmlog", "p2pd, the libp2p daemon this node reaches the swarm through, failed "
             "(failed to listen on any addresses: no space left on device): the node cannot reach the swarm until "
             "it is restarted"),
            ("ERROR", "p2ptrain.swarmlog", "an averaging helper process had died before the node stopped (killed, "
             "or out of memory?): its rounds failed since; the journal or dmesg says why")]
        assert "Traceback" not in stream.getvalue()
        assert "5 errors hidden" in (noise_filter().flush() or "")  # still counted with the rest
        p2pd.critical("p2pd fails again in the next window", extra={"caller": "p2pd"})
        assert stream.getvalue().splitlines()[-1].endswith("(p2pd fails again in the next window): the node cannot "
                                                           "reach the swarm until it is restarted")
    finally:
        hivemind_logging.use_hivemind_log_handler("in_hivemind")
