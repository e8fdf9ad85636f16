"""A fake p2ptrain node API for the TUI tests: canned, realistic snapshots over real HTTP on loopback.

Serves the same routes and JSON shapes as the node (``/api/v1/status|peers|logs``, control POSTs
with a bearer token), records every control request, and can be switched to ``down`` (the port
closes: connection refused), ``garbage`` (200 with non-JSON) or ``old`` (schema_version 0).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from p2ptrain.status import OffenderEntry, PeerRecord, StatusSnapshot, SwarmView
from p2ptrain.waiting import wait_until

NOW = 1_760_000_000.0  # the fixed "wall clock" of the tests
TOKEN = "s3cret-token-for-tests"
SELF_ID = "12D3KooWHk9ZjmCpZbB7rRWwDqQm2kQ8yUeGwTqYtr4JmVvZ1xAa"
PEER_IDS = (
    SELF_ID,
    "12D3KooWAbCdEfGhJkLmNpQrStUvWxYz123456789abcdefghijk",
    "12D3KooWQqPpXx7n2Lr5Ts8Uv9Ww1Yy3Zz4Aa5Bb6Cc7Dd8Ee9Ff",
    "12D3KooWZz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq9Pp8Oo7Nn6Mm5Kk",
    "12D3KooWMm2Nn3Pp4Qq5Rr6Ss7Tt8Uu9Vv1Ww2Xx3Yy4Zz5Aa6B",
)
#: A plain hivemind peer that sent NaN parts: no record of its own, excluded.
HOSTILE_ID = "12D3KooWHostile1NaNPartsXx7n2Lr5Ts8Uv9Ww1Yy3Zz4Aa5B"
SCRIPT_LENGTH = 30


def swarm_view(now: float = NOW) -> SwarmView:
    rows = (  # state, epoch, samples/s, loss, reachability, seconds since published, version, contributed
        ("training", 42, 118.4, 2.3141, "public", 3, "0.1.0", 1_046_400),
        ("training", 42, 231.9, 2.2987, "public", 7, "0.1.0", 2_073_600),
        ("paused", 41, 0.0, 2.4410, "relayed", 12, "0.1.0", 402_304),
        ("syncing", 38, 12.5, None, "client", 25, "0.0.9", 0),
        ("training", 42, 97.1, 2.3305, "relayed", 48, "0.1.0", 880_128),
    )
    peers = tuple(
        PeerRecord(peer_id=pid, version=ver, state=state, epoch=epoch, samples_per_second=sps, loss=loss,
                   val_loss=None if loss is None else loss + 0.08, reachability=reach,
                   uptime_seconds=3600.0 + i * 600, published_at=now - ago, samples_contributed=credit,
                   data_pass=3, shards_consumed=2, past_pass_shards=(4, 4, 3), shards_total=20,
                   data_source="0123456789abcdef", device="cuda:0" if i % 2 else "cpu",
                   precision="bf16" if i % 2 else "fp32")
        for i, (pid, (state, epoch, sps, loss, reach, ago, ver, credit)) in enumerate(zip(PEER_IDS, rows,
                                                                                           strict=True))
    )
    offenders = (
        OffenderEntry(peer_id=HOSTILE_ID, kind="nonfinite_part", reason="part has NaN or inf values", offences=3,
                      last_at=now - 40, banned_until=now + 552, excluded=True),
        OffenderEntry(peer_id=PEER_IDS[3], kind="oversized_part", reason="norm 3.1e+03 > 41.2", offences=1,
                      last_at=now - 900, banned_until=now - 300, excluded=False),
    )
    return SwarmView(peers=peers, swarm_samples_per_second=459.9, global_epoch=42, slowest_peer=PEER_IDS[3],
                     fastest_peer=PEER_IDS[1], offenders=offenders,
                     samples_contributed=sum(p.samples_contributed for p in peers),
                     data_pass=3, data_coverage=0.45, data_last_pass_coverage=1.0, shards_total=20)


def status_script(now: float = NOW) -> list[StatusSnapshot]:
    """SCRIPT_LENGTH successive snapshots (a falling loss, a wobbling rate); the last one repeats."""
    base = StatusSnapshot(
        version="0.1.0", state="training", peer_id=SELF_ID,
        visible_maddrs=(f"/ip4/203.0.113.7/tcp/31337/p2p/{SELF_ID}", "/ip4/127.0.0.1/tcp/31337"),
        reachability="public", run_id="bytelm-demo-mfvu2prtod62tp5pp2vgyrz7ty", model_fingerprint="9f2c4e1ab37d55e0",
        run_ref="bytelm-demo@mfvu2prtod62tp5pp2vgyrz7ty", manifest_version=3, admission_policy="invite",
        manifest_fingerprint="9f2c4e1ab37d55e0",
        local_epoch=42, global_epoch=42, target_batch_size=4096, peers_online=5,
        device="cuda:0", precision="bf16", device_memory_bytes=3_435_973_837,
        swarm_samples_per_second=459.9, averaging_rounds_ok_total=37, averaging_rounds_partial_total=3,
        averaging_rounds_failed_total=2, recent_round_durations=tuple(0.8 + (i % 7) * 0.15 for i in range(24)),
        last_round_duration_seconds=1.25, last_round_group_size=4, last_round_peers_online=5,
        last_round_received_fraction=2 / 3, median_received_fraction=1.0,
        received_fraction_bucket_counts=(0, 1, 2, 0, 0, 0, 37, 0), received_fraction_sum=38.8333,
        cpu_limit_percent=25.0, cpu_used_percent=24.6, cpu_idle_seconds_total=1932.0,
        bytes_sent_total=734_003_200, bytes_received_total=1_288_490_188,
        checkpoint_writes_ok_total=7, last_checkpoint_time=now - 192, uptime_seconds=7385.0,
        peer_checks=True, peer_offenses_by_kind={"nonfinite_part": 3, "oversized_part": 1}, peer_offenses_total=4,
        peers_excluded=1,
        started_at=now - 7385.0,
        samples_contributed_total=1_046_400, samples_not_averaged_total=2_304,
        data_pass=3, data_shards_consumed=2, data_past_pass_shards=(4, 4, 3), data_shards_total=20,
        data_source="0123456789abcdef", loss_history_epochs=tuple(range(0, 43, 2)),
        loss_history=tuple(5.5 - 3.2 * (1 - 0.9 ** e) for e in range(0, 43, 2)),
        val_loss_history_epochs=(0, 10, 20, 30, 40), val_loss_history=(5.6, 3.9, 3.0, 2.6, 2.4),
    )
    return [dataclasses.replace(
        base, samples_accumulated=(i * 137) % 4096, local_samples_per_second=110.0 + (i * 7) % 17,
        loss=3.1 - i * 0.027, val_loss=3.2 - i * 0.025 if i % 3 == 0 else None,
        samples_processed_total=1_100_000 + i * 1200, taken_at=now - SCRIPT_LENGTH + i,
    ) for i in range(SCRIPT_LENGTH)]


def log_lines(now: float = NOW) -> list[dict[str, Any]]:
    levels = ("INFO", "INFO", "WARNING", "INFO", "ERROR", "DEBUG")
    messages = ("joined the swarm with 4 peers", "state downloaded from 12D3KooWAbCd…ghijk in 2.1s",
                "averaging round timed out; continuing with local progress", "checkpoint written (epoch 41)",
                "peer 12D3KooWZz9Y…n6Mm5Kk sent an invalid record", "matchmaking: group of 4 formed")
    return [{"seq": i + 1, "time": now - 600 + 37 * i, "level": lvl, "logger": "p2ptrain.node",
             "message": msg} for i, (lvl, msg) in enumerate(zip(levels, messages, strict=True))]


class FakeNode:
    """Start with :meth:`start`, stop with :meth:`stop`; ``mode`` is "ok", "garbage" or "old"."""

    def __init__(self, port: int = 0, now: float = NOW) -> None:
        self.mode = "ok"
        self.now = now
        self.script = status_script(now)
        self.status_gets = 0
        self.swarm = swarm_view(now)
        self.lines = log_lines(now)
        self.controls: list[tuple[str, str | None, dict[str, Any]]] = []
        self.state_override: str | None = None
        #: The Authorization header of every read, in order (None: none sent).
        self.read_authorizations: list[str | None] = []
        self._lock = threading.Lock()
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> FakeNode:
        errors: list[OSError] = []

        def bound() -> ThreadingHTTPServer | None:
            try:
                return ThreadingHTTPServer(("127.0.0.1", self._port), self._handler())
            except OSError as error:
                errors.append(error)
                return None

        # Re-binding the same port right after a stop can need a moment.
        self._server = wait_until(bound, 10, f"bind to port {self._port}", interval=0.1,
                                  detail=lambda: str(errors[-1]))
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the port: clients now get 'connection refused', as from a dead node."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(5)
            self._server = None

    def add_log(self, level: str, message: str) -> None:
        with self._lock:
            self.lines.append({"seq": len(self.lines) + 1, "time": self.now, "level": level,
                               "logger": "p2ptrain.node", "message": message})

    def _status(self) -> dict[str, Any]:
        with self._lock:
            snapshot = self.script[min(self.status_gets, len(self.script) - 1)]
            self.status_gets += 1
        if self.state_override:
            snapshot = dataclasses.replace(snapshot, state=self.state_override)
        data = snapshot.to_dict()
        if self.mode == "old":
            data["schema_version"] = 0
        return data

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, code: int, payload: Any) -> None:
                body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                url = urllib.parse.urlsplit(self.path)
                fake.read_authorizations.append(self.headers.get("Authorization"))
                if fake.mode == "garbage":
                    self._send(200, b"<html>502 Bad Gateway</html>")
                elif url.path == "/api/v1/status":
                    self._send(200, fake._status())
                elif url.path == "/api/v1/peers":
                    self._send(200, fake.swarm.to_dict())
                elif url.path == "/api/v1/logs":
                    since = int(urllib.parse.parse_qs(url.query).get("since", ["0"])[0])
                    with fake._lock:
                        lines = [line for line in fake.lines if line["seq"] > since]
                        last = len(fake.lines)
                    self._send(200, {"lines": lines, "last_seq": last})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"unparsable": raw.decode(errors="replace")}
                auth = self.headers.get("Authorization")
                command = self.path.removeprefix("/api/v1/control/")
                fake.controls.append((command, auth, body))
                if auth != f"Bearer {TOKEN}":
                    self._send(401, {"error": "missing or wrong bearer token"})
                elif command not in ("pause", "resume", "checkpoint", "leave"):
                    self._send(404, {"error": f"unknown command {command!r}"})
                else:
                    fake.state_override = {"pause": "paused", "resume": "training"}.get(
                        command, fake.state_override)
                    self._send(202, {"accepted": True, "command": command})

        return Handler
