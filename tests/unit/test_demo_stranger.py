"""``p2ptrain demo --private``: what it says of the node without an invite is what it saw, not what it hoped."""

from __future__ import annotations

import pytest

from p2ptrain.cli.demo import StrangerSeen
from p2ptrain.status import StatusSnapshot

REFUSED = StrangerSeen(code=1, dht_refused=7, averaging_refused=0, last=None, wrote_state=False,
                       last_line="p2ptrain: no initial peer answered our DHT requests after 3 attempts in 3s")


def test_a_refused_stranger_is_described_with_the_figures_that_show_it():
    assert REFUSED.doubts() == []
    assert REFUSED.lines() == [
        ">>> stranger exited with code 1",
        "    its last line: p2ptrain: no initial peer answered our DHT requests after 3 attempts in 3s",
        "    the invited nodes refused 7 of its DHT requests (dht_requests_refused_total) and 0 averaging or state "
        "requests (averaging_refused_total)",
        "    so it was refused: it never joined a group or got any state (no state directory, no averaging round, "
        "no download)",
    ]
    assert REFUSED.event().startswith("stranger (no invite) was refused by the invited nodes' DHT (7 requests)")


@pytest.mark.parametrize(("changes", "doubt"), [
    ({"code": 0}, "it exited with code 0, as a node that trained and left would"),
    ({"code": None}, "it was still running when the demo ended"),
    ({"dht_refused": 0}, "the invited nodes refused none of its DHT requests"),
    ({"last": StatusSnapshot(averaging_rounds_ok_total=3)}, "it reported 3 averaging round(s)"),
    ({"last": StatusSnapshot(state_downloads_total=1)}, "it reported 1 state download(s)"),
    ({"wrote_state": True}, "it wrote a state directory, which a node does only once it has joined"),
])
def test_the_claim_is_withdrawn_when_what_was_seen_contradicts_it(changes, doubt):
    """It used to say "it never joined a group or got any state" whatever its exit code or counters said."""
    import dataclasses

    seen = dataclasses.replace(REFUSED, **changes)
    assert seen.doubts() == [doubt]
    text = "\n".join(seen.lines())
    assert "never joined a group" not in text and f"so the demo did NOT show it was kept out: {doubt}" in text
    assert seen.event() == f"stranger (no invite) NOT shown to be kept out: {doubt}"
