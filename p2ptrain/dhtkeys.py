"""Every DHT key the project writes or reads, each built here and nowhere else.

Stdlib only and at the bottom of the layers, so that every package that names a key takes it from
here: :mod:`p2ptrain.swarm` (records, the fingerprint claim, an owned run's entries) and the
hivemind adapters in :mod:`p2ptrain.averaging` and :mod:`p2ptrain.optim`, which may not import
:mod:`p2ptrain.swarm`.

Two names start every key.  ``run_id`` is ``swarm.run_id``: a plain run's name from the node
config, or an owned run's ``RunRef.run_id`` (``NAME-<hash of the owner's key>``, so two owners
never share keys).  The *averaging prefix* (:func:`averaging_prefix`) adds the model fingerprint,
so peers training different models never meet in a round; hivemind derives further keys from it.

==============================  ==========================================  ==========================================
key                             written by                                  read by
==============================  ==========================================  ==========================================
``<run_id>_peers``              every node: its signed, identity-bound      every node's record book (its swarm view),
                                peer record (``swarm.records``, via         the fingerprint check's witnesses,
                                ``daemon.record_publisher``)                ``p2ptrain fetch``
``<run_id>_model_fingerprint``  plain-run nodes, unsigned, a subkey per     the same claim; owned runs refuse every
                                model (``swarm.dht.claim_fingerprint``)     entry (``swarm.run_entries``)
``<run_id>_manifest``           the owner's node and every node holding a   ``swarm.ownedrun.RunKeeper``, the one-line
                                verified manifest, a subkey per version     join and ``run show``
                                (``swarm.run_entries``)                     (``swarm.manifest_source``)
``<run_id>_members``            each node of an invite run: its invite      ``RunKeeper`` (the admission gate's
                                under its peer ID                           members)
``<prefix>_progress``           gradient mode's progress tracker            the same trackers
                                (``averaging.paced_progress``), withdrawn   (``averaging.robust_progress``): the
                                while paused                                swarm's epoch and peers
``<prefix>_grad_averager``      gradient mode's gradient averager           its groupmates
                                (hivemind's name; its matchmaking keys
                                hang off it)
``<prefix>_state_averager``     gradient mode's state averager              its groupmates; newcomers looking for a
                                (``optim.gradient``,                        state donor
                                ``averaging.admitting``)
``<prefix>_diloco_progress``    DiLoCo's round clock, a progress tracker    the same clocks: the swarm's round and
                                (``averaging.roundclock``)                  peers
``<prefix>_diloco_avg``         DiLoCo's averager (``optim.diloco``)        its groupmates; newcomers looking for a
                                                                            state donor
``<averager>.all_averagers``    every averager that serves its state: its   the hardened state download's donor
                                donor priority (hivemind)                   candidates (``averaging.hardened``)
==============================  ==========================================  ==========================================

Each key has its builder below, named after it (``peers_key``, ``manifest_key``, ...).
"""

from __future__ import annotations


def peers_key(run_id: str) -> str:
    """The run's signed peer records (also ``PeersSchema``'s field ``peers`` under the prefix ``run_id``)."""
    return f"{run_id}_peers"


def fingerprint_key(run_id: str) -> str:
    """Where plain runs claim their model fingerprint (unsigned); owned runs keep it in the manifest."""
    return f"{run_id}_model_fingerprint"


def manifest_key(run_id: str) -> str:
    """An owned run's signed manifest versions."""
    return f"{run_id}_manifest"


def members_key(run_id: str) -> str:
    """An invite run's members: each admitted peer's invite token under its peer ID."""
    return f"{run_id}_members"


def averaging_prefix(run_id: str, fingerprint: str) -> str:
    """What the swarm optimizer averages under: the run and its model, so different models never meet."""
    return f"{run_id}_{fingerprint}"


def progress_key(tracker_prefix: str) -> str:
    """The progress entries of a hivemind progress tracker started with ``tracker_prefix`` (hivemind's
    own derivation: ``ProgressTracker.training_progress_key``)."""
    return f"{tracker_prefix}_progress"


def grad_averager_prefix(prefix: str) -> str:
    """Gradient mode's gradient averager (the name ``hivemind.Optimizer`` gives it)."""
    return f"{prefix}_grad_averager"


def state_averager_prefix(prefix: str) -> str:
    """Gradient mode's state averager (the name ``hivemind.Optimizer`` gives it)."""
    return f"{prefix}_state_averager"


def diloco_outer_prefix(prefix: str, outer_compression: str, value_bits: int = 2, density: float = 0.02) -> str:
    """The prefix of DiLoCo's clock and averager for one outer step's wire format: peers that average
    parameters, int8 pseudo-gradients, or top-k ones of another density or width never meet in a round
    or a download (their parts would not add up)."""
    if outer_compression == "topk":  # hivemind refuses a "." in an averager's prefix: 0.02 is written 0p02
        return f"{prefix}_topk_{value_bits}bit_{density:g}".replace(".", "p")
    return prefix if outer_compression == "none" else f"{prefix}_{outer_compression}"


def diloco_clock_prefix(prefix: str) -> str:
    """DiLoCo's round clock, a progress tracker: its entries are :func:`progress_key` of this."""
    return f"{prefix}_diloco"


def diloco_averager_prefix(prefix: str) -> str:
    """DiLoCo's averager of outer steps."""
    return f"{prefix}_diloco_avg"


def all_averagers_key(averager_prefix: str) -> str:
    """Where hivemind's averagers under ``averager_prefix`` announce themselves as state donors."""
    return f"{averager_prefix}.all_averagers"
