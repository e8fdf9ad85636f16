"""The one hivemind version the adapter was written and tested against, and every hivemind internal it touches.

The adapter (:mod:`p2ptrain.averaging`) subclasses hivemind's averagers, progress tracker, optimizer
and all-reduce internals, and overrides or calls private methods of them.  Those change between
releases without notice, so each adapter module calls :func:`require_hivemind` at import (a
different version fails loudly at start-up instead of silently skipping a defence), and
``tests/unit/test_hivemind_pin.py`` records the signature of every method named below: a hivemind
whose signatures changed fails it, naming the method.  Nothing outside :mod:`p2ptrain.averaging`
subclasses or patches hivemind's averaging: :mod:`p2ptrain.swarm` subclasses only its public extension
points, overriding public methods (the DHT's record validators ``RecordValidatorBase``,
``RSASignatureValidator`` and ``SchemaValidator`` in ``records`` and ``run_entries``, the DHT's
``TokenAuthorizerBase`` in ``dhtauth``), and ``daemon/logsetup.py`` only routes hivemind's loggers
(``hivemind.utils.logging.use_hivemind_log_handler``), which stays with the daemon's logging setup.

The map: one subclass per hivemind class, each overriding (see :data:`OVERRIDDEN`)

=====================================  ==============================  ==========================================
ours (module)                          hivemind class                  what it overrides
=====================================  ==============================  ==========================================
``AveragerLayer`` (hardened), the one  ``DecentralizedAverager`` and   ``__init__``, ``_get_handle_name``,
layer of the four averagers below      ``ServicerBase``                ``_collect_rpc_handlers``, ``get_stub``,
                                                                       ``rpc_join_group``, ``rpc_aggregate_part``,
                                                                       ``rpc_download_state``, ``_step``,
                                                                       ``_register_allreduce_group``,
                                                                       ``_run_allreduce_inplace_``,
                                                                       ``load_state_from_peers``, ``shutdown``
``HardenedAverager`` (hardened)        ``DecentralizedAverager``       (the layer's)
``HardenedGradientAverager``           ``GradientAverager``            ``load_state_from_peers``,
                                                                       ``load_accumulators_into_averager_``
``SafeTrainingStateAverager``          ``TrainingStateAverager``       ``__init__``, ``_update_scheduler``,
(state_download)                                                       ``load_state_from_peers``
``DiLoCoAverager`` (diloco)            ``DecentralizedAverager``       ``__init__``, ``get_current_state``
``SwarmProgressTracker`` (progress)    ``ProgressTracker``             ``__init__``, ``report_local_progress``,
                                                                       ``global_epoch``,
                                                                       ``_parse_swarm_progress_data``, and the
                                                                       ``should_report_progress`` attribute
``HardenedOptimizer`` (optimizer)      ``hivemind.Optimizer``          ``__init__``, ``_make_progress_tracker``,
                                                                       ``_make_state_averager``,
                                                                       ``_make_gradient_averager``,
                                                                       ``_should_load_state_from_peers``,
                                                                       ``_maybe_schedule_gradient_averaging``,
                                                                       ``_maybe_schedule_state_averaging``,
                                                                       ``_begin_averaging_gradients``,
                                                                       ``_average_gradients_and_load_into_optimizer``,
                                                                       ``load_state_from_peers``, ``shutdown``,
                                                                       ``_load_averaged_gradients_into_optimizer_``
``RobustAllReduceRunner`` (allreduce)  ``AllReduceRunner``             ``__init__`` (restated),
                                                                       ``_communicate_with_peer``,
                                                                       ``_accumulate_parts_streaming``,
                                                                       ``_get_peer_stub``
``CountingAllReduceRunner`` (counting) ``AllReduceRunner``             ``__init__``, ``_get_peer_stub``
``RobustTensorPartReducer``            ``TensorPartReducer``           ``__init__``, ``reset_accumulators``,
(allreduce)                                                            ``accumulate_part``, ``on_sender_failed``,
                                                                       ``check_current_part_finished``
``CountingTensorPartReducer``          ``TensorPartReducer``           ``__init__``,
(counting)                                                             ``check_current_part_finished``
``CheckedTensorPartContainer``         ``TensorPartContainer``         ``__init__``, ``register_failed_reducer``,
(allreduce)                                                            ``register_processed_part``
``_Uniform8Bit`` (compression)         ``Uniform8BitQuantization``     ``extract`` (installed in hivemind's
                                                                       private codec registry)
=====================================  ==============================  ==========================================

Patched on an instance, called, or relied on (see :data:`CALLED` and :data:`ATTRIBUTES`):

* ``Matchmaking._request_join_group`` and ``Matchmaking.look_for_group`` (wrapped once per averager
  process by ``AveragerLayer._step``), ``GroupKeyManager.get_averagers`` (paced: ``matchmaking``);
* ``TrainingStateAverager.load_state_from_peers`` (bounded on the instance by ``HardenedOptimizer``),
  ``_apply_optimizer_parameters_`` and ``_load_local_tensors_into_averager_`` (called after a download);
* ``Optimizer._tag_along_with_zero_weight`` (called when the node steps aside);
* ``AllReduceRunner._get_peer_stub`` (called by ours once a peer is admitted);
* ``DHT.run``, the DHT process's request loop, whose pipe ``lifecycle`` reads through its own reader;
* ``P2P._make_process_args``, p2pd's command line, which :mod:`p2ptrain.swarm.daemon_flags` extends
  (the relay service's budget, the daemon's metrics address) while a DHT starts: the one hivemind
  internal outside this package, as p2pd's flags are the swarm's business;
* ``DecentralizedAverager._run_internal``: its pipe calls any averager method by name, which is how
  ``_download_state_from_donor`` (ours: :mod:`p2ptrain.averaging.donor_stream`) runs in the averager's
  process;
* hivemind's codec registry ``hivemind.compression.serialization._BASE_COMPRESSION_TYPES``, where
  ``compression`` puts its 8-bit decoder;
* the private attributes of :data:`ATTRIBUTES`, read or written.

Before the split these were 21 overrides across 10 modules, through a tower of mixins and classes
built with ``type()`` at run time; the policy they apply now comes from objects without hivemind
(``admitting``, ``groupmates``, ``donors``, ``paced_progress``, ``robust_progress``, ``roundclock``,
``robust_reduce``: an import contract keeps them so).
"""

