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

Both waits are at most :meth:`ServeGroupmatesMixin.serve_grace` (the averager's chunk timeout):
a groupmate gives up on a silent reducer after that anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from typing import Any, AsyncIterator  # noqa: UP035  (hivemind's rpc_* annotations need typing's)

from hivemind.averaging.group_info import GroupInfo
from hivemind.p2p import P2PContext
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import achain, anext, as_aiter

from p2ptrain.waiting import WaitTimeout, wait_until

logger = logging.getLogger(__name__)

#: The wait when the averager has no chunk timeout to go by.
DEFAULT_SERVE_GRACE = 5.0
#: Never longer than this: shutting down has its own deadline (``daemon.shutdown``).
MAX_SERVE_GRACE = 10.0
POLL_SECONDS = 0.02


class ServeGroupmatesMixin:
    """Goes before a hivemind ``DecentralizedAverager`` in the bases (after mixins that refuse calls).

    ``serve_grace``: the longest either wait lasts (None: the averager's ``next_chunk_timeout``,
    or :data:`DEFAULT_SERVE_GRACE`)."""

    def __init__(self, *args: Any, serve_grace: float | None = None, **kwargs: Any) -> None:
        # Before the base class starts the averager's process: the counter is shared by the fork.
        self._serving = mp.Value(ctypes.c_int, 0)
        self._serve_grace = serve_grace
        # The rest lives in the averager's process.  Groups our matchmaking assembled that are not
        # registered for all-reduce yet (our trigger has not come), by the step that assembled them;
        # how many searches for a group are under way (a follower learns its group's ID last); and
        # the event that the next change of either sets.
        self._assembled: dict[int, set[bytes]] = {}
        self._matching = 0
        self._changed: asyncio.Event | None = None
        super().__init__(*args, **kwargs)

    def serve_grace(self) -> float:
        if self._serve_grace is not None:
            return max(0.0, min(self._serve_grace, MAX_SERVE_GRACE))
        chunk_timeout = getattr(self, "next_chunk_timeout", None)
        return min(float(chunk_timeout), MAX_SERVE_GRACE) if chunk_timeout else DEFAULT_SERVE_GRACE

    # ------------------------------------------------------------------ parts before our trigger

    async def _step(self, **kwargs: Any) -> None:
        self._note_assembled_groups()
        step = kwargs.get("step")
        try:
            await super()._step(**kwargs)  # type: ignore[misc]
        finally:
            # Groups the step never registered (cancelled, failed while awaiting its trigger): a
            # groupmate's stream for one of them stops waiting and gets hivemind's answer.
            if self._assembled.pop(id(step), None):
                self._notify()

    def _note_assembled_groups(self) -> None:
        """Wrap this process's matchmaking once so that every search and the group it finds are noted."""
        matchmaking = self._matchmaking  # type: ignore[attr-defined]
        if getattr(matchmaking, "_p2ptrain_noted", False):
            return
        look_for_group = matchmaking.look_for_group

        async def noted_look_for_group(step: Any) -> GroupInfo | None:
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

        matchmaking.look_for_group = noted_look_for_group
        matchmaking._p2ptrain_noted = True

    @contextlib.contextmanager
    def _register_allreduce_group(self, group_info: GroupInfo) -> Iterator[None]:
        with super()._register_allreduce_group(group_info):  # type: ignore[misc]
            for groups in self._assembled.values():
                groups.discard(group_info.group_id)
            self._notify()
            yield

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _settled(self, group_id: bytes) -> bool:
        """Registered, or not about to be: no step holds it as assembled and no search may yield it."""
        if group_id in self._running_groups:  # type: ignore[attr-defined]
            return True
        return self._matching == 0 and not any(group_id in groups for groups in self._assembled.values())

    async def _until_settled(self, group_id: bytes) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.serve_grace()
        while not self._settled(group_id) and (left := deadline - loop.time()) > 0:
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    # hivemind reads these annotations (typing's AsyncIterator) to tell a streaming RPC.
    async def rpc_aggregate_part(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.AveragingData]:
        self._count_serving(+1)
        try:
            request = await anext(stream)
            await self._until_settled(request.group_id)
            async for message in super().rpc_aggregate_part(  # type: ignore[misc]
                    achain(as_aiter(request), stream), context):
                yield message
        finally:
            self._count_serving(-1)

    # ------------------------------------------------------------------ leaving

    @property
    def streams_serving(self) -> int:
        """The all-reduce streams this averager is answering right now (read from any process)."""
        return int(self._serving.value)

    def _count_serving(self, change: int) -> None:
        with self._serving.get_lock():
            self._serving.value += change

    def shutdown(self) -> None:
        self.finish_serving()
        super().shutdown()  # type: ignore[misc]

    def finish_serving(self, sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic) -> float:
        """Wait (bounded) until no groupmate is still reading averages from us; returns the seconds waited."""
        in_flight = self.streams_serving
        if in_flight <= 0:
            return 0.0
        started = clock()
        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: self.streams_serving <= 0, self.serve_grace(), "groupmate reading our averages",
                       POLL_SECONDS, clock=clock, sleep=sleep)
        waited = clock() - started
        if self.streams_serving > 0:
            logger.info("leaving with %d groupmates still reading this round's averages (waited %.1f s)",
                        self.streams_serving, waited)
        else:
            logger.info("waited %.2f s for %d groupmates to read this round's averages", waited, in_flight)
        return waited
