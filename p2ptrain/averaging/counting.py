"""Every averaging round says how much of it was really averaged, with the peer checks or without.

hivemind calls a round done when its all-reduce returns, however few contributions its reducer got
(it only logs "Reducer: received 33.3% of input tensors").  :class:`CountingAveragerMixin` goes first
in the bases of a hivemind 1.1.12 ``DecentralizedAverager`` subclass and overrides (in the averager's
forked process) ``_run_allreduce_inplace_``, restated from hivemind's so that every round runs through
a runner of our choice and ends with a :class:`~p2ptrain.averaging.robust_reduce.AllReduceReport` in a fork-shared
:class:`~p2ptrain.averaging.robust_reduce.RoundReports`.  Without the peer checks that runner is hivemind's own
all-reduce with one small change (:class:`CountingAllReduceRunner`: its reducer counts the
contributions it mixed in); the hardened averagers (:mod:`p2ptrain.averaging.hardened`) build theirs with
every sender's part screened.  Either way a round is "full" by the same measure
(:mod:`p2ptrain.optim.round_stats`).  It also keeps the hivemind class's RPC names (see ``rpc_name``),
paces its matchmaking's reads of the DHT (:mod:`p2ptrain.averaging.matchmaking`), and serves its groupmates'
all-reduce streams once it is ready and until they are read (:mod:`p2ptrain.averaging.groupmates`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from hivemind.averaging.allreduce import AllReduceRunner, AveragingMode
from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.partition import TensorPartReducer
from hivemind.optim.grad_averager import GradientAverager
from hivemind.utils import get_dht_time
from hivemind.utils.asyncio import as_aiter, azip

from p2ptrain.averaging.groupmates import ServeGroupmatesMixin
from p2ptrain.averaging.matchmaking import pace_group_polls
from p2ptrain.averaging.pinned import require_hivemind
from p2ptrain.averaging.robust_reduce import AllReduceReport, RoundReports

require_hivemind(__name__)


class CountingTensorPartReducer(TensorPartReducer):
    """hivemind's reducer (``check_current_part_finished``), counting the contributions each part mixed in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.contributions_accepted = 0
        self.clipped = 0
        super().__init__(*args, **kwargs)

    def check_current_part_finished(self) -> None:
        if self.current_part_accumulated_from == self.num_current_senders and not self.finished.is_set():
            self.contributions_accepted += self.current_part_accumulated_from
        super().check_current_part_finished()


class CountingAllReduceRunner(AllReduceRunner):
    """hivemind's all-reduce, its reducer replaced by :class:`CountingTensorPartReducer` (``__init__``)."""

    tensor_part_reducer: TensorPartReducer  # hivemind's, declared: read here before it is replaced

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Nothing has reached the reducer hivemind built yet (the round starts when the runner is run).
        plain = self.tensor_part_reducer
        self.tensor_part_reducer = CountingTensorPartReducer(plain.part_shapes, plain.num_senders)
        plain.finalize()
        self.rejections: list[tuple[str, str, str]] = []


class CountingAveragerMixin(ServeGroupmatesMixin):
    """Put first in the bases of a hivemind ``DecentralizedAverager`` subclass (see the module doc).

    hivemind names every RPC after the servicer's class (``<prefix>::<ClassName>.rpc_...``), so a
    subclass under a new name could not talk to nodes running the class it replaces.  ``rpc_name``
    keeps the wire name of the hivemind class (None: the class's own name, e.g. a new averager type).
    ``round_reports`` must be created before the averager (it is shared with its forked process).
    """

    rpc_name: str | None = None
    _rpc_handlers: ClassVar[Any]  # hivemind's ServicerBase cache (declared only: see _collect_rpc_handlers)

    @classmethod
    def _get_handle_name(cls, namespace: str | None, method_name: str) -> str:
        handle = f"{cls.rpc_name or cls.__name__}.{method_name}"
        return handle if namespace is None else f"{namespace}::{handle}"

    @classmethod
    def _collect_rpc_handlers(cls) -> None:
        # hivemind caches handlers and stubs in a class attribute that subclasses inherit: a stub made
        # for a parent class would call the parent's RPC names.  Each of our classes makes its own.
        if "_rpc_handlers" not in cls.__dict__:
            cls._rpc_handlers = None
        super()._collect_rpc_handlers()  # type: ignore[misc]

    def __init__(self, *args: Any, round_reports: RoundReports | None = None, **kwargs: Any) -> None:
        self._round_reports = round_reports
        super().__init__(*args, **kwargs)

    async def _step(self, **kwargs: Any) -> None:
        pace_group_polls(self._matchmaking)  # type: ignore[attr-defined]
        await super()._step(**kwargs)

    def _make_runner(self, **kwargs: Any) -> AllReduceRunner:
        """The runner of one round (``kwargs``: what hivemind gives its ``AllReduceRunner``)."""
        return CountingAllReduceRunner(**kwargs)

    async def _run_allreduce_inplace_(self, tensors: Sequence[torch.Tensor], group_info: GroupInfo,
                                      group_id: bytes | None = None, **kwargs: Any) -> None:
        # hivemind 1.1.12's DecentralizedAverager._run_allreduce_inplace_ with our runner and a report.
        group_id = group_info.group_id if group_id is None else group_id
        runner = self._make_runner(
            p2p=self._p2p, servicer_type=type(self), prefix=self.prefix, tensors=tensors,  # type: ignore[attr-defined]
            group_id=group_id, ordered_peer_ids=group_info.peer_ids, **kwargs)
        assert group_id in self._running_groups, f"group {group_id!r} was not registered"  # type: ignore[attr-defined]
        self._running_groups[group_id].set_result(runner)  # type: ignore[attr-defined]
        ok = False
        try:
            if runner.modes[group_info.peer_ids.index(self.peer_id)] != AveragingMode.AUX:  # type: ignore[attr-defined]
                async for tensor, update in azip(as_aiter(*tensors), runner):
                    tensor.add_(update, alpha=self._averaging_alpha)  # type: ignore[attr-defined]
                    self.last_updated = get_dht_time()
                # hivemind sets this per tensor: each set re-declares this peer as a state donor (a
                # DHT store sent to every peer), one per averaged tensor every round.  Once per round
                # says the same.
                self._state_updated.set()  # type: ignore[attr-defined]
            else:
                async for _ in runner:
                    raise ValueError("aux peers should not receive averaged tensors")
            ok = True
        finally:
            self._report_round(runner, group_info, ok)

    def _report_round(self, runner: Any, group_info: GroupInfo, ok: bool) -> None:
        if self._round_reports is None:
            return
        reducer, container = runner.tensor_part_reducer, runner.tensor_part_container
        self._round_reports.put(AllReduceReport(
            averager=self.prefix, group_size=len(group_info.peer_ids),  # type: ignore[attr-defined]
            peers=tuple(str(peer) for peer in group_info.peer_ids),
            senders=len(runner.sender_peer_ids),
            contributions_expected=reducer.num_parts * len(runner.sender_peer_ids),
            contributions_received=reducer.contributions_accepted,
            results_expected=container.total_size, results_received=container.total_size - container.failed_size,
            rejected=tuple(runner.rejections), clipped=reducer.clipped, ok=ok, finished_at=time.time(),
            weights=tuple((str(runner.sender_peer_ids[index]), float(weight))
                          for index, weight in getattr(reducer, "weights", {}).items())))


class CountingGradientAverager(CountingAveragerMixin, GradientAverager):
    """hivemind's gradient averager, its rounds reported (a node without the peer checks)."""

    rpc_name = "GradientAverager"
