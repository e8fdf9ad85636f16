"""Validated state adoption: every malformed or implausible download is one clear reason, never a raise."""

from __future__ import annotations

import math

import pytest
import torch
from hivemind.optim.state_averager import dump_optimizer_state

from p2ptrain.averaging.model_check import loss_with_parameters, make_loss_check
from p2ptrain.averaging.state_check import StateValidator, TensorTemplate, check_tensors
from p2ptrain.averaging.state_download import diloco_state_validator, training_state_validator
from p2ptrain.trust.verdicts import (
    MAX_EPOCH,
    check_candidate_loss,
    check_diloco_metadata,
    check_training_metadata,
    epoch_ceiling,
    merge_optimizer_metadata,
    plausible_epoch,
)


def _optimizer() -> torch.optim.Optimizer:
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return opt


TEMPLATE = TensorTemplate.of([torch.zeros(3, 4), torch.zeros(3), torch.zeros((), dtype=torch.int64)])


@pytest.mark.parametrize(("tensors", "reason"), [
    ("nope", "tensors are a str, not a list"),
    ([torch.zeros(3, 4), torch.zeros(3)], "2 tensors, expected 3"),
    ([torch.zeros(3, 4), torch.zeros(3), torch.zeros(())], "tensor 2 is torch.float32, expected torch.int64"),
    ([torch.zeros(4, 3), torch.zeros(3), torch.zeros((), dtype=torch.int64)], "tensor 0 has shape (4, 3)"),
    ([torch.zeros(3, 4), torch.tensor([0.0, math.nan, 1.0]), torch.zeros((), dtype=torch.int64)],
     "tensor 1 has NaN or inf values"),
    ([torch.zeros(3, 4), 5, torch.zeros((), dtype=torch.int64)], "tensor 1 is a int"),
])
def test_bad_tensors_are_rejected_with_the_reason(tensors, reason):
    verdict = check_tensors(TEMPLATE, tensors)
    assert not verdict.ok and verdict.kind == "bad_state" and reason in verdict.reason


def test_good_tensors_pass_and_the_template_bounds_bytes():
    assert check_tensors(TEMPLATE, [torch.ones(3, 4), torch.ones(3), torch.tensor(7)]).ok
    assert TEMPLATE.nbytes == 12 * 4 + 3 * 4 + 8
    assert TEMPLATE.max_wire_bytes() > TEMPLATE.nbytes


def _metadata(opt: torch.optim.Optimizer, **changes):
    flat, _ = dump_optimizer_state(opt)
    return {"epoch": 5, "group_bits": "01", "optimizer_metadata": flat, **changes}, flat


@pytest.mark.parametrize(("changes", "reason"), [
    ({"epoch": 2**40}, f"epoch {2**40} is outside 0..{MAX_EPOCH}"),
    ({"epoch": -1}, "epoch -1 is outside"),
    ({"epoch": 5.0}, "epoch is a float, not an integer"),
    ({"epoch": True}, "epoch is a bool"),
    ({"group_bits": "0x"}, "group_bits is not a short string of 0 and 1"),
    ({"optimizer_metadata": "x"}, "optimizer_metadata is a str"),
    ({"optimizer_metadata": []}, "optimizer_metadata layout differs from ours (0 entries"),
])
def test_bad_training_metadata_is_rejected(changes, reason):
    opt = _optimizer()
    metadata, flat = _metadata(opt, **changes)
    verdict = check_training_metadata(metadata, flat)
    assert not verdict.ok and reason in verdict.reason


def test_training_metadata_keys_types_and_tensor_order():
    opt = _optimizer()
    good, flat = _metadata(opt)
    assert check_training_metadata(good, flat).ok
    assert "metadata is a list" in check_training_metadata([], flat).reason
    assert "has no 'optimizer_metadata'" in check_training_metadata({"epoch": 1}, flat).reason
    swapped = [dict(e) for e in flat]
    tensor_slots = [i for i, e in enumerate(swapped) if e["type"] == "tensor"]
    swapped[tensor_slots[0]]["index"] = 1
    assert "optimizer tensor index 1, expected 0" in check_training_metadata({**good, "optimizer_metadata": swapped},
                                                                            flat).reason


def test_donor_hyperparameters_are_never_adopted():
    opt = _optimizer()
    flat, _ = dump_optimizer_state(opt)
    evil = [dict(e, value=1e9) if e["type"] == "value" and isinstance(e["value"], float) else dict(e) for e in flat]
    merged = merge_optimizer_metadata(flat, evil)
    assert merged == flat


