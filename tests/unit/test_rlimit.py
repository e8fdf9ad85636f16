"""The daemon raises its open-files soft limit to the hard limit at start (libp2p needs many sockets)."""

from __future__ import annotations

import resource

import pytest

from p2ptrain.daemon.main import raise_open_files_limit


@pytest.fixture
def lowered_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256 if hard == resource.RLIM_INFINITY else min(256, hard - 1)
    if low <= 0:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} leaves no room to test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    yield low, hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_soft_limit_is_raised_to_the_hard_limit(lowered_nofile):
    low, hard = lowered_nofile
    before, after = raise_open_files_limit()
    expected = hard if hard != resource.RLIM_INFINITY else 1 << 20
    assert (before, after) == (low, expected)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)


def test_already_at_the_hard_limit_is_left_alone(lowered_nofile):
    raise_open_files_limit()
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    before, after = raise_open_files_limit()
    assert before == after == limits[0]
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limits
