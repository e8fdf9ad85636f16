"""hivemind's DHT and averager processes: a start with a deadline, a stop that never leaves a shared lock held.

hivemind 1.1.12 gets two moments of these processes' lives wrong on a loaded machine:

* **A start waits for ever.**  ``run_in_background`` waits for the new process's ready event with no
  deadline unless given one, and hivemind's constructors (``start=True``) give none.  A new averager's
  process asks the DHT's process for its p2p daemon's address (``DHT.replicate_p2p``) before it
  reports ready: a DHT that never answers leaves the caller waiting on a condition for good.
* **A stop can wedge every later start.**  ``shutdown`` gives the process ``shutdown_timeout`` to
  leave, then ``terminate()`` s it wherever it is.  Every process hivemind forks from one parent (the
  DHT's, each averager's) shares four process-wide locks: ``MPFuture._update_lock``, held while
  one process writes a future's result to another, ``MPFuture._initialization_lock`` and
  ``SharedBytes._lock``, held while a future is created, and the lock held while a process makes its
  executor for blocking calls. A process killed holding one leaves it held for good. The DHT's
  process then blocks on its next answer, so the next averager started on it waits for ever for the
  DHT's address: the first moment above. An averager's own shared values (its tensors' lock, its
  ``mp.Value`` s) go the same way for whoever reads them next. Seen in the integration suite on a
  loaded machine: three tests in a row hung for their whole timeout while an averager started, each
  leaving its process behind.
* **A caller that dies kills the DHT.**  A request to the DHT's process carries a future, and the
  future the pipe its answer goes back through.  That pipe travels as a file descriptor, which the
  DHT's process fetches from the caller while it reads the request.  When the caller (an averager
  killed past its grace) is gone by then, that read raises ``EOFError`` (or a refused connection); the
  ``EOFError`` is not caught by hivemind's request loop: the DHT's process exits, and with it every
  later DHT call and averager start of the node.  Seen in CI: an averager killed while stopping,
  and the next start on the same DHT failed at its deadline.

Installed (:func:`install`) on hivemind's ``DecentralizedAverager`` and ``DHT`` classes, so every one
of them has it (ours, hivemind's own inside ``hivemind.Optimizer``, a test's plain one), when
:mod:`p2ptrain.averaging` is imported:

* ``run_in_background(await_ready=True)`` waits at most its ``timeout``, or :data:`AVERAGER_START_TIMEOUT`
  / :data:`DHT_START_TIMEOUT`; past it: one error line, the process killed as below, and
  :class:`StartTimeout` raised.
* ``shutdown`` is hivemind's, except that a process still alive after its grace is killed while this
  process holds the locks it shares with it (:func:`kill_holding_locks`): it cannot die holding one.
* Where the process that forks them called :func:`report_stacks_on_timeout` (the node does), a process
  past its start deadline first writes its threads' stacks to stderr: the log then says where it
  hung, which no later look can.
* The DHT's process reads its requests through :class:`RequestReader`: a request whose caller died
  before it was read is dropped with one warning line, and the DHT goes on serving.
* A node forked from a process that imported hivemind (a fork server) takes locks of its own
  (:func:`renew_hivemind_locks`), so that no sibling node's death can leave one held.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import multiprocessing.connection
import multiprocessing.sharedctypes
import multiprocessing.synchronize
import os
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

from hivemind.averaging import DecentralizedAverager
from hivemind.dht import DHT
from hivemind.utils.asyncio import _AsyncContextWrapper
from hivemind.utils.mpfuture import MPFuture, SharedBytes

from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.proc import STACK_DUMP_SECONDS, STACK_DUMP_SIGNAL

require_hivemind(__name__)

logger = logging.getLogger(__name__)

#: The longest an averager's process may take to report ready: a second or two, ten on a machine
#: under heavy load.
AVERAGER_START_TIMEOUT = 60.0
#: The same for a DHT, which first starts its p2p daemon and reaches its initial peers (the node's
#: ``swarm.bootstrap_timeout`` retries a DHT whose bootstrap failed; this bounds one that never says).
DHT_START_TIMEOUT = 120.0
#: The longest to wait for one lock before a kill.  A holder of hivemind's locks writes one message
#: (microseconds); an averager's tensors may be held for the rest of a round it is leaving.
LOCK_TIMEOUT = 2.0
_stacks_on_timeout = False


def report_stacks_on_timeout() -> None:
    """Make every helper forked from now on write its threads' stacks to stderr when it misses its
    start deadline.  The handler is the interpreter's own (:mod:`faulthandler`), installed here and
    inherited by each fork; it runs in the signal handler itself, so a helper whose threads are all
    blocked still answers."""
    global _stacks_on_timeout
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    _stacks_on_timeout = True


def _ask_for_stacks(process: Any) -> None:
    if _stacks_on_timeout and process.pid is not None and process.is_alive():
        with contextlib.suppress(OSError):
            os.kill(process.pid, STACK_DUMP_SIGNAL)
            time.sleep(STACK_DUMP_SECONDS)


class StartTimeout(TimeoutError):
    """A DHT's or an averager's process did not report ready in time (it has been killed)."""


def hivemind_locks() -> list[Any]:
    """The locks every process hivemind forked from this one shares with it (see the module doc)."""
    return [MPFuture._initialization_lock, SharedBytes._lock, MPFuture._update_lock,
            _AsyncContextWrapper.EXECUTOR_LOCK]


def renew_hivemind_locks() -> None:
    """Give this process hivemind's process-wide locks of its own, shared with nothing forked before.

    hivemind creates them when it is imported (class attributes), so every process forked after that
    import shares them, as a node's helpers must with the node.  A process forked from a fork server
    that imported hivemind (``p2ptrain.local.forkserver``) is a node of its own, not a helper of the
    server: sharing them with its sibling nodes, one killed while it held one would stall every MPFuture
    of the others for good (seen: a churned node's DHT that never said it was ready)."""
    MPFuture.reset_backend()  # hivemind's own: MPFuture's two locks and SharedBytes'
    _AsyncContextWrapper.EXECUTOR_LOCK = multiprocessing.Lock()


def own_locks(process: Any) -> list[Any]:
    """The locks of a hivemind process object's own shared values: an averager's tensors' lock, its
    ``mp.Value`` s."""
    found = []
    for value in vars(process).values():
        if isinstance(value, multiprocessing.synchronize.SemLock):
            found.append(value)
        elif isinstance(value, multiprocessing.sharedctypes.SynchronizedBase):
            found.append(value.get_lock())
    return found


@contextlib.contextmanager
def holding(locks: Sequence[Any], timeout: float) -> Iterator[list[Any]]:
    """Hold each of ``locks`` that frees up within ``timeout`` (each); yields those it could not take."""
    taken: list[Any] = []
    missed: list[Any] = []
    try:
        for lock in locks:
            (taken if lock.acquire(timeout=timeout) else missed).append(lock)
        yield missed
    finally:
        for lock in reversed(taken):
            lock.release()


def kill_holding_locks(process: Any, what: str, extra_locks: Sequence[Any] = ()) -> None:
    """SIGKILL ``process`` (a forked ``multiprocessing.Process``) while this process holds the locks it
    shares with it, so that it cannot die holding one.  ``extra_locks`` first: their holder may need
    hivemind's to finish and let go of them, never the other way round."""
    with holding([*extra_locks, *hivemind_locks()], LOCK_TIMEOUT) as missed:
        if missed:  # held by a process stuck with it: killing it loses that lock whatever we do
            logger.warning("%s: killed while %d shared lock(s) stayed busy for %.0f s; later starts of "
                           "hivemind processes here may time out", what, len(missed), LOCK_TIMEOUT)
        process.kill()
        process.join(LOCK_TIMEOUT)


def _describe(process: Any) -> str:
    if isinstance(process, DecentralizedAverager):
        return f"averager {process.prefix} (pid {process.pid})"
    return f"DHT (pid {process.pid})"


def _bounded_start(hivemind_start: Callable[..., None], default_timeout: Callable[[], float]) -> Callable[..., None]:
    """hivemind 1.1.12's ``run_in_background`` of a DHT or an averager, its wait bounded (by
    ``default_timeout()`` when the caller gives no ``timeout``)."""

    def run_in_background(self: Any, await_ready: bool = True, timeout: float | None = None) -> None:
        hivemind_start(self, await_ready=False)
        if not await_ready:
            return
        deadline = default_timeout() if timeout is None else timeout
        try:
            self.wait_until_ready(deadline)
        except TimeoutError:
            what = _describe(self)
            logger.error("%s not ready within %.0f s: stopped", what, deadline)
            _ask_for_stacks(self)
            kill_holding_locks(self, what, own_locks(self))
            if isinstance(self, DecentralizedAverager):
                with contextlib.suppress(OSError):  # ends hivemind's thread that serves this averager's state
                    self._inner_pipe.send(("_SHUTDOWN", None))
            raise StartTimeout(f"{what} not ready within {deadline:.0f} s") from None

    return run_in_background


def _averager_shutdown(self: Any) -> None:
    """hivemind 1.1.12's ``DecentralizedAverager.shutdown``, but for the kill."""
    if not self.is_alive():
        logger.debug("%s: already stopped", _describe(self))
        return
    self._outer_pipe.send(("_shutdown", [self.shutdown_timeout], {}))  # the averager's process
    self._inner_pipe.send(("_SHUTDOWN", None))  # hivemind's thread here that serves its state
    _join_or_kill(self)


def _dht_shutdown(self: Any) -> None:
    """hivemind 1.1.12's ``DHT.shutdown``, but for the kill."""
    if not self.is_alive():
        return
    self._outer_pipe.send(("_shutdown", [], {}))
    self._outer_pipe.close()
    _join_or_kill(self)


def _join_or_kill(self: Any) -> None:
    """Give the process its ``shutdown_timeout``, then kill it with the locks it shares held here
    (hivemind ``terminate()`` s it wherever it is)."""
    self.join(self.shutdown_timeout)
    if self.is_alive():
        what = _describe(self)
        logger.warning("%s did not stop within %.0f s: killed", what, self.shutdown_timeout)
        kill_holding_locks(self, what, own_locks(self))


#: What the DHT's process is asked to run in place of a request it could not read: nothing.
DROPPED_REQUEST = "_p2ptrain_dropped_request"


class RequestReader:
    """The DHT process's end of its request pipe, read so that a dead caller cannot end the process.

    hivemind's loop calls ``poll()`` and then ``recv()``.  Here ``recv()`` reads the request's bytes
    (a closed pipe still raises, as before), then unpickles them; when the unpickling fails because the
    caller that serves the request's answer pipe has exited, the request is answered by nobody anyway:
    it becomes a call of :data:`DROPPED_REQUEST`, which does nothing, and one warning line.
    """

    def __init__(self, connection: multiprocessing.connection.Connection) -> None:
        self._connection = connection

    def recv(self) -> Any:
        request = self._connection.recv_bytes()
        try:
            return ForkingPickler.loads(request)
        except (EOFError, ConnectionError, FileNotFoundError) as error:
            logger.warning("DHT: dropped a request whose caller exited before it was read (%s)",
                           type(error).__name__)
            return DROPPED_REQUEST, [], {}

    def __getattr__(self, name: str) -> Any:  # poll, fileno, send, close: the connection's own
        return getattr(self._connection, name)


async def _dropped_request(self: Any) -> None:
    """The DHT's answer to a request it could not read (see :class:`RequestReader`): none."""


def _dht_run(hivemind_run: Callable[[Any], None]) -> Callable[[Any], None]:
    """hivemind 1.1.12's ``DHT.run`` (the body of the DHT's process), its requests read by a
    :class:`RequestReader`."""

    def run(self: Any) -> None:
        self._inner_pipe = RequestReader(self._inner_pipe)
        hivemind_run(self)

    return run


_HIVEMIND_STARTS = {DecentralizedAverager: DecentralizedAverager.run_in_background, DHT: DHT.run_in_background}
_HIVEMIND_STOPS = {DecentralizedAverager: DecentralizedAverager.shutdown, DHT: DHT.shutdown}
_HIVEMIND_DHT_RUN = DHT.run


def _standing_in_for(replacement: Any, original: Callable[..., Any]) -> Any:
    """``replacement``, marked as standing in for hivemind's ``original``: ``inspect.signature`` (and
    the pin's signature check, tests/unit/test_hivemind_pin.py) then reads hivemind's own."""
    replacement.__wrapped__ = original
    return replacement


def install() -> None:
    """Put the bounded starts and the safe stops on hivemind's ``DecentralizedAverager`` and ``DHT``
    (their subclasses inherit them), and the DHT's request reader.  Calling it again changes nothing."""
    DHT.run = _standing_in_for(_dht_run(_HIVEMIND_DHT_RUN), _HIVEMIND_DHT_RUN)
    setattr(DHT, DROPPED_REQUEST, _dropped_request)
    for cls, start_timeout, stop in ((DecentralizedAverager, lambda: AVERAGER_START_TIMEOUT, _averager_shutdown),
                                     (DHT, lambda: DHT_START_TIMEOUT, _dht_shutdown)):
        start = _HIVEMIND_STARTS[cls]
        cls.run_in_background = _standing_in_for(_bounded_start(start, start_timeout), start)
        cls.shutdown = _standing_in_for(stop, _HIVEMIND_STOPS[cls])
