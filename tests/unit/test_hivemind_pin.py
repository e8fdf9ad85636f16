"""The adapter's pin on hivemind: the installed version is the pinned one, every hivemind method the adapter
overrides or calls privately still has the signature it was written against, every private attribute it
reads is still set by hivemind, and the inventory in ``p2ptrain.averaging.pinned`` names every override
the adapter's classes really make (an override added without a line there fails here)."""

# ruff: noqa: E501  (hivemind's signatures are recorded whole, one a line)

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import hivemind
import pytest

from p2ptrain.averaging import pinned

ROOT = Path(__file__).resolve().parents[2]

#: ``str(inspect.signature(...))`` of each method in ``pinned.OVERRIDDEN`` and ``pinned.CALLED``, as in
#: hivemind 1.1.12.  When hivemind is upgraded, read each changed method against the override or call
#: that relies on it before updating its line here.
SIGNATURES: dict[str, str] = {
    "hivemind.averaging.allreduce.AllReduceRunner.__init__": '(self, *, p2p: hivemind.p2p.p2p_daemon.P2P, servicer_type: Type[hivemind.p2p.servicer.ServicerBase], prefix: Optional[str], group_id: bytes, tensors: Sequence[torch.Tensor], weight: Optional[float] = None, ordered_peer_ids: Sequence[hivemind.p2p.p2p_daemon_bindings.datastructures.PeerID], peer_fractions: Tuple[float, ...], modes: Optional[Sequence[hivemind.averaging.allreduce.AveragingMode]] = None, sender_timeout: Optional[float] = None, reducer_timeout: Optional[float] = None, **kwargs)',
    "hivemind.averaging.allreduce.AllReduceRunner._accumulate_parts_streaming": '(self, stream: AsyncIterator[averaging_pb2.AveragingData], sender_index: int)',
    "hivemind.averaging.allreduce.AllReduceRunner._communicate_with_peer": '(self, peer_id: hivemind.p2p.p2p_daemon_bindings.datastructures.PeerID)',
    "hivemind.averaging.allreduce.AllReduceRunner._get_peer_stub": '(self, peer: hivemind.p2p.p2p_daemon_bindings.datastructures.PeerID) -> hivemind.p2p.servicer.StubBase',
    "hivemind.averaging.averager.DecentralizedAverager.__init__": "(self, averaged_tensors: 'Sequence[torch.Tensor]', dht: 'DHT', *, start: 'bool', prefix: 'str', target_group_size: 'Optional[int]' = None, min_group_size: 'int' = 2, initial_group_bits: 'str' = '', min_matchmaking_time: 'float' = 5.0, request_timeout: 'float' = 3.0, averaging_alpha: 'float' = 1.0, part_size_bytes: 'int' = 524288, allreduce_timeout: 'Optional[float]' = None, next_chunk_timeout: 'Optional[float]' = None, sender_timeout: 'Optional[float]' = None, reducer_timeout: 'Optional[float]' = None, compression: 'CompressionBase' = hivemind.NoCompression(), state_compression: 'CompressionBase' = hivemind.NoCompression(), tensor_infos: 'Optional[Sequence[CompressionInfo]]' = None, bandwidth: 'Optional[float]' = None, min_vector_size: 'int' = 0, auxiliary: 'bool' = False, allow_state_sharing: 'Optional[bool]' = None, declare_state_period: 'float' = 30, client_mode: 'Optional[bool]' = None, daemon: 'bool' = True, shutdown_timeout: 'float' = 5)",
    "hivemind.averaging.averager.DecentralizedAverager._load_state_from_peers": "(self, future: 'MPFuture', timeout: 'Optional[float]' = None)",
    "hivemind.averaging.averager.DecentralizedAverager._register_allreduce_group": "(self, group_info: 'GroupInfo')",
    "hivemind.averaging.averager.DecentralizedAverager._run_allreduce_inplace_": "(self, tensors: 'Sequence[torch.Tensor]', group_info: 'GroupInfo', group_id: 'Optional[bytes]' = None, **kwargs)",
    "hivemind.averaging.averager.DecentralizedAverager._run_internal": '(self)',
    "hivemind.dht.dht.DHT.run": "(self) -> 'None'",
    "hivemind.p2p.p2p_daemon.P2P._make_process_args": '(*args, **kwargs) -> List[str]',
    "hivemind.averaging.averager.DecentralizedAverager._step": "(self, *, step: 'StepControl', future_for_init: 'MPFuture')",
    "hivemind.averaging.averager.DecentralizedAverager.get_current_state": "(self) -> 'Tuple[Any, Sequence[torch.Tensor], Sequence[CompressionInfo]]'",
    "hivemind.averaging.averager.DecentralizedAverager.load_state_from_peers": "(self, wait: 'bool' = True, timeout: 'Optional[float]' = None) -> 'Optional[Tuple[Any, Sequence[torch.Tensor]]]'",
    "hivemind.averaging.averager.DecentralizedAverager.rpc_aggregate_part": "(self, stream: 'AsyncIterator[averaging_pb2.AveragingData]', context: 'P2PContext') -> 'AsyncIterator[averaging_pb2.AveragingData]'",
    "hivemind.averaging.averager.DecentralizedAverager.rpc_download_state": "(self, _request: 'averaging_pb2.DownloadRequest', _context: 'P2PContext') -> 'AsyncIterator[averaging_pb2.DownloadData]'",
    "hivemind.averaging.averager.DecentralizedAverager.rpc_join_group": "(self, request: 'averaging_pb2.JoinRequest', context: 'P2PContext') -> 'AsyncIterator[averaging_pb2.MessageFromLeader]'",
    "hivemind.averaging.averager.DecentralizedAverager.shutdown": "(self) -> 'None'",
    "hivemind.averaging.key_manager.GroupKeyManager.get_averagers": '(self, group_key: str, only_active: bool) -> List[Tuple[hivemind.p2p.p2p_daemon_bindings.datastructures.PeerID, float]]',
    "hivemind.averaging.matchmaking.Matchmaking._request_join_group": "(self, leader: 'PeerID') -> 'Optional[GroupInfo]'",
    "hivemind.averaging.matchmaking.Matchmaking.look_for_group": "(self, step: 'StepControl') -> 'Optional[GroupInfo]'",
    "hivemind.averaging.partition.TensorPartContainer.__init__": '(self, tensors: Sequence[torch.Tensor], peer_fractions: Sequence[float], compression: hivemind.compression.base.CompressionBase = hivemind.NoCompression(), part_size_bytes: int = 524288, tensor_infos: Optional[Sequence[hivemind.compression.base.CompressionInfo]] = None, return_deltas: bool = True, prefetch: int = 1)',
    "hivemind.averaging.partition.TensorPartContainer.register_failed_reducer": '(self, peer_index: int)',
    "hivemind.averaging.partition.TensorPartContainer.register_processed_part": '(self, peer_index: int, part_index: int, part: torch.Tensor)',
    "hivemind.averaging.partition.TensorPartReducer.__init__": '(self, part_shapes: Sequence[torch.Size], num_senders: int)',
    "hivemind.averaging.partition.TensorPartReducer.accumulate_part": '(self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0) -> torch.Tensor',
    "hivemind.averaging.partition.TensorPartReducer.check_current_part_finished": '(self)',
    "hivemind.averaging.partition.TensorPartReducer.on_sender_failed": '(self, sender_index: int)',
    "hivemind.averaging.partition.TensorPartReducer.reset_accumulators": '(self)',
    "hivemind.compression.quantization.Quantization.extract": '(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor',
    "hivemind.optim.grad_averager.GradientAverager.__init__": '(self, parameters: Iterable[torch.nn.parameter.Parameter], *, dht: hivemind.dht.dht.DHT, prefix: str, reuse_grad_buffers: bool = False, accumulate_grads_on: Optional[torch.device] = None, client_mode: bool = None, warn: bool = True, averaged_grads: Sequence[torch.Tensor] = (), **kwargs)',
    "hivemind.optim.optimizer.Optimizer.__init__": "(self, *, dht: 'DHT', run_id: 'str', target_batch_size: 'int', batch_size_per_step: 'Optional[int]' = None, optimizer: 'Union[TorchOptimizer, OptimizerFactory]', params: 'Optional[Union[Parameters, ParamGroups]]' = None, scheduler: 'Optional[Union[LRSchedulerBase, SchedulerFactory]]' = None, matchmaking_time: 'Optional[float]' = 15.0, averaging_timeout: 'Optional[float]' = 60.0, allreduce_timeout: 'Optional[float]' = None, next_chunk_timeout: 'Optional[float]' = None, load_state_timeout: 'float' = 600.0, reuse_grad_buffers: 'bool' = False, offload_optimizer: 'Optional[bool]' = None, delay_optimizer_step: 'Optional[bool]' = None, delay_grad_averaging: 'bool' = False, delay_state_averaging: 'bool' = True, average_state_every: 'int' = 1, use_local_updates: 'bool' = False, client_mode: 'bool' = None, auxiliary: 'bool' = False, grad_compression: 'CompressionBase' = hivemind.NoCompression(), grad_averager_factory: 'Optional[GradientAveragerFactory]' = None, state_averaging_compression: 'CompressionBase' = hivemind.NoCompression(), load_state_compression: 'CompressionBase' = hivemind.NoCompression(), average_opt_statistics: 'Sequence[str]' = (), extra_tensors: 'Sequence[torch.Tensor]' = (), averager_opts: 'Optional[dict]' = None, tracker_opts: 'Optional[dict]' = None, performance_ema_alpha: 'float' = 0.1, shutdown_timeout: 'float' = 5, verbose: 'bool' = False)",
    "hivemind.optim.optimizer.Optimizer._average_gradients_and_load_into_optimizer": "(self, maybe_step_control: 'Optional[StepControl]')",
    "hivemind.optim.grad_averager.GradientAverager._grad_accumulators": "(self) -> Iterator[torch.Tensor]",
    "hivemind.optim.grad_averager.GradientAverager.load_accumulators_into_averager_": "(self)",
    "hivemind.optim.optimizer.Optimizer._load_averaged_gradients_into_optimizer_": "(self)",
    "hivemind.optim.optimizer.Optimizer._begin_averaging_gradients": "(self, grad_scaler: 'Optional[GradScaler]') -> 'bool'",
    "hivemind.optim.optimizer.Optimizer._make_gradient_averager": "(self, factory: 'Optional[GradientAveragerFactory]', **kwargs) -> 'GradientAverager'",
    "hivemind.optim.optimizer.Optimizer._make_progress_tracker": "(self, target_batch_size: 'int', **kwargs) -> 'ProgressTracker'",
    "hivemind.optim.optimizer.Optimizer._make_state_averager": "(self, **kwargs) -> 'TrainingStateAverager'",
    "hivemind.optim.optimizer.Optimizer._maybe_schedule_gradient_averaging": "(self) -> 'None'",
    "hivemind.optim.optimizer.Optimizer._maybe_schedule_state_averaging": "(self) -> 'None'",
    "hivemind.optim.optimizer.Optimizer._should_load_state_from_peers": "(self) -> 'bool'",
    "hivemind.optim.optimizer.Optimizer._tag_along_with_zero_weight": "(self, control: 'StepControl')",
    "hivemind.optim.optimizer.Optimizer.load_state_from_peers": '(self, **kwargs)',
    "hivemind.optim.optimizer.Optimizer.shutdown": '(self)',
    "hivemind.optim.progress_tracker.ProgressTracker.__init__": '(self, dht: hivemind.dht.dht.DHT, prefix: str, target_batch_size: int, *, client_mode: Optional[bool] = None, min_refresh_period: float = 0.5, max_refresh_period: float = 10, default_refresh_period: float = 3, expected_drift_peers: float = 3, expected_drift_rate: float = 0.2, performance_ema_alpha: float = 0.1, metadata_expiration: float = 60.0, status_loglevel: int = 10, private_key: Optional[hivemind.utils.crypto.RSAPrivateKey] = None, daemon: bool = True, start: bool)',
    "hivemind.optim.progress_tracker.ProgressTracker._parse_swarm_progress_data": '(self, metadata: hivemind.optim.progress_tracker.TrainingProgressSchema) -> hivemind.optim.progress_tracker.GlobalTrainingProgress',
    "hivemind.optim.progress_tracker.ProgressTracker.global_epoch": '(self) -> int',
    "hivemind.optim.progress_tracker.ProgressTracker.report_local_progress": '(self, local_epoch: int, samples_accumulated: int, update_global_samples: bool = True)',
    "hivemind.optim.state_averager.TrainingStateAverager.__init__": '(self, *, dht: hivemind.dht.dht.DHT, optimizer: Union[torch.optim.optimizer.Optimizer, Callable[[Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]]]], torch.optim.optimizer.Optimizer]], params: Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]], NoneType] = None, scheduler: Union[torch.optim.lr_scheduler.LRScheduler, Callable[[torch.optim.optimizer.Optimizer], torch.optim.lr_scheduler.LRScheduler], NoneType] = None, initialize_optimizer: Optional[bool] = None, offload_optimizer: bool = False, custom_gradients: bool = False, reuse_tensors: Optional[bool] = None, delta_rule_averaging: bool = False, performance_ema_alpha: float = 0.1, sync_epoch_when_averaging: bool = False, parameter_names: Optional[Sequence[str]] = None, average_opt_statistics: Sequence[str] = (), extra_tensors: Sequence[torch.Tensor] = (), status_loglevel: int = 10, **kwargs)',
    "hivemind.optim.state_averager.TrainingStateAverager._apply_optimizer_parameters_": '(self)',
    "hivemind.optim.state_averager.TrainingStateAverager._load_local_tensors_into_averager_": '(self)',
    "hivemind.optim.state_averager.TrainingStateAverager._update_scheduler": '(self)',
    "hivemind.optim.state_averager.TrainingStateAverager.load_state_from_peers": '(self, **kwargs)',
    "hivemind.p2p.servicer.ServicerBase._collect_rpc_handlers": '(cls) -> None',
    "hivemind.p2p.servicer.ServicerBase._get_handle_name": '(cls, namespace: Optional[str], method_name: str) -> str',
    "hivemind.p2p.servicer.ServicerBase.get_stub": '(cls, p2p: hivemind.p2p.p2p_daemon.P2P, peer: hivemind.p2p.p2p_daemon_bindings.datastructures.PeerID, *, namespace: Optional[str] = None) -> hivemind.p2p.servicer.StubBase',
}