from __future__ import annotations

import hivemind

HIVEMIND_VERSION = "1.1.12"

_AVERAGER = "hivemind.averaging.averager.DecentralizedAverager"
_SERVICER = "hivemind.p2p.servicer.ServicerBase"
_GRAD = "hivemind.optim.grad_averager.GradientAverager"
_STATE = "hivemind.optim.state_averager.TrainingStateAverager"
_TRACKER = "hivemind.optim.progress_tracker.ProgressTracker"
_OPTIMIZER = "hivemind.optim.optimizer.Optimizer"
_RUNNER = "hivemind.averaging.allreduce.AllReduceRunner"
_REDUCER = "hivemind.averaging.partition.TensorPartReducer"
_CONTAINER = "hivemind.averaging.partition.TensorPartContainer"

#: Every hivemind method a class of ours overrides, by where hivemind defines it.
OVERRIDDEN: tuple[str, ...] = (
    *(f"{_AVERAGER}.{name}" for name in (
        "__init__", "rpc_join_group", "rpc_aggregate_part", "rpc_download_state", "_step",
        "_register_allreduce_group", "_run_allreduce_inplace_", "load_state_from_peers", "shutdown",
        "get_current_state")),
    *(f"{_SERVICER}.{name}" for name in ("_get_handle_name", "_collect_rpc_handlers", "get_stub")),
    f"{_GRAD}.__init__", f"{_GRAD}.load_accumulators_into_averager_",
    *(f"{_STATE}.{name}" for name in ("__init__", "_update_scheduler", "load_state_from_peers")),
    *(f"{_TRACKER}.{name}" for name in (
        "__init__", "report_local_progress", "global_epoch", "_parse_swarm_progress_data")),
    *(f"{_OPTIMIZER}.{name}" for name in (
        "__init__", "_make_progress_tracker", "_make_state_averager", "_make_gradient_averager",
        "_should_load_state_from_peers", "_maybe_schedule_gradient_averaging", "_maybe_schedule_state_averaging",
        "_begin_averaging_gradients", "_average_gradients_and_load_into_optimizer", "load_state_from_peers",
        "shutdown", "_load_averaged_gradients_into_optimizer_")),
    *(f"{_RUNNER}.{name}" for name in (
        "__init__", "_communicate_with_peer", "_accumulate_parts_streaming", "_get_peer_stub")),
    *(f"{_REDUCER}.{name}" for name in (
        "__init__", "reset_accumulators", "accumulate_part", "on_sender_failed", "check_current_part_finished")),
    *(f"{_CONTAINER}.{name}" for name in ("__init__", "register_failed_reducer", "register_processed_part")),
    "hivemind.compression.quantization.Quantization.extract",
)

