"""A DHT stand-in for building hivemind progress trackers in unit tests."""

from __future__ import annotations


class TrackerDht:
    """Just what a progress tracker's constructor touches; with start=False it never reaches the DHT again."""

    client_mode = False
    peer_id = type("PeerId", (), {"to_bytes": lambda self: b"self"})()

    def add_validators(self, validators: object) -> None: ...

    def get(self, key: str, latest: bool = False) -> None:
        return None
