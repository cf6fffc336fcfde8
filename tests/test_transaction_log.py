"""The transaction log's records are versioned JSON: old ones read, newer ones are refused."""

from __future__ import annotations

import json

import pytest

from logstore.errors import CorruptRecordError, KafkaStorageError
from replication.common import TopicPartition
from replication.coordinator.transaction import (
    TXN_RECORD_FORMAT_VERSION,
    TransactionMetadata,
    TxnState,
    _record_doc,
)

pytestmark = pytest.mark.unit


def test_transaction_metadata_round_trips_with_its_format_version() -> None:
    meta = TransactionMetadata(
        "txn-a", 7, 3, 60_000, TxnState.ONGOING, {TopicPartition("t", 1), TopicPartition("t", 0)}
    )
    doc = meta.to_json()
    assert doc["format_version"] == TXN_RECORD_FORMAT_VERSION
    value = json.dumps(doc).encode()
    back = TransactionMetadata.from_json("txn-a", _record_doc(value, "here"))
    assert back == meta
    assert all(isinstance(tp, TopicPartition) for tp in back.partitions)


def test_a_record_written_before_format_version_still_reads() -> None:
    legacy = {"pid": 7, "epoch": 3, "timeout": 60_000, "state": "Empty", "partitions": []}
    legacy.update(start=-1, update=0)
    doc = _record_doc(json.dumps(legacy).encode(), "here")
    assert TransactionMetadata.from_json("txn-a", doc).producer_id == 7


def test_a_newer_or_broken_record_is_refused_with_where_it_is() -> None:
    newer = json.dumps({"format_version": TXN_RECORD_FORMAT_VERSION + 1, "batch": 3}).encode()
    with pytest.raises(KafkaStorageError, match=r"__transaction_state-0 offset 9: .* upgrade"):
        _record_doc(newer, "__transaction_state-0 offset 9")
    with pytest.raises(CorruptRecordError, match="offset 9: transaction log record is not JSON"):
        _record_doc(b"{", "offset 9")
    with pytest.raises(CorruptRecordError, match="not a JSON object"):
        _record_doc(b"[1]", "offset 9")
