"""The adapter layer over hivemind's averagers and progress tracker: every subclass and patch of them.

hivemind's private methods are overridden here and nowhere else, next to the pinned version
(``pinned``); what those overrides decide comes from the pure policy of :mod:`p2ptrain.trust`, and the
tensor math they need (screens, robust aggregates, state checks) lives here beside them.

- ``pinned``           the hivemind version these subclasses were written against, checked at start-up
- ``hardened``         the one layer of averager overrides; the plain and gradient averagers through it
- ``allreduce``        hivemind's all-reduce with each sender's part checked before it is mixed in
- ``counting``         hivemind's all-reduce counting what it mixed in (without the peer checks)
- ``robust_reduce``    the math of a robust part: screen, weight cap, robust aggregate, round reports
- ``admitting``        whether an averager may deal with a peer of an owned run (no hivemind)
- ``groupmates``       answering groupmates' streams: not before ready, not cut off (no hivemind)
- ``donors``           which donor's state to adopt, and whom a bad one bans (no hivemind)
- ``donor_stream``     reading donors' streams in the averager's process, best first, each bounded
- ``optimizer``        ``hivemind.Optimizer``'s overrides, for gradient mode
- ``matchmaking``      group reads paced
- ``handles``          the DHT, DHT time and where a round's control stands, for the optimizers to hold
- ``progress``         hivemind's progress tracker, hardened: paced reports, the robust view, DiLoCo's round target
- ``paced_progress``   when a progress report is due: about once a second (no hivemind)
- ``robust_progress``  the swarm's epoch as several peers agree on it (no hivemind)
- ``roundclock``       DiLoCo's round target, by the peers' speed (no hivemind; the arithmetic: ``trust.pace``)
- ``state_check``      a downloaded state's tensors checked before they touch the model
- ``model_check``      a downloaded model's loss on our validation batches
- ``state_download``   adopting a peer's state: validated, donor-aware, O(1) catch-up
- ``diloco``           DiLoCo's averager, serving the outer state to newcomers
- ``compression``      the config's compression names as hivemind codecs
- ``sparse_codec``     the sparse outer round's wire format: per-chunk top-k offsets and few-bit values
- ``lifecycle``        an averager's start with a deadline; a stop that never leaves a shared lock held
                       (installed on hivemind's averager class when this package is imported)

May import: hivemind, torch, :mod:`p2ptrain.trust`, the stdlib-only modules at the top.
"""

from p2ptrain.averaging import lifecycle as _lifecycle

# Here, not in each averager's module: hivemind's own averagers (inside hivemind.Optimizer) and plain
# ones need the bounded start and the safe stop as much as ours do, and every one of them is created
# after something of this package has been imported.
_lifecycle.install()
