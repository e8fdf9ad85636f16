"""One benchmark peer: trains the shared model in one mode for a fixed number of sequences, writes JSON.

Started by :mod:`benchmarks.swarm` as a real subprocess (``python -m benchmarks.worker``), never
through multiprocessing's spawn (hivemind forks helpers).  Peers meet through files in ``--run-dir``
(the first peer's DHT address, start/finish barriers), so no port is guessed twice.

p2ptrain's modes run what a node runs by default: the optimizer built by
:func:`p2ptrain.optim.build.build_optimizer` with the peer checks of
:meth:`p2ptrain.optim.defences.Defences.from_config` (``--peer-checks off``: plain hivemind, trusting
every peer) and the node's validation pass for the state check.  The validation curve is taken
every ``--eval-every`` sequences, or with ``--eval-on-change`` each time the swarm's model changes
(DiLoCo: each landed round; gradient mode: each epoch); validating never counts as training time,
nor against ``--cpu-percent``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from p2ptrain.config.schema import SwarmSection, TaskSection, TrainingSection
from p2ptrain.daemon.cpushare import CpuShare, process_cpu
from p2ptrain.optim.build import build_optimizer
from p2ptrain.optim.defences import Defences, evaluate_fn
from p2ptrain.optim.inner import ClippedAdamW
from p2ptrain.optim.swarm_stats import SwarmStats
from p2ptrain.proc import cpu_seconds, descendants
from p2ptrain.tasks.loader import build_task
from p2ptrain.waiting import wait_until

MODES = ("compute", "ddp", "hivemind", "p2p_grad", "diloco", "diloco_int8", "diloco_topk", "diloco_topk_sync")
#: The DiLoCo modes and what each sends a round (training.outer_compression).
OUTER_COMPRESSION = {"diloco": "none", "diloco_int8": "int8", "diloco_topk": "topk", "diloco_topk_sync": "topk"}
#: DiLoCo modes whose outer step waits for its round (training.overlap off); the others apply it a round late.
SYNCHRONOUS_OUTER = frozenset({"diloco_topk_sync"})
BARRIER_TIMEOUT = 180.0


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what, interval=0.05)  # WaitTimeout is a TimeoutError


def barrier(run_dir: Path, name: str, rank: int, world: int) -> None:
    (run_dir / f"{name}.{rank}").touch()
    wait_for(lambda: all((run_dir / f"{name}.{r}").exists() for r in range(world)), BARRIER_TIMEOUT, name)


def add_outer_step_options(p: argparse.ArgumentParser) -> None:
    """The DiLoCo outer step's options, the same in every benchmark that starts workers (the defaults are
    the node's own: ``[training]`` in the config schema)."""
    default = {name: field.default for name, field in TrainingSection.model_fields.items()}
    p.add_argument("--outer-topk-density", type=float, default=default["outer_topk_density"],
                   help="diloco_topk: the share of each chunk's values a round sends")
    p.add_argument("--outer-value-bits", type=int, choices=(2, 4, 8), default=default["outer_value_bits"],
                   help="diloco_topk: bits per value")
    p.add_argument("--outer-lr", type=float, default=default["outer_lr"],
                   help="DiLoCo modes: the outer step's learning rate")
    p.add_argument("--outer-momentum", type=float, default=default["outer_momentum"],
                   help="DiLoCo modes: the outer step's Nesterov momentum (0: plain SGD, as SparseLoCo's outer step)")


def training_section(args: argparse.Namespace) -> TrainingSection:
    return TrainingSection(
        batch_size=args.micro_batch, target_batch_size=args.global_batch, lr=args.lr, warmup_epochs=0,
        total_epochs=100_000, mode="diloco" if args.mode in OUTER_COMPRESSION else "gradient",
        outer_compression=OUTER_COMPRESSION.get(args.mode, "none"), outer_topk_density=args.outer_topk_density,
        outer_value_bits=args.outer_value_bits, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
        grad_compression=args.compression, inner_steps=args.inner_steps, inner_batch_size=args.inner_batch,
        matchmaking_time=args.matchmaking_time, overlap=args.mode not in SYNCHRONOUS_OUTER,
        averaging_timeout=args.averaging_timeout, load_state_timeout=30.0, threads=1, seed=0,
    )


def start_dht(args: argparse.Namespace, run_dir: Path) -> Any:
    import hivemind

    addr_file = run_dir / "dht0.addr"
    initial: list[str] = []
    if args.rank > 0:
        wait_for(addr_file.exists, BARRIER_TIMEOUT, "the first peer's DHT address")
        initial = addr_file.read_text().split()
    dht = hivemind.DHT(start=True, host_maddrs=[f"/ip4/{args.host}/tcp/0"], initial_peers=initial,
                       nat_port_map=False, auto_nat=False)
    if args.rank == 0:
        addrs = [str(a) for a in dht.get_visible_maddrs() if str(a).startswith(f"/ip4/{args.host}/")]
        tmp = addr_file.with_suffix(".tmp")
        tmp.write_text(" ".join(addrs))
        tmp.rename(addr_file)
    return dht


