"""The model fingerprint: stable across processes, sensitive to structure, blind to values."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from p2ptrain.model.fingerprint import model_fingerprint
from p2ptrain.tasks.bytelm import ByteLM, shape_config

torch.set_num_threads(1)

SHAPE = (16, 32, 2, 4)


def _fingerprint(
    seq_len: int = 16, d_model: int = 32, n_layers: int = 2, n_heads: int = 4, seed: int = 0
) -> str:
    model = ByteLM(seq_len, d_model, n_layers, n_heads, seed=seed)
    return model_fingerprint(model, shape_config(seq_len, d_model, n_layers, n_heads))


def test_fingerprint_is_short_hex_and_ignores_values() -> None:
    value = _fingerprint()
    assert len(value) == 16 and int(value, 16) >= 0
    assert _fingerprint(seed=1) == value  # weights differ, structure does not
    model = ByteLM(*SHAPE, seed=0)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert model_fingerprint(model, shape_config(*SHAPE)) == value


def test_fingerprint_is_stable_across_processes() -> None:
    code = (
        "from p2ptrain.model.fingerprint import model_fingerprint\n"
        "from p2ptrain.tasks.bytelm import ByteLM, shape_config\n"
        f"print(model_fingerprint(ByteLM(*{SHAPE}, seed=3), shape_config(*{SHAPE})))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert result.stdout.strip() == _fingerprint()


def test_fingerprint_changes_with_shape_dtype_names_and_config() -> None:
    base = _fingerprint()
    assert _fingerprint(d_model=64) != base
    assert _fingerprint(n_layers=3) != base
    assert _fingerprint(seq_len=32) != base
    doubled = ByteLM(*SHAPE, seed=0).double()
    assert model_fingerprint(doubled, shape_config(*SHAPE)) != base
    # n_heads changes no tensor shape: only the shape config tells the two models apart.
    assert _fingerprint(n_heads=2) != base
    assert model_fingerprint(ByteLM(*SHAPE, seed=0), {**shape_config(*SHAPE), "n_heads": 2}) != base


def test_fingerprint_sees_names_and_key_order_does_not_matter() -> None:
    a = torch.nn.Sequential(torch.nn.Linear(3, 3))
    b = torch.nn.Sequential()
    b.add_module("renamed", torch.nn.Linear(3, 3))
    assert model_fingerprint(a, {}) != model_fingerprint(b, {})
    assert model_fingerprint(a, {"x": 1, "y": 2}) == model_fingerprint(a, {"y": 2, "x": 1})
