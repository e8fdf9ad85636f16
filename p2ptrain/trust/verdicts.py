"""Verdicts on what a peer claims about its state: epochs, optimizer layout, round position, loss.

Every check here is pure (no tensors, no network) and never raises: whatever a peer sent, the worst
outcome is "rejected, because ...".  A verdict says whether the failure is the donor's offence (its
peer is banned) or only a mismatch an honest peer can cause (its state is behind ours).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: No run reaches a billion optimizer epochs; anything above is a lie or garbage.
MAX_EPOCH = 10**9
@dataclass(frozen=True)
class Verdict:
    """Accept or reject, why (one line), and which offence it is (empty: not the donor's fault)."""

    ok: bool
    reason: str = ""
    kind: str = ""
    unconfirmed: bool = False
    """Refused on a view, not a fact (e.g. a model judged against our own, or one peer's report): the
    donor is not blamed for it (in a loss spike every honest donor scores worse than a model from before it)."""

    @classmethod
    def good(cls) -> Verdict:
        return cls(True)

    @classmethod
    def bad(cls, kind: str, reason: str, *, unconfirmed: bool = False) -> Verdict:
        return cls(False, reason, kind, unconfirmed)

    @classmethod
    def refuse(cls, reason: str) -> Verdict:
        """Not usable, but an honest peer could have sent it (e.g. it is behind us)."""
        return cls(False, reason, "")


def check_epoch(value: Any, name: str = "epoch") -> Verdict:
    if not isinstance(value, int) or isinstance(value, bool):
        return Verdict.bad("bad_state", f"{name} is a {type(value).__name__}, not an integer")
    if not 0 <= value <= MAX_EPOCH:
        return Verdict.bad("bad_state", f"{name} {value} is outside 0..{MAX_EPOCH}")
    return Verdict.good()


def _layout(flat: Sequence[Any]) -> list[str]:
    return [entry.get("type", "?") if isinstance(entry, dict) else "?" for entry in flat]


def check_training_metadata(metadata: Any, local_optimizer_metadata: Sequence[dict[str, Any]]) -> Verdict:
    """hivemind ``TrainingStateAverager`` metadata: ``epoch``, ``optimizer_metadata`` (and ``group_bits``).

    ``optimizer_metadata`` is hivemind's flattened optimizer state dict; it must have exactly the
    local optimizer's layout (the same tensor and value slots, tensor indices in order).  Its *values*
    (learning rate, betas, weight decay...) are never adopted: see :func:`merge_optimizer_metadata`.
    """
    if not isinstance(metadata, dict):
        return Verdict.bad("bad_state", f"metadata is a {type(metadata).__name__}, not a map")
    for key in ("epoch", "optimizer_metadata"):
        if key not in metadata:
            return Verdict.bad("bad_state", f"metadata has no {key!r}")
    verdict = check_epoch(metadata["epoch"])
    if not verdict.ok:
        return verdict
    bits = metadata.get("group_bits", "")
    if not isinstance(bits, str) or len(bits) > 256 or set(bits) - {"0", "1"}:
        return Verdict.bad("bad_state", "group_bits is not a short string of 0 and 1")
    flat = metadata["optimizer_metadata"]
    if not isinstance(flat, list):
        return Verdict.bad("bad_state", f"optimizer_metadata is a {type(flat).__name__}, not a list")
    if _layout(flat) != _layout(local_optimizer_metadata):
        return Verdict.bad("bad_state", f"optimizer_metadata layout differs from ours ({len(flat)} entries, "
                                        f"expected {len(local_optimizer_metadata)})")
    expected_index = 0
    for entry in flat:
        if entry["type"] == "tensor":
            if entry.get("index") != expected_index:
                return Verdict.bad("bad_state", f"optimizer tensor index {entry.get('index')!r}, "
                                                f"expected {expected_index}")
            expected_index += 1
        elif "value" not in entry:
            return Verdict.bad("bad_state", "an optimizer value entry has no value")
    return Verdict.good()


def merge_optimizer_metadata(local: Sequence[dict[str, Any]], donor: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The donor's tensor slots with our own hyperparameter values: a donor cannot set our learning
    rate, betas or weight decay through the state it serves."""
    return [dict(theirs) if ours.get("type") == "tensor" else dict(ours) for ours, theirs in zip(local, donor,
                                                                                                 strict=True)]


#: A DiLoCo donor's inner step may run past ``inner_steps`` (a fast peer, or one whose round clock also
#: counts slower peers, makes more inner steps than the average before the round ends; only
#: ``min(inner_step, inner_steps - 1)`` places the schedule), but not beyond this many times it.
MAX_INNER_STEP_FACTOR = 1024


def check_diloco_metadata(metadata: Any, inner_steps: int) -> Verdict:
    """DiLoCo metadata: ``epoch`` (outer round) in range and ``inner_step`` a step count of this round,
    ``0..inner_steps * MAX_INNER_STEP_FACTOR`` (see :data:`MAX_INNER_STEP_FACTOR`)."""
    if not isinstance(metadata, dict):
        return Verdict.bad("bad_state", f"metadata is a {type(metadata).__name__}, not a map")
    for key in ("epoch", "inner_step"):
        if key not in metadata:
            return Verdict.bad("bad_state", f"metadata has no {key!r}")
    verdict = check_epoch(metadata["epoch"])
    if not verdict.ok:
        return verdict
    step = metadata["inner_step"]
    most = inner_steps * MAX_INNER_STEP_FACTOR
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= most:
        return Verdict.bad("bad_state", f"inner_step {step!r} is outside 0..{most}")
    return Verdict.good()


def epoch_ceiling(reference: int, *, slack: int = 10, relative: float = 0.25) -> int:
    """The highest epoch believable when the run's peers report ``reference``.  Epochs advance while
    reports travel through the DHT (fast in small runs), so the margin grows with the run."""
    return reference + max(slack, int(reference * relative))


def plausible_epoch(claim: int, others: Sequence[int], *, own: int, slack: int = 10,
                    relative: float = 0.25) -> Verdict:
    """Is a donor's epoch believable next to what the run's *other* peers report?

    A claim not ahead of ours is not adopted (but is no offence).  Peers at epoch 0 (fresh, not synced)
    say nothing about where the run is; with no other reports the claim stands (the structural and
    model checks still apply).  Otherwise it may exceed the upper median of the others, or our own
    epoch when that is higher, by at most :func:`epoch_ceiling`'s margin: a single other peer is
    believed only that far, a claim far above everyone else's is a lie, and peers lagging behind (a
    record minutes old, a peer that has since left) do not make an honest donor just ahead of us
    look like one.
    """
    if claim <= own:
        # Not ahead of us: nothing to gain (a fresh peer serving its initialisation is no offence).
        return Verdict.refuse(f"epoch {claim} is not ahead of ours ({own})")
    reports = sorted(e for e in others if isinstance(e, int) and 0 < e <= MAX_EPOCH)
    if not reports:
        return Verdict.good()
    median = reports[len(reports) // 2]
    if claim > epoch_ceiling(max(median, own), slack=slack, relative=relative):
        return Verdict.bad("implausible_epoch", f"claims epoch {claim}; the run's other {len(reports)} peer(s) "
                                                f"report {median} (we are at {own})")
    return Verdict.good()


#: Peers' reported validation losses "agree" when all lie within this share of their median.
LOSS_AGREEMENT = 0.25
#: How much worse than the reference a donor's model may score and still be taken.  Honest models
#: wobble by several per cent between evaluations seconds apart (docs/benchmarks.md), a judgement
#: bans the donor for ``swarm.ban_seconds`` (which splits a small swarm), and reports are published
#: minutes apart.  Garbage is far off: constant parameters score ln(256) = 5.5 on the byte-level
#: model against 1-3 for a trained one.
LOSS_TOLERANCE = 0.2
#: Agreeing reports it takes to call a donor's model bad as a fact (an offence) rather than a view.
#: One peer's report may be stale or its own outlier, and our own model may be in a loss spike; in a
#: spike its whole group shares, an honest peer's model can score worse than a freshly initialised
#: one (docs/security.md), so a poor model alone does not make its donor a liar.
LOSS_WITNESSES = 2


def advertised_epoch(metadata: Any, priority: float | None, *, own: int = 0, slack: int = 10) -> Verdict:
    """A donor advertises its epoch as its donor priority (hivemind sets one from the other); a state
    claiming an epoch far above what its donor advertised, and far above ours (``own``), is a lie told
    to jump the queue with a modest priority and a huge claim.  One within reach of ours is refused
    without blame: an advertisement lags its state by one declaration (a newcomer that has just
    downloaded the run's state still advertises the epoch it had), and a state that close to ours is
    worth no ban of a peer we may average with; it can be adopted once its donor advertises it.
    Metadata that is not a map is left to the other checks."""
    epoch = metadata.get("epoch") if isinstance(metadata, dict) else None
    if priority is None or not isinstance(epoch, int) or isinstance(epoch, bool):
        return Verdict.good()
    if math.isfinite(priority) and epoch <= epoch_ceiling(max(0, int(priority)), slack=slack):
        return Verdict.good()
    reason = f"serves epoch {epoch} but advertised {priority:.0f} as a donor"
    if math.isfinite(priority) and epoch <= epoch_ceiling(max(0, own), slack=slack):
        return Verdict.refuse(f"{reason} (an advertisement that lags its state: not adopted now)")
    return Verdict.bad("implausible_epoch", reason)


def check_candidate_loss(candidate: float, *, own: float | None, honest: Sequence[float],
                         tolerance: float = LOSS_TOLERANCE, agreement: float = LOSS_AGREEMENT) -> Verdict:
    """The donor's model, evaluated here on the shared validation batches, against a reference.

    When the run's peers' reports agree (all within ``agreement`` of their median; they evaluate the
    same batches), the median is the reference: a donor worse than ``(1 + tolerance)`` times it is
    rejected, unless this node is itself trained that far (its own loss near the median) and the
    donor is no worse than it.  When reports disagree (one honest report among forged ones is enough)
    or there are none, our own model's loss is the reference.  A fresh node cannot judge by its own
    model (anything beats a random initialisation), so it needs the reports; forged ones can only
    decide when no honest peer reports at all, and what they decide is a ban for a while.  A verdict
    by our own model or by fewer than :data:`LOSS_WITNESSES` reports is :attr:`Verdict.unconfirmed`:
    the state is refused, its donor not blamed.
    """
    if not math.isfinite(candidate):
        return Verdict.bad("bad_model", f"the downloaded model's validation loss is {candidate}")
    slack = 1 + tolerance
    has_own = own is not None and math.isfinite(own)
    reports = sorted(x for x in honest if math.isfinite(x))
    median = reports[len(reports) // 2] if reports else None
    if median is not None and all(abs(x - median) <= agreement * abs(median) for x in reports):
        if candidate <= median * slack + 1e-6:
            return Verdict.good()
        trained = has_own and own <= median * (1 + agreement)  # type: ignore[operator]
        if trained and candidate <= own * slack + 1e-6:  # type: ignore[operator]
            return Verdict.good()
        return Verdict.bad("bad_model", f"validation loss {candidate:.4f} is worse than the median of "
                                        f"{len(reports)} peer(s)' reports {median:.4f}",
                           unconfirmed=len(reports) < LOSS_WITNESSES)
    if not has_own:
        return Verdict.good()
    if candidate > own * slack + 1e-6:  # type: ignore[operator]
        return Verdict.bad("bad_model", f"validation loss {candidate:.4f} is worse than our own model's {own:.4f}",
                           unconfirmed=True)
    return Verdict.good()
