"""Who this node will not deal with: a ban list with expiry, offence counters, and run admission.

Offences are found in two processes: the node's (a downloaded state that fails validation) and
each averager's forked helper (a rejected averaging part).  Both must see the same list, so it lives
in fork-shared memory created with the gate, before hivemind forks its averagers: a gate must be
built before the optimizer.  Every offence is one WARNING line naming the peer, a count per kind
(``p2ptrain_peer_offenses_total{kind=...}``), and a ban for a configurable time.

The gate also answers "is this peer admitted at all?" through a pluggable predicate (an invite
run's ``is_admitted(peer_id) -> bool``), so the averagers ask one question, :meth:`PeerGate.is_gated`,
whatever the reason for keeping a peer out.  The predicate runs in both processes; state it reads
after the fork must itself be process-shared.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from p2ptrain.peerid import base58
from p2ptrain.status import OffenderEntry

logger = logging.getLogger(__name__)

#: Offence kinds, in the order of the shared counters.  A kind names what the peer did, not where.
OFFENCE_KINDS: tuple[str, ...] = (
    "nonfinite_part",     # an averaging part with NaN or inf
    "oversized_part",     # a part far larger (norm or bytes) than the others' or ours
    "malformed_part",     # wrong shape, too many parts, an impossible weight
    "bad_result",         # as reducer, returned a non-finite or implausible average
    "bad_state",          # a downloaded state that failed validation
    "implausible_epoch",  # an epoch claim far above what the run's other peers report
    "bad_model",          # a downloaded model whose loss is implausible for its claimed progress
    "short_state",        # a state download that ended before its last tensor
)

#: Offences that are a judgement (a part far from the others, an average that moved ours far): honest
#: peers can trip them now and then (one fresh from a state download next to a trained one), so a peer
#: is excluded for them only after this many rounds with one, each at least STRIKE_GAP_SECONDS
#: apart (one round's parts count once) and the last within STRIKE_WINDOW_SECONDS.  Non-finite or
#: malformed data and bad states are never honest: they exclude at once.  A state download that ends
#: early is a judgement too: hivemind ends a stream whose connection closed as if it were complete, so
#: an honest donor that left (or whose link broke) mid-transfer looks exactly like one that sent too
#: few tensors on purpose.
JUDGED_KINDS = frozenset({"oversized_part", "bad_result", "short_state"})
JUDGED_STRIKES = 3
STRIKE_GAP_SECONDS = 1.0
STRIKE_WINDOW_SECONDS = 120.0
#: Offenders listed in the status snapshot and the swarm view (newest first).
LISTED_OFFENDERS = 32
#: Default ban: long enough that a peer that keeps misbehaving is out of most rounds.
DEFAULT_BAN_SECONDS = 600.0
_NAME_BYTES = 64
_REASON_BYTES = 120


class _Slot(ctypes.Structure):
    _fields_ = [
        ("digest", ctypes.c_ubyte * 16),
        ("name", ctypes.c_char * _NAME_BYTES),
        ("reason", ctypes.c_char * _REASON_BYTES),
        ("kind", ctypes.c_int32),
        ("count", ctypes.c_int64),
        ("strikes", ctypes.c_int64),
        ("first_at", ctypes.c_double),
        ("last_at", ctypes.c_double),
        # When the last strike was counted: the gap between strikes runs from there, not from the
        # last offence (a sender refused several times a second must still collect its strikes).
        ("strike_at", ctypes.c_double),
        ("until", ctypes.c_double),
    ]


def peer_name(peer: Any) -> str:
    """A peer ID as its base58 string, whether given as a hivemind PeerID, raw bytes or a string."""
    if isinstance(peer, bytes | bytearray):
        return base58(bytes(peer))
    return str(peer)  # a hivemind PeerID's str() is base58 already


def _digest(name: str) -> bytes:
    return hashlib.blake2b(name.encode(), digest_size=16).digest()


@dataclass(frozen=True)
class Offender:
    """One peer on the list, as the JSON API shows it."""

    peer_id: str
    kind: str
    reason: str
    offences: int
    first_at: float
    last_at: float
    #: Unix time the ban ends; None means for the rest of the run.
    banned_until: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class OffenceFigures:
    """What the snapshot says about offences: counts by kind, who is excluded now, the latest offenders."""

    checks_on: bool = False
    by_kind: dict[str, int] = field(default_factory=dict)
    excluded: int = 0
    offenders: tuple[OffenderEntry, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


class PeerGate:
    """A process-shared ban list with expiry, offence counters and an admission predicate."""

    def __init__(self, *, capacity: int = 1024, default_ban_seconds: float = DEFAULT_BAN_SECONDS,
                 admission: Callable[[str], bool] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        ctx = mp.get_context("fork")
        self._slots = ctx.RawArray(_Slot, capacity)
        self._counts = ctx.RawArray(ctypes.c_int64, len(OFFENCE_KINDS))
        self._version = ctx.RawValue(ctypes.c_int64, 0)
        self._used = ctx.RawValue(ctypes.c_int64, 0)  # slots [0, used) have been written at least once
        self._lock = ctx.Lock()
        self.default_ban_seconds = default_ban_seconds
        self._admission = admission
        self._clock = clock

    # ------------------------------------------------------------------ questions

    def set_admission(self, admission: Callable[[str], bool] | None) -> None:
        """Plug in run admission; call before the averagers fork for it to reach them."""
        self._admission = admission

    def admitted(self, peer: Any) -> bool:
        if self._admission is None:
            return True
        try:
            return bool(self._admission(peer_name(peer)))
        except Exception as exc:  # an admission check that breaks must not let strangers in, nor crash
            logger.debug("admission check failed for %s: %r", peer, exc)
            return False

    def is_banned(self, peer: Any) -> bool:
        digest = _digest(peer_name(peer))
        now = self._clock()
        with self._lock:
            return any(bytes(slot.digest) == digest and slot.until > now for slot in self._in_use())

    def is_gated(self, peer: Any) -> bool:
        """True for a peer this node refuses to average with, download from or serve."""
        return self.is_banned(peer) or not self.admitted(peer)

    @property
    def version(self) -> int:
        """Changes on every new ban, so cached views of the swarm know to filter again."""
        return int(self._version.value)

    # ------------------------------------------------------------------ offences

    def offend(self, peer: Any, kind: str, reason: str, *, ban_seconds: float | None = None,
               certain: bool = False) -> None:
        """Count an offence and ban the peer (one WARNING line naming it); never raises.

        An offence of :data:`JUDGED_KINDS` bans only on the peer's :data:`JUDGED_STRIKES`-th round
        with one (until then one INFO line: the part was refused, the peer is not excluded), unless
        ``certain`` (e.g. a non-finite average, which no honest reducer returns)."""
        if kind not in OFFENCE_KINDS:
            raise ValueError(f"unknown offence kind {kind!r}")  # a programming error, not swarm weather
        name = peer_name(peer)
        seconds = self.default_ban_seconds if ban_seconds is None else ban_seconds
        now = self._clock()
        until = now + seconds if math.isfinite(seconds) else math.inf
        needed = JUDGED_STRIKES if kind in JUDGED_KINDS and not certain else 1
        with self._lock:
            self._counts[OFFENCE_KINDS.index(kind)] += 1
            slot = self._slot_for(_digest(name), now)
            if slot.count == 0 or (slot.until <= now and now - slot.last_at > STRIKE_WINDOW_SECONDS):
                slot.first_at, slot.strikes = now, 0
            if slot.strikes == 0 or now - slot.strike_at >= STRIKE_GAP_SECONDS:
                slot.strikes += 1
                slot.strike_at = now
            slot.name = name.encode()[:_NAME_BYTES]
            slot.reason = reason.encode(errors="replace")[:_REASON_BYTES]
            slot.kind = OFFENCE_KINDS.index(kind)
            slot.count += 1
            slot.last_at = now
            strikes, already = int(slot.strikes), slot.until > now
            banning = strikes >= needed
            if banning:
                slot.until = max(slot.until, until)
                self._version.value += 1
        if not banning:
            logger.info("peer %s: %s (%s); refused (%d of %d before it is excluded)", name, kind, reason,
                        strikes, needed)
        elif not already or needed == 1:
            span = "for the rest of the run" if not math.isfinite(until) else f"for {seconds:.0f}s"
            logger.warning("peer %s: %s (%s); excluded %s", name, kind, reason, span)

    def _in_use(self) -> list[_Slot]:
        return [self._slots[i] for i in range(self._used.value)]

    def _slot_for(self, digest: bytes, now: float) -> _Slot:
        """The peer's slot; else one nobody needs any more (no live ban, no strikes still counting), else a
        new one; when the list is full, the strike-holder heard from least recently, else the ban that
        ends first.  A slot whose peer is still collecting strikes is never handed to another peer
        while others are free: two offenders in turn would otherwise wipe each other's strikes for ever."""
        used = self._in_use()
        for slot in used:
            if bytes(slot.digest) == digest:
                return slot
        free = next((slot for slot in used if slot.until <= now and now - slot.last_at > STRIKE_WINDOW_SECONDS),
                    None)
        if free is None and self._used.value < len(self._slots):
            free = self._slots[self._used.value]
            self._used.value += 1
        if free is None:  # full of strike-holders and live bans: a flood of offenders evicts the least useful
            holders = [slot for slot in used if slot.until <= now]
            free = min(holders, key=lambda s: s.last_at) if holders else min(used, key=lambda s: s.until)
        ctypes.memset(ctypes.addressof(free), 0, ctypes.sizeof(_Slot))
        ctypes.memmove(ctypes.addressof(free) + _Slot.digest.offset, digest, 16)
        return free

    def offence_counts(self) -> dict[str, int]:
        """Offences per kind since start (for ``p2ptrain_peer_offenses_total{kind=...}``)."""
        with self._lock:
            return {kind: int(self._counts[i]) for i, kind in enumerate(OFFENCE_KINDS)}

    def offenders(self, *, include_expired: bool = True) -> list[Offender]:
        """Every peer on the list (newest offence first), for the JSON API and the swarm view."""
        now = self._clock()
        with self._lock:
            rows = [
                Offender(peer_id=slot.name.decode(errors="replace"), kind=OFFENCE_KINDS[slot.kind],
                         reason=slot.reason.decode(errors="replace"), offences=int(slot.count),
                         first_at=slot.first_at, last_at=slot.last_at,
                         banned_until=slot.until if math.isfinite(slot.until) else None)
                for slot in self._in_use()
                if slot.count and (include_expired or slot.until > now)
            ]
        return sorted(rows, key=lambda o: -o.last_at)

    def figures(self) -> OffenceFigures:
        """Counts by kind, how many peers are excluded now, and the latest offenders (for the snapshot)."""
        now = self._clock()
        offenders = self.offenders()
        listed = tuple(OffenderEntry(peer_id=o.peer_id, kind=o.kind, reason=o.reason, offences=o.offences,
                                     last_at=o.last_at, banned_until=o.banned_until,
                                     excluded=o.banned_until is None or o.banned_until > now)
                       for o in offenders[:LISTED_OFFENDERS])
        excluded = sum(o.banned_until is None or o.banned_until > now for o in offenders)
        return OffenceFigures(checks_on=True, by_kind=self.offence_counts(), excluded=excluded, offenders=listed)


def no_offences() -> OffenceFigures:
    """The figures of a node without peer checks: every kind at 0."""
    return OffenceFigures(checks_on=False, by_kind=dict.fromkeys(OFFENCE_KINDS, 0))
