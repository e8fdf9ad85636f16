"""Compression choices map to hivemind's classes; the new training fields validate."""

from __future__ import annotations

import pytest
import torch
from hivemind.compression import (
    Float16Compression,
    NoCompression,
    SizeAdaptiveCompression,
    Uniform8BitQuantization,
)

from p2ptrain.averaging.compression import SMALL_TENSOR_ELEMENTS, make_compression, wire_bytes
from p2ptrain.config.schema import ConfigError, parse_config
from p2ptrain.optim.build import bandwidth_hint


def test_none_and_fp16_map_to_hivemind_classes() -> None:
    assert isinstance(make_compression("none"), NoCompression)
    assert isinstance(make_compression("fp16"), Float16Compression)


def test_8bit_quantizes_large_tensors_and_keeps_small_ones_fp16() -> None:
    compression = make_compression("8bit")
    assert isinstance(compression, SizeAdaptiveCompression)
    assert isinstance(compression.greater_equal, Uniform8BitQuantization)
    assert isinstance(compression.less, Float16Compression)
    assert compression.threshold == SMALL_TENSOR_ELEMENTS


@pytest.mark.parametrize("choice", ["none", "fp16", "8bit"])
def test_round_trip_error_is_bounded(choice: str) -> None:
    from hivemind.compression import CompressionInfo, deserialize_torch_tensor

    tensor = torch.randn(SMALL_TENSOR_ELEMENTS * 2, generator=torch.Generator().manual_seed(0))
    compression = make_compression(choice)  # type: ignore[arg-type]
    packed = compression.compress(tensor, CompressionInfo.from_tensor(tensor))
    restored = deserialize_torch_tensor(packed)
    rms_error = (restored - tensor).pow(2).mean().sqrt().item()  # 8-bit clips beyond 3 sigma: use RMS
    assert rms_error <= {"none": 0.0, "fp16": 1e-3, "8bit": 0.03}[choice]
    assert len(packed.buffer) <= wire_bytes(tensor.numel(), choice) * 1.05  # type: ignore[arg-type]


def test_unknown_choice_raises() -> None:
    with pytest.raises(ValueError, match="unknown compression"):
        make_compression("4bit")  # type: ignore[arg-type]


def test_bandwidth_hint_takes_the_slower_direction_in_mbit() -> None:
    assert bandwidth_hint(0, 0) is None
    assert bandwidth_hint(20_000, 0) == 20.0
    assert bandwidth_hint(20_000, 100_000) == 20.0


def test_training_defaults() -> None:
    training = parse_config({}, "t").training
    assert (training.mode, training.grad_compression, training.state_compression) == ("gradient", "fp16", "none")
    assert (training.outer_lr, training.outer_momentum, training.outer_nesterov) == (0.7, 0.9, True)
    assert training.overlap and training.inner_steps == 25


@pytest.mark.parametrize(("field", "value", "message"), [
    ("mode", "async", "training.mode: Input should be 'gradient' or 'diloco'"),
    ("grad_compression", "4bit", "training.grad_compression: Input should be 'none', 'fp16' or '8bit'"),
    ("state_compression", "zip", "training.state_compression: Input should be"),
    ("inner_steps", 0, "training.inner_steps: Input should be greater than 0"),
    ("outer_lr", 0, "training.outer_lr: Input should be greater than 0"),
    ("outer_momentum", 1.0, "training.outer_momentum: Input should be less than 1"),
    ("average_state_every", -1, "training.average_state_every: Input should be greater than 0"),
])
def test_bad_training_fields_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_config({"training": {field: value}}, "cfg.toml")


def test_env_override_selects_diloco() -> None:
    config = parse_config({}, "t", {"P2PTRAIN_TRAINING__MODE": "diloco", "P2PTRAIN_TRAINING__INNER_STEPS": "50"})
    assert config.training.mode == "diloco" and config.training.inner_steps == 50
