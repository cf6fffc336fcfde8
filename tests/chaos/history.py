"""What a chaos run records: the operations the workloads saw, and the cluster's final state.

The workloads append to a :class:`History` while the nemesis injects faults (every list is
appended to from several threads; ``list.append`` is atomic in CPython). After the cluster is
healed and quiet, the runner fills a :class:`FinalState` from the leaders and from every
replica's storage. :mod:`tests.chaos.checker` judges the two together; nothing here checks.

Values name their writer, so the checker needs no other bookkeeping:

- an idempotent producer writes ``p<n>.<k>-<seq:06d>`` (``p1.0-000123``): worker ``n``'s
  ``k``-th producer (a new producer id each), seq counting from 0 per worker;
- the transactional producer writes ``t<txn:06d>-<i>``: record ``i`` of transaction ``txn``;
- on confluent-kafka (:mod:`tests.chaos.kafka_workload`), an idempotent producer writes
  ``pk<n>.<k>-<seq:06d>`` and the consume-transform-produce loop
  ``kt<txn:06d>-<i>:<partition>@<offset>`` (:func:`transformed_value`): output ``i`` of its
  transaction ``txn``, made from the record at ``offset`` of ``partition`` of its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

#: A topic partition as the checker keys it.
TP = tuple[str, int]

Outcome = Literal["committed", "aborted", "unknown"]
Isolation = Literal["read_uncommitted", "read_committed"]


def producer_value(producer: str, seq: int) -> str:
    return f"{producer}-{seq:06d}"


def parse_producer_value(value: str) -> tuple[str, int] | None:
    """``("p1.0", 123)`` for ``"p1.0-000123"``; None for a value no idempotent producer wrote."""
    name, sep, seq = value.rpartition("-")
    if not sep or not name.startswith("p") or not seq.isdigit():
        return None
    return name, int(seq)


def txn_value(txn: int, index: int) -> str:
    return f"t{txn:06d}-{index}"


def transformed_value(txn: int, index: int, partition: int, offset: int) -> str:
    """``"kt000012-3:1@456"``: output ``index`` of the consume-transform-produce loop's
    transaction ``txn``, made from the record at ``offset`` of partition ``partition`` of the
    loop's source topic."""
    return f"kt{txn:06d}-{index}:{partition}@{offset}"


def parse_transformed_value(value: str) -> tuple[int, int] | None:
    """``(1, 456)`` (the input's partition and offset) for ``"kt000012-3:1@456"``; None for a
    value the consume-transform-produce loop did not write."""
    name, sep, source = value.partition(":")
    partition, at, offset = source.partition("@")
    if not (sep and at and name.startswith("kt") and partition.isdigit() and offset.isdigit()):
        return None
    return int(partition), int(offset)


@dataclass(frozen=True)
class Fault:
    """A fault the nemesis injected, from its first action to its heal."""

    fault_class: str
    #: time.monotonic() of the first action and of the heal
    start: float
    end: float
    #: what was done to whom, for the report (brokers, partition, durations)
    detail: dict[str, object] = field(default_factory=dict)


#: An :class:`Ack`'s offset when the client was told the record is stored but not where
#: (librdkafka's delivery report of a retried batch the broker already had, with no offset).
NO_OFFSET = -1


@dataclass(frozen=True)
class Ack:
    """An idempotent producer's record was acknowledged (acks=all) at ``offset`` (or at an
    offset it was not told: :data:`NO_OFFSET`)."""

    producer: str
    value: str
    topic: str
    partition: int
    offset: int
    #: time.monotonic() when the ack arrived
    time: float


@dataclass(frozen=True)
class SendFailure:
    """A send that failed: its record may be stored once, or not at all, never twice."""

    producer: str
    value: str
    partition: int
    error: str


@dataclass(frozen=True)
class Transaction:
    """One transaction of the transactional producer and what the client was told.

    ``committed``: commit_transaction() returned; ``aborted``: abort_transaction() returned
    and no commit was asked; ``unknown``: a call failed, so all or none of it may be visible.
    """

    txn: int
    topic: str
    #: (partition, value) of every record sent in it
    records: tuple[tuple[int, str], ...]
    outcome: Outcome


