"""The small value types of the client API: partitions, record metadata, records, topics.

Every type here is immutable and picklable (named tuples and frozen dataclasses), so it can
cross Spark's driver/executor boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa

from logstore.batch import HEADERS_TYPE
from replication.common import TopicPartition

__all__ = [
    "FETCH_SCHEMA",
    "BrokerInfo",
    "ClusterDescription",
    "ConfigEntry",
    "ConsumerGroupDescription",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "FetchedBatch",
    "HangingTransaction",
    "Header",
    "MemberDescription",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionInfo",
    "ProducerState",
    "RecordBatchMetadata",
    "RecordMetadata",
    "ReplicaLog",
    "SinkCommitResult",
    "TopicDescription",
    "TopicPartition",
    "TransactionHandle",
    "TransactionListing",
]

#: One record header: a string key and a nullable bytes value, as Kafka's.
Header = tuple[str, bytes | None]


class RecordMetadata(NamedTuple):
    """Where an acknowledged record was written.

    ``offset`` is -1 with acks=0 (the broker sends no response). ``timestamp`` is the broker's
    log-append time when the topic uses LogAppendTime, else the record's create time.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class RecordBatchMetadata(NamedTuple):
    """Where a batch sent by :meth:`Producer.send_arrow` was written.

    Record ``i`` of the batch has offset ``base_offset + i``; ``base_offset`` is -1 with acks=0.
    """

    topic: str
    partition: int
    base_offset: int
    record_count: int

    @property
    def last_offset(self) -> int:
        """Offset of the last record (-1 with acks=0)."""
        return -1 if self.base_offset < 0 else self.base_offset + self.record_count - 1


class ConsumerRecord(NamedTuple):
    """One fetched record, as kafka-python's ``ConsumerRecord``.

    ``timestamp_type`` is 0 (CreateTime) or 1 (LogAppendTime); ``headers`` is a tuple of
    ``(key, value)`` pairs (empty when the record has none).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


#: The schema of :attr:`FetchedBatch.batch`: the record columns of
#: :data:`logstore.batch.RECORD_SCHEMA` plus the offset and the timestamp type.
#:
#: ==============  ======================================  ========================================
#: offset          int64, not null                         the record's offset in the partition
#: key             binary                                  null for unkeyed records
#: value           binary                                  null for tombstones
#: timestamp       int64 (ms since the epoch), not null    LogAppendTime batches: the batch's time
#: timestamp_type  int32, not null                         0 CreateTime, 1 LogAppendTime
#: headers         list<struct<key: string, value: binary>>  null or empty: no headers
#: ==============  ======================================  ========================================
FETCH_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("key", pa.binary(), nullable=True),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("timestamp_type", pa.int32(), nullable=False),
        pa.field("headers", HEADERS_TYPE, nullable=True),
    ]
)


class FetchedBatch(NamedTuple):
    """Consecutive records of one partition as Arrow, with schema :data:`FETCH_SCHEMA`."""

    topic: str
    partition: int
    batch: pa.RecordBatch

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def num_rows(self) -> int:
        return int(self.batch.num_rows)


class OffsetAndTimestamp(NamedTuple):
    """The earliest offset whose timestamp is at least the one asked for, and its timestamp."""

    offset: int
    timestamp: int


@dataclass(frozen=True)
class NewTopic:
    """A topic to create. -1 partitions or replication factor take the broker's defaults.

    ``configs`` are topic-level settings with Kafka's names (``retention.ms``, ...).
    """

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionInfo:
    """A partition's leader (-1: none), leader epoch, replicas and in-sync replicas."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionInfo, ...]
    is_internal: bool = False


