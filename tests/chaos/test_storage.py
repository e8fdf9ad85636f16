"""Scenario 7 - storage faults: the checkpoint directory fills up, or turns read-only, under a running node.

Each node runs in its own mount namespace (``unshare -m``) on a small tmpfs, so the fault is
real (ENOSPC, EROFS) and touches nothing outside the test.  Training must go on, the failure must
show in the status and in /metrics, and the previous checkpoint must still load.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import time

import pytest
import torch

from p2ptrain.local.swarm import LocalNode
from tests.chaos.helpers import training
from tests.support.nodeapi import node_client

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

needs_namespaces = pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("nsenter") is None
    or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0,
    reason="needs unshare -m / nsenter (root or user namespaces) to mount a private tmpfs")


def _in_ns(node: LocalNode, *command: str) -> subprocess.CompletedProcess[bytes]:
    assert node.process is not None
    return subprocess.run(["nsenter", "-t", str(node.process.pid), "-m", *command], capture_output=True, timeout=30)


def _storage_node(make_node, name: str, tmp_path) -> LocalNode:
    base = make_node(name, checkpoint={"interval": 2.0, "keep": 2})
    node = LocalNode(base.name, base.workdir, base.run_id + name, base.overrides)
    ckpt = node.state_dir / "checkpoints"
    ckpt.mkdir(parents=True)
    node.command_prefix = ("unshare", "-m", "--propagation", "private", "sh", "-c",
                           f'mount -t tmpfs -o size=4m p2ptrain-chaos "{ckpt}" && exec "$@"', "p2ptrain-node")
    base.process = None  # the fixture stops ``base``; this wrapper is stopped by the test
    return node


@needs_namespaces
def test_full_and_read_only_checkpoint_dirs(make_node, chaos_report, tmp_path):
    full, readonly = _storage_node(make_node, "full", tmp_path), _storage_node(make_node, "ro", tmp_path)
    figures = {}
    try:
        for node in (full, readonly):
            node.start()
        for node in (full, readonly):
            training(node, 120)
            node.wait_for(lambda s: s.checkpoint_writes_ok_total >= 1, 60, "a first checkpoint")
        ckpt = full.state_dir / "checkpoints"
        # Fill the disk: dd stops at ENOSPC (non-zero exit is expected).
        _in_ns(full, "sh", "-c", f'dd if=/dev/zero of="{ckpt}/filler" bs=64k 2>/dev/null; true')
        assert _in_ns(readonly, "mount", "-o", "remount,ro", str(readonly.state_dir / "checkpoints")).returncode == 0
        faulted_at = time.monotonic()
        for node, errno_text in ((full, "No space left"), (readonly, "Read-only")):
            before = node.status()
            failed = node.wait_for(lambda s: s.checkpoint_writes_failed_total >= 2, 60, "failed checkpoint writes")
            assert errno_text in failed.last_checkpoint_error, failed.last_checkpoint_error
            # Training goes on.
            node.wait_for(lambda s, e=before.local_epoch: s.local_epoch >= e + 2, 60, "two more epochs")
            metrics = node_client(node, timeout=5).request("GET", "/metrics").body.decode()
            failed_metric = 'p2ptrain_checkpoint_writes_total{outcome="failed"}'
            line = next(x for x in metrics.splitlines() if x.startswith(failed_metric))
            assert float(line.split()[-1]) >= 2
            # The previous checkpoint is intact (read from inside the node's mount namespace), no temp file is left.
            listing = _in_ns(node, "ls", "-a", str(node.state_dir / "checkpoints")).stdout.decode().split()
            assert not [n for n in listing if n.endswith(".tmp")], listing
            checkpoints = sorted(n for n in listing if n.startswith("ckpt-") and n.endswith(".pt"))
            assert checkpoints, listing
            raw = _in_ns(node, "cat", str(node.state_dir / "checkpoints" / checkpoints[-1])).stdout
            state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
            assert state["epoch"] >= 0 and all(torch.isfinite(t).all() for t in state["model"].values())
            figures[node.name] = {"error": failed.last_checkpoint_error.split(":")[-1].strip(),
                                  "failed_writes": failed.checkpoint_writes_failed_total,
                                  "ok_writes": failed.checkpoint_writes_ok_total,
                                  "epochs_after_fault": node.status().local_epoch - before.local_epoch,
                                  "seconds_to_visible": round(time.monotonic() - faulted_at, 1)}
        for node in (full, readonly):
            assert node.stop(30) == 0, node.report()  # the failed final checkpoint does not fail the exit
    finally:
        for node in (full, readonly):
            if node.running:
                node.stop(20)
    chaos_report.record("7_storage", **figures)