class Runner:
    """Builds the mode's optimizer and exposes ``micro_step(batch)``; everything else is shared."""

    def __init__(self, args: argparse.Namespace, task: Any, run_dir: Path) -> None:
        self.args, self.task, self.model = args, task, task.model
        self.stats = SwarmStats()
        self.dht: Any = None
        self.opt: Any = None
        self.defences: Defences | None = None
        self.accumulated = 0
        mode = args.mode
        if mode == "compute":
            self.opt = ClippedAdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01, max_grad_norm=1.0)
            self.accum = args.global_batch // args.micro_batch
        elif mode == "ddp":
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.master_port}",
                                    rank=args.rank, world_size=args.world, timeout=__import__("datetime").timedelta(
                                        seconds=120))
            self.model = torch.nn.parallel.DistributedDataParallel(self.model)
            self.opt = ClippedAdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01, max_grad_norm=1.0)
            self.accum = args.global_batch // (args.micro_batch * args.world)
        elif mode == "hivemind":
            import hivemind

            self.dht = start_dht(args, run_dir)
            # What a user writes by hand: the documented constructor, hivemind's defaults otherwise.
            self.opt = hivemind.Optimizer(
                dht=self.dht, run_id="bench_plain", params=self.model.parameters(),
                optimizer=lambda p: torch.optim.AdamW(p, lr=args.lr, weight_decay=0.01),
                batch_size_per_step=args.micro_batch, target_batch_size=args.global_batch, client_mode=False,
                verbose=False)
        else:
            self.dht = start_dht(args, run_dir)
            self.defences = Defences.from_config(SwarmSection(peer_checks=args.peer_checks == "on"))
            self.opt = build_optimizer(self.model, self.dht, f"bench_{mode}", training_section(args),
                                       client_mode=False, stats=self.stats, defences=self.defences,
                                       evaluate=evaluate_fn(task))

    def micro_step(self, batch: torch.Tensor) -> None:
        mode = self.args.mode
        if mode in ("compute", "ddp"):
            self.accumulated += 1
            last = self.accumulated % self.accum == 0
            if mode == "ddp" and not last:
                with self.model.no_sync():
                    self._backward(batch, self.accum)
            else:
                self._backward(batch, self.accum)
            if last:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            return
        self._backward(batch, 1)
        self.opt.step(batch_size=self.args.micro_batch)
        self.opt.zero_grad()

    def _backward(self, batch: torch.Tensor, scale: int) -> None:
        (self.task.loss_fn(self.model, batch) / scale).backward()

    def epoch(self) -> int:
        return int(getattr(self.opt, "local_epoch", self.accumulated // getattr(self, "accum", 1)))

    def shutdown(self) -> None:
        if self.args.mode == "ddp":
            import torch.distributed as dist

            dist.destroy_process_group()
        if self.dht is not None:
            self.opt.shutdown()
            self.dht.shutdown()


def stall_seconds(step_seconds: list[float]) -> float:
    """Time spent waiting rather than computing: what the steps took beyond twice the median step.

    A step that ends an epoch (or an outer round) may block on communication; a plain step only
    computes, so the median step is the compute cost and the excess of the slow ones is the stall.
    """
    if not step_seconds:
        return 0.0
    median = sorted(step_seconds)[len(step_seconds) // 2]
    return sum(took - median for took in step_seconds if took > 2 * median)


@torch.no_grad()
def validation_loss(task: Any) -> float:
    model = task.model
    model.eval()
    losses = [float(task.loss_fn(model, batch)) for batch in task.validation_batches()]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def swarm_model_loss(runner: Runner, task: Any) -> float:
    """Validation loss of the model the swarm agreed on: in DiLoCo mode the outer parameters (the
    parameters add this peer's own progress since the last round), else the model itself."""
    outer = getattr(getattr(runner.opt, "outer", None), "params", None)
    if outer is None:
        return validation_loss(task)
    params = [p for p in task.model.parameters() if p.requires_grad]
    kept = [p.detach().clone() for p in params]
    for param, value in zip(params, outer, strict=True):
        param.copy_(value)
    try:
        return validation_loss(task)
    finally:
        for param, value in zip(params, kept, strict=True):
            param.copy_(value)


def model_version(runner: Runner, params: list[torch.Tensor]) -> tuple[int, float]:
    """Changes whenever the swarm's model does: DiLoCo's outer steps applied; in the other modes the
    epoch and a checksum of the parameters, which change only at an optimizer step.  The epoch alone
    is not enough: hivemind applies an overlapped (delayed) optimizer step up to an epoch after the
    epoch's number moves, and a validation at the number's change would measure the model before it."""
    outer = getattr(runner.opt, "outer", None)
    if outer is not None:
        return int(outer.steps_applied), 0.0
    return runner.epoch(), float(sum(float(p.detach().float().sum()) for p in params))


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    run_dir = Path(args.run_dir)
    task_cfg = TaskSection(seq_len=args.seq_len, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                           validation_batches=args.val_batches)
    task = build_task(task_cfg, training_section(args), peer_seed=1000 + args.rank)
    runner = Runner(args, task, run_dir)
    timeline: list[tuple[float, int]] = []
    curve: list[tuple[float, int, float]] = []
    #: CPU and wall seconds spent validating: neither training time nor the CPU share's business.
    eval_cpu, eval_wall = [0.0], [0.0]

    def evaluate(of_swarm: bool) -> float:
        cpu, wall = process_cpu(), time.perf_counter()
        loss = swarm_model_loss(runner, task) if of_swarm else validation_loss(task)
        eval_cpu[0] += process_cpu() - cpu
        eval_wall[0] += time.perf_counter() - wall
        return loss

    try:
        barrier(run_dir, "ready", args.rank, args.world)
        train_time, seqs = 0.0, 0
        curve.append((0.0, 0, evaluate(False)))
        params = list(task.model.parameters())
        version, last_eval = model_version(runner, params), 0.0
        # A mode slower than the cap stops early (and reports fewer sequences): every run stays bounded.
        step_seconds: list[float] = []
        # --cpu-percent: a slow peer, held to a share of one core the way a volunteer's node holds
        # itself to volunteer.max_cpu_percent (its idling counts as its training time).
        share = CpuShare(args.cpu_percent, cpu_seconds=lambda: process_cpu() - eval_cpu[0], cores=1,
                         wait=lambda seconds: bool(time.sleep(seconds)))
        while seqs < args.sequences and train_time < args.max_train_seconds:
            started = time.perf_counter()
            while not share.wait_for_budget():
                pass
            runner.micro_step(task.train_batches.next())
            step_seconds.append(time.perf_counter() - started)
            train_time += step_seconds[-1]
            seqs += args.micro_batch
            timeline.append((train_time, seqs))
            done = seqs >= args.sequences or train_time >= args.max_train_seconds
            if done and hasattr(runner.opt, "flush"):  # an overlapped DiLoCo round lands before the last loss
                started = time.perf_counter()
                runner.opt.flush()
                train_time += time.perf_counter() - started
            if args.eval_on_change:
                current = model_version(runner, params)
                if done or (current != version and train_time - last_eval >= args.eval_min_gap):
                    version, last_eval = current, train_time
                    curve.append((train_time, seqs, evaluate(True)))
            elif seqs % args.eval_every == 0 or done:
                curve.append((train_time, seqs, evaluate(done)))
        final = curve[-1][2]
        stats, rounds = runner.stats.view(), runner.stats.rounds.figures()
        result = {"mode": args.mode, "rank": args.rank, "world": args.world, "sequences": seqs,
                  "target_sequences": args.sequences, "train_seconds": train_time, "final_val_loss": final,
                  "curve": curve,
                  "timeline": timeline[:: max(1, len(timeline) // 400)] + timeline[-1:],
                  "epoch": runner.epoch(), "rounds_ok": rounds.rounds_ok, "rounds_partial": rounds.rounds_partial,
                  "rounds_failed": rounds.rounds_failed, "swarm_bytes_sent": stats.bytes_sent,
                  "cpu_percent": args.cpu_percent, "peer_checks": "on" if runner.defences is not None else "off",
                  "eval_seconds": eval_wall[0],
                  # Its helper processes' CPU (DHT, averager, p2pd) so far: averaging work, not training.
                  "helpers_cpu_seconds": sum(cpu_seconds(pid) for pid in descendants()),
                  "params": sum(p.numel() for p in task.model.parameters()),
                  "stall_seconds": stall_seconds(step_seconds)}
        Path(args.out).write_text(json.dumps(result))
        # Stay in the swarm until every peer is done, so nobody's last round loses its partner.
        barrier(run_dir, "done", args.rank, args.world)
        return result
    finally:
        runner.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=0)
    p.add_argument("--sequences", type=int, default=1600, help="sequences this peer trains on")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--max-train-seconds", type=float, default=120.0)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--inner-steps", type=int, default=100)
    p.add_argument("--inner-batch", type=int, default=0,
                   help="DiLoCo: sequences per inner step (0: the node's default, 4 micro-batches)")
    p.add_argument("--cpu-percent", type=float, default=0.0, help="hold this peer to this share of one core (0: none)")
    p.add_argument("--compression", default="fp16")
    add_outer_step_options(p)
    p.add_argument("--matchmaking-time", type=float, default=0.5)
    p.add_argument("--averaging-timeout", type=float, default=30.0)
    p.add_argument("--peer-checks", choices=("on", "off"), default="on",
                   help="p2ptrain's modes: the node's peer checks (its default) or plain hivemind")
    p.add_argument("--eval-on-change", action="store_true",
                   help="validate the swarm's model each time it changes instead of every --eval-every sequences")
    p.add_argument("--eval-min-gap", type=float, default=0.0,
                   help="with --eval-on-change: at least this many seconds of training between validations")
    return p.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run(parse_args())
