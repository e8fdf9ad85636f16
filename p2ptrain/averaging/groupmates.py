"""How an averager answers its groupmates' all-reduce streams: not before it is ready, not cut off.

In an all-reduce each member reduces a share of the vector for the whole group: every groupmate
opens a stream to it, sends its parts of that share and reads the averages back.  hivemind 1.1.12
gets two moments of that wrong for peers of different speeds:

* **Parts that arrive before our trigger.**  After matchmaking each member waits for its own
  trigger (DiLoCo: the end of its round, at its next micro-batch) before it registers the group
  for all-reduce.  A faster groupmate triggered first streams its parts at once.  hivemind's
  handler waits for "a group registered", an event that the end of our *previous* round has often
  set already (the next round is matched while the last one still runs), so it answers
  ``BAD_GROUP_ID``: the groupmate keeps its own values for our share, and our reducer averages
  nothing but our own parts: such a round averages about half of the vector, and the replicas drift
  apart (docs/reliability.md).  A slow follower may even get the parts before it has read the
  leader's word that the group is complete.  Here a stream waits (bounded)
  while its group is one our matchmaking assembled and we have not registered yet, or while a
  search of ours that may end in it is under way.
* **Leaving while groupmates still read.**  A member's own round ends as soon as it holds every
  average it needs, which can be before its groupmates have read the averages it computed for them.
  A node shutting down then (``training.max_epochs``, a leave) would cut those streams.  Here
  ``shutdown`` first waits (bounded) until no stream is being served.

Both waits are at most :meth:`GroupmateService.grace` (the averager's chunk timeout): a groupmate
gives up on a silent reducer after that anyway.  :class:`GroupmateService` is that policy, free of
hivemind; the adapter's averagers (:mod:`p2ptrain.averaging.hardened`) call it from their overrides.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing as mp
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Iterator
from typing import Any, TypeVar

from p2ptrain.waiting import WaitTimeout, wait_until

logger = logging.getLogger(__name__)

#: The wait when the averager has no chunk timeout to go by.
DEFAULT_SERVE_GRACE = 5.0
#: Never longer than this: shutting down has its own deadline (``daemon.shutdown``).
MAX_SERVE_GRACE = 10.0
POLL_SECONDS = 0.02

_Message = TypeVar("_Message")


class GroupmateService:
    """How one averager serves its groupmates' streams (see the module doc).

    ``grace``: the longest either wait lasts (None: the averager's chunk timeout, or
    :data:`DEFAULT_SERVE_GRACE`).  Create it before the averager's process forks: the count of streams
    being served is shared with it.
    """

    def __init__(self, grace: float | None = None) -> None:
        self._serving = mp.Value(ctypes.c_int, 0)
        self._grace = grace
        # The rest lives in the averager's process.  Groups our matchmaking assembled that are not
        # registered for all-reduce yet (our trigger has not come), by the step that assembled them;
        # how many searches for a group are under way (a follower learns its group's ID last); and
        # the event that the next change of either sets.
        self._assembled: dict[int, set[bytes]] = {}
        self._matching = 0
        self._changed: asyncio.Event | None = None

    def grace(self, chunk_timeout: float | None) -> float:
        """The longest wait, given the averager's chunk timeout (None or 0: none set)."""
        if self._grace is not None:
            return max(0.0, min(self._grace, MAX_SERVE_GRACE))
        return min(float(chunk_timeout), MAX_SERVE_GRACE) if chunk_timeout else DEFAULT_SERVE_GRACE

    # ------------------------------------------------------------------ parts before our trigger

    async def search(self, look_for_group: Callable[[Any], Awaitable[Any]], step: Any) -> Any:
        """One search of our matchmaking (``look_for_group(step)``), noted with the group it found."""
        self._matching += 1
        group = None
        try:
            group = await look_for_group(step)
        finally:
            self._matching -= 1
            if group is not None:
                self._assembled.setdefault(id(step), set()).add(group.group_id)
            self._notify()
        return group

    def step_ended(self, step: Any) -> None:
        """Groups the step never registered (cancelled, failed while awaiting its trigger): a
        groupmate's stream for one of them stops waiting and gets hivemind's answer."""
        if self._assembled.pop(id(step), None):
            self._notify()

    def registered(self, group_id: bytes) -> None:
        """The group is registered for all-reduce: streams for it need not wait any longer."""
        for groups in self._assembled.values():
            groups.discard(group_id)
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def settled(self, group_id: bytes, running: Container[bytes]) -> bool:
        """Registered (in ``running``), or not about to be: no step holds it as assembled and no
        search may yield it."""
        if group_id in running:
            return True
        return self._matching == 0 and not any(group_id in groups for groups in self._assembled.values())

    async def until_settled(self, group_id: bytes, running: Container[bytes], grace: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while not self.settled(group_id, running) and (left := deadline - loop.time()) > 0:
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def serve(self, stream: AsyncIterator[_Message], group_of: Callable[[_Message], bytes],
                    running: Container[bytes], grace: float,
                    answer: Callable[[AsyncIterator[_Message]], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        """A groupmate's stream, answered by ``answer`` once its group (``group_of`` its first message)
        is settled, and counted as served until it ends."""
        with self.serving():
            first = await stream.__anext__()
            await self.until_settled(group_of(first), running, grace)
            async for message in answer(_prepend(first, stream)):
                yield message

    # ------------------------------------------------------------------ leaving

    @property
    def streams_serving(self) -> int:
        """The all-reduce streams the averager is answering right now (read from any process)."""
        return int(self._serving.value)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        self._count(+1)
        try:
            yield
        finally:
            self._count(-1)

    def _count(self, change: int) -> None:
        with self._serving.get_lock():
            self._serving.value += change

    def finish_serving(self, grace: float, sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic) -> float:
        """Wait (bounded) until no groupmate is still reading averages from us; returns the seconds waited."""
        in_flight = self.streams_serving
        if in_flight <= 0:
            return 0.0
        started = clock()
        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: self.streams_serving <= 0, grace, "groupmate reading our averages",
                       POLL_SECONDS, clock=clock, sleep=sleep)
        waited = clock() - started
        if self.streams_serving > 0:
            logger.info("leaving with %d groupmates still reading this round's averages (waited %.1f s)",
                        self.streams_serving, waited)
        else:
            logger.info("waited %.2f s for %d groupmates to read this round's averages", waited, in_flight)
        return waited


async def _prepend(first: _Message, rest: AsyncIterator[_Message]) -> AsyncIterator[_Message]:
    yield first
    async for message in rest:
        yield message
