"""``p2ptrain demo``: a first look at an elastic swarm, on this machine only.

It creates a run with a throwaway owner key (its signed manifest holds the run's settings),
starts N real nodes on 127.0.0.1 (separate processes, loopback only, no NAT traversal) that join
with one line, ``--join ADDR --run REF``, makes one leave part way and a new one join, prints a
live table, and ends with a summary of what the swarm learned and survived, then exports the
model of the node that got furthest and prints a short sample of its text.  ``--private`` makes
it an invite run instead, and shows a node without an invite being refused.  Every process it
started is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from p2ptrain.errors import EX_BAD_ARGUMENT, EX_FAILURE, EX_INTERRUPTED, EX_OK, ConfigError
from p2ptrain.local.run import LocalRun, create_local_run
from p2ptrain.local.swarm import LocalNode
from p2ptrain.run.runconfig import local_only
from p2ptrain.status import StatusSnapshot
from p2ptrain.waiting import WaitTimeout, wait_until

#: Small enough for several nodes to share two cores and still learn visibly in 90 s.  An epoch of
#: 512 sequences lasts several loopback rounds for three nodes, as the tuning guidance asks
#: (docs/benchmarks.md); an epoch shorter than the matchmaking window leaves many rounds partial and
#: the nodes train fewer samples for the same loss (docs/reliability.md).
DEMO_OVERRIDES = {
    "training": {"target_batch_size": 512, "validate_every": 10.0, "lr": 2e-3, "warmup_epochs": 2},
    "checkpoint": {"interval": 20.0},
}
REFRESH_SECONDS = 3.0
SAMPLE_TOKENS = 160
LEAVE_AT, JOIN_AT = 0.35, 0.55
#: --private: when the node without an invite tries to join, and how long it keeps trying.
STRANGER_AT, STRANGER_BOOTSTRAP = 0.3, 10.0
#: How long the demo waits, once its time is up, for the stranger to give up (start-up included).
STRANGER_GRACE = 60.0
#: Seconds the invited nodes get to count the stranger's refused requests once it has exited.
REFUSAL_GRACE = 10.0


@dataclass
class DemoRun:
    """What the demo saw: the nodes, their last status, the churn events."""

    workdir: Path
    nodes: list[LocalNode] = field(default_factory=list)
    owned: LocalRun | None = None
    """The demo's run (None only in tests of the summary and export)."""
    last: dict[str, StatusSnapshot] = field(default_factory=dict)
    first_val_loss: float | None = None
    events: list[str] = field(default_factory=list)
    joins: int = 0
    leaves: int = 0
    stranger: LocalNode | None = None
    stranger_seen: StrangerSeen | None = None

    def add_node(self, join: list[str], *, invited: bool = True, name: str = "") -> LocalNode:
        """A node of the run: the first one holds the manifest file, the others join with one line."""
        assert self.owned is not None
        name = name or f"node{len(self.nodes) + 1}"
        args = ["--run", str(self.owned.ref)]
        if not self.nodes:
            args += ["--manifest", str(self.owned.manifest_path)]
        overrides = local_only(DEMO_OVERRIDES)
        node = LocalNode(name, self.workdir / name, None, overrides, args=tuple(args))
        if self.owned.manifest.policy == "invite" and invited:
            node.overrides = {**overrides, "swarm": {"invite": self.owned.invite(node.peer_id())}}
        elif not invited:
            node.overrides = {**overrides, "swarm": {"bootstrap_timeout": STRANGER_BOOTSTRAP}}
        node.start(join=join)
        self.nodes.append(node)
        return node

    def poll(self) -> None:
        for node in self.nodes:
            status = node.status(timeout=1.0)
            if status is not None:
                self.last[node.name] = status
                if self.first_val_loss is None and status.val_loss is not None:
                    self.first_val_loss = status.val_loss

    def stop_all(self) -> None:
        LocalNode.stop_all(self.nodes, timeout=30)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(run: DemoRun, elapsed: float, out: TextIO) -> None:
    out.write(f"\n t={elapsed:5.1f}s   node     state      epoch  samples/s    loss  val loss  peers\n")
    for node in run.nodes:
        status = run.last.get(node.name)
        if not node.running:
            out.write(f"{'':12} {node.name:<8} {'(gone)':<10}\n")
            continue
        if status is None:
            out.write(f"{'':12} {node.name:<8} {'starting':<10}\n")
            continue
        out.write(f"{'':12} {node.name:<8} {status.state:<10} {status.local_epoch:5d} "
                  f"{status.local_samples_per_second:10.1f} {_fmt(status.loss, '7.3f')} "
                  f"{_fmt(status.val_loss, '9.3f')} {status.peers_online:6d}\n")
    out.flush()


