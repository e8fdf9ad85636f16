"""training.device and training.precision: resolution, the training step in each precision, CPU staging,
checkpoints across devices, records and metrics, and a bf16 peer averaging with an fp32 peer.

The CPU path of every setting runs everywhere; the CUDA tests run where torch sees a CUDA device and
are skipped elsewhere with their reason.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from p2ptrain.config.schema import ConfigError, NodeConfig, TrainingSection
from p2ptrain.model.checkpoint import CheckpointStore
from p2ptrain.model.device import HostStaging, Placement, resolve_device, to_cpu
from p2ptrain.optim.trainer import Trainer
from p2ptrain.tasks.base import IndexedStream, Task

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device: torch sees none on this machine")


def _no_cuda() -> bool:
    return False


def _task(seed: int = 0, data_seed: int = 1) -> Task:
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)

    def batch(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(data_seed * 1000 + index)
        return torch.randn(4, 6, generator=generator), torch.randn(4, 2, generator=generator)

    def loss_fn(module: torch.nn.Module, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = pair
        return torch.nn.functional.mse_loss(module(inputs).float(), targets)

    return Task(model=model, loss_fn=loss_fn, train_batches=IndexedStream(batch),
                validation_batches=lambda: [batch(10_000)], shape_config={})


class _Recording:
    """A swarm optimizer that applies plain SGD and remembers the gradients it was given."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = list(model.parameters())
        self.local_epoch = 0
        self.seen: list[list[torch.Tensor]] = []

    def step(self, batch_size: int) -> None:
        self.seen.append([p.grad.detach().clone() for p in self.params])
        with torch.no_grad():
            for p in self.params:
                p.sub_(0.1 * p.grad)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


# ---------------------------------------------------------------------------------------- settings


def test_auto_is_the_cpu_without_cuda_and_cuda_0_with_it() -> None:
    assert resolve_device("auto", _no_cuda) == torch.device("cpu")
    assert resolve_device("auto", lambda: True, lambda: 2) == torch.device("cuda", 0)
    assert resolve_device("cpu", lambda: True) == torch.device("cpu")
    assert resolve_device("cuda:1", lambda: True, lambda: 2) == torch.device("cuda", 1)


@pytest.mark.parametrize("setting", ["cuda", "cuda:0"])
def test_an_explicit_cuda_device_without_cuda_is_a_one_line_config_error(setting: str) -> None:
    with pytest.raises(ConfigError, match=rf'^training.device: "{setting}" but torch sees no CUDA device') as err:
        resolve_device(setting, _no_cuda)
    assert "\n" not in str(err.value)


def test_a_cuda_index_beyond_the_machine_s_devices_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r'"cuda:2" but torch sees 2 CUDA device\(s\) \(cuda:0..cuda:1\)'):
        resolve_device("cuda:2", lambda: True, lambda: 2)


@pytest.mark.parametrize(("section", "message"), [
    ({"device": "gpu"}, "training.device"),
    ({"device": "cuda:123"}, "training.device"),
    ({"precision": "fp8"}, "training.precision"),
    ({"device": "cpu", "precision": "fp16"}, 'precision "fp16" needs a CUDA device'),
])
def test_bad_device_settings_are_refused_naming_the_field(tmp_path: Path, section: dict[str, str],
                                                          message: str) -> None:
    from p2ptrain.config.schema import load_config

    path = tmp_path / "node.toml"
    path.write_text("[training]\n" + "".join(f'{key} = "{value}"\n' for key, value in section.items()))
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path, environ={})
    assert "\n" not in str(err.value)


def test_the_defaults_are_auto_and_fp32() -> None:
    training = NodeConfig().training
    assert (training.device, training.precision) == ("auto", "fp32")


def test_fp16_under_auto_on_a_cpu_machine_trains_in_fp32_and_says_so_once(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="p2ptrain.model.device"):
        placement = Placement.from_settings("auto", "fp16", _no_cuda)
    assert (placement.name, placement.precision, placement.scaler) == ("cpu", "fp32", None)
    assert len(caplog.records) == 1 and 'training.precision "fp16" needs a CUDA device' in caplog.text


def test_bf16_stays_bf16_on_a_cpu_and_there_is_no_device_memory_to_count() -> None:
    placement = Placement.from_settings("cpu", "bf16")
    assert (placement.name, placement.precision, placement.scaler) == ("cpu", "bf16", None)
    assert placement.memory_bytes() is None and placement.describe() == "training on cpu in bf16"


