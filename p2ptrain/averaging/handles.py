"""The hivemind objects the optimizers hold and read without calling into hivemind: the DHT, DHT time,
and where a round's control stands.  Named here so that :mod:`p2ptrain.optim` never imports hivemind."""

from __future__ import annotations

from typing import Any

from hivemind import DHT
from hivemind.averaging.control import AveragingStage
from hivemind.utils import get_dht_time

__all__ = ["DHT", "awaiting_trigger", "dht_time", "looking_for_group"]


def dht_time() -> float:
    """The swarm's shared clock (hivemind's DHT time): round ends are agreed in it."""
    return float(get_dht_time())


def looking_for_group(control: Any) -> bool:
    """A hivemind averaging step that has not found its group yet.  A second step started meanwhile
    is queued behind it by the averager ("Another look_for_group is already in progress")."""
    return not control.done() and control.stage in (AveragingStage.IDLE, AveragingStage.LOOKING_FOR_GROUP)


def awaiting_trigger(control: Any) -> bool:
    """A hivemind averaging step whose group has assembled and waits for this peer's trigger."""
    return bool(control.stage == AveragingStage.AWAITING_TRIGGER)