#: hivemind methods we wrap on an instance, call although private, or rely on the shape of.
CALLED: tuple[str, ...] = (
    "hivemind.averaging.matchmaking.Matchmaking._request_join_group",
    "hivemind.averaging.matchmaking.Matchmaking.look_for_group",
    "hivemind.averaging.key_manager.GroupKeyManager.get_averagers",
    f"{_STATE}._apply_optimizer_parameters_",
    f"{_STATE}._load_local_tensors_into_averager_",
    f"{_OPTIMIZER}._tag_along_with_zero_weight",
    f"{_GRAD}._grad_accumulators",
    f"{_AVERAGER}._run_internal",
    _AVERAGER + "._load_state_from_peers",  # concatenated: no DHT key, though it ends like one
    "hivemind.dht.dht.DHT.run",  # reads its requests with poll() then recv() (lifecycle.RequestReader)
    "hivemind.p2p.p2p_daemon.P2P._make_process_args",  # swapped while a DHT starts (swarm.daemon_flags)
)

#: Private (or undocumented) attributes of hivemind's objects we read or write, by the class that sets them.
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    _AVERAGER: ("_matchmaking", "_p2p", "_outer_pipe", "_running_groups", "_state_updated", "_averaging_alpha",
                "next_chunk_timeout", "request_timeout", "serializer", "last_updated"),
    "hivemind.averaging.matchmaking.Matchmaking": ("group_key_manager", "min_matchmaking_time"),
    _SERVICER: ("_rpc_handlers", "_stub_type"),
    _OPTIMIZER: ("_should_check_synchronization_on_update", "scheduled_grads", "scheduled_state", "grad_averager",
                 "state_averager", "tracker"),
    _GRAD: ("local_times_accumulated",),
    _TRACKER: ("_local_public_key", "should_report_progress", "training_progress_key", "metadata_expiration",
               "performance_ema", "local_progress", "global_progress", "fetched_global_progress_this_epoch"),
    _CONTAINER: ("_input_parts_by_peer", "failed_size", "local_tensors", "num_parts_by_tensor"),
    _REDUCER: ("current_part_index", "current_part_accumulated_from", "current_part_future", "num_current_senders",
               "sender_failed_after", "accumulator", "denominator", "num_parts_received", "finished"),
    "hivemind.compression.serialization": ("_BASE_COMPRESSION_TYPES",),
    "hivemind.compression.quantization.Uniform8BitQuantization": ("codebook_dtype", "indices_dtype"),
    "hivemind.dht.dht.DHT": ("_inner_pipe",),
    _RUNNER: ("_p2p", "_servicer_type", "_prefix", "_future", "sender_peer_ids", "all_senders_started",
              "banned_senders", "banlock", "active_senders", "tensor_part_container", "parts_for_local_averaging",
              "tensor_part_reducer"),
}


def require_hivemind(component: str) -> None:
    """Raise ImportError unless the installed hivemind is the pinned one."""
    found = getattr(hivemind, "__version__", "unknown")
    if found != HIVEMIND_VERSION:
        raise ImportError(
            f"{component} overrides hivemind {HIVEMIND_VERSION} internals but hivemind {found} is installed; "
            f"install hivemind=={HIVEMIND_VERSION}"
        )
