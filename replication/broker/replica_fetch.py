"""The replica manager's fetch path, as Kafka's ReplicaManager.fetchMessages.

A fetch reads for a consumer (up to the HW, or the LSO for read_committed, with the aborted
transactions it covers) or for a follower (up to the LEO; its fetch offset moves its LEO here,
the HW and the ISR), and long-polls in the fetch purgatory until ``min_bytes`` arrive or the
wait ends. Reads come from memory while the bytes are there, the rest in one worker thread.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from logstore.batch import count_records
from logstore.errors import ReplogError
from replication.broker.partition import Partition
from replication.broker.producer_state import AbortedTxn
from replication.broker.purgatory import DelayedOperation
from replication.common import TopicPartition
from replication.errors import OffsetOutOfRangeError

if TYPE_CHECKING:
    from replication.broker.replica_manager import ReplicaManager

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@dataclass(slots=True)
class FetchPartitionData:
    error: ReplogError | None = None
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    diverging_epoch: tuple[int, int] | None = None
    #: read_committed: the aborted transactions with records in what was read
    aborted: list[AbortedTxn] | None = None


@dataclass(frozen=True, slots=True)
class FetchSpec:
    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1


async def fetch_messages(
    rm: ReplicaManager,
    replica_id: int,
    specs: list[FetchSpec],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int,
) -> dict[TopicPartition, FetchPartitionData]:
    """Read for a consumer (replica_id < 0) or a follower; long-poll until ``min_bytes``."""
    deadline = time.monotonic() + max_wait_ms / 1000
    follower = replica_id >= 0
    while True:
        marks = {(s.topic, s.partition): _progress_mark(rm, s, follower) for s in specs}
        result = await _read_once(rm, replica_id, specs, max_bytes, isolation_level)
        total = sum(len(d.records) for d in result.values())
        errors = any(d.error is not None or d.diverging_epoch for d in result.values())
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if total >= min_bytes or errors or remaining_ms <= 0 or rm._stopping:
            break
        op = DelayedOperation(
            lambda marks=marks: any(  # type: ignore[misc]
                _progress_mark(rm, s, follower) != marks[(s.topic, s.partition)] for s in specs
            ),
            remaining_ms,
        )
        if not await rm.fetch_purgatory.wait(op, list(marks)):
            break
    for key, data in result.items():
        if data.records:
            stats = rm.topic_stats.topic(key.topic)
            if replica_id >= 0:
                stats.replication_bytes_out += len(data.records)
            else:
                stats.messages_out += count_records(data.records)
                stats.bytes_out += len(data.records)
    return result


def _progress_mark(rm: ReplicaManager, spec: FetchSpec, follower: bool) -> tuple[int, ...]:
    partition = rm.partitions.get(TopicPartition(spec.topic, spec.partition))
    if partition is None:
        return (-1,)
    plog = partition.log
    end = plog.log_end_offset if follower else plog.high_watermark
    return (id(partition), partition.leader_epoch, end, plog.log_start_offset)


async def _read_once(
    rm: ReplicaManager,
    replica_id: int,
    specs: list[FetchSpec],
    max_bytes: int,
    isolation_level: int,
) -> dict[TopicPartition, FetchPartitionData]:
    follower = replica_id >= 0
    plans: list[tuple[TopicPartition, Partition | None, FetchPartitionData, int]] = []
    for spec in specs:
        key = TopicPartition(spec.topic, spec.partition)
        data = FetchPartitionData()
        try:
            partition = rm.get_partition(spec.topic, spec.partition)
            partition.check_leader_epoch(spec.current_leader_epoch, require_leader=True)
            plog = partition.log
            if not follower:
                partition.check_high_watermark_known()
            diverging = partition.diverging_epoch(spec.last_fetched_epoch, spec.fetch_offset)
            if diverging is not None:
                # A diverged follower's fetch offset says nothing about what it holds of
                # this log: it moves neither its LEO here nor the HW (as Kafka).
                data.diverging_epoch = diverging
                data.high_watermark = partition.high_watermark
                data.log_start_offset = plog.log_start_offset
                plans.append((key, None, data, 0))
                continue
            if follower:
                if partition.update_follower_fetch(replica_id, spec.fetch_offset):
                    rm._hw_moved(partition)
                expanded = partition.isr_to_expand(replica_id, rm._live or None)
                if expanded is not None:
                    rm._alter_isr(partition, expanded)
                upper = plog.log_end_offset
            elif isolation_level == READ_COMMITTED:
                upper = partition.last_stable_offset
                data.aborted = partition.producer_state.aborted_in_range(spec.fetch_offset, upper)
            else:
                upper = partition.high_watermark
            data.high_watermark = partition.high_watermark
            data.last_stable_offset = partition.last_stable_offset
            data.log_start_offset = plog.log_start_offset
            if not plog.log_start_offset <= spec.fetch_offset <= plog.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"fetch offset {spec.fetch_offset} of {spec.topic}-{spec.partition} is "
                    f"outside [{plog.log_start_offset}, {plog.log_end_offset}]"
                )
            plans.append((key, partition, data, upper))
        except ReplogError as err:
            rm._check_behind(err)
            data.error = err
            plans.append((key, None, data, 0))

    # Read in request order (the response budget is shared): from memory while the bytes
    # are there (unflushed or tail-cached, CRC-checked on append), then the rest in one
    # worker thread, which may do I/O.
    budget = max_bytes
    rest = len(plans)  # the first plan left to the worker thread
    for i, ((_, target, data, upper), spec) in enumerate(zip(plans, specs, strict=True)):
        if target is None or data.error is not None:
            continue
        if budget <= 0:
            break
        records = target.log.read_from_memory(
            spec.fetch_offset,
            min(spec.partition_max_bytes, budget),
            max_offset=upper,
            min_one_batch=budget == max_bytes,
        )
        if records is None:
            rest = i
            break
        data.records = records
        budget -= len(records)
        rm.memory_reads += 1
    if rest < len(plans):
        budget_left = budget

        def read_all() -> None:
            budget = budget_left
            for (_, target, data, upper), spec in zip(plans[rest:], specs[rest:], strict=True):
                if target is None or data.error is not None:
                    continue
                if budget <= 0:
                    break
                try:
                    data.records = target.log.read(
                        spec.fetch_offset,
                        min(spec.partition_max_bytes, budget),
                        max_offset=upper,
                        min_one_batch=budget == max_bytes,
                    )
                except ReplogError as err:
                    data.error = err
                budget -= len(data.records)

        rm.storage_reads += 1
        await asyncio.to_thread(read_all)
    return {key: data for key, _, data, _ in plans}
