"""Raw HTTP clients for the API's load tests: one request over a socket, floods, timed health checks."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import NamedTuple

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
STATUS = b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def exchange(port: int, payload: bytes, timeout: float = 5.0, source: str | None = None) -> bytes:
    """Send ``payload`` (from the loopback address ``source``, when given) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                  source_address=(source, 0) if source is not None else None) as sock:
        sock.sendall(payload)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


class Probe(NamedTuple):
    """One health check: its status (0: no answer), how long it took, and why there was no answer."""

    code: int
    seconds: float
    error: str = ""


def timed_healthz(port: int) -> Probe:
    started = time.monotonic()
    try:
        return Probe(status_of(exchange(port, HEALTHZ, timeout=3.0)), time.monotonic() - started)
    except OSError as error:
        return Probe(0, time.monotonic() - started, repr(error))


async def flood(port: int, count: int) -> list[int]:
    """``count`` requests opened at the same moment; the status of each answer (0: none)."""

    async def one() -> int:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
            writer.write(STATUS)
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return status_of(answer)
        except (OSError, TimeoutError):
            return 0

    return list(await asyncio.gather(*(one() for _ in range(count))))
