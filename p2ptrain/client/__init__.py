"""Talking to a running node's local API: the one HTTP client and where to find the node.

- ``http``       the client of ``/api/v1`` used by the TUI, the CLI and the tests
- ``discovery``  the API's URL and token file: flags, then the config's state dir, then defaults

Standard library only (with :mod:`p2ptrain.status` and :mod:`p2ptrain.config.tomlfile`): ``p2ptrain top``
imports it and must start in well under a second.
"""
