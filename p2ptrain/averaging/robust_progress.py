"""The swarm's epoch as several peers agree on it, not as the loudest peer claims it.

hivemind 1.1.12's ``ProgressTracker`` takes the *maximum* epoch any peer reports as the global epoch
and sums everyone's samples: one peer claiming epoch 2**40 makes every node think it is behind (it
downloads state, and its optimizer jumps its own epoch there), and one peer claiming huge sample counts
or rates makes every node step early.  With the peer checks the tracker
(:class:`p2ptrain.averaging.progress.SwarmProgressTracker`, ``robust=True``) drops the entries of gated
peers, bounds each peer's samples and rate, and takes the global epoch from :func:`robust_global_epoch`
(here, free of hivemind), recounted at once when a new ban comes.

An entry's peer ID is self-declared (its DHT subkey is an RSA key anyone can make), so one process
could write many entries, or one in an honest peer's name.  Given the bound record keys
(``bound``: record key -> peer ID, from :class:`p2ptrain.trust.evidence.PeerEvidence`), only entries written
with the key a peer's identity-bound record names get a say in the epoch, and they win over other
entries claiming the same peer.  Without any (no records read yet, or none published) every entry
votes; when several claim one peer ID and none is bound, the most modest wins.  Every entry counts
as a peer and towards the samples, each bounded.  Entries are filtered and merged per peer before
their number is capped.
"""

from __future__ import annotations

from collections.abc import Sequence

from p2ptrain.trust.verdicts import MAX_EPOCH

#: Progress entries read per refresh; more than this is a flood, not a swarm.
MAX_PROGRESS_ENTRIES = 512


def robust_global_epoch(own: int, others: Sequence[int], *, quorum: int = 2, unsupported: bool = True) -> int:
    """The swarm's epoch as far as we can believe it; never below ``own``.

    The highest epoch that at least ``quorum`` peers (us included) agree on within 1 wins.  Without
    such agreement, the lower median of the others' epochs is believed (``unsupported=False``: not
    at all): a lone peer ahead of us is followed (a newcomer must catch up with a run of one), but
    one peer far ahead of the others is not, and when peers disagree the modest claim wins.  Claims
    outside ``0..MAX_EPOCH`` are ignored.
    """
    epochs = [e for e in others if isinstance(e, int) and 0 <= e <= MAX_EPOCH]
    pool = [*epochs, own]
    supported = [c for c in set(epochs) if sum(abs(e - c) <= 1 for e in pool) >= quorum]
    if supported:
        return max(own, max(supported))
    if not epochs or not unsupported:
        return own
    return max(own, sorted(epochs)[(len(epochs) - 1) // 2])
