"""The node in the DHT: the one place a ``hivemind.DHT`` is made, and everything stored in it.

- ``dht``              builds the DHT: identity, addresses, bootstrap, fingerprint, NAT settings
- ``daemon_flags``     p2pd's flags hivemind does not pass: the relay budget, a loopback metrics address
- ``relay_meter``      what the p2p daemon relays for peers behind NAT, read from its own counters
- ``identity``         the libp2p identity key as a signer, bound to a peer ID
- ``dialback``         asks a peer to connect back (can this node be dialled?), and answers peers that ask
- ``reach``            how peers reach this node (public, relayed, client, unknown) and the line that says it
- ``records``          signed per-peer records: publish our own, read and validate everyone's
- ``recordcheck``      what one record must be to enter a swarm view
- ``rejoin``           dialling lost peers again after a partition
- ``dhtauth``          an invite run's DHT gate (a hivemind authorizer)
- ``run_entries``      an owned run's entries: its manifest copies and members
- ``manifest_source``  a run's manifest from a file, a running DHT or a swarm to dial
- ``ownedrun``         a node's part in an owned run, before and after the DHT starts
- ``probe``            ``p2ptrain doctor``'s ping of a few peers: their clocks, and whether they dial back

The names of the keys it stores are :mod:`p2ptrain.dhtkeys` (stdlib only, below every layer: the
averaging adapters name keys too).

May import: hivemind, multiaddr, :mod:`p2ptrain.run`, :mod:`p2ptrain.trust`, :mod:`p2ptrain.config`.
"""