# ---------------------------------------------------------------------------------------- the training step


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_forward_pass_runs_in_the_precision_and_the_rest_stays_fp32(precision: str, dtype: torch.dtype) -> None:
    task = _task()
    seen: list[torch.dtype] = []
    task.model[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    optimizer = _Recording(task.model)
    trainer = Trainer(task, optimizer, 4, Placement.from_settings("cpu", precision))  # type: ignore[arg-type]
    stats = trainer.step()
    assert seen == [dtype]
    assert not stats.skipped_nonfinite and math.isfinite(stats.loss)
    assert all(g.dtype == torch.float32 for g in optimizer.seen[0])
    assert all(p.dtype == torch.float32 for p in task.model.parameters())
    assert math.isfinite(trainer.validation_loss())


def test_bf16_gradients_are_close_to_fp32_ones() -> None:
    grads = {}
    for precision in ("fp32", "bf16"):
        task = _task()
        optimizer = _Recording(task.model)
        Trainer(task, optimizer, 4, Placement.from_settings("cpu", precision)).step()  # type: ignore[arg-type]
        grads[precision] = optimizer.seen[0]
    for full, half in zip(grads["fp32"], grads["bf16"], strict=True):
        assert not torch.equal(full, half)  # bf16 arithmetic did take place
        assert torch.allclose(full, half, rtol=0.05, atol=0.02)


def test_with_a_loss_scale_the_optimizer_sees_unscaled_gradients() -> None:
    """The fp16 path's scaler, exercised on the CPU: what reaches the optimizer (and the swarm) is the true
    gradient, not the scaled one."""
    reference_task, task = _task(), _task()
    reference = _Recording(reference_task.model)
    Trainer(reference_task, reference, 4).step()  # type: ignore[arg-type]
    scaled = _Recording(task.model)
    placement = Placement(torch.device("cpu"), "fp32", torch.amp.GradScaler("cpu", init_scale=1024.0))
    Trainer(task, scaled, 4, placement).step()  # type: ignore[arg-type]
    for expected, got in zip(reference.seen[0], scaled.seen[0], strict=True):
        assert torch.allclose(expected, got, rtol=1e-5, atol=1e-7)


def test_an_overflow_under_a_loss_scale_skips_the_step_and_halves_the_scale() -> None:
    task = _task()
    optimizer = _Recording(task.model)
    placement = Placement(torch.device("cpu"), "fp32", torch.amp.GradScaler("cpu", init_scale=1024.0))
    trainer = Trainer(task, optimizer, 4, placement)  # type: ignore[arg-type]
    with torch.no_grad():
        task.model[2].bias[0] = math.inf
    stats = trainer.step()
    assert stats.skipped_nonfinite and optimizer.seen == [] and trainer.nonfinite_skips == 1
    assert placement.scaler.get_scale() == 512.0


# ---------------------------------------------------------------------------------------- staging, checkpoints


def test_cpu_staging_copies_both_ways_into_fp32_and_keeps_no_alias() -> None:
    sources = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.ones(4, dtype=torch.bfloat16)]
    staging = HostStaging(sources, torch.device("cpu"))
    targets = [torch.zeros(2, 3), torch.zeros(4)]
    staging.to_host(sources, targets)
    assert torch.equal(targets[0], sources[0]) and torch.equal(targets[1], torch.ones(4))
    moved = staging.to_device(targets)
    targets[0].fill_(-1.0)  # the averager's buffers change later: what was moved does not
    assert torch.equal(moved[0], sources[0]) and all(t.dtype == torch.float32 for t in moved)


def test_to_cpu_keeps_the_structure_and_every_value() -> None:
    state = {"model": {"w": torch.ones(2)}, "list": [torch.zeros(1), 3], "tuple": (torch.ones(1), "x"), "n": 5}
    moved = to_cpu(state)
    assert moved["n"] == 5 and moved["list"][1] == 3 and moved["tuple"][1] == "x"
    assert torch.equal(moved["model"]["w"], torch.ones(2)) and isinstance(moved["tuple"], tuple)


