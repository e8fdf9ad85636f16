"""The robust reduction's math: per-sender screening, weight caps, CenteredClip, result checks, reports."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from p2ptrain.robustreduce import (
    ReduceRule,
    RoundReport,
    RoundReports,
    aggregate,
    centered_clip,
    check_result,
    screen_parts,
)


def _honest(n: int, d: int = 4096, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=generator)
    return [base + 0.3 * torch.randn(d, generator=generator) for _ in range(n)]


def test_honest_round_is_exactly_the_weighted_mean():
    parts = _honest(4)
    weights = [8.0, 16.0, 8.0, 32.0]
    result, clipped = aggregate(parts, weights, ReduceRule())
    expected = sum(w * p for w, p in zip(weights, parts, strict=True)) / sum(weights)
    assert clipped == 0
    assert torch.allclose(result, expected, atol=1e-5)


def test_a_hundredfold_sender_moves_the_result_by_at_most_its_clipped_pull():
    honest = _honest(3)
    attacker = 100 * honest[0]
    result, clipped = aggregate([*honest, attacker], [1.0] * 4, ReduceRule())
    honest_mean = torch.stack(honest).mean(0)
    plain_mean = torch.stack([*honest, attacker]).mean(0)
    spread = max(float((p - honest_mean).norm()) for p in honest)
    assert clipped >= 1
    assert float((result - honest_mean).norm()) < 1.5 * spread  # the plain mean is ~25x further
    assert float((plain_mean - honest_mean).norm()) > 20 * spread


def test_identical_parts_and_one_outlier_give_the_identical_value():
    same = torch.full((100,), 0.5)
    result, _ = centered_clip(torch.stack([same, same, same, torch.full((100,), 7.0)]), torch.ones(4), 2.0, 5)
    assert torch.allclose(result, same)


def test_zero_total_weight_falls_back_to_equal_weights_not_nan():
    parts = _honest(3)
    result, _ = aggregate(parts, [0.0, 0.0, 0.0], ReduceRule())
    assert torch.isfinite(result).all()
    two, _ = aggregate(parts[:2], [0.0, 0.0], ReduceRule())
    assert torch.allclose(two, (parts[0] + parts[1]) / 2)


def test_screen_rejects_nonfinite_bad_weight_and_oversized_and_caps_weight():
    parts = _honest(5)
    nan = parts[1].clone()
    nan[3] = math.nan
    contributions = {0: (parts[0], 8.0), 1: (nan, 8.0), 2: (parts[2], -1.0), 3: (parts[3] * 100, 8.0),
                     4: (parts[4], 1e9)}
    accepted, rejected = screen_parts(contributions, 0, ReduceRule(max_weight=64.0))
    assert set(accepted) == {0, 4} and accepted[4][1] == 64.0
    assert rejected[1].kind == "nonfinite_part"
    assert rejected[2].kind == "malformed_part" and "weight -1.0" in rejected[2].reason
    assert rejected[3].kind == "oversized_part" and rejected[3].reason.startswith("norm")


def test_a_sender_claiming_far_more_samples_than_ours_is_capped_relative_to_ours():
    parts = _honest(4)
    contributions = {0: (parts[0], 10.0), 1: (parts[1], 30.0), 2: (parts[2], 10_000.0), 3: (parts[3], 0.0)}
    accepted, rejected = screen_parts(contributions, 0, ReduceRule.for_gradients(max_weight=50_000.0))
    assert not rejected
    assert [accepted[i][1] for i in range(4)] == [10.0, 30.0, 80.0, 0.0]  # 8x ours at most
    # Tagging along with zero weight: the median weight is the reference.
    contributions[0] = (parts[0], 0.0)
    accepted, _ = screen_parts(contributions, 0, ReduceRule.for_gradients(max_weight=50_000.0))
    assert accepted[2][1] == 8 * 30.0


def test_zero_parts_cannot_lower_our_reference():
    """Our own part is the reference: senders of zeros do not make honest parts look oversized."""
    parts = _honest(2)
    zeros = torch.zeros_like(parts[0])
    accepted, rejected = screen_parts({0: (parts[0], 1.0), 1: (zeros, 1.0), 2: (zeros, 1.0), 3: (parts[1], 1.0)},
                                      0, ReduceRule())
    assert set(accepted) == {0, 1, 2, 3} and not rejected


def test_our_own_bad_part_is_dropped_silently():
    parts = _honest(3)
    own = torch.full_like(parts[0], math.inf)
    accepted, rejected = screen_parts({0: (own, 1.0), 1: (parts[1], 1.0), 2: (parts[2], 1.0)}, 0, ReduceRule())
    assert set(accepted) == {1, 2} and rejected == {}


def test_parameter_rounds_take_a_peer_a_round_behind_with_zero_biases():
    """A newcomer one round behind still has its zero-initialised biases: the averaging repairs that
    drift, so its part is no offence (nor is ours to it)."""
    trained = 0.05 * torch.randn(64)
    zeros = torch.zeros(64)
    for own, other in ((zeros, trained), (trained, zeros)):
        accepted, rejected = screen_parts({0: (own, 1.0), 1: (other, 1.0)}, 0, ReduceRule.for_diloco(max_weight=800))
        assert set(accepted) == {0, 1} and not rejected


def test_result_check_refuses_nonfinite_and_implausible_moves_but_not_honest_ones():
    local = torch.randn(100)
    assert check_result(torch.randn(100) * 0.5, local, ReduceRule()) == ""
    assert "NaN or inf" in check_result(torch.full((100,), math.nan), local, ReduceRule())
    assert check_result(local * 50, local, ReduceRule()).startswith("moved our part")
    assert check_result(-2 * local, local, ReduceRule(max_result_ratio=1.0)).startswith("moved our part")
    assert check_result(torch.randn(100), torch.zeros(100), ReduceRule()) == ""  # nothing to compare with
    assert "shape" in check_result(torch.randn(5), local, ReduceRule())


def _report(n: int) -> RoundReport:
    return RoundReport(averager="a", group_size=3, peers=("a", "b", "QmX"), senders=3, contributions_expected=6,
                       contributions_received=n, results_expected=10, results_received=10,
                       rejected=(("QmX", "nonfinite_part", "nan"),), clipped=0, ok=True, finished_at=1.0)


def test_round_reports_cross_a_fork_and_never_block_when_full():
    reports = RoundReports(capacity=3)
    pid = os.fork()
    if pid == 0:
        for n in range(5):
            reports.put(_report(n))
        os._exit(0)
    os.waitpid(pid, 0)
    drained = reports.drain()
    assert [r.contributions_received for r in drained] == [0, 1, 2]
    assert reports.dropped == 2
    assert drained[0].received_fraction == 0.0 and drained[2].received_fraction == pytest.approx(2 / 6)
    assert reports.drain() == []


def test_a_round_report_says_how_much_was_averaged_and_whom_this_node_met():
    report = dataclasses.replace(_report(6), results_received=5)
    assert report.received_fraction == 1.0 and report.averaged_fraction == 0.5  # half our tensors came back
    assert report.met("a") == ("b",)  # not ourselves, not the peer refused this round
    assert dataclasses.replace(report, ok=False).met("a") == ()


def test_a_fresh_peers_larger_gradient_is_not_an_offence():
    """A peer just started next to a trained one sends gradients ~10x larger: not a reason to ban it."""
    generator = torch.Generator().manual_seed(5)
    trained, fresh = 0.06 * torch.randn(1000, generator=generator), 0.65 * torch.randn(1000, generator=generator)
    accepted, rejected = screen_parts({0: (trained, 8.0), 1: (fresh, 8.0)}, 0, ReduceRule())
    assert set(accepted) == {0, 1} and not rejected