def _resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = inspect.getattr_static(obj, name) if isinstance(obj, type) else getattr(obj, name)
        return obj
    raise ImportError(path)


def _signature(path: str) -> str:
    obj = _resolve(path)
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, classmethod | staticmethod):
        obj = obj.__func__
    return str(inspect.signature(obj))


def test_the_installed_hivemind_is_the_pinned_one():
    assert hivemind.__version__ == pinned.HIVEMIND_VERSION, (
        f"hivemind {hivemind.__version__} is installed; the adapter was written against {pinned.HIVEMIND_VERSION}")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"hivemind=={pinned.HIVEMIND_VERSION}" in dependencies, "pyproject.toml must pin the same hivemind"


def test_every_recorded_method_is_in_the_inventory_and_back():
    named = set(pinned.OVERRIDDEN) | set(pinned.CALLED)
    assert len(named) == len(pinned.OVERRIDDEN) + len(pinned.CALLED), "a method is listed twice"
    assert set(SIGNATURES) == named, (
        f"not recorded here: {sorted(named - set(SIGNATURES))}; recorded but not in the inventory: "
        f"{sorted(set(SIGNATURES) - named)}")


@pytest.mark.parametrize("path", sorted(SIGNATURES))
def test_hivemind_s_signature_is_the_one_the_adapter_was_written_against(path):
    try:
        found = _signature(path)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"hivemind no longer has {path} ({exc!r}), which the adapter overrides or calls")
    assert found == SIGNATURES[path], (
        f"hivemind's {path} changed: {found} (the adapter was written against {SIGNATURES[path]}); "
        "read the override or call that relies on it before updating the pin")


