"""Make hivemind's forked helper processes die with the node, however the node dies.

hivemind forks its DHT and averager processes from the node's main thread.  Each of them asks
the kernel (``PR_SET_PDEATHSIG``) for SIGKILL when the node goes away, so even a SIGKILLed node
leaves no Python helpers behind; ``p2pd`` exits on its own once its client is gone (its idle
timeout), and under systemd ``KillMode=mixed`` reaps the rest of the cgroup.

Each fork also freezes the garbage collector's view of every object alive then (``gc.freeze``):
the helpers start as copy-on-write copies of the node, and a collection that walks those objects
writes to each one's header, so without the freeze every helper soon holds its own copy of the
node's whole Python heap (torch's and hivemind's modules included).  Frozen objects are never
collected; what the node creates after its last fork is collected as usual.

Tensors the helpers share with the node (the averagers' buffers) are shared by file descriptor,
not through named files: hivemind picks torch's ``file_system`` strategy, which starts one more
process per node (``torch_shm_manager``, some 80 MiB of PSS) to clean those files up.  The node has
raised its open-files limit to the hard limit, which the descriptors need on a model with many
tensors; ``HIVEMIND_MEMORY_SHARING_STRATEGY=file_system`` in the environment restores hivemind's
choice where that limit is low.
"""

from __future__ import annotations

import gc
import os
import sys

from p2ptrain.proc import die_with_parent

_installed = False
#: hivemind reads this when it is imported (and calls torch's set_sharing_strategy with it).
SHARING_STRATEGY_ENV = "HIVEMIND_MEMORY_SHARING_STRATEGY"


def tie_children_to_this_process() -> None:
    """Install the at-fork hook once per process."""
    global _installed
    if not _installed:
        os.register_at_fork(before=gc.freeze, after_in_child=die_with_parent)
        _installed = True


def share_tensors_by_descriptor() -> str:
    """Share tensors with the helper processes by file descriptor unless the environment says
    otherwise (see the module docstring); returns the strategy in force."""
    strategy = os.environ.setdefault(SHARING_STRATEGY_ENV, "file_descriptor")
    if "torch" in sys.modules:  # hivemind may already have set its choice: ours wins, as it would have
        import torch.multiprocessing

        torch.multiprocessing.set_sharing_strategy(strategy)
    return strategy