@dataclass(frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


@dataclass(frozen=True)
class TransactionHandle:
    """The open transaction of one transactional producer, to be committed by someone else.

    A Spark task writes inside a transaction, calls :meth:`Producer.transaction_handle` instead
    of committing, and sends the handle to the driver in its commit message; the driver commits
    the handles of all tasks in one step with :meth:`Admin.commit_sink_batch`. Small, frozen and
    picklable.

    Examples
    --------
    >>> import pickle
    >>> handle = TransactionHandle("sink-q1-task-3", producer_id=4000, producer_epoch=2)
    >>> pickle.loads(pickle.dumps(handle)) == handle
    True
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True)
class SinkCommitResult:
    """What :meth:`Admin.commit_sink_batch` did.

    ``committed`` is True if the transactions were committed as the batch (by this call, or by
    an earlier attempt of it whose answer was lost), False if they were aborted because the
    batch had already been committed (a replayed batch) or an abort was asked.
    ``last_committed_batch`` is the sink's last committed batch after the call (-1: none).
    """

    committed: bool
    last_committed_batch: int


@dataclass(frozen=True)
class TransactionListing:
    """One transaction as the coordinator knows it (as kafka-transactions.sh list/describe).

    ``state`` is Kafka's: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
    CompleteAbort. ``start_time_ms`` is when the open transaction started (-1 when none is
    open); ``partitions`` are the partitions of the open transaction.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    start_time_ms: int
    partitions: tuple[TopicPartition, ...] = ()

    @property
    def is_open(self) -> bool:
        """True while the transaction is Ongoing or being completed (Prepare*)."""
        return self.state in ("Ongoing", "PrepareCommit", "PrepareAbort")


@dataclass(frozen=True)
class ProducerState:
    """A producer a partition's leader knows (DescribeProducers, as Kafka's admin).

    ``current_transaction_start_offset`` is the first offset of its open transaction on the
    partition (-1: none open), ``last_timestamp`` the timestamp of that transaction's first
    batch (-1 when none is open). ``coordinator_epoch`` is the epoch of the last coordinator
    that wrote a marker for it (-1: none yet).
    """

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_transaction_start_offset: int


@dataclass(frozen=True)
class HangingTransaction:
    """An open transaction on a partition that its coordinator does not know as ongoing
    (kafka-transactions.sh find-hanging): it holds the partition's LSO back until aborted."""

    partition: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    #: when its first batch was written (ms since the epoch; -1 if unknown)
    start_time_ms: int
    #: the transactional id of the producer id, if the coordinator knows it
    transactional_id: str | None = None


@dataclass(frozen=True)
class ReplicaLog:
    """One replica's log as the broker holding it reports it (DescribeLogDirs)."""

    broker_id: int
    #: The broker's storage root (``log.dir``, a URL): the replica's segment objects are under
    #: ``<log_dir>/<topic>/<partition>/``.
    log_dir: str
    log_start_offset: int
    #: The next offset this replica will write (in memory: may run ahead of the durable end).
    log_end_offset: int
    #: The end of what is in this replica's segment objects (a follower's fetch offset).
    durable_end_offset: int
    #: This replica's high watermark (a follower learns the leader's with each fetch).
    high_watermark: int
    leader_epoch: int
    is_leader: bool
    size_bytes: int


@dataclass(frozen=True)
class ConfigEntry:
    """One config of a topic or broker as DescribeConfigs reports it."""

    name: str
    #: None for a sensitive key (never sent)
    value: str | None
    #: Kafka's config source: DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG,
    #: DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG or DEFAULT_CONFIG
    source: str
    #: False when AlterConfigs may change it (without a restart)
    read_only: bool
    is_sensitive: bool = False


@dataclass(frozen=True)
class MemberDescription:
    """A member of a consumer group and the partitions assigned to it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: frozenset[TopicPartition]


@dataclass(frozen=True)
class ConsumerGroupDescription:
    """A consumer group: its state (Kafka's: Empty, PreparingRebalance, CompletingRebalance,
    Stable, Dead), assignor, coordinator and members."""

    group_id: str
    state: str
    protocol_type: str
    assignor: str
    coordinator: int
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """Who a consumer is in its group, for ``Producer.send_offsets_to_transaction`` (Kafka's
    ConsumerGroupMetadata): the coordinator refuses the offsets of a member that is no longer
    part of this generation."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class OffsetAndMetadata(tuple[int, str | None]):
    """A committed offset (the next record to read) and its metadata string."""

    def __new__(cls, offset: int, metadata: str | None = None) -> OffsetAndMetadata:
        return super().__new__(cls, (offset, metadata))

    @property
    def offset(self) -> int:
        return self[0]

    @property
    def metadata(self) -> str | None:
        return self[1]
