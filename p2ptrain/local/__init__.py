"""Real nodes on this machine: the swarm behind ``p2ptrain demo``, the tests and the benchmarks.

- ``swarm``  nodes on 127.0.0.1, each a ``p2ptrain run`` subprocess, with their API clients
- ``run``    a throwaway owned run for them: owner key, signed manifest, invites
- ``forkserver``  one process that imported torch and hivemind forks the test tiers' nodes and
  the benchmarks' smoke-run peers, so that each skips those imports
"""
