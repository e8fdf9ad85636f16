"""The run's record validators judge each exact record once: a search reads the same entries from
every replica it visits, and hivemind checks every copy."""

from __future__ import annotations

from typing import Any

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import SchemaValidator
from hivemind.dht.validation import DHTRecord

from p2ptrain.swarm import records
from p2ptrain.swarm.records import record_validators


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[DHTRecord]:
    seen: list[DHTRecord] = []

    def counted(original: Any) -> Any:
        def validate(self: Any, record: DHTRecord) -> bool:
            seen.append(record)
            return bool(original(self, record))
        return validate

    monkeypatch.setattr(RSASignatureValidator, "validate", counted(RSASignatureValidator.validate))
    return seen


def _signature_validator() -> Any:
    return next(v for v in record_validators("verdictrun") if isinstance(v, RSASignatureValidator))


def test_the_same_record_is_checked_once_and_any_change_is_checked_again(calls: list[DHTRecord]) -> None:
    validator = _signature_validator()
    record = DHTRecord(b"key", b"subkey", b"value", 1000.0)
    assert validator.validate(record) and validator.validate(record)
    assert len(calls) == 1
    for changed in (DHTRecord(b"key", b"subkey", b"value", 1001.0), DHTRecord(b"key", b"subkey", b"other", 1000.0),
                    DHTRecord(b"key", b"sub", b"keyvalue", 1000.0)):  # the same bytes, split elsewhere
        validator.validate(changed)
    assert len(calls) == 4


def test_a_refused_record_stays_refused_and_is_counted_once(calls: list[DHTRecord]) -> None:
    validators = record_validators("verdictrun")
    signature = next(v for v in validators if isinstance(v, RSASignatureValidator))
    # an owned subkey (the node's own key) whose value carries no signature
    record = DHTRecord(signature._key_id, signature.local_public_key, b"value", 1000.0)
    assert not signature.validate(record) and not signature.validate(record)
    assert len(calls) == 1 and signature._counter.total == 1


def test_a_merged_validator_judges_again(calls: list[DHTRecord]) -> None:
    validator = next(v for v in record_validators("verdictrun") if isinstance(v, SchemaValidator))
    record = DHTRecord(b"key", b"subkey", b"value", 1000.0)
    validator.validate(record)
    validator.merge_with(SchemaValidator(records.PeersSchema, prefix="another"))  # hivemind adds the optimizer's
    assert not validator._verdicts
    assert len(records._record_digest(record)) == 16


def test_the_verdicts_kept_are_bounded(monkeypatch: pytest.MonkeyPatch, calls: list[DHTRecord]) -> None:
    monkeypatch.setattr(records, "_VERDICTS_KEPT", 3)
    validator = _signature_validator()
    for i in range(10):
        validator.validate(DHTRecord(b"key", b"subkey", bytes([i]), 1000.0))
    assert len(validator._verdicts) == 3
