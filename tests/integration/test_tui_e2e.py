"""``p2ptrain top`` in a real terminal (tmux) against a real node with a peer: the Swarm view lists both."""

from __future__ import annotations

import os
import shlex
import sys

import pytest

from p2ptrain.tui.widgets.format import short_id
from tests.integration.conftest import TINY_TASK
from tests.support.tmuxterm import TMUX, Terminal, private_socket

if TMUX is None and os.environ.get("CI"):
    raise RuntimeError("tmux is required in CI (apt-get install -y tmux)")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(200),
              pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux)")]


def test_top_shows_a_real_swarm(make_node):
    a = make_node("a", task=TINY_TASK)
    a.start()
    b = make_node("b", task=TINY_TASK)
    b.start(join=a.join_addrs()[:1])
    ids = [node.wait_for(lambda s: s.state == "training", 90, "TRAINING state").peer_id for node in (a, b)]
    # Found through the node's config (state directory -> api.url, api.token), as a volunteer would.
    command = shlex.join([sys.executable, "-m", "p2ptrain.cli", "top", "--config", str(a.config_path)])
    term = Terminal(private_socket(), f"env TERM=xterm-256color {command}", (120, 40))
    try:
        term.wait_for(lambda s: "● connected to" in s and "TRAINING" in s, 30)
        term.keys("2")
        # Peer records go round every few seconds: wait for B's to reach A.
        # (A record published while a node still synced says so until its next one arrives.)
        screen = term.wait_for(lambda s: "Σ 2 peers" in s and all(short_id(i) in s for i in ids)
                               and s.count("training") >= 2, 60)
        assert short_id(ids[0]) != short_id(ids[1])
        assert screen.count("training") >= 2, screen
        term.keys("q")
        term.wait_for(lambda _s: not term.alive(), 10) if term.alive() else None
    finally:
        term.close()
