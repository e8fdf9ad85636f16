"""hivemind's reducer and container, hardened: exercised on the event loop without any network."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from hivemind.averaging.partition import BannedException

from p2ptrain.averaging.allreduce import CheckedTensorPartContainer, RobustTensorPartReducer
from p2ptrain.averaging.robust_reduce import ReduceRule


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def _reducer(num_senders: int, parts: int = 2, size: int = 256, local: int | None = 0, **rule):
    rejected: list[tuple[int, str, str]] = []
    reducer = RobustTensorPartReducer([torch.Size([size])] * parts, num_senders, rule=ReduceRule(**rule),
                                      local_sender=local, on_reject=lambda i, why: rejected.append((i, why.kind,
                                                                                                    why.reason)))
    return reducer, rejected


async def _send(reducer, sender: int, parts: list[torch.Tensor], weight: float = 1.0):
    results = []
    try:
        for index, part in enumerate(parts):
            results.append(await reducer.accumulate_part(sender, index, part, weight=weight))
    except BannedException:
        results.append("banned")
    return results


def test_honest_senders_get_the_weighted_mean_for_every_part():
    async def scenario():
        reducer, rejected = _reducer(3)
        data = {s: [torch.randn(256) + s, torch.randn(256) - s] for s in range(3)}
        results = await asyncio.gather(*(_send(reducer, s, data[s], weight=float(s + 1)) for s in range(3)))
        return reducer, rejected, data, results

    reducer, rejected, data, results = _run(scenario())
    for part in range(2):
        expected = sum((s + 1) * data[s][part] for s in range(3)) / 6
        for s in range(3):
            assert torch.allclose(results[s][part], expected, atol=1e-5)
    assert rejected == [] and reducer.contributions_accepted == 6 and reducer.finished.is_set()
    assert reducer.weights == {0: 1.0, 1: 2.0, 2: 3.0}  # what the round report vouches for


def test_a_nonfinite_sender_is_rejected_named_and_left_out_of_later_parts():
    async def scenario():
        reducer, rejected = _reducer(3)
        good = {s: [torch.randn(256), torch.randn(256)] for s in (0, 1)}
        bad = [torch.full((256,), math.nan), torch.randn(256)]
        results = await asyncio.gather(_send(reducer, 0, good[0]), _send(reducer, 1, good[1]), _send(reducer, 2, bad))
        return reducer, rejected, good, results

    reducer, rejected, good, results = _run(scenario())
    assert [(i, kind) for i, kind, _ in rejected] == [(2, "nonfinite_part")]
    for part in range(2):
        assert torch.allclose(results[0][part], (good[0][part] + good[1][part]) / 2, atol=1e-6)
        assert torch.isfinite(results[1][part]).all()
    assert results[2][-1] == "banned"  # its second part is refused
    assert reducer.contributions_accepted == 4 and set(reducer.weights) == {0, 1}  # nothing vouched for it


def test_inflated_weight_is_capped_before_mixing():
    async def scenario():
        reducer, _ = _reducer(2, parts=1, max_weight=10.0)
        ours, theirs = torch.zeros(256), torch.ones(256)
        return reducer, await asyncio.gather(_send(reducer, 0, [ours], 10.0), _send(reducer, 1, [theirs], 1e12))

    reducer, results = _run(scenario())
    assert torch.allclose(results[0][0], torch.full((256,), 0.5))  # capped to 10 vs 10, not 1e12 vs 10
    assert reducer.weights == {0: 10.0, 1: 10.0}  # and vouched for as capped


def test_a_wrong_shape_is_rejected_without_stalling_the_others():
    async def scenario():
        reducer, rejected = _reducer(3, parts=1)
        parts = [torch.ones(256), torch.ones(256) * 3]
        results = await asyncio.gather(_send(reducer, 0, [parts[0]]), _send(reducer, 1, [parts[1]]),
                                       _send(reducer, 2, [torch.ones(7)]))
        return rejected, results

    rejected, results = _run(scenario())
    assert rejected[0][:2] == (2, "malformed_part") and "shape (7,)" in rejected[0][2]
    assert torch.allclose(results[0][0], torch.full((256,), 2.0)) and results[2] == ["banned"]


def test_a_sender_failing_after_rejection_is_not_counted_out_twice():
    async def scenario():
        reducer, _ = _reducer(3, parts=2)
        first = await asyncio.gather(*(reducer.accumulate_part(s, 0, torch.full((256,), math.nan if s == 2 else 1.0))
                                       for s in range(3)))
        reducer.on_sender_failed(2)  # what hivemind does when the rejected sender's stream ends
        second = await asyncio.gather(*(reducer.accumulate_part(s, 1, torch.ones(256)) for s in range(2)))
        return first, second, reducer

    first, second, reducer = _run(scenario())
    assert all(torch.allclose(r, torch.ones(256)) for r in [*first, *second])
    assert reducer.finished.is_set()


def test_checked_container_refuses_a_poisoned_average_and_keeps_our_values():
    async def scenario():
        bad: list[tuple[int, str]] = []
        tensors = [torch.randn(4096)]
        container = CheckedTensorPartContainer(tensors, (1.0, 1.0), rule=ReduceRule(), local_index=0,
                                               on_bad_result=lambda index, reason: bad.append((index, reason)),
                                               part_size_bytes=2048 * 4)
        theirs = len(container._input_parts_by_peer[1])
        for index in range(container.num_parts_by_peer[0]):
            container.register_processed_part(0, index, torch.full((2048,), 0.25))
        for index in range(theirs):
            container.register_processed_part(1, index, torch.full((2048,), math.nan))
        outputs = [t async for t in container.iterate_output_tensors()]
        return bad, outputs, container

    bad, outputs, container = _run(scenario())
    assert len(bad) == 1 and bad[0][0] == 1 and "NaN" in bad[0][1]
    delta = outputs[0]
    assert torch.isfinite(delta).all()
    assert torch.allclose(delta[:2048], torch.full((2048,), 0.25)) and torch.all(delta[2048:] == 0)
    assert container.failed_size == 2048


@pytest.mark.parametrize("local", [None, 1])
def test_nobody_usable_returns_our_part_or_zeros(local):
    async def scenario():
        reducer, _ = _reducer(2, parts=1, local=local)
        nan = torch.full((256,), math.nan)
        return await asyncio.gather(_send(reducer, 0, [nan]), _send(reducer, 1, [torch.ones(256)] if local else [nan]))

    results = _run(scenario())
    expected = torch.ones(256) if local == 1 else torch.zeros(256)
    assert torch.allclose(results[0][0], expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_a_part_of_an_unexpected_dtype_is_refused_and_named_without_stalling_the_others(dtype):
    """hivemind deserialises a part with whatever dtype its sender declares: one that is not a float type
    is refused as malformed (its sender named), and the honest senders still get their average."""
    async def scenario():
        reducer, rejected = _reducer(3, parts=2)
        honest = {s: [torch.full((256,), float(s + 1)), torch.full((256,), float(s + 1))] for s in (0, 1)}
        odd = [torch.ones(256, dtype=dtype), torch.ones(256, dtype=dtype)]
        results = await asyncio.wait_for(asyncio.gather(_send(reducer, 0, honest[0]), _send(reducer, 1, honest[1]),
                                                        _send(reducer, 2, odd)), timeout=5)
        return reducer, rejected, results

    reducer, rejected, results = _run(scenario())
    assert [(index, kind) for index, kind, _ in rejected] == [(2, "malformed_part")]
    assert str(dtype).replace("torch.", "") in rejected[0][2]
    for part in range(2):
        assert torch.allclose(results[0][part], torch.full((256,), 1.5))
    assert results[2][-1] == "banned" and reducer.finished.is_set()


def test_a_check_that_breaks_on_a_part_refuses_its_sender_and_never_stalls_the_round(monkeypatch):
    """Whatever a peer sends, the per-part check must not raise into hivemind's reducer: a check that
    breaks on one sender's part refuses that sender; the others get their average."""
    import p2ptrain.averaging.robust_reduce as robustreduce

    real = robustreduce._part_norm

    def fragile(tensor):
        if float(tensor[0]) == 7.0:
            raise RuntimeError("cannot read this part")
        return real(tensor)

    monkeypatch.setattr(robustreduce, "_part_norm", fragile)

    async def scenario():
        reducer, rejected = _reducer(3, parts=1)
        parts = [torch.ones(256), torch.full((256,), 3.0), torch.full((256,), 7.0)]
        results = await asyncio.wait_for(asyncio.gather(*(_send(reducer, s, [parts[s]]) for s in range(3))), 5)
        return rejected, results

    rejected, results = _run(scenario())
    assert [(index, kind) for index, kind, _ in rejected] == [(2, "malformed_part")]
    assert torch.allclose(results[0][0], torch.full((256,), 2.0))


