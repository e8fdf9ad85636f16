"""The Node view: one node's snapshot as labelled rows with a progress bar and sparklines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Label, ProgressBar, Sparkline, Static

from p2ptrain.status import NodeState, StatusSnapshot
from p2ptrain.tui.widgets.format import (
    DASH,
    age,
    averaging_line,
    cpu_line,
    device_line,
    duration,
    last_round_line,
    number,
    rounds_line,
    traffic_line,
)

#: (row key, label, kind of the third column): "span" lets the value take the whole line.
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("state", "State", "blank"),
    ("peer", "Peer", "span"),
    ("run", "Run", "span"),
    ("addrs", "Addresses", "span"),
    ("epoch", "Epoch", "blank"),
    ("progress", "Progress", "bar"),
    ("sps", "Samples/s", "spark"),
    ("loss", "Loss", "spark"),
    ("val", "Val loss", "spark"),
    ("avg", "Averaging", "span"),
    ("rounds", "Rounds", "spark"),
    ("round", "Last round", "blank"),
    ("traffic", "Traffic", "blank"),
    ("ckpt", "Checkpoint", "blank"),
    ("cpu", "CPU", "span"),
    ("device", "Device", "span"),
    ("uptime", "Uptime", "blank"),
)


@dataclass
class History:
    """Recent values the TUI collected, one per new snapshot (the node keeps no history itself)."""

    samples_per_second: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)


def run_line(status: StatusSnapshot) -> str:
    """The run: an owned run's reference, manifest version and admission policy, or a plain run's id;
    then the model fingerprint."""
    if status.run_ref:
        run = f"{status.run_ref} · manifest v{status.manifest_version} · {status.admission_policy or 'open'}"
    else:
        run = status.run_id or DASH
    return f"{run}  model {status.model_fingerprint[:12]}" if status.model_fingerprint else run


class NodePanel(Grid):
    """Shows what it is given; fetches nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Data can arrive before the rows exist; it is kept and shown once they do.
        self._latest: tuple[StatusSnapshot, History, float] | None = None
        self._ready = False
        # Children are kept by reference: during shutdown they leave the DOM before this panel does.
        self._values: dict[str, Static] = {}
        self._sparks: dict[str, Sparkline] = {}
        self._bar = ProgressBar(total=None, show_eta=False, id="progress-bar")

    def on_mount(self) -> None:
        self._ready = True
        if self._latest is not None:
            self.show(*self._latest)

    def compose(self) -> ComposeResult:
        for key, label, kind in _ROWS:
            yield Label(label, classes="label")
            value = self._values[key] = Static(DASH, id=f"{key}-value",
                                               classes=f"value {'span' if kind == 'span' else ''}")
            yield value
            if kind == "bar":
                yield self._bar
            elif kind == "spark":
                spark = self._sparks[key] = Sparkline([], id=f"{key}-spark")
                yield spark
            elif kind == "blank":
                yield Static("", classes="blank")

    def _set(self, key: str, text: str) -> None:
        self._values[key].update(text)

    def _spark(self, key: str, values: Sequence[float]) -> None:
        self._sparks[key].data = list(values)

    def show(self, status: StatusSnapshot, history: History, now: float) -> None:
        self._latest = (status, history, now)
        if not self._ready:
            return
        state = self._values["state"]
        known = {s.value for s in NodeState}
        state.set_classes(f"value state-{status.state if status.state in known else 'unknown'}")
        reason = f" ({status.pause_reason})" if status.pause_reason else ""
        state.update(f"{status.state.upper()}{reason}")
        self._set("peer", status.peer_id or DASH)
        self._set("run", run_line(status))
        addrs = status.visible_maddrs
        more = f"  (+{len(addrs) - 1} more)" if len(addrs) > 1 else ""
        self._set("addrs", f"{status.reachability} · {addrs[0] if addrs else 'no addresses'}{more}")
        excluded = f" · {status.peers_excluded} excluded" if status.peers_excluded else ""
        self._set("epoch", f"{status.local_epoch} (swarm {status.global_epoch}) · "
                           f"{status.peers_online} peer{'s' if status.peers_online != 1 else ''}{excluded}")
        self._set("progress", f"{status.samples_accumulated:,} / {status.target_batch_size:,} samples")
        self._bar.update(total=status.target_batch_size or None,
                   progress=min(status.samples_accumulated, status.target_batch_size))
        self._set("sps", f"{number(status.local_samples_per_second)} (swarm "
                         f"{number(status.swarm_samples_per_second)})")
        self._spark("sps", history.samples_per_second)
        self._set("loss", number(status.loss, 4))
        self._spark("loss", history.loss)
        self._set("val", number(status.val_loss, 4))
        self._spark("val", history.val_loss)
        self._set("avg", averaging_line(status))
        self._set("rounds", rounds_line(status))
        self._spark("rounds", status.recent_round_durations[-60:])
        self._set("round", last_round_line(status))
        self._set("traffic", traffic_line(status))
        ckpt = f"{age(status.last_checkpoint_time, now)} ({status.checkpoint_writes_ok_total} ok"
        ckpt += f", {status.checkpoint_writes_failed_total} failed)"
        self._set("ckpt", ckpt + (f" {status.last_checkpoint_error}" if status.last_checkpoint_error else ""))
        self._set("cpu", cpu_line(status))
        self._set("device", device_line(status))
        self._set("uptime", duration(status.uptime_seconds))