@pytest.mark.parametrize("owner", sorted(pinned.ATTRIBUTES))
def test_the_private_attributes_the_adapter_reads_are_still_set_by_hivemind(owner):
    cls = _resolve(owner)
    classes = cls.__mro__ if isinstance(cls, type) else [cls]  # a module's own names are checked as attributes
    source = "".join(inspect.getsource(klass) for klass in classes if klass.__name__.startswith("hivemind")
                     or getattr(klass, "__module__", "").startswith("hivemind"))
    missing = [name for name in pinned.ATTRIBUTES[owner]
               if not re.search(rf"\bself\.{re.escape(name)}\b", source) and not hasattr(cls, name)]
    assert not missing, f"hivemind's {owner} no longer sets {missing}, which the adapter reads or writes"


def _adapter_pairs() -> list[tuple[type, type]]:
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.allreduce import AllReduceRunner
    from hivemind.averaging.partition import TensorPartContainer, TensorPartReducer
    from hivemind.compression import Uniform8BitQuantization
    from hivemind.optim.grad_averager import GradientAverager
    from hivemind.optim.progress_tracker import ProgressTracker
    from hivemind.optim.state_averager import TrainingStateAverager

    from p2ptrain.averaging.allreduce import CheckedTensorPartContainer, RobustAllReduceRunner, RobustTensorPartReducer
    from p2ptrain.averaging.compression import _Uniform8Bit
    from p2ptrain.averaging.counting import CountingAllReduceRunner, CountingTensorPartReducer
    from p2ptrain.averaging.diloco import DiLoCoAverager
    from p2ptrain.averaging.hardened import HardenedAverager, HardenedGradientAverager
    from p2ptrain.averaging.optimizer import HardenedOptimizer
    from p2ptrain.averaging.progress import SwarmProgressTracker
    from p2ptrain.averaging.state_download import SafeTrainingStateAverager

    return [(HardenedAverager, DecentralizedAverager), (HardenedGradientAverager, GradientAverager),
            (SafeTrainingStateAverager, TrainingStateAverager), (DiLoCoAverager, DecentralizedAverager),
            (SwarmProgressTracker, ProgressTracker), (HardenedOptimizer, hivemind.Optimizer),
            (RobustAllReduceRunner, AllReduceRunner), (CountingAllReduceRunner, AllReduceRunner),
            (RobustTensorPartReducer, TensorPartReducer), (CountingTensorPartReducer, TensorPartReducer),
            (CheckedTensorPartContainer, TensorPartContainer), (_Uniform8Bit, Uniform8BitQuantization)]