@dataclass(frozen=True)
class Read:
    """A reader (consumer) was given ``value`` at ``offset`` while faults were running."""

    reader: Isolation
    topic: str
    partition: int
    offset: int
    value: str
    time: float


@dataclass(frozen=True)
class HighWatermark:
    """The high watermark a reader's fetch reported for a partition. Each reader's series is
    its own (replog's readers are named after their isolation level, confluent-kafka's group
    members ``kafka-<isolation>-<member>``, and the LSOs a read_committed member got
    ``kafka-read_committed-<member>/lso``)."""

    reader: str
    topic: str
    partition: int
    high_watermark: int
    time: float


@dataclass(frozen=True)
class OutOfRange:
    """A reader's fetch at ``position`` (below a high watermark it had seen) was refused as
    out of range: the log it was reading shrank. ``end`` is the end the cluster gave next."""

    reader: Isolation
    topic: str
    partition: int
    position: int
    end: int
    time: float


@dataclass(frozen=True)
class CorruptRead:
    """A reader was given a batch that failed its CRC check (the client refused it)."""

    reader: Isolation
    error: str
    time: float


@dataclass
class History:
    """Everything the workloads observed during one schedule."""

    faults: list[Fault] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    send_failures: list[SendFailure] = field(default_factory=list)
    transactions: list[Transaction] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    high_watermarks: list[HighWatermark] = field(default_factory=list)
    out_of_range: list[OutOfRange] = field(default_factory=list)
    corrupt_reads: list[CorruptRead] = field(default_factory=list)
    #: where the consume-transform-produce loop's group began reading each partition of its
    #: source (its committed offset when it joined, or the log start offset if it had none)
    transformer_starts: dict[TP, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredBatch:
    """One record batch as a replica's segment objects hold it."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int


@dataclass(frozen=True)
class TimestampLookup:
    """ListOffsets by the timestamp of the record at ``offset``, and the offset it returned
    (the first offset whose timestamp is at least that: never past ``offset``)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    found: int


@dataclass(frozen=True)
class Retention:
    """A partition with a retention.ms, at the end: its log start offset, and how long ago
    (by the harness's clock, the true one) the partition was created."""

    log_start_offset: int
    retention_ms: int
    age_s: float


@dataclass
class FinalState:
    """The cluster after the faults: healed, caught up, read in full, then stopped."""

    #: every record below the HW, read through the leader with read_uncommitted: offset -> value
    uncommitted: dict[TP, dict[int, str]] = field(default_factory=dict)
    #: the same with read_committed (aborted records filtered out)
    committed: dict[TP, dict[int, str]] = field(default_factory=dict)
    #: the leader's high watermark when the logs were read
    high_watermarks: dict[TP, int] = field(default_factory=dict)
    #: per partition, per broker: the stored batches below the HW, or why they could not be read
    replicas: dict[TP, dict[int, list[StoredBatch] | str]] = field(default_factory=dict)
    #: seconds each process took to exit after SIGTERM; None: it had to be SIGKILLed
    sigterm_s: dict[str, float | None] = field(default_factory=dict)
    #: False if the logs could not be read in full through the leaders: the checks that need
    #: them are skipped (and ``not_recovered`` says why)
    logs_read: bool = True
    #: ListOffsets by record timestamps (with clock_jump)
    timestamp_lookups: list[TimestampLookup] = field(default_factory=list)
    #: the partitions with a retention.ms (with clock_jump)
    retention: dict[TP, Retention] = field(default_factory=dict)
    #: the consume-transform-produce loop's group's committed offset of each partition of its
    #: source at the end (negative: it committed none; empty: not read, or no such loop ran)
    transformer_committed: dict[TP, int] = field(default_factory=dict)
    #: what did not come back after the faults (a process that would not start, a partition
    #: without a full ISR by the deadline), one line each
    not_recovered: list[str] = field(default_factory=list)
