"""The Kafka listener's own response classes (replication/kafka/schemas.py) write the bytes
of Kafka's schema: the same as kio's classes for every value kio can hold, and -1 where
Kafka sends -1 and kio's class cannot hold it."""

from __future__ import annotations

import datetime
import io
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.describe_transactions.v0.response import TopicData
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import OutOfBoundValue
from kio.static.primitive import i32

from replication.kafka.schemas import OWN_RESPONSE_SCHEMAS
from replication.kafka.wire import response_class

pytestmark = pytest.mark.unit

_START = datetime.datetime(2026, 12, 4, 9, 30, 0, 123000, tzinfo=datetime.UTC)


def _state(**start: Any) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "transactional_id": "orders-1",
        "transaction_state": "Ongoing",
        "transaction_timeout": datetime.timedelta(seconds=60),
        "producer_id": 4711,
        "producer_epoch": 3,
        "topics": (TopicData(topic=TopicName("events"), partitions=(i32(0), i32(2))),),
        **start,
    }


def _bytes(cls: Any, body: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(cls)(out, body)
    return out.getvalue()


def _response(cls: Any, **start: Any) -> Any:
    state_cls = cls.__dataclass_fields__["transaction_states"].type.__args__[0]
    return cls(
        throttle_time=datetime.timedelta(0), transaction_states=(state_cls(**_state(**start)),)
    )


def test_describe_transactions_writes_kios_bytes_and_minus_one_for_no_start_time() -> None:
    ours: Any = response_class(65, 0)
    assert ours is OWN_RESPONSE_SCHEMAS[(65, 0)]
    kio: Any = load_response_schema(65, 0)
    ms = int(_START.timestamp() * 1000)
    assert _bytes(ours, _response(ours, transaction_start_time_ms=ms)) == _bytes(
        kio, _response(kio, transaction_start_time=_START)
    )
    none = _bytes(ours, _response(ours, transaction_start_time_ms=-1))
    assert b"\xff" * 8 in none
    body: Any
    body, size = entity_reader(ours)(none, 0)
    assert size == len(none)
    assert body.transaction_states[0].transaction_start_time_ms == -1
    with pytest.raises(OutOfBoundValue):  # why kio's own class cannot be the reader
        entity_reader(kio)(none, 0)