def test_a_checkpoint_of_a_bf16_node_resumes_exactly_on_another_device_map(tmp_path: Path) -> None:
    """Checkpoints are CPU tensors: written by one node, read with whatever map the reader's torch.load
    uses, loaded into a model and an optimizer built on the reader's device, they go on identically."""
    task = _task()
    adam = torch.optim.AdamW(task.model.parameters(), lr=0.01)
    trainer = Trainer(task, _Adam(adam), 4, Placement.from_settings("cpu", "bf16"))  # type: ignore[arg-type]
    for _ in range(3):
        trainer.step()
    store = CheckpointStore(tmp_path, keep=2)
    store.save(to_cpu({"model": task.model.state_dict(), "optimizer": adam.state_dict(), "epoch": 3}))

    def opener(path: Path) -> Any:  # another reader's map: every storage relocated by a function
        return torch.load(path, map_location=lambda storage, location: storage.cpu(), weights_only=True)

    reader = CheckpointStore(tmp_path, keep=2, opener=opener)
    loaded = reader.load_latest()
    assert loaded is not None
    resumed = _task()
    resumed.model.load_state_dict(loaded.state["model"])
    resumed_adam = torch.optim.AdamW(resumed.model.parameters(), lr=0.01)
    resumed_adam.load_state_dict(loaded.state["optimizer"])
    resumed.train_batches.load_state_dict(task.train_batches.state_dict())
    Trainer(resumed, _Adam(resumed_adam), 4, Placement.from_settings("cpu", "bf16")).step()  # type: ignore[arg-type]
    trainer.step()
    for a, b in zip(task.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


class _Adam(_Recording):
    def __init__(self, adam: torch.optim.Optimizer) -> None:
        self.adam, self.local_epoch, self.seen = adam, 0, []

    def step(self, batch_size: int) -> None:
        self.adam.step()

    def zero_grad(self) -> None:
        self.adam.zero_grad()


# ---------------------------------------------------------------------------------------- records, metrics


@pytest.mark.parametrize(("fields", "refused"), [
    ({}, ""), ({"device": "cpu", "precision": "fp32"}, ""), ({"device": "cuda:7", "precision": "bf16"}, ""),
    ({"device": "", "precision": ""}, ""),
    ({"device": "gpu"}, "device"), ({"device": "cuda:123"}, "device"), ({"device": "cuda"}, "device"),
    ({"device": "cpu" * 100}, "device"), ({"device": 0}, "device"), ({"device": ["cpu"]}, "device"),
    ({"precision": "fp8"}, "precision"), ({"precision": None}, "precision"),
])
def test_record_device_fields_are_bounded(fields: dict[str, Any], refused: str) -> None:
    from p2ptrain.swarm.recordcheck import credit_problem

    problem = credit_problem(fields)
    assert problem.startswith(refused) if refused else problem == ""


def test_status_record_and_view_carry_the_device() -> None:
    from p2ptrain.status import PeerRecord, StatusSnapshot, SwarmView

    status = StatusSnapshot(device="cuda:0", precision="bf16", device_memory_bytes=1 << 30)
    assert StatusSnapshot.from_dict(status.to_dict()) == status
    record = PeerRecord.from_status(status)
    assert (record.device, record.precision) == ("cuda:0", "bf16")
    view = SwarmView.from_dict(SwarmView(peers=(record,)).to_dict())
    assert view.peers[0] == record


def test_metrics_show_the_device_and_its_memory_only_where_there_is_some() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from p2ptrain.metrics import P2PTrainCollector
    from p2ptrain.status import LatestSnapshot, StatusSnapshot

    def scrape(status: StatusSnapshot) -> str:
        latest = LatestSnapshot()
        latest.publish(status)
        registry = CollectorRegistry()
        registry.register(P2PTrainCollector(latest, clock=lambda: 0.0))
        return generate_latest(registry).decode()

    cpu = scrape(StatusSnapshot(device="cpu", precision="fp32"))
    assert 'p2ptrain_training_device_info{device="cpu",precision="fp32"} 1.0' in cpu
    assert "p2ptrain_device_memory_bytes" not in cpu
    gpu = scrape(StatusSnapshot(device="cuda:0", precision="bf16", device_memory_bytes=123))
    assert "p2ptrain_device_memory_bytes 123.0" in gpu
    assert "p2ptrain_training_device_info" not in scrape(StatusSnapshot())


def test_top_shows_the_device_precision_and_memory() -> None:
    from p2ptrain.status import PeerRecord, StatusSnapshot
    from p2ptrain.tui.widgets.format import device_line, peer_device

    assert device_line(StatusSnapshot()) == "—"
    assert device_line(StatusSnapshot(device="cpu", precision="bf16")) == "cpu · bf16"
    assert device_line(StatusSnapshot(device="cuda:0", precision="fp16", device_memory_bytes=3 << 30)) \
        .startswith("cuda:0 · fp16 · 3")
    assert peer_device(PeerRecord(device="cuda:1", precision="bf16")) == "gpu1/bf16"
    assert peer_device(PeerRecord()) == "—"


# ---------------------------------------------------------------------------------------- a mixed swarm


class _Clock:
    """A round tracker that sees two peers, the round ending within the matchmaking time."""

    client_mode = False
    state_sharing_priority = 0.0
    global_epoch = 0
    ready_to_update_epoch = False
    global_progress = SimpleNamespace(num_peers=2, samples_accumulated=0)
    pace = 0.0
    performance_ema = SimpleNamespace(samples_per_second=0.0)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    @property
    def estimated_next_update_time(self) -> float:
        from hivemind.utils import get_dht_time

        return get_dht_time() + 0.1

    def report_local_progress(self, *args: object) -> None:
        pass

    def pause_updates(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def update_epoch(self, epoch: int) -> None:
        pass


class _Round:
    """One all-reduce between in-process peers: each peer's control, then the weighted mean into every buffer."""

    def __init__(self) -> None:
        self.members: list[tuple[Any, list[torch.Tensor]]] = []

    def reduce(self) -> None:
        total = sum(control.weight for control, _ in self.members)
        means = [sum(control.weight * buffers[i] for control, buffers in self.members) / total
                 for i in range(len(self.members[0][1]))]
        for control, buffers in self.members:
            for buffer, mean in zip(buffers, means, strict=True):
                buffer.copy_(mean)
            control.landed = True


class _Control:
    def __init__(self) -> None:
        from hivemind.averaging.control import AveragingStage

        self.stage, self.weight, self.triggered, self.landed = AveragingStage.LOOKING_FOR_GROUP, 0.0, False, False

    def allow_allreduce(self) -> None:
        self.triggered = True

    def done(self) -> bool:
        return self.landed

    def result(self, timeout: float | None = None) -> dict[Any, int]:
        return {None: 0, "the-other-peer": 0}

    def cancel(self) -> None:
        pass


def test_a_bf16_peer_and_an_fp32_peer_average_to_the_same_model(monkeypatch) -> None:
    """Both peers hand the averager fp32 host buffers (the bf16 peer's parameters are fp32: autocast only
    changes its arithmetic), the all-reduce is the samples-weighted mean of both, and after the outer
    step both hold identical outer parameters."""
    import p2ptrain.optim.diloco as diloco
    from p2ptrain.optim.swarm_stats import SwarmStats

    shared = _Round()

    class _Averager:
        client_mode, state_sharing_priority = False, 0.0

        def __init__(self, tensors: list[torch.Tensor], *args: object, **kwargs: object) -> None:
            self.tensors = tensors

        def step(self, **kwargs: object) -> _Control:
            control = _Control()
            shared.members.append((control, self.tensors))
            return control

        def get_tensors(self) -> contextlib.AbstractContextManager[list[torch.Tensor]]:
            return contextlib.nullcontext(self.tensors)

    monkeypatch.setattr(diloco, "SwarmProgressTracker", _Clock)
    monkeypatch.setattr(diloco, "DiLoCoAverager", _Averager)
    cfg = TrainingSection(mode="diloco", batch_size=4, inner_batch_size=4, inner_steps=10, lr=0.05,
                          warmup_epochs=0, matchmaking_time=5.0)
    peers = []
    for precision, data_seed in (("bf16", 1), ("fp32", 2)):
        task = _task(seed=0, data_seed=data_seed)  # the same initial model, each its own data
        optimizer = diloco.DiLoCoOptimizer(task.model.parameters(), None, "run", cfg, client_mode=False,
                                           stats=SwarmStats())
        peers.append((task, optimizer, Trainer(task, optimizer, 4, Placement.from_settings("cpu", precision))))
    sent = []
    for _, optimizer, trainer in peers:
        from hivemind.averaging.control import AveragingStage

        trainer.step()  # schedules the round
        shared.members[-1][0].stage = AveragingStage.AWAITING_TRIGGER  # its group has assembled
        trainer.step()  # the round ends, its all-reduce in flight
        assert optimizer.local_epoch == 1
        sent.append([t.clone() for t in optimizer.averager.tensors])
        assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in optimizer.averager.tensors)
    assert not torch.equal(sent[0][0], sent[1][0])  # they trained apart
    shared.reduce()
    weights = [control.weight for control, _ in shared.members]
    assert weights == [8.0, 8.0]
    for _, optimizer, trainer in peers:
        trainer.step()  # the round lands: the outer step on the swarm's average
        assert optimizer.round_settled.is_set()
    for index, (a, b) in enumerate(zip(peers[0][1].outer.params, peers[1][1].outer.params, strict=True)):
        assert torch.equal(a, b)
        expected = (weights[0] * sent[0][index] + weights[1] * sent[1][index]) / sum(weights)
        assert torch.allclose(peers[0][1].averager.tensors[index], expected)


# ---------------------------------------------------------------------------------------- CUDA


@NEEDS_CUDA
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_training_step_in_each_precision(precision: str) -> None:
    task = _task()
    placement = Placement.from_settings("cuda", precision)
    task.model.to(placement.device)
    optimizer = _Recording(task.model)
    trainer = Trainer(task, optimizer, 4, placement)  # type: ignore[arg-type]
    for _ in range(3):
        stats = trainer.step()
    assert not stats.skipped_nonfinite
    assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in task.model.parameters())
    assert (placement.scaler is not None) == (precision == "fp16")
    assert (placement.memory_bytes() or 0) > 0


