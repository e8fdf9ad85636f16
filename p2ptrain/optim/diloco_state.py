"""DiLoCo's state: downloading a peer's outer parameters and round position, and checkpoints.

The rounds are :mod:`p2ptrain.optim.diloco`'s, a subclass of this one; each reads on its own.  A download
replaces the round in flight, never the reverse, and is checked before anything is copied
(:mod:`p2ptrain.averaging.state_check`; with the peer checks also the donor's model's loss here).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from p2ptrain.averaging.model_check import make_loss_check
from p2ptrain.averaging.progress import SwarmProgressTracker
from p2ptrain.averaging.state_check import StateValidator
from p2ptrain.config.schema import TrainingSection
from p2ptrain.optim.defences import Defences
from p2ptrain.optim.error_feedback import ErrorFeedback
from p2ptrain.optim.inner import ClippedAdamW
from p2ptrain.optim.microbatches import MicroBatches
from p2ptrain.optim.outer_step import OuterStep
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.trust.verdicts import Verdict

logger = logging.getLogger(__name__)


class DiLoCoState:
    """State downloads and checkpoints of :class:`p2ptrain.optim.diloco.DiLoCoOptimizer` (its base)."""

    cfg: TrainingSection
    stats: SwarmStats
    averager: Any
    params: list[torch.Tensor]
    inner: ClippedAdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    outer: OuterStep
    inner_step: int
    samples_this_round: int
    _micro: MicroBatches
    _tracker: SwarmProgressTracker
    _validator: StateValidator
    _defences: Defences | None
    _feedback: ErrorFeedback | None
    _evaluate: Callable[[], float] | None
    _wait: Callable[[float], object]
    _last_failed_sync: float
    round_settled: threading.Event

    @property
    def local_epoch(self) -> int:
        raise NotImplementedError

    def _set_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def _settle_round(self, block: bool) -> None:
        raise NotImplementedError

    def served_state(self) -> tuple[dict[str, int], list[torch.Tensor]]:
        """(round position, outer params and momentum) for a newcomer; runs in an averager's thread."""
        # A newcomer must get the outer params after the round in flight is applied, or it would
        # start from params its peers have already left.
        self.round_settled.wait(timeout=self.cfg.averaging_timeout + self.cfg.matchmaking_time)
        # CPU copies: hivemind serialises host tensors, and the outer state lives on the training device.
        tensors = [t.detach().to("cpu", copy=True) for t in (*self.outer.params, *self.outer.momentum_buffers())]
        # A fast peer makes more inner steps than inner_steps in a round; newcomers check the step
        # against 0..inner_steps-1, and the LR schedule stands at the round's last position anyway.
        step = min(self.inner_step, self.cfg.inner_steps - 1)
        return dict(epoch=self.local_epoch, inner_step=step), tensors

    def load_state_from_peers(self) -> bool:
        """Download outer params, momentum and round position from a peer; bounded, never raises.

        Every state is checked before it is adopted (:meth:`_adopt`); a fresh node that finds only
        bad donors trains from its own initialisation."""
        if time.monotonic() - self._last_failed_sync < max(30.0, self.cfg.averaging_timeout):
            return False
        self._settle_round(block=True)  # a downloaded state replaces the round in flight, not the reverse
        started = time.perf_counter()
        self.stats.download_started()
        rejected = 0
        for attempt in range(1, self.cfg.load_state_attempts + 1):
            try:
                loaded = self.averager.load_state_from_peers(timeout=self.cfg.load_state_timeout)
            except Exception as exc:
                logger.warning("state download attempt %d failed: %r", attempt, exc)
                continue
            rejected += len(getattr(self.averager, "last_download_rejections", ()))
            source = getattr(self.averager, "last_download_source", None)  # the hardened averager names it
            if loaded is not None and self._adopt(*loaded, donor=source[0] if source else "a peer"):
                self.stats.download_finished(True, time.perf_counter() - started)
                return True
            rejected += loaded is not None
            # A node that has just joined may not see the donors' DHT entries yet.
            if attempt < self.cfg.load_state_attempts and self._wait(2.0 * attempt):
                break
        self.stats.download_finished(False, 0.0)
        self._last_failed_sync = time.monotonic()
        if getattr(self._tracker, "robust", False):
            self._tracker.distrust_unsupported(max(30.0, self.cfg.averaging_timeout))
        if rejected and self.local_epoch == 0:
            logger.warning("every donor's state was rejected: training from this node's own initialisation")
        else:
            logger.warning("could not download state from any peer; continuing with local state")
        return False

    def _check_model(self, metadata: Any, tensors: Any, donor: str) -> Verdict:
        """The downloaded outer parameters' validation loss here, against ours and the run's reports."""
        if self._evaluate is None or self._defences is None:
            return Verdict.good()
        averager = self.averager
        check = make_loss_check(self.params, self._evaluate, own_loss=lambda: None,
                                peer_losses=self._defences.evidence.peer_val_losses,
                                lock=lambda: averager.lock_averaged_tensors)
        return check(metadata, tensors, donor)

    @torch.no_grad()
    def _adopt(self, metadata: Any, tensors: Any, *, donor: str = "a peer") -> bool:
        """Switch to a downloaded state once it passes the structural checks (count, shapes, dtypes,
        finite values, epoch and inner step in range); False, and nothing changed, if it does not."""
        try:
            verdict = self._validator.structure(metadata, tensors)
        except Exception as exc:  # the validator never raises; if it ever did, the state is not adopted
            verdict = Verdict.bad("bad_state", f"could not be checked ({type(exc).__name__})")
        if not verdict.ok:
            logger.warning("not adopting the downloaded state: %s", verdict.reason)
            return False
        count = len(self.params)
        # The download is host memory; each tensor lands on the training device (the outer state's).
        for outer, param, value in zip(self.outer.params, self.params, tensors[:count], strict=True):
            outer.copy_(value)
            param.copy_(outer)
        for outer, buffer in zip(self.outer.params, tensors[count:], strict=True):
            self.outer.optimizer.state[outer]["momentum_buffer"] = buffer.to(outer.device, outer.dtype, copy=True)
        # Finish the donor's current round with it instead of drifting a partial round behind.
        self.inner_step = int(metadata["inner_step"])
        self.samples_this_round = 0
        self._micro.reset()
        if self._feedback is not None:  # what it kept was relative to outer params it has now left
            self._feedback.reset()
        self._set_epoch(int(metadata["epoch"]))
        logger.info("loaded round %d (inner step %d) from %s", self.local_epoch, self.inner_step, donor)
        return True

    def checkpoint_state(self) -> dict[str, Any]:
        optimizer = {"inner": self.inner.state_dict(), "outer": self.outer.optimizer.state_dict(),
                     "outer_params": [p.detach().to("cpu", copy=True) for p in self.outer.params],
                     "inner_step": self.inner_step}
        if self._feedback is not None:
            optimizer["error_feedback"] = self._feedback.state()
        return {"optimizer": optimizer, "scheduler": self.scheduler.state_dict(), "epoch": self.local_epoch}

    @torch.no_grad()
    def restore(self, state: dict[str, Any]) -> None:
        optimizer = state.get("optimizer")
        if optimizer is not None:
            self.inner.load_state_dict(optimizer["inner"])
            for outer, value in zip(self.outer.params, optimizer["outer_params"], strict=True):
                outer.copy_(value)
            self.outer.optimizer.load_state_dict(optimizer["outer"])
            self.inner_step = int(optimizer.get("inner_step", 0))
            if self._feedback is not None and not self._feedback.load(optimizer.get("error_feedback")):
                logger.info("no error-feedback buffer in the checkpoint that fits: it starts at zero")
        if state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self._set_epoch(int(state.get("epoch", 0)))