def print_summary(run: DemoRun, elapsed: float, out: TextIO) -> None:
    finals = [s.val_loss for s in run.last.values() if s.val_loss is not None]
    final = min(finals) if finals else None
    samples = sum(s.samples_processed_total for s in run.last.values())
    epoch = max((s.local_epoch for s in run.last.values()), default=0)
    out.write("\n=== p2ptrain demo summary ===\n")
    out.write(f"  ran for            {elapsed:.0f} s with {len(run.nodes)} nodes in all\n")
    if run.owned is not None:
        out.write(f"  run                {run.owned.ref} ({run.owned.manifest.policy} run, owner key "
                  f"{run.owned.directory / 'owner.key'})\n")
    out.write(f"  validation loss    {_fmt(run.first_val_loss, '.3f')} at the start -> {_fmt(final, '.3f')} now\n")
    out.write(f"  samples processed  {samples:,} (all nodes)\n")
    out.write(f"  swarm epoch        {epoch}\n")
    if run.stranger is None:
        out.write(f"  churn survived     {run.leaves} leave(s), {run.joins} join(s)\n")
    else:
        out.write("  admission          invited nodes only\n")
    for event in run.events:
        out.write(f"    - {event}\n")
    out.write(f"  node logs          {run.workdir}\n")
    out.flush()


def export_and_sample(run: DemoRun, out: TextIO) -> Path | None:
    """Export the model of the node whose final checkpoint got furthest, and print a short sample of it.

    Runs after every node has stopped; a problem here is one line, never a failed demo.
    """
    from p2ptrain.cli.tryit import measured_card
    from p2ptrain.config.schema import load_config
    from p2ptrain.model.export import ExportError, write_export
    from p2ptrain.model.load import LoadedModel, ModelError, from_checkpoint
    from p2ptrain.run.runconfig import merge_manifest
    from p2ptrain.tasks.base import SampleRequest
    from p2ptrain.tasks.generate import sample_bytes

    best: LoadedModel | None = None
    for node in run.nodes:
        try:
            config = load_config(node.config_path)
            if run.owned is not None:  # the node's config holds local matters only
                config = merge_manifest(config, run.owned.manifest)
            loaded = from_checkpoint(config, None, lambda _line: None)
        except (ModelError, ConfigError):
            continue
        if best is None or (loaded.card.epoch or 0) > (best.card.epoch or 0):
            best = loaded
    if best is None:
        out.write("  no node wrote a checkpoint: nothing to export\n")
        return None
    target = run.workdir / "model"
    try:
        card = measured_card(best, lambda _line: None)  # the card's validation loss is this model's own
        write_export(best.model, best.task, best.fingerprint, card, target, force=True,
                     shape_config=best.shape_config, training=best.training)
    except ExportError as error:
        out.write(f"  could not export the model: {error}\n")
        return None
    text = "def " + sample_bytes(best.model, SampleRequest("def ", SAMPLE_TOKENS, temperature=0.8, top_k=40))
    out.write("\n=== the demo's model ===\n")
    out.write(f"  exported           {target} (from {Path(best.source).name}, epoch {best.card.epoch})\n")
    out.write(f"  try it             p2ptrain sample {target} --prompt 'def '   ·   p2ptrain eval {target}\n")
    out.write("  a sample of it     (prompt 'def ', 160 bytes)\n")
    for line in text.splitlines()[:12]:
        out.write(f"    | {''.join(c if c.isprintable() else ' ' for c in line)}\n")
    out.flush()
    return target


