"""A small HTTP/1.x server on its own thread and asyncio loop, built to stay up under hostile clients.

One request per connection (answered ``HTTP/1.0`` with ``Connection: close``).  An idle or slow
connection costs a sleeping coroutine, not a thread, and is dropped when the whole request (line,
headers, body) has not arrived within one total deadline, however slowly it trickles in.  Open
connections are capped in total (over the cap: ``503`` at once, nothing read) and per client
address (over it, a connection gets a short deadline and the handler decides: the API still
answers ``/healthz``); all of loopback counts as one address, since any local process can
connect from any of 127.0.0.0/8's sixteen million.  Heads and bodies are size-capped; every
protocol error is a JSON answer.  What a request means is the handler's business (:mod:`p2ptrain.daemon.api`).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import ipaddress
import json
import logging
import re
import socket
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(rb"HTTP/1\.[01]")
#: After an error with a request body left unread, how long (and how much) to read and discard so
#: the client sees the answer instead of a connection reset.
_LINGER_SECONDS = 0.5
_LINGER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    #: Seconds for the whole request (line, headers and body) to arrive, and again for the answer to leave.
    request_timeout: float = 10.0
    #: Total deadline for a connection over its client's cap (only a quick, cheap request is served).
    over_cap_timeout: float = 1.0
    max_head_bytes: int = 16 * 1024
    max_headers: int = 64
    max_body_bytes: int = 4096
    max_connections: int = 256
    max_client_connections: int = 64
    #: Listen backlog: a burst of connections waits in the kernel instead of being dropped.
    backlog: int = 1024


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    path: str
    query: str
    version: str
    #: Header names lower-cased (a repeated header: the last one).
    headers: Mapping[str, str]
    body: bytes
    #: The client's IP address.
    client: str
    #: The connection is over its client's connection cap.
    over_cap: bool = False

    @property
    def group(self) -> str:
        """The client this request counts against in every per-client limit (:func:`client_group`)."""
        return client_group(self.client)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


def json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
    body = (json.dumps(payload, allow_nan=False, default=str) + "\n").encode("utf-8")
    return Response(status, body, "application/json", dict(headers or {}))


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return json_response(status, {"error": message}, headers)


class HttpError(Exception):
    """A request that gets an error answer; ``linger`` when a body was left unread."""

    def __init__(self, response: Response, linger: bool = False) -> None:
        super().__init__(response.status)
        self.response = response
        self.linger = linger


def _bad(status: int, message: str, linger: bool = False) -> HttpError:
    return HttpError(error_response(status, message), linger)


class _HeadReader:
    """Reads the request head line by line from its own buffer, counting every byte that arrives
    (a connection that sent nothing is closed quietly, one that sent part of a request gets 408)."""

    def __init__(self, reader: asyncio.StreamReader, limits: Limits) -> None:
        self.reader = reader
        self.limits = limits
        self.buffer = bytearray()
        self.received = 0

    async def line(self) -> bytes:
        """The next line with its ending; b"" when the client closed first."""
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > self.limits.max_head_bytes:
                raise _bad(431, f"request head larger than {self.limits.max_head_bytes} bytes")
            chunk = await self.reader.read(4096)
            if not chunk:
                return b""
            self.received += len(chunk)
            self.buffer += chunk
        if self.received - len(self.buffer) + end > self.limits.max_head_bytes:
            raise _bad(431, f"request head larger than {self.limits.max_head_bytes} bytes")
        line = bytes(self.buffer[:end + 1])
        del self.buffer[:end + 1]
        return line

    async def body(self, length: int) -> bytes:
        data = bytes(self.buffer[:length])
        del self.buffer[:length]
        if len(data) < length:
            data += await self.reader.readexactly(length - len(data))
        return data


async def read_request(head: _HeadReader, client: str, over_cap: bool, limits: Limits) -> Request | None:
    """One request; None when the client closed before sending a whole head."""
    line = await head.line()
    if not line:
        return None
    parts = line.rstrip(b"\r\n").split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1] or not _VERSION.fullmatch(parts[2]):
        shown = line.rstrip(b"\r\n")[:80].decode("latin-1")
        raise _bad(400, f"Bad request syntax ({shown!r})")
    method, target, version = (part.decode("latin-1") for part in parts)
    headers: dict[str, str] = {}
    seen: Counter[str] = Counter()
    while True:
        line = await head.line()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            return None
        name, colon, value = line.rstrip(b"\r\n").partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise _bad(400, "malformed header line")
        key = name.decode("latin-1").lower()
        seen[key] += 1
        if sum(seen.values()) > limits.max_headers:
            raise _bad(431, f"more than {limits.max_headers} header lines")
        headers[key] = value.strip().decode("latin-1")
    if seen["host"] > 1 or seen["content-length"] > 1:
        raise _bad(400, "repeated Host or Content-Length header")
    path, query = _split_target(target, headers)
    body = await head.body(_body_length(headers, limits))
    return Request(method, target, path, query, version, headers, body, client, over_cap)


def _split_target(target: str, headers: dict[str, str]) -> tuple[str, str]:
    if target.startswith("/"):
        path, _, query = target.partition("?")
        return path, query
    if target.lower().startswith(("http://", "https://")):  # absolute form: its authority is the host
        parts = urlsplit(target)
        headers["host"] = parts.netloc
        return parts.path or "/", parts.query
    return target, ""  # "*" or garbage: no endpoint has that path


def _body_length(headers: dict[str, str], limits: Limits) -> int:
    if "transfer-encoding" in headers:
        raise _bad(411, "send the body with a Content-Length, not chunked", linger=True)
    raw = headers.get("content-length", "0").strip() or "0"
    if not (raw.isascii() and raw.isdigit()):
        raise _bad(400, f"bad Content-Length: {raw[:40]!r}", linger=True)
    length = int(raw)
    if length > limits.max_body_bytes:
        raise _bad(413, f"request body over {limits.max_body_bytes} bytes", linger=True)
    return length


def _encode(response: Response, head_only: bool) -> bytes:
    reason = http.HTTPStatus(response.status).phrase
    lines = [f"HTTP/1.0 {response.status} {reason}", "Server: p2ptrain",
             f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}",
             "Cache-Control: no-store", "Connection: close",
             *(f"{name}: {value}" for name, value in response.headers.items())]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


Handler = Callable[[Request], Awaitable[Response]]


def client_group(address: str) -> str:
    """The name a client's open connections are counted under: its address, except that every
    loopback address (127.0.0.0/8, ::1) is the one client "loopback"."""
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address
    return "loopback" if loopback else address


class HttpServer:
    """Binds at construction (a taken port fails there, with a clear OSError); serves after :meth:`start`."""

    def __init__(self, host: str, port: int, handler: Handler, limits: Limits, log: logging.Logger) -> None:
        self.handler = handler
        self.limits = limits
        self.log = log
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=limits.backlog)
        self.sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._open: Counter[str] = Counter()
        self._open_total = 0

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def open_connections(self) -> int:
        """Connections being served now (read from any thread: one int, written by the server's loop)."""
        return self._open_total

    def start(self, name: str = "p2ptrain-api") -> None:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                server = loop.run_until_complete(asyncio.start_server(
                    self._connected, sock=self.sock, backlog=self.limits.backlog,
                    limit=self.limits.max_head_bytes))
            except BaseException as error:  # handed to start(), which raises it in the caller's thread
                failed.append(error)
                loop.close()
                return
            finally:
                started.set()
            try:
                loop.run_forever()
            finally:
                server.close()
                loop.run_until_complete(self._cancel_connections())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()
        started.wait(10)
        if failed:
            raise failed[0]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._thread = None
        self.sock.close()

    async def _cancel_connections(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if peer else "?"
        client = client.removeprefix("::ffff:")  # an IPv4 client of a dual-stack socket is that IPv4 address
        group = client_group(client)
        self._open[group] += 1
        self._open_total += 1
        try:
            await self._serve(reader, writer, client, group)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping: nothing to answer
        except Exception:
            self.log.exception("API connection from %s failed", client)
        finally:
            self._open[group] -= 1
            self._open_total -= 1
            if self._open[group] <= 0:
                del self._open[group]
            if not writer.is_closing():
                writer.transport.abort()
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str,
                     group: str) -> None:
        limits = self.limits
        if self._open_total > limits.max_connections:
            # Refuse before reading anything: this costs the server nothing.
            await self._send(writer, error_response(503, "too many connections", {"Retry-After": "1"}), None)
            return
        over_cap = self._open[group] > limits.max_client_connections
        deadline = limits.over_cap_timeout if over_cap else limits.request_timeout
        head = _HeadReader(reader, limits)
        try:
            async with asyncio.timeout(deadline):
                request = await read_request(head, client, over_cap, limits)
        except TimeoutError:
            if head.received:
                self.log.debug("API %s sent no complete request in time", client)
                over = f" (the deadline of a connection over its client's cap of {limits.max_client_connections})"
                await self._send(writer, error_response(408, f"request not complete within {deadline:g} s"
                                                        f"{over if over_cap else ''}"), None)
            return
        except HttpError as error:
            self.log.debug("API %s bad request: %d", client, error.response.status)
            await self._send(writer, error.response, reader if error.linger else None)
            return
        if request is None:
            return
        response = await self.handler(request)
        await self._send(writer, response, None, head_only=request.method == "HEAD")

    async def _send(self, writer: asyncio.StreamWriter, response: Response,
                    unread: asyncio.StreamReader | None, head_only: bool = False) -> None:
        """Write the answer and close; a client that does not read it within the deadline is cut off."""
        writer.write(_encode(response, head_only))
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(self.limits.request_timeout):
                await writer.drain()
            if unread is not None:
                # Read (and drop) what the client is still sending, so closing does not reset the
                # connection before it has read the answer.
                writer.write_eof()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_LINGER_SECONDS):
                        dropped = 0
                        while dropped < _LINGER_BYTES and (chunk := await unread.read(_LINGER_BYTES)):
                            dropped += len(chunk)
            writer.close()  # flushes what is still buffered, then closes
            async with asyncio.timeout(self.limits.request_timeout):
                await writer.wait_closed()
