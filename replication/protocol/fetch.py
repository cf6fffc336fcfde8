"""Messages of the read APIs: Fetch (1, with KIP-227 sessions and diverging epochs),
ListOffsets (2), OffsetForLeaderEpoch (23)."""

from __future__ import annotations

from dataclasses import field
from typing import Final

from replication.protocol.api import (
    CONSUMER_REPLICA_ID,
    READ_UNCOMMITTED,
)
from replication.protocol.codec import (
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_BYTES,
    STRING,
    Array,
    Bytes,
    Struct,
    array_field,
    message,
    wire,
)

# --- Fetch (1) ------------------------------------------------------------------------------------


@message
class FetchRequestPartition:
    partition: int = field(metadata=wire(INT32))
    current_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    fetch_offset: int = field(metadata=wire(INT64))
    last_fetched_epoch: int = field(default=-1, metadata=wire(INT32))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    partition_max_bytes: int = field(metadata=wire(INT32))


@message
class FetchRequestTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[FetchRequestPartition] = array_field(FetchRequestPartition)


@message
class ForgottenTopic:
    """Partitions an incremental fetch drops from its session."""

    topic: str = field(metadata=wire(STRING))
    partitions: list[int] = array_field(INT32)


@message
class FetchRequest:
    """Fetch records (a consumer has replica_id -1; a follower its broker id).

    Sessions as KIP-227: session_id 0 and session_epoch 0 open a session (full fetch);
    session_epoch -1 is a full fetch without a session; later requests name the session and
    the next epoch, and list only changed partitions (and forgotten ones).
    """

    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=wire(INT32))
    max_wait_ms: int = field(default=500, metadata=wire(INT32))
    min_bytes: int = field(default=1, metadata=wire(INT32))
    max_bytes: int = field(default=52428800, metadata=wire(INT32))
    isolation_level: int = field(default=READ_UNCOMMITTED, metadata=wire(INT8))
    session_id: int = field(default=0, metadata=wire(INT32))
    session_epoch: int = field(default=-1, metadata=wire(INT32))
    topics: list[FetchRequestTopic] = array_field(FetchRequestTopic)
    forgotten_topics_data: list[ForgottenTopic] = array_field(ForgottenTopic)
    rack_id: str = field(default="", metadata=wire(STRING))


@message
class EpochEndOffset:
    """Where the leader's log diverges from the follower's (-1, -1: it does not)."""

    epoch: int = field(default=-1, metadata=wire(INT32))
    end_offset: int = field(default=-1, metadata=wire(INT64))


@message
class LeaderIdAndEpoch:
    """The current leader, when the fetch went to a broker that is not it (-1, -1: unknown)."""

    leader_id: int = field(default=-1, metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))


@message
class AbortedTransaction:
    producer_id: int = field(metadata=wire(INT64))
    first_offset: int = field(metadata=wire(INT64))


_NO_DIVERGENCE: Final = EpochEndOffset()
_NO_LEADER: Final = LeaderIdAndEpoch()


@message
class FetchResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    high_watermark: int = field(default=-1, metadata=wire(INT64))
    last_stable_offset: int = field(default=-1, metadata=wire(INT64))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    diverging_epoch: EpochEndOffset = field(
        default=_NO_DIVERGENCE, metadata=wire(Struct(EpochEndOffset))
    )
    current_leader: LeaderIdAndEpoch = field(
        default=_NO_LEADER, metadata=wire(Struct(LeaderIdAndEpoch))
    )
    aborted_transactions: list[AbortedTransaction] | None = field(
        default=None, metadata=wire(Array(AbortedTransaction, nullable=True))
    )
    preferred_read_replica: int = field(default=-1, metadata=wire(INT32))
    records: Bytes | None = field(default=None, repr=False, metadata=wire(NULLABLE_BYTES))


@message
class FetchResponseTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[FetchResponsePartition] = array_field(FetchResponsePartition)


@message
class FetchResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    session_id: int = field(default=0, metadata=wire(INT32))
    responses: list[FetchResponseTopic] = array_field(FetchResponseTopic)


# --- ListOffsets (2) ----------------------------------------------------------------------------


@message
class ListOffsetsRequestPartition:
    """timestamp: LATEST_TIMESTAMP (-1), EARLIEST_TIMESTAMP (-2), MAX_TIMESTAMP (-3), or a time
    in ms."""

    partition_index: int = field(metadata=wire(INT32))
    current_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    timestamp: int = field(metadata=wire(INT64))


@message
class ListOffsetsRequestTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[ListOffsetsRequestPartition] = array_field(ListOffsetsRequestPartition)


@message
class ListOffsetsRequest:
    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=wire(INT32))
    isolation_level: int = field(default=READ_UNCOMMITTED, metadata=wire(INT8))
    topics: list[ListOffsetsRequestTopic] = array_field(ListOffsetsRequestTopic)


@message
class ListOffsetsResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    timestamp: int = field(default=-1, metadata=wire(INT64))
    offset: int = field(default=-1, metadata=wire(INT64))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))


@message
class ListOffsetsResponseTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[ListOffsetsResponsePartition] = array_field(ListOffsetsResponsePartition)


@message
class ListOffsetsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[ListOffsetsResponseTopic] = array_field(ListOffsetsResponseTopic)


# --- OffsetForLeaderEpoch (23) --------------------------------------------------------------------


@message
class OffsetForLeaderPartition:
    partition: int = field(metadata=wire(INT32))
    current_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    leader_epoch: int = field(metadata=wire(INT32))


@message
class OffsetForLeaderTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[OffsetForLeaderPartition] = array_field(OffsetForLeaderPartition)


@message
class OffsetsForLeaderEpochRequest:
    """For each partition, the end offset of ``leader_epoch`` on the leader (KIP-101/279)."""

    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=wire(INT32))
    topics: list[OffsetForLeaderTopic] = array_field(OffsetForLeaderTopic)


@message
class OffsetForLeaderPartitionResult:
    """Kafka's ``EpochEndOffset`` of this API: the largest epoch <= the one asked, its end."""

    error_code: int = field(default=0, metadata=wire(INT16))
    partition: int = field(metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    end_offset: int = field(default=-1, metadata=wire(INT64))


@message
class OffsetForLeaderTopicResult:
    topic: str = field(metadata=wire(STRING))
    partitions: list[OffsetForLeaderPartitionResult] = array_field(OffsetForLeaderPartitionResult)


@message
class OffsetsForLeaderEpochResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[OffsetForLeaderTopicResult] = array_field(OffsetForLeaderTopicResult)