_NOT_OVERRIDES = {"__module__", "__doc__", "__qualname__", "__dict__", "__weakref__", "__annotations__",
                  "__abstractmethods__", "_abc_impl",
                  "_rpc_handlers", "_stub_type",  # hivemind's per-class caches (pinned.ATTRIBUTES), not methods
                  "__parameters__", "__orig_bases__", "__firstlineno__", "__static_attributes__", "rpc_name"}


def test_the_inventory_names_every_override_the_adapter_makes():
    """Found by walking our classes: a name of ours that hivemind's class also has is an override."""
    found: set[str] = set()
    for ours, theirs in _adapter_pairs():
        for klass in ours.__mro__:
            if not klass.__module__.startswith("p2ptrain."):
                continue
            for name in set(vars(klass)) - _NOT_OVERRIDES:
                owner = next((c for c in theirs.__mro__ if name in vars(c)), None)
                if owner is not None:
                    found.add(f"{owner.__module__}.{owner.__qualname__}.{name}")
    assert found == set(pinned.OVERRIDDEN), (
        f"overridden but not in pinned.OVERRIDDEN: {sorted(found - set(pinned.OVERRIDDEN))}; listed but not "
        f"overridden: {sorted(set(pinned.OVERRIDDEN) - found)}")


def _hivemind_bases(source: str) -> list[str]:
    """The classes defined in ``source`` with a base taken from hivemind (imported by name, or as
    ``hivemind.<...>``)."""
    tree = ast.parse(source)
    from_hivemind = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and (node.module or "").split(".")[0] == "hivemind" for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                text = ast.unparse(base)
                if text.split(".")[0] in from_hivemind or text.startswith("hivemind."):
                    found.append(f"{node.name}({text})")
    return found


