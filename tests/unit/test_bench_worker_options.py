"""Every benchmark that starts workers through ``benchmarks.swarm.run_mode`` has each option the worker is
given, and the worker accepts each of them (a missing one fails only once the benchmark runs)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import hetero, swarm, worker
from p2ptrain.config.schema import TrainingSection


@pytest.mark.parametrize("parse", [swarm.parse_args, hetero.parse_args], ids=["swarm", "hetero"])
def test_each_option_passed_to_the_workers_exists_and_the_worker_takes_it(parse):
    args = parse([])
    passed: list[str] = []
    for opt in swarm.WORKER_OPTS:
        assert hasattr(args, opt), f"{parse.__module__} has no --{opt.replace('_', '-')}"
        passed += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    taken = worker.parse_args(["--mode", "diloco_topk", "--run-dir", "d", "--out", "o", *passed])
    options = swarm.WORKER_OPTS
    assert {opt: getattr(taken, opt) for opt in options} == {opt: getattr(args, opt) for opt in options}


def test_the_outer_step_options_default_to_the_node_s_own():
    p = argparse.ArgumentParser()
    worker.add_outer_step_options(p)
    args = p.parse_args([])
    defaults = TrainingSection()
    assert (args.outer_lr, args.outer_momentum, args.outer_topk_density, args.outer_value_bits) == (
        defaults.outer_lr, defaults.outer_momentum, defaults.outer_topk_density, defaults.outer_value_bits)
    assert p.parse_args(["--outer-momentum", "0", "--outer-lr", "1"]).outer_momentum == 0.0
