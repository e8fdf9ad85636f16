"""A fork server: one process that has imported torch and hivemind once forks each node or worker.

Why: a node started as ``python -m p2ptrain.cli run`` spends most of its start-up CPU importing torch
and hivemind and building its first optimizer (torch imports its compiler then), and the test tiers
and the benchmarks' smoke runs start many nodes and workers on a machine of few cores
(docs/operations.md has the figures).  A process forked from here skips that and nothing else: it runs the
module asked for (``python -m MODULE``, by default ``p2ptrain.cli``) in a process of its own, with its
own session, log, environment and working directory, exits with that module's code, and is
signalled and waited for by process ID as a ``subprocess.Popen`` is; it takes hivemind's
process-wide locks of its own, which a fork would share with every sibling.  What it does not give: a
process of its own from the start (its memory is shared with the server's until written, so a
figure of a process's memory or start-up cost is not a fresh process's), a wrapper command (a
network namespace, ``unshare``), or imports made by the environment (``PYTHONPATH`` hooks): those
start a process of their own.

The server (``python -m p2ptrain.local.forkserver MODULE...``, the modules to import first) speaks
one JSON object per line: a request ``{"module", "argv", "env", "cwd", "log"}`` on its stdin is
answered ``{"pid": N}`` (or ``{"error": "..."}``) on its stdout, and each child's exit is told as
``{"exited": N, "code": C}``, ``C`` as ``Popen.returncode`` gives it (minus the signal that killed it).
The server holds no thread (a fork copies only the calling thread) and dies with its starter.
"""

from __future__ import annotations

import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from p2ptrain.proc import die_with_parent

#: What ``p2ptrain run`` imports on its way to training.
NODE_MODULES = ("p2ptrain.cli.main", "p2ptrain.daemon.main", "p2ptrain.daemon.node", "p2ptrain.daemon.builder")


def _preload(modules: Sequence[str]) -> None:
    import importlib

    # A node's main sets torch's sharing strategy itself, also when hivemind was imported first.
    for module in modules:
        importlib.import_module(module)
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # torch imports torch._dynamo here, once


def _reply(message: Mapping[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _become_child(request: Mapping[str, Any]) -> None:
    """In the forked child: its session, stdio, environment and arguments (then its module runs)."""
    os.setsid()
    die_with_parent(signal.SIGTERM)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["module"], *request["argv"]]
    if "hivemind" in sys.modules:  # a node of its own, not the server's helper: its own locks
        from p2ptrain.averaging.lifecycle import renew_hivemind_locks

        renew_hivemind_locks()


def _serve() -> Mapping[str, Any] | None:
    """The server's loop; returns the request a forked child is to run (in that child), or None when
    the starter has gone (stdin closed)."""
    selector = selectors.DefaultSelector()
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector.register(0, selectors.EVENT_READ)
    selector.register(wakeup_r, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in selector.select(timeout=1.0):
            if key.fd == wakeup_r:
                os.read(wakeup_r, 4096)
                continue
            chunk = os.read(0, 65536)
            if not chunk:  # the test process is gone: so are we
                return None
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as exc:
                    _reply({"error": f"fork failed: {exc}"})
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    selector.close()
                    for fd in (wakeup_r, wakeup_w):
                        os.close(fd)
                    return request
                _reply({"pid": pid})
        while True:  # reap every child that has exited
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def main() -> None:
    die_with_parent(signal.SIGKILL)
    _preload(sys.argv[1:])
    request = _serve()
    if request is None:
        return
    _become_child(request)
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


class ForkedProcess:
    """A process forked by the server, handled as a ``subprocess.Popen`` is (the calls made of one here)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The starter's side: starts the server once, asks it for processes, learns of their exits.

    ``preload``: the modules the server imports first (what the processes it forks will import);
    ``env``: the server's environment, which its imports see (a child's own ``env`` comes after them).
    """

    def __init__(self, preload: Sequence[str] = NODE_MODULES, env: Mapping[str, str] | None = None) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "p2ptrain.local.forkserver", *preload], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            start_new_session=True)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._requests: IO[bytes] = self._process.stdin
        self._lock = threading.Lock()  # one start at a time: the answer to a request is the next pid line
        self._changed = threading.Condition()
        self._started: list[int | str] = []
        self._exits: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True,
                                        name="forkserver")
        self._reader.start()

    def _read(self, answers: IO[bytes]) -> None:
        for line in answers:
            message = json.loads(line)
            with self._changed:
                if "exited" in message:
                    self._exits[message["exited"]] = message["code"]
                else:
                    self._started.append(message.get("pid") or str(message.get("error")))
                self._changed.notify_all()
        with self._changed:
            self._started.append("the fork server exited")
            self._changed.notify_all()

    def start(self, argv: Sequence[str], env: Mapping[str, str], log: Path,
              module: str = "p2ptrain.cli") -> ForkedProcess:
        """``python -m module *argv`` (as a node by default) in this process's working directory, its
        output appended to ``log``; raises RuntimeError if it could not be forked."""
        log.touch()  # there when start returns, as a Popen's redirected output is
        request = {"module": module, "argv": list(argv), "env": dict(env), "cwd": str(Path.cwd()), "log": str(log)}
        with self._lock:
            self._requests.write((json.dumps(request) + "\n").encode())
            self._requests.flush()
            with self._changed:
                if not self._changed.wait_for(lambda: bool(self._started), timeout=120):
                    raise RuntimeError("the fork server did not answer in 120 s")
                answer = self._started.pop(0)
        if isinstance(answer, str):
            raise RuntimeError(f"the fork server could not start {module}: {answer}")
        return ForkedProcess(self, answer)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit code once it has exited, waiting up to ``timeout`` seconds (None: no limit)."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits, timeout=timeout)
            return self._exits.get(pid)

    def close(self) -> None:
        """Stop the server (the processes it forked and still runs get SIGTERM from the kernel as it goes)."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)


if __name__ == "__main__":
    main()