def test_the_subclass_finder_finds_a_hivemind_subclass():
    assert _hivemind_bases("import hivemind\nclass A(hivemind.Optimizer): pass") == ["A(hivemind.Optimizer)"]
    assert _hivemind_bases("from hivemind.averaging import DecentralizedAverager as D\nclass B(D): pass") == ["B(D)"]
    assert _hivemind_bases("class C(dict): pass") == []


#: Subclasses of hivemind's public extension points outside the adapter: DHT record validators and the
#: DHT's request authorizer (p2ptrain.swarm), none of them an averager, tracker or optimizer.
PUBLIC_EXTENSIONS = {"RecordValidatorBase", "TokenAuthorizerBase", "SchemaValidator", "RSASignatureValidator"}


def test_nothing_outside_the_adapter_subclasses_hivemind_s_averaging():
    """Only p2ptrain.averaging subclasses hivemind's averagers, trackers, optimizer and all-reduce."""
    offenders = []
    for package in ("p2ptrain", "daemon"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(ROOT / "p2ptrain" / "averaging"):
                continue
            for found in _hivemind_bases(path.read_text()):
                base = found[found.index("(") + 1:-1].split(".")[-1]
                if base not in PUBLIC_EXTENSIONS:
                    offenders.append(f"{path.relative_to(ROOT)}: {found}")
    assert not offenders, f"hivemind subclassed outside the adapter: {offenders}"


def test_outside_the_adapter_hivemind_s_public_extension_points_get_only_public_overrides():
    from hivemind.dht.validation import RecordValidatorBase
    from hivemind.utils.auth import TokenAuthorizerBase

    from p2ptrain.swarm import dhtauth, records, run_entries

    private = []
    for module, base in ((records, RecordValidatorBase), (run_entries, RecordValidatorBase),
                         (dhtauth, TokenAuthorizerBase)):
        for cls in vars(module).values():
            if not (isinstance(cls, type) and cls.__module__ == module.__name__):
                continue
            for klass in [c for c in cls.__mro__ if c.__module__.startswith("p2ptrain.")]:
                hivemind_side = [c for c in cls.__mro__ if c.__module__.startswith("hivemind")]
                private += [f"{cls.__name__}.{name}" for name in set(vars(klass)) - _NOT_OVERRIDES if name.startswith("_")
                            and not name.startswith("__") and any(name in vars(c) for c in hivemind_side)]
        assert any(issubclass(c, base) for c in vars(module).values() if isinstance(c, type))
    assert not private, f"private hivemind methods overridden outside the adapter: {private}"
