"""The robust reduction's math: per-sender screening, weight caps, CenteredClip, result checks, reports."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from p2ptrain.averaging.robust_reduce import (
    AllReduceReport,
    ReduceRule,
    RoundReports,
    aggregate,
    centered_clip,
    check_result,
    screen_parts,
)

torch.set_num_threads(1)  # the pair of real peers below trains a little: one thread on a shared machine


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


def _report(n: int) -> AllReduceReport:
    return AllReduceReport(averager="a", group_size=3, peers=("a", "b", "QmX"), senders=3, contributions_expected=6,
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


# ------------------------------------------------------------------------------------------------
# A pair of real peers: what the pair bound lets through and what it stops.  Two bytelm replicas of
# the chaos suite's size, trained on different shards of the data; their gradients and parameters
# split into parts as hivemind splits them (chunks of single tensors).


def _task(peer_seed: int):
    from p2ptrain.config.schema import TaskSection, TrainingSection
    from p2ptrain.tasks.loader import build_task

    name = f"peer{peer_seed}"
    return build_task(TaskSection(d_model=32, n_layers=1, n_heads=2, seq_len=32), TrainingSection(batch_size=8),
                      peer_seed=peer_seed, peer_id=name, live_peers=lambda: [name])


def _train(task, steps: int) -> None:
    from p2ptrain.optim.inner import ClippedAdamW

    optimizer = ClippedAdamW(task.model.parameters(), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)
    for _ in range(steps):
        optimizer.zero_grad()
        task.loss_fn(task.model, task.train_batches.next()).backward()
        optimizer.step()


def _gradients(task, micro_batches: int) -> list[torch.Tensor]:
    task.model.zero_grad()
    for _ in range(micro_batches):
        (task.loss_fn(task.model, task.train_batches.next()) / micro_batches).backward()
    return [p.grad.detach().clone() for p in task.model.parameters()]


def _params(task) -> list[torch.Tensor]:
    return [p.detach().clone() for p in task.model.parameters()]


def _hivemind_parts(tensors: list[torch.Tensor], compression, rule: ReduceRule | None = None
                    ) -> tuple[list[torch.Tensor], list[float]]:
    """Every part of ``tensors`` a group of two splits them into (both reducers' shares), and each part's
    floor as our own reference (as the hardened all-reduce computes them)."""
    from hivemind.averaging.partition import TensorPartContainer

    from p2ptrain.averaging.robust_reduce import part_floors

    container = TensorPartContainer(tensors, (1.0, 1.0), compression=compression)
    parts = [part for share in container._input_parts_by_peer for part, _ in share]
    floor = rule.vector_floor if rule is not None else 0.0
    return parts, part_floors(tensors, container.num_parts_by_tensor, [p.numel() for p in parts], floor)


@pytest.fixture(scope="module")
def pair_of_peers() -> dict[str, list[torch.Tensor]]:
    """Vectors two honest peers send, in the situations a pair meets (and what a fresh model sends)."""
    torch.manual_seed(0)
    a, b, fresh = _task(1), _task(2), _task(3)
    _train(a, 40)
    b.model.load_state_dict(a.model.state_dict())  # gradient mode: the replicas share their parameters
    vectors = {"grad_a": _gradients(a, 1), "grad_b": _gradients(b, 8), "grad_fresh": _gradients(fresh, 1)}
    # DiLoCo: a round starts from shared parameters; a fast and a slow peer train 16 and 2 inner steps.
    _train(a, 16)
    _train(b, 2)
    vectors.update(param_a=_params(a), param_b=_params(b), param_fresh=_params(fresh))
    _train(a, 94)  # a replica 150 steps in, next to one still at its initialisation (a failed download)
    vectors.update(param_trained=_params(a))
    return vectors


def _screen_pair(own: list[torch.Tensor], other: list[torch.Tensor], rule: ReduceRule, compression,
                 weights: tuple[float, float] = (1.0, 1.0)) -> tuple[int, int, list[tuple[torch.Tensor, float]]]:
    """(parts rejected, parts in all, accepted (part, weight) of the other sender) with ``own`` as local."""
    rejected, results = 0, []
    (ours, floors), (theirs, _) = _hivemind_parts(own, compression, rule), _hivemind_parts(other, compression)
    for mine, its, floor in zip(ours, theirs, floors, strict=True):
        accepted, refused = screen_parts({0: (mine, weights[0]), 1: (its, weights[1])}, 0, rule, floor)
        assert set(refused) <= {1} and all(why.kind == "oversized_part" for why in refused.values())
        rejected += bool(refused)
        if 1 in accepted:
            results.append(accepted[1])
    return rejected, len(ours), results


def test_an_honest_pair_refuses_nothing_of_the_other(pair_of_peers):
    """Each peer as local in turn: gradients of one micro-batch next to eight, a peer whose download failed
    (its gradient on a fresh model), a DiLoCo round's fast and slow replicas, a fresh replica next to one
    trained for 150 steps: no part is refused."""
    from hivemind.compression import Float16Compression, NoCompression

    v = pair_of_peers
    gradients = ReduceRule.for_gradients(max_weight=192.0)
    for x, y in (("grad_a", "grad_b"), ("grad_a", "grad_fresh"), ("grad_b", "grad_fresh")):
        for own, other in ((x, y), (y, x)):
            assert _screen_pair(v[own], v[other], gradients, Float16Compression(), (8.0, 64.0))[0] == 0, (own, other)
    for rule in (ReduceRule.for_parameters(), ReduceRule.for_diloco(max_weight=800.0)):
        for x, y in (("param_a", "param_b"), ("param_fresh", "param_trained")):
            for own, other in ((x, y), (y, x)):
                assert _screen_pair(v[own], v[other], rule, NoCompression())[0] == 0, (rule, own, other)


def test_what_a_pair_stops_and_what_it_cannot(pair_of_peers):
    """The other sender of a pair is bounded by our own parts.  Constant parameters of 50 are refused on
    every part; gradients x100 (of a fresh model's, what a peer that does not train sends, or of its own
    at our parameters) on every part where that is over 64x ours: most of them, and the first one refused
    leaves the sender out of the rest of the round.  Parameters of the same norm as ours but random are
    not refused (a pair has no majority to tell them from honest ones), nor are gradients inside the
    bound, whose weight is capped at 8x ours."""
    from hivemind.compression import Float16Compression, NoCompression

    v = pair_of_peers
    gradients = ReduceRule.for_gradients(max_weight=192.0)
    for base in ("grad_fresh", "grad_b"):
        scaled = [100 * g for g in v[base]]
        rejected, parts, _ = _screen_pair(v["grad_a"], scaled, gradients, Float16Compression(), (8.0, 256.0))
        assert rejected > parts // 2, base  # 11-13 of 16 here: on a few parts its gradient is 10x smaller
    rejected, parts, accepted = _screen_pair(v["grad_a"], [10 * g for g in v["grad_b"]], gradients,
                                             Float16Compression(), (8.0, 256.0))
    assert rejected == 0 and all(weight == 64.0 for _, weight in accepted)  # x10: inside the bound, 8x our weight
    for rule in (ReduceRule.for_parameters(), ReduceRule.for_diloco(max_weight=800.0)):
        constant = [torch.full_like(p, 50.0) for p in v["param_a"]]
        rejected, parts, _ = _screen_pair(v["param_a"], constant, rule, NoCompression())
        assert rejected == parts
        generator = torch.Generator().manual_seed(1)
        lookalike = [torch.randn(p.shape, generator=generator) for p in v["param_a"]]
        lookalike = [r * p.norm() / r.norm() for r, p in zip(lookalike, v["param_a"], strict=True)]
        assert _screen_pair(v["param_a"], lookalike, rule, NoCompression())[0] == 0


def test_a_pair_refuses_an_average_far_from_ours_but_not_an_honest_one(pair_of_peers):
    """The other half of a pair: the other peer reduces its share and hands back the average.  An honest
    average of two replicas passes; one pulled to constant 50 is refused."""
    from hivemind.compression import NoCompression

    v = pair_of_peers
    for rule in (ReduceRule.for_parameters(), ReduceRule.for_diloco(max_weight=800.0)):
        for own, other in (("param_a", "param_b"), ("param_fresh", "param_trained"), ("param_trained", "param_fresh")):
            ours, floors = _hivemind_parts(v[own], NoCompression(), rule)
            theirs, _ = _hivemind_parts(v[other], NoCompression())
            for mine, its, floor in zip(ours, theirs, floors, strict=True):
                # DiLoCo weighs by samples: the other peer may count up to 8x ours.
                for share in (0.5, 8 / 9):
                    assert check_result(share * (its - mine), mine, rule, floor) == "", (own, other)
                assert check_result((50.0 - mine) / 2, mine, rule, floor).startswith("moved our part")
