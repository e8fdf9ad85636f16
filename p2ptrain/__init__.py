"""p2ptrain: an elastic peer-to-peer training daemon for volunteer compute, built on hivemind."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("p2ptrain")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
