"""The swarm view a node shows: its peers' records, less those an owned run does not admit and
claims no honest peer makes, with the offenders it knows of marked.

Kept out of :mod:`p2ptrain.daemon.node` so the loop only asks for it; the admission and evidence
modules load hivemind, so they are imported where a view is actually filtered.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from p2ptrain.status import StatusSnapshot, SwarmView


def shown_view(view: SwarmView, *, gate: Any, defences: Any, own: StatusSnapshot) -> tuple[SwarmView, int]:
    """(the view to show, how many records the run's admission ``gate`` dropped).

    ``gate`` is an owned run's admission gate (None: every peer is admitted); ``defences`` the
    node's :class:`p2ptrain.optim.defences.Defences` (None: peer checks off, records shown as they are)."""
    dropped = 0
    if gate is not None:
        from p2ptrain.trust.admission import filter_view

        view, dropped = filter_view(view, gate.is_admitted)
    if defences is None:
        return view, dropped
    from p2ptrain.trust.evidence import trusted_view

    view, _ = trusted_view(view, own_peer=own.peer_id, own_epoch=own.local_epoch,
                           own_rate=own.local_samples_per_second, met=defences.evidence.met_peers(),
                           is_gated=defences.gate.is_banned)
    return dataclasses.replace(view, offenders=defences.figures().offenders), dropped
