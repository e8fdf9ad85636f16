"""The p2p daemon's flags that ``hivemind.P2P.create`` does not take: the relay service's budget, and a
loopback address where the daemon serves its own metrics (what it relayed for others).

hivemind builds p2pd's command line in the private static method ``P2P._make_process_args``, inside
the DHT's process, which it forks.  :func:`extra_daemon_flags` puts a version that appends ours in its
place while a DHT starts (the forked process keeps it), then puts hivemind's back; the method is pinned
with hivemind's other internals in :mod:`p2ptrain.averaging.pinned`, and ``tests/unit/test_daemon_flags.py``
checks that the bundled p2pd knows every flag named here.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from hivemind.p2p.p2p_daemon import P2P

from p2ptrain.config.schema import SwarmSection

#: One DHT start at a time may swap the method (the swap is process-wide).
_swapping = threading.Lock()

DaemonFlags = Mapping[str, "str | int | bool"]


def relay_flags(cfg: SwarmSection, metrics_port: int | None) -> dict[str, str | int | bool]:
    """The relay service's switch and budget from config, and the metrics address (``metrics_port``
    on 127.0.0.1; None: none)."""
    flags: dict[str, str | int | bool] = {
        "relayService": cfg.use_relay and cfg.relay_service,
        "relayMaxReservations": cfg.relay_max_reservations,
        "relayMaxCircuits": cfg.relay_max_circuits,
    }
    if metrics_port is not None:
        flags["metricsAddr"] = f"127.0.0.1:{metrics_port}"
    return flags


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a process started a moment later to take
    (the p2p daemon's metrics; the benchmarks' and tests' servers).  Should another process take it
    first, the daemon runs on without its metrics and the figures they feed read as unknown."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def extra_daemon_flags(flags: DaemonFlags) -> Iterator[None]:
    """While inside, every p2pd that hivemind starts (in this process or one it forks) gets ``flags``
    too (a flag hivemind also sets takes our value)."""
    original = P2P.__dict__["_make_process_args"]
    make_args = original.__func__

    def with_ours(*args: object, **kwargs: object) -> list[str]:
        return list(make_args(*args, **{**kwargs, **flags}))

    with _swapping:
        P2P._make_process_args = staticmethod(with_ours)
        try:
            yield
        finally:
            P2P._make_process_args = original