@NEEDS_CUDA
def test_cuda_staging_round_trip_through_pinned_memory() -> None:
    device = torch.device("cuda", 0)
    sources = [torch.randn(64, 32, device=device), torch.randn(7, device=device)]
    staging = HostStaging(sources, device)
    host = [torch.zeros(64, 32).share_memory_(), torch.zeros(7).share_memory_()]
    staging.to_host(sources, host)
    assert all(torch.equal(h, s.cpu()) for h, s in zip(host, sources, strict=True))
    moved = staging.to_device(host)
    host[0].fill_(0.0)
    again = staging.to_device(host)  # the second upload waits for the first to leave the pinned buffers
    assert torch.equal(moved[0], sources[0]) and torch.equal(again[0], torch.zeros_like(sources[0]))
    assert all(m.device == device for m in moved)


@NEEDS_CUDA
def test_a_gpu_checkpoint_resumes_on_a_cpu_and_the_reverse(tmp_path: Path) -> None:
    gpu = _task()
    gpu.model.to("cuda")
    adam = torch.optim.AdamW(gpu.model.parameters(), lr=0.01)
    Trainer(gpu, _Adam(adam), 4, Placement.from_settings("cuda", "bf16")).step()  # type: ignore[arg-type]
    CheckpointStore(tmp_path / "a", keep=1).save(
        to_cpu({"model": gpu.model.state_dict(), "optimizer": adam.state_dict(), "epoch": 1}))
    loaded = CheckpointStore(tmp_path / "a", keep=1).load_latest()
    assert loaded is not None
    assert all(t.device.type == "cpu" for t in loaded.state["model"].values())
    cpu = _task()
    cpu.model.load_state_dict(loaded.state["model"])
    cpu_adam = torch.optim.AdamW(cpu.model.parameters(), lr=0.01)
    cpu_adam.load_state_dict(loaded.state["optimizer"])
    Trainer(cpu, _Adam(cpu_adam), 4).step()  # type: ignore[arg-type]
    CheckpointStore(tmp_path / "b", keep=1).save(
        to_cpu({"model": cpu.model.state_dict(), "optimizer": cpu_adam.state_dict(), "epoch": 2}))
    back = CheckpointStore(tmp_path / "b", keep=1).load_latest()
    assert back is not None
    again = _task()
    again.model.to("cuda").load_state_dict(back.state["model"])
    again_adam = torch.optim.AdamW(again.model.parameters(), lr=0.01)
    again_adam.load_state_dict(back.state["optimizer"])
    Trainer(again, _Adam(again_adam), 4, Placement.from_settings("cuda", "fp32")).step()  # type: ignore[arg-type]
    assert all(p.device.type == "cuda" for p in again.model.parameters())