def test_a_reducer_that_returns_an_unexpected_dtype_is_refused():
    async def scenario():
        bad: list[tuple[int, str]] = []
        container = CheckedTensorPartContainer([torch.randn(4096)], (1.0, 1.0), rule=ReduceRule(), local_index=0,
                                               on_bad_result=lambda index, reason: bad.append((index, reason)),
                                               part_size_bytes=2048 * 4)
        for index in range(container.num_parts_by_peer[0]):
            container.register_processed_part(0, index, torch.zeros(2048))
        for index in range(container.num_parts_by_peer[1]):
            container.register_processed_part(1, index, torch.ones(2048, dtype=torch.int64))
        outputs = [t async for t in container.iterate_output_tensors()]
        return bad, outputs

    bad, outputs = _run(scenario())
    assert len(bad) == 1 and bad[0][0] == 1 and "int64" in bad[0][1]
    assert outputs[0].dtype == torch.float32 and torch.all(outputs[0] == 0)


def test_a_part_message_is_refused_before_decoding_when_it_declares_what_no_honest_peer_sends():
    from hivemind.compression import CompressionInfo, serialize_torch_tensor
    from hivemind.proto import runtime_pb2

    from p2ptrain.averaging.allreduce import _declared_problem
    from p2ptrain.averaging.compression import make_compression

    n = 70_000  # large enough for "8bit" to quantise it
    shapes = [torch.Size([n])]
    for choice in ("none", "fp16", "8bit"):  # what honest peers send passes, whatever the run's compression
        values = torch.randn(n)
        message = make_compression(choice).compress(values, CompressionInfo.from_tensor(values), False)
        assert _declared_problem(message, 0, shapes) is None, choice
    as_int = serialize_torch_tensor(torch.ones(n, dtype=torch.int64))
    assert _declared_problem(as_int, 0, shapes) == ("malformed_part", "part 0 declares dtype 'int64'")
    quantile = serialize_torch_tensor(torch.randn(n), runtime_pb2.CompressionType.QUANTILE_8BIT)
    assert _declared_problem(quantile, 0, shapes) == ("malformed_part", "part 0 declares compression QUANTILE_8BIT")
    short = serialize_torch_tensor(torch.randn(n - 1))
    short.size[:] = [n]
    assert _declared_problem(short, 0, shapes)[0] == "malformed_part"  # hivemind would fail to reshape it
    assert _declared_problem(serialize_torch_tensor(torch.randn(7)), 0, shapes)[0] == "malformed_part"
    assert "more than the 1 parts" in _declared_problem(serialize_torch_tensor(torch.randn(n)), 1, shapes)[1]
