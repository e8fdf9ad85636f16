"""The math of a robust all-reduce part: screen each sender's part, cap its weight, aggregate robustly.

No networking here: :mod:`p2ptrain.averaging.allreduce` calls these from inside hivemind's reducer,
once every sender's copy of one part has arrived.

Why CenteredClip rather than a coordinate-wise trimmed mean.  Our groups are small (2 to 16 peers):
a trimmed mean that drops one value per side out of three is a median and throws away two thirds of
honest information in every coordinate, every round, attack or not.  CenteredClip (the rule of
"Secure Distributed Training at Scale", BTARD) starts at the coordinate-wise median and moves towards
every sender, each pull clipped to a radius.  We take the radius from the parts themselves: a
factor times the median distance of the parts from the median.  In high dimension honest parts sit at
nearly the same distance from their centre, so with a factor of 2 no honest part is clipped, the first
step lands exactly on the weighted mean, and an honest round costs one median and one pass; a part
a hundred times further away moves the result by at most its clipped pull, ``weight / total * radius``.

Before aggregating, parts that are plainly wrong are rejected per sender (and their senders named):
a dtype that is not a float type, non-finite values, an impossible weight, and a norm far above a
reference no single other sender can set.  In a group of three or more that is the upper median of
the part norms (or our own part's, when larger: we trust ourselves, and a peer cannot lower our
reference by sending zeros).  With fewer, the upper median of two is the larger norm, which the other
sender picks; so a pair bounds the other sender by our own part alone, with a ratio of its own per rule
(:attr:`ReduceRule.pair_norm_ratio`).  A part is a chunk of one tensor, and honest chunks can be
nearly all zeros on one peer and not on another (embedding rows one peer never used, a bias still at
its zero initialisation), so "our own part" is never taken below its tensor's RMS (in parameter rounds:
our whole vector's) times the chunk's size (:func:`part_floors`).  Two senders cannot outvote each
other: a pair gets these checks and the weighted mean, not CenteredClip, and what it cannot be
protected from is in docs/security.md.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing as mp
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

#: Parameter and DiLoCo rounds: a pair's other sender may send parts up to this many times ours.
PARAMETER_PAIR_RATIO = 8.0
#: The dtypes honest peers send parts in (hivemind restores each part in the dtype its sender names).
PART_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


@dataclass(frozen=True)
class ReduceRule:
    """How one averager bounds each sender's contribution."""

    #: A sender's self-reported weight is capped here (what its samples can plausibly be).
    max_weight: float = math.inf
    #: ... and at this many times the reference weight (ours when we send one, else the median):
    #: volunteers' machines differ 2-10x in speed, a sender claiming far more samples than that lies.
    max_weight_ratio: float = math.inf
    #: A part whose norm exceeds this times the reference norm is rejected.  Honest gradients differ
    #: by up to ~10x (a peer fresh from its initialisation next to a trained one): 25 leaves room.
    max_norm_ratio: float = 25.0
    #: With fewer than three parts, the other sender's part is rejected above this times our own part's
    #: norm (at least its floor: see :func:`part_floors`).
    pair_norm_ratio: float = 25.0
    #: A reducer's returned change to our part above this times our part's norm (at least its floor)
    #: is refused.
    max_result_ratio: float = 25.0
    #: Our own part is never taken as smaller than this share of our whole vector's RMS per element.
    #: Parameter chunks of honest replicas are alike, their zero-initialised biases aside: 1.  Gradients
    #: differ by orders of magnitude between tensors: 0 (each part is floored by its own tensor only).
    vector_floor: float = 0.0
    #: Slack per element (times sqrt(numel)) added to every norm bound, for near-zero parts.
    abs_tolerance: float = 1e-6
    clip_radius_factor: float = 2.0
    clip_iterations: int = 5
    min_senders_for_clip: int = 3

    @classmethod
    def for_gradients(cls, max_weight: float, max_weight_ratio: float = 8.0) -> ReduceRule:
        """Gradient rounds: weight = samples accumulated, at most ``max_weight`` (the target batch)
        and ``max_weight_ratio`` times the reference weight."""
        # A pair's bound is loose: a peer whose download failed computes gradients on its own fresh
        # model, up to ~30x larger than a trained peer's (tests/unit/test_robustreduce.py),
        # and the optimizer clips the averaged gradient anyway.
        return cls(max_weight=max_weight, max_weight_ratio=max_weight_ratio, pair_norm_ratio=64.0)

    @classmethod
    def for_parameters(cls) -> ReduceRule:
        """Parameter rounds (drift repair): every peer weighs 1, parameters differ only by drift."""
        # No bound on the distance from ours: a node fresh from a state download (a donor a
        # few epochs behind) differs by that much, which is what these rounds repair.  Parameter chunks
        # are not sparse, so a pair's bound is tight: a replica trained for hundreds of steps next to
        # one still at its initialisation is up to ~4x apart in norm (with the floor of part_floors),
        # hence 8.
        return cls(max_weight=1.0, abs_tolerance=1e-3, pair_norm_ratio=PARAMETER_PAIR_RATIO,
                   max_result_ratio=PARAMETER_PAIR_RATIO + 1, vector_floor=1.0)

    @classmethod
    def for_diloco(cls, max_weight: float, max_weight_ratio: float = 8.0) -> ReduceRule:
        """DiLoCo rounds average parameters weighted by the samples of the round; weights are capped
        as in gradient rounds."""
        # No bound on how far a peer's parameters are from ours: peers of different speeds make
        # different numbers of inner steps, so honest replicas differ by a round's worth of training,
        # which is what the round averages away.  Norms (25x the group's), finiteness and weights
        # are still checked, and groups of three or more are combined with CenteredClip.
        # A pair: the same tight bound as parameter rounds (a round starts from shared outer parameters).
        return cls(max_weight=max_weight, max_weight_ratio=max_weight_ratio, abs_tolerance=1e-3,
                   pair_norm_ratio=PARAMETER_PAIR_RATIO, max_result_ratio=PARAMETER_PAIR_RATIO + 1, vector_floor=1.0)