def test_diloco_metadata_bounds():
    assert check_diloco_metadata({"epoch": 3, "inner_step": 4}, 5).ok
    # A fast peer (or one whose round clock also counts slower peers) is past inner_steps when it serves.
    assert check_diloco_metadata({"epoch": 3, "inner_step": 24}, 8).ok
    assert "inner_step -5 is outside 0..5120" in check_diloco_metadata({"epoch": 3, "inner_step": -5}, 5).reason
    assert "inner_step 5121 is outside" in check_diloco_metadata({"epoch": 3, "inner_step": 5121}, 5).reason
    assert f"epoch {2**62} is outside" in check_diloco_metadata({"epoch": 2**62, "inner_step": 0}, 5).reason
    assert "has no 'inner_step'" in check_diloco_metadata({"epoch": 3}, 5).reason
    assert "not a map" in check_diloco_metadata(None, 5).reason


def test_epoch_plausibility_against_the_other_peers():
    assert plausible_epoch(5000, [], own=0).ok  # nobody contradicts it: other checks decide
    lie = plausible_epoch(5000, [40, 41, 40], own=0)
    assert not lie.ok and lie.kind == "implausible_epoch" and "report 40" in lie.reason
    assert plausible_epoch(50, [40, 41, 40], own=0).ok  # reports lag behind a fast run: a margin
    single = plausible_epoch(5000, [12], own=0)
    assert not single.ok and "other 1 peer(s)" in single.reason
    assert plausible_epoch(40, [5000, 40], own=0).ok  # another liar does not make an honest donor one
    assert plausible_epoch(68, [0, 0], own=0).ok  # fresh peers say nothing about where the run is
    assert not plausible_epoch(2000, [1000, 1100, 1200], own=0).ok  # the margin grows with the run...
    assert plausible_epoch(1370, [1000, 1100, 1200], own=0).ok  # ...by a quarter of the median (1100)
    # A stale record (here of a peer that left at epoch 20) must not make a donor just ahead of us a liar.
    assert plausible_epoch(36, [20], own=35).ok
    assert not plausible_epoch(5000, [20], own=35).ok
    behind = plausible_epoch(3, [3], own=10)
    assert not behind.ok and behind.kind == "" and "not ahead of ours" in behind.reason
    fresh = plausible_epoch(0, [], own=0)  # a fresh peer serving its initialisation: useless, no offence
    assert not fresh.ok and fresh.kind == ""


def test_epoch_ceiling():
    assert epoch_ceiling(0) == 10 and epoch_ceiling(40) == 50 and epoch_ceiling(1000) == 1250


def test_candidate_loss_against_peers_or_our_own():
    assert check_candidate_loss(3.0, own=5.3, honest=[3.1, 2.9, 3.05]).ok
    worse = check_candidate_loss(5.545, own=4.4, honest=[])
    assert not worse.ok and worse.kind == "bad_model" and "our own model's 4.4000" in worse.reason
    # An honest donor's model wobbles: 4% worse than the state we took from it seconds before is no lie.
    assert check_candidate_loss(0.8973, own=0.8602, honest=[]).ok
    assert not check_candidate_loss(5.545, own=5.32, honest=[3.0, 3.1]).ok
    assert not check_candidate_loss(math.nan, own=5.0, honest=[]).ok
    assert check_candidate_loss(4.0, own=None, honest=[]).ok


def test_a_state_far_above_what_its_donor_advertised_is_a_lie():
    from p2ptrain.trust.verdicts import advertised_epoch

    assert advertised_epoch({"epoch": 12}, 12.0).ok and advertised_epoch({"epoch": 20}, 12.0).ok
    lie = advertised_epoch({"epoch": 5000}, 181.0)
    assert not lie.ok and lie.kind == "implausible_epoch" and "advertised 181" in lie.reason
    assert advertised_epoch({"epoch": 5000}, None).ok and advertised_epoch("junk", 3.0).ok
    assert advertised_epoch({"epoch": 5000}, 104.0, own=100).kind == "implausible_epoch"  # above ours too
    assert advertised_epoch({"epoch": 12}, math.inf, own=100).kind == "implausible_epoch"


