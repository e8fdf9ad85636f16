"""p2ptrain: an elastic peer-to-peer training daemon for volunteer compute, built on hivemind.

The library, from the top layer down (a layer imports only those below it; see
``[tool.importlinter]`` in pyproject.toml, which CI enforces):

- ``cli``        the front door, ``p2ptrain <command>``
- ``local``      real nodes on this machine (demo, tests, benchmarks)
- ``metrics``    the Prometheus collector over the latest snapshot
- ``optim``      gradient averaging and DiLoCo behind one protocol; the training step
- ``averaging``  the adapter over hivemind's averagers | ``swarm`` the DHT and what is stored in it
- ``model``      checkpoints, exports, loading a trained model
- ``tasks``      the task interface and the built-in byte-level LM
- ``data``       shards, this node's stream of them, the validation split
- ``run``        owned runs: owner key, manifest, invites, updates
- ``trust``      pure policy about other peers
- ``config``     the typed node config | ``client`` the local API's client
- the stdlib-only base: ``status`` (the snapshot contract), ``health``, ``errors`` (exit codes),
  ``paths``, ``peerid``, ``runref``, ``dhtkeys`` (every DHT key), ``waiting`` (polling, retrying),
  ``proc``, ``atomicfile``

The node service (``p2ptrain.daemon``, in daemon/) and the monitor (``p2ptrain.tui``, in tui/) sit
above all of it; the library never imports them.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("p2ptrain")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
