"""The front door: ``p2ptrain <command>`` and the commands that are not the node itself.

- ``main``     the parser and dispatch; daemon and TUI commands are imported only when run
- ``config``   ``config init`` and ``config check``
- ``run``      the run owner's commands: ``run init|show|invite|update|peer-id``
- ``tryit``    ``export``, ``sample`` and ``eval``
- ``report``   ``report``: a running node's summary as text or JSON
- ``demo``     ``demo``: a local swarm, trained, left, joined, exported and sampled
- ``completion`` shell completion (argcomplete, optional) and ``completion bash|zsh``
- ``doctor``   ``doctor``: this machine checked for what volunteers get wrong, one line per check
- ``__main__`` ``python -m p2ptrain.cli``, what the systemd units run

The top layer: it may import anything, and nothing in the library imports it.
"""