@dataclass(frozen=True)
class Rejection:
    kind: str
    reason: str


def _bound(rule_ratio: float, norm: float, numel: int, rule: ReduceRule) -> float:
    return rule_ratio * norm + rule.abs_tolerance * math.sqrt(max(numel, 1))


def _part_norm(tensor: torch.Tensor) -> float:
    # Half precision overflows at 65504: an honest part's norm can be larger than that.
    return float((tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor).norm())


def part_floors(tensors: Sequence[torch.Tensor], num_parts_by_tensor: Sequence[int], part_numels: Sequence[int],
                vector_floor: float) -> list[float]:
    """For each part (in hivemind's order: every tensor's chunks, tensor after tensor), the least norm our
    own copy of it counts as when it is the reference: its tensor's RMS times the part's size, or
    ``vector_floor`` times our whole vector's RMS if that is more (zeros for anything unreadable).

    A chunk can be nearly all zeros on one peer and not on another (embedding rows one peer never
    used, a bias still at its zero initialisation): our own chunk alone would make honest peers liars."""
    try:
        norms = [_part_norm(t.detach()) for t in tensors]
        total = sum(t.numel() for t in tensors)
        vector_rms = math.sqrt(sum(n * n for n in norms) / total) if total else 0.0
        floors: list[float] = []
        numels = iter(part_numels)
        for tensor, norm, count in zip(tensors, norms, num_parts_by_tensor, strict=True):
            rms = max(norm / math.sqrt(max(tensor.numel(), 1)), vector_floor * vector_rms)
            floors += [rms * math.sqrt(next(numels)) for _ in range(count)]
    except Exception:  # our own tensors; if they cannot be read there is no floor
        return [0.0] * len(part_numels)
    return [floor if math.isfinite(floor) else 0.0 for floor in floors]


