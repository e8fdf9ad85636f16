"""Make hivemind's forked helper processes die with the node, however the node dies.

hivemind forks its DHT and averager processes from the node's main thread.  Each of them asks
the kernel (``PR_SET_PDEATHSIG``) for SIGKILL when the node goes away, so even a SIGKILLed node
leaves no Python helpers behind; ``p2pd`` exits on its own once its client is gone (its idle
timeout), and under systemd ``KillMode=mixed`` reaps the rest of the cgroup.
"""

from __future__ import annotations

import os

from p2ptrain.proc import die_with_parent

_installed = False


def tie_children_to_this_process() -> None:
    """Install the at-fork hook once per process."""
    global _installed
    if not _installed:
        os.register_at_fork(after_in_child=die_with_parent)
        _installed = True
