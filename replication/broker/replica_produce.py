"""The replica manager's produce path, as Kafka's ReplicaManager.appendRecords.

A leader appends each partition's batches (CRC check and an offset rewrite, no decoding), marks
the partition dirty for the next group commit and wakes followers waiting on its LEO; acks=all
requests then wait in the produce purgatory until every ISR member holds their batches (or the
timeout, or a leadership change). Transaction markers are appended and waited for the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from logstore.batch import iter_batches
from logstore.errors import InvalidRecordError, ReplogError
from replication.broker.partition import Partition
from replication.broker.purgatory import DelayedOperation
from replication.common import TopicPartition
from replication.errors import (
    InvalidRequiredAcksError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
)

if TYPE_CHECKING:
    from replication.broker.replica_manager import ReplicaManager


@dataclass(slots=True)
class ProduceResult:
    error: ReplogError | None = None
    base_offset: int = -1
    log_start_offset: int = -1


async def append_records(
    rm: ReplicaManager,
    acks: int,
    timeout_ms: int,
    entries: list[tuple[str, int, bytes | bytearray | memoryview | None]],
) -> dict[TopicPartition, ProduceResult]:
    results: dict[TopicPartition, ProduceResult] = {}
    waiting: list[tuple[Partition, int]] = []
    for topic, index, records in entries:
        key = TopicPartition(topic, index)
        try:
            if acks not in (-1, 0, 1):
                raise InvalidRequiredAcksError(f"acks={acks} is not one of -1 (all), 0, 1")
            partition = rm.get_partition(topic, index)
            if partition.log.config.compact:
                _check_keys(topic, records or b"")
            info = partition.append_as_leader(records or b"", acks)
        except ReplogError as err:
            rm._check_behind(err)
            results[key] = ProduceResult(err)
            continue
        rm._mark_dirty(partition)
        rm.fetch_purgatory.check_and_complete(key)  # followers wait on the LEO
        if not info.duplicate:
            stats = rm.topic_stats.topic(topic)
            stats.messages_in += info.record_count
            stats.bytes_in += len(records or b"")
        results[key] = ProduceResult(None, info.first_offset, info.log_start_offset)
        if acks == -1:
            waiting.append((partition, info.last_offset + 1))
    if waiting:
        op = DelayedOperation(
            lambda: all(p.acks_satisfied(end) or not p.is_leader for p, end in waiting),
            timeout_ms,
        )
        await rm.produce_purgatory.wait(op, [p.key for p, _ in waiting])
        for partition, end in waiting:
            result = results[partition.key]
            if not partition.is_leader or rm.partitions.get(partition.key) is not partition:
                result.error = NotLeaderOrFollowerError(
                    f"leadership of {partition.topic}-{partition.index} moved while the "
                    "produce waited for the ISR; the outcome is unknown, retry"
                )
            elif not partition.acks_satisfied(end):
                result.error = RequestTimedOutError(
                    f"{partition.topic}-{partition.index}: the ISR did not acknowledge "
                    f"within {timeout_ms} ms"
                )
            elif len(partition.state.isr) < partition.policy.min_insync_replicas:
                result.error = NotEnoughReplicasAfterAppendError(
                    f"{partition.topic}-{partition.index}: written, but the ISR shrank below "
                    f"min.insync.replicas={partition.policy.min_insync_replicas}"
                )
    return results


def _check_keys(topic: str, records: bytes | bytearray | memoryview) -> None:
    """A compacted topic keeps the latest record per key: a record without one is refused (as
    Kafka refuses it, and replog's Kafka listener), naming the topic and its cleanup.policy."""
    for batch in iter_batches(records, validate=True):
        if not batch.is_control and batch.to_arrow().column(0).null_count:
            raise InvalidRecordError(
                f"Compacted topic cannot accept message without key: topic {topic!r} has "
                "cleanup.policy=compact, which keeps the latest record per key; give every "
                "record a key"
            )


async def write_txn_markers(
    rm: ReplicaManager, markers: list[tuple[int, int, bool, int, str, int]], timeout_ms: int
) -> dict[tuple[int, str, int], ReplogError | None]:
    """Append transaction markers (producer id, epoch, commit, coordinator epoch, topic,
    partition) as leader and wait until the ISR has them (as acks=all)."""
    results: dict[tuple[int, str, int], ReplogError | None] = {}
    waiting: list[tuple[tuple[int, str, int], Partition, int]] = []
    for pid, epoch, commit, coordinator_epoch, topic, index in markers:
        key = (pid, topic, index)
        try:
            partition = rm.get_partition(topic, index)
            info = partition.append_marker(pid, epoch, commit, coordinator_epoch)
        except ReplogError as err:
            results[key] = err
            continue
        rm._mark_dirty(partition)
        rm.fetch_purgatory.check_and_complete(partition.key)
        results[key] = None
        waiting.append((key, partition, info.last_offset + 1))
    if waiting:
        op = DelayedOperation(
            lambda: all(pt.acks_satisfied(end) or not pt.is_leader for _, pt, end in waiting),
            timeout_ms,
        )
        await rm.produce_purgatory.wait(op, [pt.key for _, pt, _ in waiting])
        for key, partition, end in waiting:
            if not partition.is_leader:
                results[key] = NotLeaderOrFollowerError(
                    f"leadership of {partition.topic}-{partition.index} moved"
                )
            elif not partition.acks_satisfied(end):
                results[key] = RequestTimedOutError(
                    f"{partition.topic}-{partition.index}: marker not replicated in time"
                )
    return results