def dtype_name(value: object) -> str:
    """A part's dtype as a peer would name it ("int64"), or the type of something that is no tensor."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "")
    return type(value).__name__


def _screen_one(tensor: object, weight: object) -> Rejection | float:
    """One contribution's own checks: a Rejection, or the part's norm."""
    if not (isinstance(weight, int | float) and not isinstance(weight, bool) and math.isfinite(weight)
            and weight >= 0):
        return Rejection("malformed_part", f"weight {weight!r}")
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in PART_DTYPES:
        return Rejection("malformed_part", f"part of dtype {dtype_name(tensor)}")
    try:
        if not bool(torch.isfinite(tensor).all()):
            return Rejection("nonfinite_part", "part has NaN or inf values")
        norm = _part_norm(tensor)
    except Exception as exc:  # whatever a peer sends, the check must not raise into hivemind's reducer
        return Rejection("malformed_part", f"unreadable part ({type(exc).__name__})")
    return norm if math.isfinite(norm) else Rejection("nonfinite_part", "part's norm overflows")


def screen_parts(parts: Mapping[int, tuple[torch.Tensor, float]], local: int | None, rule: ReduceRule,
                 own_floor: float = 0.0) -> tuple[dict[int, tuple[torch.Tensor, float]], dict[int, Rejection]]:
    """Split one part's contributions (sender index -> (tensor, weight)) into accepted and rejected.

    Our own contribution (``local``) is never an offence; it is only left out if it is unusable.
    ``own_floor`` is the least norm our own part counts as when it is the reference (:func:`part_floors`).
    Accepted weights come back capped.  Never raises.
    """
    accepted: dict[int, tuple[torch.Tensor, float]] = {}
    rejected: dict[int, Rejection] = {}
    norms: dict[int, float] = {}
    for sender, (tensor, weight) in parts.items():
        verdict = _screen_one(tensor, weight)
        if isinstance(verdict, Rejection):
            rejected[sender] = verdict
        else:
            norms[sender] = verdict
            accepted[sender] = (tensor, min(float(weight), rule.max_weight))
    own = accepted.get(local) if local is not None else None
    # Our own part is a reference only when we sent it with a weight (a peer tagging along with weight 0
    # sends whatever its buffers hold).
    trusted_own = own is not None and own[1] > 0
    own_reference = max(norms[local], own_floor) if trusted_own else 0.0  # type: ignore[index]
    if len(norms) >= 3:
        # The upper median, or our own part's when that is larger: a node whose own part is small (fresh
        # from a state download, a short accumulation) must not take an honest majority for liars.
        ordered = sorted(norms.values())
        reference, ratio = max(ordered[len(ordered) // 2], own_reference), rule.max_norm_ratio
    else:
        # Two parts: the upper median would be the other sender's own; only ours is a reference.
        reference, ratio = own_reference, rule.pair_norm_ratio
    for sender in list(accepted):
        if sender == local:
            continue
        tensor = accepted[sender][0]
        limit = _bound(ratio, reference, tensor.numel(), rule)
        if reference > 0 and norms[sender] > limit:
            rejected[sender] = Rejection("oversized_part", f"norm {norms[sender]:.3g} > {limit:.3g}")
            del accepted[sender]
    if local is not None and local in parts and local not in accepted:
        rejected.pop(local, None)  # our own bad part is dropped silently: not an offence of a peer
    if math.isfinite(rule.max_weight_ratio) and accepted:
        own_weight = accepted[local][1] if local in accepted else 0.0
        weights = sorted(weight for _, weight in accepted.values())
        reference = own_weight if own_weight > 0 else weights[len(weights) // 2]
        if reference > 0:
            cap = rule.max_weight_ratio * reference
            accepted = {sender: (tensor, min(weight, cap)) for sender, (tensor, weight) in accepted.items()}
    return accepted, rejected


def centered_clip(parts: torch.Tensor, weights: torch.Tensor, radius_factor: float,
                  iterations: int) -> tuple[torch.Tensor, int]:
    """CenteredClip over the rows of ``parts`` (n x d); returns the aggregate and how many rows were
    clipped in the last step.  The radius is ``radius_factor`` times the median distance of the rows
    from their coordinate-wise median; with no row clipped a step lands on the weighted mean exactly."""
    total = weights.sum()
    if float(total) <= 0:
        weights, total = torch.ones_like(weights), torch.tensor(float(len(weights)))
    center = parts.median(dim=0).values
    distances = (parts - center).norm(dim=1)
    radius = radius_factor * float(distances.sort().values[len(distances) // 2])
    clipped = 0
    for _ in range(max(1, iterations)):
        diff = parts - center
        distances = diff.norm(dim=1)
        scale = torch.where(distances > radius, radius / distances.clamp_min(1e-30), torch.ones_like(distances))
        clipped = int((scale < 1).sum())
        center = center + (weights * scale) @ diff / total
        if clipped == 0:
            break
    return center, clipped


def aggregate(parts: list[torch.Tensor], weights: list[float], rule: ReduceRule) -> tuple[torch.Tensor, int]:
    """The weighted mean (fewer than ``min_senders_for_clip`` parts) or CenteredClip of accepted parts."""
    stacked = torch.stack([p.reshape(-1).float() for p in parts])
    w = torch.tensor(weights, dtype=torch.float32)
    shape = parts[0].shape
    if len(parts) < rule.min_senders_for_clip:
        total = float(w.sum())
        if total <= 0:
            w, total = torch.ones_like(w), float(len(parts))
        return (w @ stacked / total).reshape(shape), 0
    result, clipped = centered_clip(stacked, w, rule.clip_radius_factor, rule.clip_iterations)
    return result.reshape(shape), clipped


def check_result(delta: torch.Tensor, local_part: torch.Tensor, rule: ReduceRule, own_floor: float = 0.0) -> str:
    """Why a reducer's returned change to our part is refused ("" if it is fine).  Never raises.

    The bound is ``max_result_ratio`` times our part's norm, at least ``own_floor`` (:func:`part_floors`);
    against a part of ours that is all zeros and no floor (nothing to compare with) only finiteness is
    checked."""
    if not isinstance(delta, torch.Tensor) or delta.dtype not in PART_DTYPES:
        return f"returned dtype {dtype_name(delta)}"
    if delta.shape != local_part.shape:
        return f"returned shape {tuple(delta.shape)}, expected {tuple(local_part.shape)}"
    try:
        if not bool(torch.isfinite(delta).all()):
            return "returned NaN or inf"
        own = max(_part_norm(local_part), own_floor)
        size = _part_norm(delta)
    except Exception as exc:  # whatever a peer sends, the check must not raise into hivemind's container
        return f"returned an unreadable part ({type(exc).__name__})"
    if not math.isfinite(size):
        return "returned NaN or inf"
    if own > 0:
        limit = _bound(rule.max_result_ratio, own, delta.numel(), rule)
        if size > limit:
            return f"moved our part by {size:.3g} > {limit:.3g}"
    return ""


@dataclass(frozen=True)
class AllReduceReport:
    """What one all-reduce round looked like from this node (sent from the averager's process)."""

    averager: str
    group_size: int
    #: The group's peer IDs (this node's among them), as libp2p authenticated them.
    peers: tuple[str, ...]
    senders: int
    #: (sender, part) contributions this node was to reduce, and how many it accepted.
    contributions_expected: int
    contributions_received: int
    #: Elements of our own tensors averaged by the group, and how many came back usable.
    results_expected: int
    results_received: int
    #: (peer ID, offence kind, reason) for every sender or reducer refused this round.
    rejected: tuple[tuple[str, str, str], ...]
    clipped: int
    ok: bool
    finished_at: float
    #: (peer ID, weight) of every sender whose parts this node reduced and accepted, the weight as the
    #: reduce rule capped it (gradient and DiLoCo rounds: its samples); what this node can vouch for.
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def received_fraction(self) -> float:
        """Fraction of expected contributions actually received (1.0 when none were expected)."""
        if self.contributions_expected == 0:
            return 1.0
        return self.contributions_received / self.contributions_expected

    @property
    def averaged_fraction(self) -> float:
        """How much of this round was really averaged, as this node saw it: the smaller of the share
        of contributions it received as a reducer and the share of its own tensors that came back
        averaged from the other reducers (their parts refused or missing keep our own values)."""
        results = self.results_received / self.results_expected if self.results_expected > 0 else 1.0
        return max(0.0, min(1.0, self.received_fraction, results))

    def met(self, own: str) -> tuple[str, ...]:
        """Peers this node averaged with in this round: the group less itself and those refused."""
        if not self.ok:
            return ()
        refused = {peer for peer, _, _ in self.rejected}
        return tuple(peer for peer in self.peers if peer != own and peer not in refused)

    def shares(self, own: str) -> dict[str, float]:
        """The weights this node accepted from the peers it averaged with in this round (its own left out)."""
        met = set(self.met(own))
        return {peer: weight for peer, weight in self.weights if peer in met}


class RoundReports:
    """A fork-shared queue of :class:`AllReduceReport` from averager processes to the node.

    Create it before the averagers fork.  ``put`` never blocks the averager's event loop: when the
    node has not drained ``capacity`` reports, new ones are dropped and counted.
    """

    def __init__(self, capacity: int = 32) -> None:
        ctx = mp.get_context("fork")
        self._queue = ctx.SimpleQueue()
        self._pending = ctx.RawValue(ctypes.c_int64, 0)
        self._dropped = ctx.RawValue(ctypes.c_int64, 0)
        self._lock = ctx.Lock()
        self._capacity = capacity

    def put(self, report: AllReduceReport) -> None:
        # The count goes up only once the report is wholly in the pipe, so drain() never waits for
        # one that is still being written; at most ``capacity`` small reports fit the pipe's buffer.
        with self._lock:
            if self._pending.value >= self._capacity:
                self._dropped.value += 1
                return
            self._queue.put(report)
            self._pending.value += 1

    def drain(self) -> list[AllReduceReport]:
        """Every report waiting now; never blocks for long (an averager mid-write: try later)."""
        if not self._lock.acquire(timeout=0.1):
            return []
        try:
            reports = [self._queue.get() for _ in range(self._pending.value)]
            self._pending.value = 0
        finally:
            self._lock.release()
        return reports

    def latest(self) -> AllReduceReport | None:
        """The newest report waiting now (the others are dropped), or None."""
        reports = self.drain()
        return reports[-1] if reports else None

    @property
    def dropped(self) -> int:
        return int(self._dropped.value)