@dataclass(frozen=True)
class StrangerSeen:
    """What the demo saw of the node without an invite, and of the invited nodes' refusals."""

    code: int | None
    """Its exit code (None: still running when the demo ended)."""
    dht_refused: int
    """DHT requests the invited nodes refused, all of them together (dht_requests_refused_total)."""
    averaging_refused: int
    """Averaging and state requests the invited nodes refused (averaging_refused_total)."""
    last: StatusSnapshot | None
    """Its own last status, if it ever answered."""
    wrote_state: bool
    """Whether its state directory exists (a node writes it only once it is let in)."""
    last_line: str = ""

    def doubts(self) -> list[str]:
        """Each observation that contradicts "it was refused: it never joined a group or got any state"."""
        found = []
        if self.code is None:
            found.append("it was still running when the demo ended")
        elif self.code == 0:
            found.append("it exited with code 0, as a node that trained and left would")
        if self.dht_refused == 0:
            found.append("the invited nodes refused none of its DHT requests")
        if self.last is not None and self.last.averaging_rounds_ok_total:
            found.append(f"it reported {self.last.averaging_rounds_ok_total} averaging round(s)")
        if self.last is not None and self.last.state_downloads_total:
            found.append(f"it reported {self.last.state_downloads_total} state download(s)")
        if self.wrote_state:
            found.append("it wrote a state directory, which a node does only once it has joined")
        return found

    def lines(self) -> list[str]:
        ended = "is still running" if self.code is None else f"exited with code {self.code}"
        lines = [f">>> stranger {ended}"]
        if self.last_line:
            lines.append(f"    its last line: {self.last_line}")
        lines.append(f"    the invited nodes refused {self.dht_refused} of its DHT requests "
                     f"(dht_requests_refused_total) and {self.averaging_refused} averaging or state requests "
                     "(averaging_refused_total)")
        doubts = self.doubts()
        if doubts:
            lines.append("    so the demo did NOT show it was kept out: " + "; ".join(doubts))
        else:
            lines.append("    so it was refused: it never joined a group or got any state (no state directory, "
                         "no averaging round, no download)")
        return lines

    def event(self) -> str:
        doubts = self.doubts()
        if doubts:
            return "stranger (no invite) NOT shown to be kept out: " + "; ".join(doubts)
        return (f"stranger (no invite) was refused by the invited nodes' DHT ({self.dht_refused} requests) and exited "
                f"{self.code}, never in a group, never served state")


def _invited_statuses(run: DemoRun) -> list[StatusSnapshot]:
    """The last status of every node but the stranger."""
    stranger = run.stranger.name if run.stranger is not None else None
    return [status for name, status in run.last.items() if name != stranger]


def stranger_seen(run: DemoRun) -> StrangerSeen:
    stranger = run.stranger
    assert stranger is not None
    code = stranger.process.returncode if stranger.process is not None and not stranger.running else None
    lines = [line for line in stranger.log_tail(200).splitlines() if line.startswith("p2ptrain: ")]
    honest = _invited_statuses(run)
    return StrangerSeen(code=code, dht_refused=sum(s.dht_requests_refused_total for s in honest),
                        averaging_refused=sum(s.averaging_refused_total for s in honest),
                        last=run.last.get(stranger.name), wrote_state=stranger.state_dir.exists(),
                        last_line=lines[-1] if lines else "")


def _stranger(run: DemoRun, join: list[str], elapsed: float, duration: float, out: TextIO) -> None:
    """--private: a node that knows the run and an address, but has no invite, tries to join."""
    if run.stranger is None and elapsed >= STRANGER_AT * duration:
        run.stranger = run.add_node(join, invited=False, name="stranger")
        out.write(f"\n>>> stranger tries the one-line join without an invite: p2ptrain run --join {join[0]} "
                  f"--run {run.owned.ref if run.owned else ''}\n")
        return
    stranger = run.stranger
    if stranger is None or stranger.running or run.stranger_seen is not None:
        return
    _report_stranger(run, out)


def _report_stranger(run: DemoRun, out: TextIO) -> None:
    """What was seen of the stranger, once: when it has exited, or when the demo ends.  An invited
    node counts a refusal when it handles the stranger's request, which on a busy machine can come
    after the stranger gave up: with none counted yet, the nodes get ``REFUSAL_GRACE`` s more."""
    def refused() -> bool:
        run.poll()
        return any(status.dht_requests_refused_total for status in _invited_statuses(run))

    with contextlib.suppress(WaitTimeout):  # none counted: the report below says so
        wait_until(refused, REFUSAL_GRACE, "a refused request of the stranger counted", interval=0.5)
    run.stranger_seen = seen = stranger_seen(run)
    run.events.append(seen.event())
    out.write("\n" + "\n".join(seen.lines()) + "\n")