def test_a_newcomer_serving_the_state_it_just_downloaded_before_it_advertised_it_is_refused_unblamed():
    """It still advertises epoch 0 (its next declaration is on its way) and serves the run's epoch 100:
    a peer at epoch 100 asking it does not adopt that state now, and bans nobody."""
    from p2ptrain.trust.verdicts import advertised_epoch

    for served in (100, 125):  # 125: within the run's margin of ours
        lagging = advertised_epoch({"epoch": served}, 0.0, own=100)
        assert not lagging.ok and lagging.kind == "" and "lags" in lagging.reason
    assert advertised_epoch({"epoch": 126}, 0.0, own=100).kind == "implausible_epoch"


def test_forged_loss_reports_can_neither_ban_a_good_donor_nor_pass_a_bad_one():
    # Reports that disagree (one honest among forged ones) are not used: our own loss is the reference.
    assert check_candidate_loss(3.0, own=3.0, honest=[0.01, 0.01, 3.1]).ok
    verdict = check_candidate_loss(4.5, own=3.5, honest=[0.01, 3.2, 3.3])
    assert not verdict.ok and "our own model's 3.5000" in verdict.reason
    assert not check_candidate_loss(5.545, own=4.4, honest=[100.0, 3.0]).ok  # forged high reports: ours
    # A fresh node (its own loss far above the run's) judges by the reports: garbage with a plausible epoch
    # is refused even though it beats a random initialisation.
    fresh = check_candidate_loss(5.545, own=5.6, honest=[3.0, 3.1, 2.9])
    assert not fresh.ok and "median of 3 peer(s)' reports 3.0000" in fresh.reason
    assert not check_candidate_loss(5.545, own=None, honest=[3.0, 3.1, 2.9]).ok
    assert check_candidate_loss(3.05, own=None, honest=[3.0, 3.1, 2.9]).ok
    # A trained node takes a donor as good as itself, a little behind the reports.
    assert check_candidate_loss(3.05, own=3.0, honest=[2.9, 2.9]).ok
    assert not check_candidate_loss(3.7, own=3.0, honest=[2.9, 2.9]).ok


def test_validator_runs_every_check_and_never_raises():
    opt = _optimizer()
    validator = training_state_validator(opt, (), own_epoch=lambda: 0,
                                         peer_epochs=lambda: {"QmDonor": 5000, "QmA": 40, "QmB": 41})
    params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    flat, opt_tensors = dump_optimizer_state(opt)
    tensors = [*params, *opt_tensors]
    assert validator({"epoch": 45, "optimizer_metadata": flat}, tensors, "QmDonor").ok
    lie = validator({"epoch": 5000, "optimizer_metadata": flat}, tensors, "QmDonor")
    assert lie.kind == "implausible_epoch"
    assert validator({"epoch": 41}, tensors, "QmDonor").reason == "metadata has no 'optimizer_metadata'"
    broken = StateValidator(TensorTemplate.of(tensors), check_metadata=lambda m: 1 / 0, own_epoch=lambda: 0)
    verdict = broken({"epoch": 1}, tensors, "x")
    assert not verdict.ok and "could not be checked (ZeroDivisionError)" in verdict.reason


def test_diloco_validator_checks_outer_params_and_momentum():
    params = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(3))]
    validator = diloco_state_validator(params, 5, own_epoch=lambda: 0)
    good = [torch.ones(2, 2), torch.ones(3), torch.zeros(2, 2), torch.zeros(3)]
    assert validator({"epoch": 2, "inner_step": 1}, good, "QmD").ok
    assert "3 tensors, expected 4" in validator({"epoch": 2, "inner_step": 1}, good[:3], "QmD").reason
    nan = [torch.full((2, 2), math.nan), *good[1:]]
    assert "NaN" in validator({"epoch": 2, "inner_step": 1}, nan, "QmD").reason


def test_loss_check_swaps_parameters_in_and_back():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    x = torch.ones(4, 2)

    def evaluate() -> float:
        with torch.no_grad():
            return float((model(x) - 2.0).pow(2).mean())

    assert loss_with_parameters(list(model.parameters()), [torch.zeros(1, 2)], evaluate) == pytest.approx(4.0)
    assert torch.all(model.weight == 1.0)
    check = make_loss_check(list(model.parameters()), evaluate, own_loss=lambda: None,
                            peer_losses=lambda: {"QmDonor": 0.0, "QmA": 0.1})
    assert check({}, [torch.full((1, 2), 1.0)], "QmDonor").ok  # loss 0 vs peers' 0.1
    bad = check({}, [torch.zeros(1, 2)], "QmDonor")
    assert not bad.ok and bad.kind == "bad_model"
    assert torch.all(model.weight == 1.0)
