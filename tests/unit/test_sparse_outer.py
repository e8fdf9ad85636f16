"""The compressed outer round: the sparse codec, error feedback, and the buffer in checkpoints and downloads."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hivemind.compression import CompressionInfo, deserialize_torch_tensor

from p2ptrain.averaging.allreduce import _declared_problem
from p2ptrain.averaging.sparse_codec import (
    CHUNK,
    SparseChunkCodec,
    chunk_topk,
    sparse_problem,
    sparse_wire_bytes,
)
from p2ptrain.optim.error_feedback import ErrorFeedback, chunk_int8


def _encode(values: torch.Tensor, bits: int = 8):
    return SparseChunkCodec(bits).compress(values, CompressionInfo.from_tensor(values), False)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_a_peer_s_top_k_part_travels_exactly_at_its_bits_and_density(bits: int) -> None:
    torch.manual_seed(0)
    values = torch.randn(3 * CHUNK + 1000)  # a short last chunk too
    sent = chunk_topk(values, 0.02, bits)
    k = math.ceil(0.02 * CHUNK)
    per_chunk = [int(c.count_nonzero()) for c in sent.split(CHUNK)]
    assert per_chunk[:3] == [k, k, k] and 0 < per_chunk[3] <= k
    for chunk, kept in zip(values.split(CHUNK), sent.split(CHUNK), strict=True):
        assert chunk.abs()[kept != 0].min() >= chunk.abs()[kept == 0].max()  # the largest ones were kept
        assert len(set(kept[kept != 0].abs().tolist())) <= 2 ** (bits - 1)  # values on the chunk's grid
    message = _encode(sent, bits)
    assert len(message.buffer) == sparse_wire_bytes(values.numel(), 0.02, bits)
    assert len(message.buffer) < values.numel() * 4 / 30  # fp32 would be 4 bytes a value
    assert sparse_problem(message.buffer, values.numel()) == ""
    assert torch.allclose(deserialize_torch_tensor(message), sent, rtol=1e-6, atol=0.0)


def test_fewer_bits_send_fewer_bytes() -> None:
    sizes = [sparse_wire_bytes(1 << 20, 0.02, bits) for bits in (2, 4, 8)]
    # fp32 would send 4 << 20 bytes, int8 1 << 20: the offsets (2 bytes each) dominate at 2 bits
    assert sizes[0] < sizes[1] < sizes[2] < (1 << 20) // 15 and sizes[0] < (4 << 20) // 80


def test_an_average_off_the_grid_travels_at_8_bits_within_its_step() -> None:
    torch.manual_seed(1)
    a, b = chunk_topk(torch.randn(CHUNK), 0.02, 2), chunk_topk(torch.randn(CHUNK), 0.02, 2)
    average = (a + b) / 3  # not on either peer's 2-bit grid
    decoded = deserialize_torch_tensor(_encode(average, 2))
    assert np.frombuffer(_encode(average, 2).buffer, dtype=np.uint8, count=1, offset=3)[0] == 8
    assert (decoded != 0).equal(average != 0)
    assert float((decoded - average).abs().max()) <= float(average.abs().max()) / 256 + 1e-7


def _corrupt(buffer: bytes, offset: int, data: bytes) -> bytes:
    return buffer[:offset] + data + buffer[offset + len(data):]


def test_a_malformed_sparse_part_is_refused_before_decoding() -> None:
    sent = chunk_topk(torch.randn(2 * CHUNK), 0.01, 4)
    good = _encode(sent, 4)
    buffer, numel = good.buffer, sent.numel()
    k = math.ceil(0.01 * CHUNK)
    broken = {
        "version": _corrupt(buffer, 0, b"\x07"),
        "count": _corrupt(buffer, 1, np.array([CHUNK + 1], "<u2").tobytes()),
        "bits": _corrupt(buffer, 3, b"\x03"),
        "scale": _corrupt(buffer, 4, np.array([np.nan], "<f4").tobytes()),
        "order": _corrupt(buffer, 8, np.array([5, 5], "<u2").tobytes()),
        "outside": _corrupt(buffer, 8 + 2 * (k - 1), np.array([CHUNK], "<u2").tobytes()),
        "truncated": buffer[:-1],
        "trailing": buffer + b"\x00",
    }
    for name, data in broken.items():
        assert sparse_problem(data, numel), name
        message = type(good)()
        message.CopyFrom(good)
        message.buffer = data
        with pytest.raises(ValueError):
            deserialize_torch_tensor(message)
        kind, reason = _declared_problem(message, 0, [torch.Size([numel])])
        assert kind == "malformed_part" and reason.startswith("part 0:"), name
    assert _declared_problem(good, 0, [torch.Size([numel])]) is None


def test_error_feedback_keeps_what_was_not_sent_and_loses_nothing_over_rounds() -> None:
    torch.manual_seed(2)
    feedback = ErrorFeedback([torch.Size([CHUNK])], "topk", density=0.01, bits=2)
    small = torch.zeros(CHUNK)
    small[7] = 0.001  # not among a round's largest on its own: it must build up and then be sent
    total_in, total_sent = torch.zeros(CHUNK), torch.zeros(CHUNK)
    sent_small_at = None
    for round_ in range(200):
        pseudo = torch.randn(CHUNK) * 0.001 + small
        (sent,) = feedback.take([pseudo])
        total_in += pseudo
        total_sent += sent
        if sent_small_at is None and sent[7] != 0:
            sent_small_at = round_
        assert torch.allclose(total_sent + feedback.buffers[0], total_in, atol=1e-5)  # nothing lost
    assert sent_small_at is not None and sent_small_at > 0


def test_int8_sends_every_value_within_a_step_of_its_chunk_scale() -> None:
    values = torch.randn(CHUNK + 10)
    sent = chunk_int8(values)
    for chunk, out in zip(values.split(CHUNK), sent.split(CHUNK), strict=True):
        assert float((chunk - out).abs().max()) <= float(chunk.abs().max()) / 254 + 1e-7
    feedback = ErrorFeedback([values.shape], "int8")
    (first,) = feedback.take([values])
    assert torch.allclose(first + feedback.buffers[0], values, atol=1e-6)


def test_saved_buffers_resume_and_ones_that_do_not_fit_start_at_zero() -> None:
    feedback = ErrorFeedback([torch.Size([4, 3])], "topk")
    feedback.take([torch.randn(4, 3)])
    saved = feedback.state()
    other = ErrorFeedback([torch.Size([4, 3])], "topk")
    assert other.load(saved) and torch.equal(other.buffers[0], saved[0])
    assert not other.load([torch.zeros(5)]) and not other.buffers[0].any()
    assert not other.load([torch.full((4, 3), math.inf)]) and not other.buffers[0].any()
    assert not other.load(None)


def _topk_optimizer(monkeypatch):
    """A topk-mode DiLoCo optimizer on the fake two-peer clock and averager of test_diloco."""
    import p2ptrain.optim.diloco as diloco
    from p2ptrain.config.schema import TrainingSection
    from p2ptrain.optim.swarm_stats import SwarmStats
    from tests.unit.test_diloco import _Averager, _TwoPeerClock

    monkeypatch.setattr(diloco, "SwarmProgressTracker", _TwoPeerClock)
    made: list[tuple[_Averager, dict[str, object]]] = []

    def make_averager(*args: object, **kwargs: object) -> _Averager:
        made.append((_Averager(*args, **kwargs), kwargs))
        return made[-1][0]

    monkeypatch.setattr(diloco, "DiLoCoAverager", make_averager)
    param = torch.nn.Parameter(torch.zeros(2 * CHUNK))
    cfg = TrainingSection(mode="diloco", batch_size=8, inner_steps=10, lr=0.1, warmup_epochs=0,
                          outer_compression="topk", outer_topk_density=0.01, outer_value_bits=4, outer_lr=1.0,
                          outer_momentum=0.0)
    optimizer = diloco.DiLoCoOptimizer([param], SimpleNamespace(peer_id="QmMe"), "run", cfg, client_mode=False,
                                       stats=SwarmStats())
    return optimizer, param, made[0]


def test_a_topk_round_averages_what_the_peers_sent_and_keeps_the_rest(monkeypatch) -> None:
    import time

    optimizer, param, (averager, kwargs) = _topk_optimizer(monkeypatch)
    assert isinstance(kwargs["compression"], SparseChunkCodec) and kwargs["compression"].bits == 4
    with torch.no_grad():
        param.add_(torch.randn(param.shape))  # a round's inner steps
    pseudo = optimizer.outer.pseudo_gradients([param])
    (sent,) = optimizer._feedback.take(pseudo)
    assert int(sent.count_nonzero()) == 2 * math.ceil(0.01 * CHUNK)
    assert torch.allclose(sent + optimizer._feedback.buffers[0], pseudo[0], atol=1e-6)
    averager.tensors[0].copy_(sent / 2)  # what the group's average brought back
    optimizer._finish_round({"QmMe": None, "QmPeer": None}, [sent], None, time.perf_counter())
    assert torch.allclose(param.detach(), -sent / 2, atol=1e-6)  # outer_lr 1, no momentum: outer - average


def test_checkpoints_hold_the_buffer_and_a_downloaded_state_zeroes_it(monkeypatch) -> None:
    optimizer, param, _ = _topk_optimizer(monkeypatch)
    optimizer._feedback.take([torch.randn(param.shape)])
    state = optimizer.checkpoint_state()
    kept = state["optimizer"]["error_feedback"][0]
    assert kept.any()
    restarted, _, _ = _topk_optimizer(monkeypatch)
    restarted.restore(state)
    assert torch.equal(restarted._feedback.buffers[0], kept)
    metadata, tensors = restarted.served_state()
    assert restarted._adopt(metadata, tensors) and not restarted._feedback.buffers[0].any()


def test_the_settings_are_checked() -> None:
    from p2ptrain.config.schema import TrainingSection

    cfg = TrainingSection()
    assert (cfg.outer_compression, cfg.outer_topk_density, cfg.outer_value_bits) == ("none", 0.02, 2)
    for bad in ({"outer_value_bits": 3}, {"outer_topk_density": 0.0}, {"outer_compression": "zip"}):
        with pytest.raises(ValueError):
            TrainingSection(**bad)


def test_peers_of_different_outer_wire_formats_never_share_a_clock_or_an_averager() -> None:
    from p2ptrain.dhtkeys import diloco_averager_prefix, diloco_outer_prefix

    formats = [("none", 2, 0.02), ("int8", 2, 0.02), ("topk", 2, 0.02), ("topk", 4, 0.02), ("topk", 2, 0.05)]
    prefixes = {diloco_averager_prefix(diloco_outer_prefix("run", *wire)) for wire in formats}
    assert len(prefixes) == len(formats) and diloco_outer_prefix("run", "none") == "run"  # today's keys unchanged
    assert not any("." in prefix for prefix in prefixes)  # hivemind's averager refuses a "." in its prefix


def test_an_overlapped_topk_round_lands_one_round_late_keeping_the_progress_made_meanwhile(monkeypatch) -> None:
    """The delayed outer step (``overlap``, on by default) in topk mode: the round's sparse part goes to the
    averager, training goes on, and when the average lands the outer step is applied under that progress."""
    from hivemind.averaging.control import AveragingStage

    optimizer, param, (averager, _) = _topk_optimizer(monkeypatch)
    assert optimizer.cfg.overlap

    def micro_batch() -> None:
        param.grad = torch.randn(param.shape)
        optimizer.step(batch_size=8)
        optimizer.zero_grad()

    micro_batch()
    [control] = averager.controls
    control.stage = AveragingStage.AWAITING_TRIGGER
    micro_batch()  # the round ends: its part handed over, its all-reduce in flight
    assert control.triggered and optimizer._in_flight is not None
    sent = averager.tensors[0].clone()
    assert int(sent.count_nonzero()) == 2 * math.ceil(0.01 * CHUNK)
    for _ in range(4):  # an inner step of progress while the round is in flight
        micro_batch()
    assert optimizer._in_flight is not None
    control.done = lambda: True  # type: ignore[method-assign]
    control.result = lambda timeout=None: {"QmMe": None, "QmPeer": None}  # type: ignore[attr-defined]
    averager.tensors[0].copy_(sent / 2)  # the group's average
    micro_batch()  # lands here; this micro-batch's own progress is kept on top
    assert optimizer._in_flight is None
    assert torch.allclose(optimizer.outer.params[0], -sent / 2, atol=1e-6)  # outer_lr 1, no momentum
    assert not torch.allclose(param.detach(), optimizer.outer.params[0])  # that progress kept on top


def test_a_failed_topk_round_keeps_what_it_sent_and_leaves_the_outer_params_where_the_swarm_s_are(
        monkeypatch) -> None:
    """Rounds average pseudo-gradients here, so a peer that applied its own part after a failed round
    would sit apart from the swarm for good; instead the part goes back into its buffer."""
    import time

    optimizer, param, _ = _topk_optimizer(monkeypatch)
    with torch.no_grad():
        param.add_(torch.randn(param.shape))
    pseudo = optimizer.outer.pseudo_gradients([param])
    before = optimizer.outer.params[0].clone()
    momentum = [buffer.clone() for buffer in optimizer.outer.momentum_buffers()]
    sent = optimizer._feedback.take(pseudo)
    optimizer._finish_round(None, sent, None, time.perf_counter())
    assert torch.equal(optimizer.outer.params[0], before) and torch.equal(param.detach(), before)
    assert all(torch.equal(a, b) for a, b in zip(optimizer.outer.momentum_buffers(), momentum, strict=True))
    assert torch.allclose(optimizer._feedback.buffers[0], pseudo[0], atol=1e-6)  # nothing lost: sent next round


def test_a_topk_peer_one_round_behind_downloads_instead_of_joining_the_next_round(monkeypatch) -> None:
    """With averaged pseudo-gradients, the outer step a peer missed is a gap no later round closes."""
    optimizer, _, _ = _topk_optimizer(monkeypatch)
    downloads: list[int] = []
    monkeypatch.setattr(optimizer, "load_state_from_peers", lambda: downloads.append(optimizer.local_epoch) or False)
    optimizer.restore({"epoch": 3})
    assert optimizer.join_next_round(4) is False and optimizer.local_epoch == 3
    optimizer._tracker.global_epoch = 4
    optimizer._catch_up()
    assert downloads == [3]


def test_the_all_reduce_names_the_sender_of_a_malformed_sparse_part_and_reads_no_further() -> None:
    """The stream check of a round (``RobustAllReduceRunner._screened``) on a sender's sparse parts: the
    good one passes, the malformed one is refused before hivemind decodes it, its sender named."""
    import asyncio

    from hivemind.averaging.allreduce import AllreduceException
    from hivemind.proto import averaging_pb2

    from p2ptrain.averaging.allreduce import RobustAllReduceRunner

    numel = 2 * CHUNK
    good = _encode(chunk_topk(torch.randn(numel), 0.01, 4), 4)
    bad = type(good)()
    bad.CopyFrom(good)
    bad.buffer = _corrupt(good.buffer, 4, np.array([np.inf], "<f4").tobytes())  # chunk 0's scale
    named: list[tuple[str, str, str]] = []
    runner = SimpleNamespace(tensor_part_reducer=SimpleNamespace(part_shapes=[torch.Size([numel])] * 2),
                             sender_peer_ids=["QmHonest", "QmLiar"],
                             _offend=lambda peer, kind, reason: named.append((peer, kind, reason)))

    async def stream():
        for part in (good, bad):
            yield averaging_pb2.AveragingData(tensor_part=part)

    async def read() -> list[object]:
        passed: list[object] = []
        with pytest.raises(AllreduceException, match="part 1: chunk 0 has scale inf"):
            async for message in RobustAllReduceRunner._screened(runner, stream(), 1):
                passed.append(message)
        return passed

    passed = asyncio.run(read())
    assert len(passed) == 1 and named == [("QmLiar", "malformed_part", "part 1: chunk 0 has scale inf")]
