"""Which donors a state download blames: a model judged against our own, or against one peer's report,
is refused and nobody blamed (every honest donor in a loss spike scores worse than a model from before
it); a model worse than what several peers agree on is an offence."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from p2ptrain.averaging.donors import StateDownloads
from p2ptrain.trust.verdicts import Verdict, check_candidate_loss

OUR_LOSS = 3.39


class Downloader:
    """The download policy with a stand-in for the averager's process that answers ``ask``."""

    def __init__(self, policy: StateDownloads, ask: Any) -> None:
        self.policy, self.ask = policy, ask

    def download_state(self, timeout: float) -> Any:
        return self.policy.download(self.ask, timeout)

    @property
    def last_download_rejections(self) -> list[tuple[str, str]]:
        return self.policy.rejections


class RecordingGate:
    def __init__(self) -> None:
        self.offences: list[tuple[str, str]] = []

    def offend(self, peer: Any, kind: str, reason: str, **_: Any) -> None:
        self.offences.append((str(peer), kind))


def downloader(losses: dict[str, float], reports: tuple[float, ...] = ()) -> tuple[Downloader, RecordingGate]:
    """Donors answer in the given order, and each one's model scores its loss here against the run's
    ``reports`` or, with none, our own model's."""
    gate = RecordingGate()
    queue = list(losses)

    def ask(tried: set[str], validator: Any, timeout: float) -> dict[str, Any] | None:
        return {"failures": [], "donor": queue.pop(0), "metadata": {"epoch": 11}, "tensors": []} if queue else None

    class Validator:  # the two calls of a StateValidator made here, judging by the loss alone
        def own_epoch(self) -> int:
            return 11

        def __call__(self, metadata: Any, tensors: Any, donor: str) -> Verdict:
            return check_candidate_loss(losses[donor], own=OUR_LOSS, honest=reports)

    policy = StateDownloads(gate, validator=Validator(), max_donors=len(losses) + 1,  # type: ignore[arg-type]
                            state_ban_seconds=float("inf"), judgement_ban_seconds=600.0)
    return Downloader(policy, ask), gate


def test_donors_that_all_score_worse_than_our_model_are_not_adopted_and_not_blamed(caplog):
    averager, gate = downloader({"QmHonestA": 4.24, "QmHonestB": 4.57})
    with caplog.at_level(logging.INFO, logger="p2ptrain.averaging.donors"):
        assert averager.download_state(timeout=10) is None
    assert gate.offences == [] and [peer for peer, _ in averager.last_download_rejections] == ["QmHonestA",
                                                                                                "QmHonestB"]
    assert "2 refused as worse than the reference, nobody blamed" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.parametrize("reports", [(), (3.63,)])
def test_a_model_in_a_spike_is_refused_but_not_blamed_on_our_own_word_or_one_peer_s(reports):
    """One demo run: a group's shared model spiked to 5.75-6.13 (a fresh one scores 5.31); a node of that
    group downloading judged a groupmate's state against one peer's report from 16 s before."""
    averager, gate = downloader({"QmSpiked": 6.13, "QmHonest": 3.41}, reports)
    download = averager.download_state(timeout=10)
    assert download is not None and download.donor == "QmHonest" and gate.offences == []
    assert [peer for peer, _ in averager.last_download_rejections] == ["QmSpiked"]


def test_a_model_worse_than_what_several_peers_agree_on_is_an_offence():
    averager, gate = downloader({"QmGarbage": 5.55, "QmHonest": 3.41}, reports=(3.3, 3.5))
    download = averager.download_state(timeout=10)
    assert download is not None and download.donor == "QmHonest"
    assert gate.offences == [("QmGarbage", "bad_model")]


@pytest.mark.parametrize(("reports", "unconfirmed"), [((3.1, 2.9, 3.05), False), ((3.1, 2.9), False),
                                                      ((3.0,), True), ((), True)])
def test_a_judgement_is_a_fact_only_with_several_agreeing_reports(reports, unconfirmed):
    verdict = check_candidate_loss(5.5, own=3.0, honest=reports)
    assert not verdict.ok and verdict.kind == "bad_model" and verdict.unconfirmed == unconfirmed
