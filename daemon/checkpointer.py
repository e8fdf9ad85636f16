"""The node's checkpoints: what goes into one, writing it without stopping training on a failure,
and resuming from the newest one that belongs to this model.

The store (``p2ptrain.model.checkpoint``) makes writes atomic and falls back past corrupt files; this
module decides the layout and counts the outcomes for the status snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from p2ptrain.config.schema import ConfigError
from p2ptrain.daemon.snapshot import CheckpointFigures
from p2ptrain.model.checkpoint import CheckpointError, CheckpointStore

logger = logging.getLogger(__name__)

#: Layout version of the node's checkpoint dict.
FORMAT = 1


class Checkpointer:
    """Writes and reads this node's checkpoints, stamped with the model fingerprint."""

    def __init__(self, store: CheckpointStore, fingerprint: str, *, wall_clock: Callable[[], float],
                 long_operation: Callable[[float], None]) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self._wall_clock = wall_clock
        self._long_operation = long_operation
        self.figures = CheckpointFigures()

    def load_latest(self) -> dict[str, Any] | None:
        """The newest loadable checkpoint's state, or None; ConfigError if it holds another model."""
        loaded = self.store.load_latest()
        if loaded is None:
            logger.info("no local checkpoint in %s: starting from scratch", self.store.directory)
            return None
        held = loaded.state.get("fingerprint")
        if held not in (None, self.fingerprint):
            raise ConfigError(
                f"checkpoint.dir: {loaded.path} holds model {held} but this config builds "
                f"{self.fingerprint}; restore the [task] settings or point checkpoint.dir elsewhere"
            )
        logger.info("resumed from checkpoint %s (epoch %d)", loaded.path.name, int(loaded.state.get("epoch", 0)))
        return loaded.state

    def save(self, content: dict[str, Any]) -> bool:
        """Write one checkpoint of ``content``; a failure is counted and logged, training goes on."""
        self._long_operation(60.0)
        state = {"format": FORMAT, **content, "saved_at": self._wall_clock(), "fingerprint": self.fingerprint}
        old = self.figures
        try:
            path = self.store.save(state)
        except CheckpointError as exc:
            self.figures = CheckpointFigures(old.ok, old.failed + 1, old.last_time, str(exc), old.last_path,
                                             old.last_epoch)
            logger.error("checkpoint failed (training goes on; previous checkpoint kept): %s", exc)
            return False
        self.figures = CheckpointFigures(old.ok + 1, old.failed, self._wall_clock(), "", str(path),
                                         int(state.get("epoch", 0)))
        logger.info("checkpoint written: %s (epoch %d)", path.name, int(state.get("epoch", 0)))
        return True
