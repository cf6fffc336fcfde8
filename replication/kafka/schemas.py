"""The Kafka listener's schema classes where kio's cannot carry what Kafka sends.

kio models Kafka's ``*TimestampMs`` and ``*TimeMs`` int64 fields as timezone-aware datetimes,
and its reader refuses a negative one ("Cannot parse negative timestamp"). Kafka's own
answers carry -1 in some of them: DescribeTransactions' ``TransactionStartTimeMs`` is -1 for
a transactional id with no open transaction (Kafka's TransactionMetadata.txnStartTimestamp),
so a kio entity could not be read back, and writing -1 through a datetime would depend on
a float's rounding of a time before the epoch.

So for DescribeTransactions v0 the response classes here are kio's, field for field and in
kio's form (frozen dataclasses with the same ``kafka_type`` metadata, readable and writable
by kio's native ``entity_reader``/``entity_writer``), except that ``TransactionStartTimeMs``
is the plain int64 it is on the wire, under Kafka's name. The bytes are the schema's
(DescribeTransactionsResponse.json): an int64 is an int64 whatever Python type stands for it.
:func:`replication.kafka.wire.response_class` answers these instead of kio's, for encoding
on the listener and for reading its answers back.
"""

# No ``from __future__ import annotations``: kio's serializers read the fields' types, which
# must be types, not strings.
from dataclasses import dataclass, field
from typing import ClassVar, Final

from kio.schema.describe_transactions.v0.response import TopicData
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.schema.types import ProducerId, TransactionalId
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32Timedelta, i64

__all__ = ["OWN_RESPONSE_SCHEMAS", "DescribeTransactionsResponse", "TransactionState"]

_DESCRIBE_TRANSACTIONS: Final = i16(65)


class _DescribeTransactionsV0:
    """What kio's classes of DescribeTransactions v0's response say about themselves."""

    __slots__ = ()
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = _DESCRIBE_TRANSACTIONS
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionState(_DescribeTransactionsV0):
    """kio's DescribeTransactions v0 TransactionState, the start time an int64 (-1: none)."""

    __type__: ClassVar = EntityType.nested
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    transactional_id: TransactionalId = field(metadata={"kafka_type": "string"})
    transaction_state: str = field(metadata={"kafka_type": "string"})
    transaction_timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    #: ms since the epoch of the open transaction's start; -1 when none is open
    transaction_start_time_ms: i64 = field(metadata={"kafka_type": "int64"})
    producer_id: ProducerId = field(metadata={"kafka_type": "int64"})
    producer_epoch: i16 = field(metadata={"kafka_type": "int16"})
    topics: tuple[TopicData, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeTransactionsResponse(_DescribeTransactionsV0):
    """kio's DescribeTransactions v0 response, with :class:`TransactionState` in it."""

    __type__: ClassVar = EntityType.response
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    transaction_states: tuple[TransactionState, ...]


#: (API key, version) -> the response class used instead of kio's
OWN_RESPONSE_SCHEMAS: Final[dict[tuple[int, int], type]] = {
    (int(_DESCRIBE_TRANSACTIONS), 0): DescribeTransactionsResponse,
}