def _churn(run: DemoRun, join: list[str], elapsed: float, duration: float, out: TextIO) -> None:
    live = [node for node in run.nodes if node.running]
    if run.leaves == 0 and elapsed >= LEAVE_AT * duration and len(live) > 1:
        leaver = live[-1]
        leaver.signal(15)
        run.leaves += 1
        run.events.append(f"{leaver.name} left gracefully at t={elapsed:.0f}s (SIGTERM)")
        out.write(f"\n>>> {leaver.name} leaves the swarm (SIGTERM: last step, checkpoint, goodbye)\n")
    if run.joins == 0 and elapsed >= JOIN_AT * duration:
        newcomer = run.add_node(join)
        run.joins += 1
        run.events.append(f"{newcomer.name} joined late at t={elapsed:.0f}s and synced from its peers")
        out.write(f"\n>>> {newcomer.name} joins late: it will download the swarm's state and contribute\n")


def run_demo(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout  # looked up now: a default is bound at import time
    peers, duration = int(args.peers), float(args.duration)
    if not 1 <= peers <= 8:
        print("p2ptrain demo: --peers must be between 1 and 8", file=sys.stderr)
        return EX_BAD_ARGUMENT
    private = bool(getattr(args, "private", False))
    # The work directory is kept: its node logs and checkpoints are worth a look afterwards.
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="p2ptrain-demo-"))
    owned = create_local_run(workdir / "run", "demo", DEMO_OVERRIDES, policy="invite" if private else "open")
    run = DemoRun(workdir, owned=owned)
    started = time.monotonic()
    out.write(f"p2ptrain demo: {peers} nodes on 127.0.0.1 for {duration:.0f}s (state in {workdir})\n")
    out.write(f"created {'an invite-only' if private else 'an open'} run {owned.ref} with a throwaway owner key; "
              f"its signed manifest ({owned.manifest_path}) holds the run's settings\n")
    try:
        first = run.add_node([])
        join = first.join_addrs(timeout=90)[:1]
        out.write(f"first node is up; the others join with one line: p2ptrain run --join {join[0]} "
                  f"--run {owned.ref}\n")
        if private:
            out.write("  (each with an invite for its peer ID: p2ptrain run invite RUN PEER_ID, in swarm.invite)\n")
        for _ in range(peers - 1):
            run.add_node(join)
        out.write(f"watch any node live: p2ptrain top --url {first.api_url()}\n")
        while (elapsed := time.monotonic() - started) < duration:
            run.poll()
            print_table(run, elapsed, out)
            if private:
                _stranger(run, join, elapsed, duration, out)
            else:
                _churn(run, join, elapsed, duration, out)
            time.sleep(REFRESH_SECONDS)
        if run.stranger is not None and run.stranger_seen is None:
            # It gives up after its bootstrap timeout; on a busy machine it may not have got that far.
            out.write(f"\nwaiting for the stranger to finish trying (at most {STRANGER_GRACE:.0f}s) ...\n")
            run.stranger.wait(STRANGER_GRACE)
            run.poll()
            _report_stranger(run, out)  # say what was seen, not what was hoped
        run.poll()
        out.write("\nstopping all nodes (each writes a final checkpoint) ...\n")
        run.stop_all()
        print_summary(run, time.monotonic() - started, out)
        export_and_sample(run, out)
        return EX_FAILURE if run.stranger_seen is not None and run.stranger_seen.doubts() else EX_OK
    except KeyboardInterrupt:
        out.write("\ninterrupted: stopping all nodes ...\n")
        run.stop_all()
        print_summary(run, time.monotonic() - started, out)
        return EX_INTERRUPTED
    except (TimeoutError, RuntimeError) as error:
        out.write(f"\np2ptrain demo: {error}\n")
        run.stop_all()
        return EX_FAILURE
    finally:
        for node in run.nodes:  # nothing outlives the demo, whatever happened above
            if node.running:
                node.kill()
