"""Real nodes on 127.0.0.1, each a ``p2ptrain run`` subprocess: for the demo, tests and benchmarks.

Every node gets its own work directory (config, state, log file), listens and announces on
loopback only, with NAT port mapping and AutoNAT off, and an API on a free port that is found
through ``<state_dir>/api.url``.  Children are started in their own session (so a Ctrl-C aimed
at the parent does not hit them mid-step) and are told by the kernel to stop if the parent dies.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from p2ptrain.client.discovery import TOKEN_FILE, TokenUnavailable, read_token
from p2ptrain.client.http import NodeClient, NodeError
from p2ptrain.proc import STACK_DUMP_SECONDS, STACK_DUMP_SIGNAL, descendants, die_with_parent, signal_all
from p2ptrain.status import StatusSnapshot, SwarmView
from p2ptrain.waiting import wait_until

LOOPBACK_LISTEN = "/ip4/127.0.0.1/tcp/0"
#: The most lines of a node's thread stacks a failure report quotes (a node has a few dozen threads).
STACK_LINES = 400
#: Numbers in a log message (masked to group the same message).
_NUMBER = re.compile(r"\b[0-9]+(?:\.[0-9]+)?\b")
#: [training] for a small machine on loopback; an owned run's manifest takes the run-wide part.
LOOPBACK_TRAINING: dict[str, Any] = {
    "threads": 1, "target_batch_size": 64, "matchmaking_time": 0.5, "averaging_timeout": 15.0,
    "load_state_timeout": 20.0, "validate_every": 10.0, "warmup_epochs": 3,
}


def _curl_in_namespace(netns: str, url: str, timeout: float, *options: str, stdin: bytes = b"") -> Any:
    """``url``'s JSON answer fetched with curl (and ``options``) from inside ``netns``, or None."""
    try:
        done = subprocess.run(["ip", "netns", "exec", netns, "curl", "-sf", "-m", str(timeout), *options, url],
                              input=stdin, capture_output=True, timeout=timeout + 5)
        return json.loads(done.stdout) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def local_node_config(state_dir: Path, run_id: str | None,
                      overrides: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """TOML for a loopback node tuned for a small machine; ``overrides`` patch sections/keys.

    ``run_id`` None: a node of an owned run (``--run REF``), whose config holds only local matters.
    """
    training = dict(LOOPBACK_TRAINING)
    if run_id is None:
        from p2ptrain.run.manifest import LOCAL_TRAINING

        training = {k: v for k, v in training.items() if k in LOCAL_TRAINING}
    sections: dict[str, dict[str, Any]] = {
        "node": {"state_dir": str(state_dir)},
        "swarm": {"listen_addrs": [LOOPBACK_LISTEN], "nat_port_map": False, "auto_nat": False,
                  "use_relay": False, "bootstrap_timeout": 30.0},
        "training": training,
        "checkpoint": {"interval": 30.0, "keep": 3},
        "api": {"host": "127.0.0.1", "port": 0},
    }
    if run_id is not None:
        sections["swarm"] = {"run_id": run_id, **sections["swarm"]}
    for section, values in (overrides or {}).items():
        sections.setdefault(section, {}).update(values)
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


class NodeProcess(Protocol):
    """What LocalNode needs of a started node: ``subprocess.Popen``'s calls, by process ID."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class NodeLauncher(Protocol):
    """Starts ``p2ptrain.cli`` with ``argv`` in a process of its own (session, log, environment): a
    fork server (``p2ptrain.local.forkserver``), which saves each node the imports a fresh interpreter makes."""

    def start(self, argv: Sequence[str], env: Mapping[str, str], log: Path) -> NodeProcess: ...


@dataclass
class LocalNode:
    """One node process and its files."""

    name: str
    workdir: Path
    run_id: str | None
    """None: a node of an owned run, started with ``args`` such as ``("--run", REF)``."""
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    process: NodeProcess | None = None
    #: A wrapper the node runs under (``["unshare", "-m", ...]``).
    command_prefix: Sequence[str] = ()
    #: A network namespace the node runs in (``ip netns exec``); its API, on loopback there, is then
    #: read with ``curl`` inside the namespace.
    netns: str | None = None
    args: tuple[str, ...] = ()
    """More ``p2ptrain run`` flags (``--run REF``, ``--manifest FILE``)."""
    launcher: NodeLauncher | None = None
    """Starts the node unless it runs under a wrapper or in a namespace; None: ``python -m p2ptrain.cli``."""

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def config_path(self) -> Path:
        return self.workdir / "node.toml"

    @property
    def log_path(self) -> Path:
        return self.workdir / "node.log"

    def write_config(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(local_node_config(self.state_dir, self.run_id, self.overrides), encoding="utf-8")

    def start(self, join: Iterable[str] = ()) -> None:
        """Start ``p2ptrain run`` for this node (writes its config first if missing)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"{self.name} is already running")
        if not self.config_path.exists():
            self.write_config()
        (self.state_dir / "api.url").unlink(missing_ok=True)
        argv = ["run", "--config", str(self.config_path), *self.args]
        for addr in join:
            argv += ["--join", addr]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        if self.launcher is not None and not self.command_prefix and self.netns is None:
            self.process = self.launcher.start(argv, env, self.log_path)
            return
        inside = ("ip", "netns", "exec", self.netns) if self.netns else ()
        command = [*self.command_prefix, *inside, sys.executable, "-m", "p2ptrain.cli", *argv]
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGTERM),
            )
        finally:
            log.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def api_url(self) -> str | None:
        try:
            return (self.state_dir / "api.url").read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def _read(self, path: str, timeout: float) -> Any:
        """The node's JSON answer at ``path``, or None while it does not answer (yet)."""
        url = self.api_url()
        if url is None or not self.running:
            return None
        if self.netns is not None:
            return _curl_in_namespace(self.netns, url + path, timeout)
        try:
            return NodeClient(url, None, timeout).get_json(path)
        except NodeError:
            return None

    def control(self, command: str, timeout: float = 10.0) -> bool:
        """Send a control command (pause, resume, checkpoint, leave) with the node's own API token;
        whether the node accepted it."""
        url = self.api_url()
        if url is None or not self.running:
            return False
        try:
            token = read_token(self.state_dir / TOKEN_FILE)
        except TokenUnavailable:
            return False
        if self.netns is not None:  # the token goes on curl's stdin, not its command line
            answer = _curl_in_namespace(self.netns, f"{url}/api/v1/control/{command}", timeout, "-X", "POST",
                                        "-H", "@-", "-H", "Content-Type: application/json", "-d", "{}",
                                        stdin=f"Authorization: Bearer {token}\n".encode())
        else:
            try:
                answer = NodeClient(url, token, timeout).control(command)
            except NodeError:
                return False
        return isinstance(answer, dict) and bool(answer.get("accepted"))

    def status(self, timeout: float = 2.0) -> StatusSnapshot | None:
        data = self._read("/api/v1/status", timeout)
        return StatusSnapshot.from_dict(data) if isinstance(data, dict) else None

    def peers(self, timeout: float = 2.0) -> SwarmView | None:
        data = self._read("/api/v1/peers", timeout)
        return SwarmView.from_dict(data) if isinstance(data, dict) else None

    def wait_for(self, predicate: Callable[[StatusSnapshot], bool], timeout: float,
                 what: str = "condition") -> StatusSnapshot:
        """Poll the status until ``predicate`` holds; TimeoutError (with the log tail) if it does not,
        RuntimeError at once if the node exits meanwhile."""
        last: list[StatusSnapshot] = []

        def holds() -> StatusSnapshot | None:
            if not self.running:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode if self.process else None} "
                                   f"while waiting for {what}:\n{self.log_tail(120)}")
            status = self.status()
            if status is not None:
                last[:] = [status]
                if predicate(status):
                    return status
            return None

        def detail() -> str:
            if not last:
                return f"no status read:\n{self.log_tail()}"
            seen = last[0]
            return (f"last state {seen.state}, epoch {seen.local_epoch}, {seen.peers_online} peers online, rounds "
                    f"{seen.averaging_rounds_ok_total} ok / {seen.averaging_rounds_partial_total} partial / "
                    f"{seen.averaging_rounds_failed_total} failed, {seen.state_downloads_total} state downloads; "
                    f"its warnings:\n{self.warning_summary()}\nits log's tail:\n{self.log_tail()}")

        return wait_until(holds, timeout, f"{what} from {self.name}", interval=0.5, detail=detail)

    def join_addrs(self, timeout: float = 60.0) -> list[str]:
        """The multiaddrs others can join this node with (waits until it has joined)."""
        status = self.wait_for(lambda s: bool(s.visible_maddrs), timeout, "swarm address")
        return list(status.visible_maddrs)

    def signal(self, sig: int) -> None:
        if self.running and self.process is not None:
            self.process.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the whole session if it did not go (its threads' stacks
        written to its log first: where it was stuck)."""
        if self.process is None:
            return None
        self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.ask_for_stacks()
            self.kill()
            code = self.wait(10)
        return code

    @staticmethod
    def stop_all(nodes: Iterable[LocalNode], timeout: float = 40.0, *, stacks: bool = True) -> dict[str, int | None]:
        """Stop several nodes at once: one SIGTERM each (a second one means "exit now", skipping
        the final checkpoint), then wait for all of them together; SIGKILL what is left, each first
        asked for its threads' stacks unless ``stacks`` is False (a clean-up that expects to kill)."""
        running = [node for node in nodes if node.running]
        for node in running:
            node.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for node in running:
            codes[node.name] = node.wait(max(0.0, deadline - time.monotonic()))
            if codes[node.name] is None:
                if stacks:
                    node.ask_for_stacks()
                node.kill()
                node.wait(10)
        return codes

    def kill(self, whole_tree: bool = True) -> None:
        """SIGKILL the node; with ``whole_tree`` also every process it started, as when a machine
        crashes or a service's main process dies (systemd then kills the rest of its cgroup).
        ``whole_tree=False`` kills its process group only: its forked helpers must then die on their
        own, and its p2pd leaves by its 30 s idle timeout."""
        if self.process is not None:
            helpers = descendants(self.process.pid) if whole_tree else {}
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            signal_all(helpers, signal.SIGKILL)

    def peer_id(self) -> str:
        """This node's peer ID, creating its identity now if it has none (e.g. to invite it)."""
        from p2ptrain.swarm.identity import ensure_identity, identity_path, peer_id_of_identity  # hivemind

        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        ensure_identity(identity_path(self.state_dir))
        return peer_id_of_identity(identity_path(self.state_dir))

    def warning_summary(self, kinds: int = 12) -> str:
        """The log's WARNING and ERROR messages, numbers masked, each with how often it came (most
        frequent first): what a failed wait needs beyond the last lines."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        counts: collections.Counter[str] = collections.Counter()
        for line in text.splitlines():
            level, _, message = line.partition(" ")[2].partition(" ")[2].partition(" ")
            if level in ("WARNING", "ERROR"):
                counts[f"{level} {_NUMBER.sub('N', message.strip())[:160]}"] += 1
        return "\n".join(f"{n:5d} x {message}" for message, n in counts.most_common(kinds)) or "(none)"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def ask_for_stacks(self) -> bool:
        """Ask the node's process, then each helper it forked (its DHT, its averagers), for its threads'
        stacks, one process at a time, each under a line naming it in the node's log; False when the
        node is not running.  p2pd is not asked (not Python)."""
        if self.process is None or not self.running:
            return False
        node = self.process.pid
        asked = [(node, "the node")] + [(pid, f"a helper of the node: {command[:80]}")
                                        for pid, command in sorted(descendants(node).items()) if "p2pd" not in command]
        for pid, what in asked:
            with contextlib.suppress(OSError), self.log_path.open("a", encoding="utf-8") as log:
                log.write(f"--- stacks of process {pid}, {what}\n")
            try:
                os.kill(pid, STACK_DUMP_SIGNAL)
            except ProcessLookupError:
                if pid == node:
                    return False
                continue
            time.sleep(STACK_DUMP_SECONDS)
        return True

    def report(self, lines: int = 30) -> str:
        """What a failed check shows of this node: its log's last ``lines`` lines, and when it is still
        running (a wait that timed out), where each of its threads is now."""
        tail = self.log_tail(lines)
        try:
            size = self.log_path.stat().st_size
        except OSError:
            return tail
        if not self.ask_for_stacks():
            return tail
        with self.log_path.open("rb") as log:
            log.seek(size)
            stacks = log.read().decode("utf-8", errors="replace").splitlines()
        return f"{tail}\n--- {self.name} is still running; its threads now:\n" + "\n".join(stacks[:STACK_LINES])
