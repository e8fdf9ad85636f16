"""The node's forked helpers: they start with the node's heap frozen, and tensors are shared with them
by file descriptor (no torch_shm_manager process) unless the environment says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _run(code: str, env: dict[str, str] | None = None) -> str:
    """``code``'s output in a fresh interpreter whose environment has ``env`` and no other sharing strategy."""
    base = {k: v for k, v in os.environ.items() if k != "HIVEMIND_MEMORY_SHARING_STRATEGY"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**base, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


FORK_AND_REPORT = """
    import gc, os
    from p2ptrain.daemon.children import tie_children_to_this_process
    tie_children_to_this_process()
    objects = [{"n": i} for i in range(1000)]  # alive at the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(gc.get_freeze_count()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(os.read(read, 64).decode())
"""


def test_a_helper_starts_with_every_object_of_the_node_frozen() -> None:
    # A collection in the helper would otherwise write to every inherited object (copy-on-write).
    assert int(_run(FORK_AND_REPORT)) >= 1000


SHARE = """
    import torch.multiprocessing as mp
    import hivemind  # picks file_system unless told otherwise
    from p2ptrain.daemon.children import share_tensors_by_descriptor
    print(share_tensors_by_descriptor(), mp.get_sharing_strategy())
"""


@pytest.mark.parametrize(("env", "expected"), [({}, "file_descriptor file_descriptor"),
                                              ({"HIVEMIND_MEMORY_SHARING_STRATEGY": "file_system"},
                                               "file_system file_system")])
def test_tensors_are_shared_by_descriptor_unless_the_environment_says_otherwise(env: dict[str, str],
                                                                             expected: str) -> None:
    assert _run(SHARE, env) == expected
