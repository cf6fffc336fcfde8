"""The producer's record accumulator: per-partition queues of batches waiting to be sent.

``send()`` appends a record to the open batch of its partition: a few list appends under one
lock, no Arrow work. The sender thread drains batches that are ready (full, lingered for
linger.ms, flushed or closing) into produce requests, at most one batch per partition in
flight (the partition is *muted* meanwhile), so a retried batch goes back to the head of its
queue and a partition's records are never reordered (Kafka's ``RecordAccumulator`` with
``max.in.flight.requests.per.connection=1`` semantics, per partition).

A batch is turned into bytes (:func:`logstore.batch.build` of an Arrow table built from its
lists) only when it is first sent, in a sender I/O thread, and the bytes are kept for retries.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Final

import pyarrow as pa

from logstore.batch import (
    HEADERS_TYPE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORD_SCHEMA,
    Compression,
    build,
    build_checked,
)
from replication.client.futures import ProduceFuture, complete_all, fail_all
from replication.client.types import Header, RecordBatchMetadata, RecordMetadata, TopicPartition

__all__ = [
    "RECORD_OVERHEAD",
    "Drained",
    "ProducerBatch",
    "RecordAccumulator",
]

#: Bytes counted per record on top of its key, value and headers (two offsets, a timestamp, a
#: validity bit or two), to decide when a batch is full.
RECORD_OVERHEAD = 20
#: Bytes counted per header on top of its key and value.
HEADER_OVERHEAD = 12

TpKey = tuple[str, int]
#: Sticky state meaning "switch partition on the next record".
_SWITCH: Final = object()


class ProducerBatch:
    """Records of one partition sent (and acknowledged) together.

    Two kinds: records appended one by one by ``send()`` (parallel lists, one future per
    record), or an Arrow table from ``send_arrow()`` (one future for the batch).
    """

    __slots__ = (
        "attempts",
        "base_sequence",
        "closed",
        "condition",
        "created",
        "deadline",
        "future",
        "futures",
        "has_headers",
        "has_keys",
        "headers",
        "keys",
        "last_error",
        "payload",
        "producer_epoch",
        "producer_id",
        "retry_at",
        "seq",
        "size",
        "stamped_attempt",
        "table",
        "timestamps",
        "tp",
        "transactional",
        "values",
    )

    def __init__(
        self,
        tp: TopicPartition,
        *,
        created: float,
        deadline: float,
        seq: int,
        table: pa.RecordBatch | pa.Table | None = None,
        size: int = 0,
    ) -> None:
        self.tp = tp
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Sequence[Header] | None] = []
        self.futures: list[ProduceFuture] = []
        #: Shared by the futures of the batch's records (see replication.client.futures).
        self.condition = threading.Condition()
        self.has_keys = False
        self.has_headers = False
        self.size = size
        self.created = created
        self.deadline = deadline
        self.seq = seq
        self.closed = table is not None
        self.attempts = 0
        self.retry_at = 0.0
        self.last_error: BaseException | None = None
        self.payload: bytes | None = None
        self.table = table
        self.future: ProduceFuture | None = ProduceFuture() if table is not None else None
        # Idempotence: stamped when the batch is first sent (see transactions.py), then kept.
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.base_sequence = NO_SEQUENCE
        self.transactional = False
        #: ``attempts`` when the stamp was given: later attempts resent the same stamp
        self.stamped_attempt = 0

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.tp}, records={self.record_count}, size={self.size}, "
            f"attempts={self.attempts})"
        )

    @property
    def record_count(self) -> int:
        return self.table.num_rows if self.table is not None else len(self.values)

    # --- encoding -------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table | pa.RecordBatch:
        """The records as Arrow input for :func:`logstore.batch.build`."""
        if self.table is not None:
            return self.table
        # Built straight in RECORD_SCHEMA (build() then takes it as it is): converting a
        # table of other types cost ~90 us, most of a lone record's encoding.
        count = len(self.values)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()) if self.has_keys else pa.nulls(count, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array(self.timestamps, pa.int64()),
                pa.array([list(h) if h else None for h in self.headers], HEADERS_TYPE)
                if self.has_headers
                else pa.nulls(count, HEADERS_TYPE),
            ],
            schema=RECORD_SCHEMA,
        )

    def encode(self, compression: Compression) -> bytes:
        """The batch's bytes, built once and kept for retries (with the same producer id,
        epoch and sequence numbers, so the broker recognises a retry)."""
        if self.payload is not None:
            return self.payload
        if self.table is not None:
            self.payload = build(
                self.table,
                compression=compression,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence,
                is_transactional=self.transactional,
            )
        else:  # send()'s records, checked there and built in RECORD_SCHEMA
            timestamps = self.timestamps
            self.payload = build_checked(
                self.to_arrow(),
                timestamps=(timestamps[0], max(timestamps)),
                compression=compression,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence,
                is_transactional=self.transactional,
            )
        return self.payload

    # --- completion -----------------------------------------------------------------------

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        """Complete every future: record i has offset base_offset + i (-1 stays -1)."""
        topic, partition = self.tp
        if self.future is not None:
            self.future.set_result(
                RecordBatchMetadata(topic, partition, base_offset, self.record_count)
            )
            return
        timestamps = self.timestamps
        futures = self.futures
        if base_offset < 0:
            results = [RecordMetadata(topic, partition, -1, ts) for ts in timestamps]
        elif log_append_time >= 0:
            results = [
                RecordMetadata(topic, partition, base_offset + i, log_append_time)
                for i in range(len(futures))
            ]
        else:
            results = [
                RecordMetadata(topic, partition, base_offset + i, ts)
                for i, ts in enumerate(timestamps)
            ]
        complete_all(futures, results)

    def fail(self, error: BaseException) -> None:
        """Fail every future with ``error``."""
        if self.future is not None:
            self.future.set_exception(error)
            return
        fail_all(self.futures, error)

    def split(self, now: float) -> list[ProducerBatch]:
        """Two halves of a batch of records (for RECORD_TOO_LARGE), keeping seq and deadline.

        The halves are not stamped: they take sequence numbers when they are sent."""
        if self.table is not None or len(self.values) < 2:
            return [self]
        half = len(self.values) // 2
        out: list[ProducerBatch] = []
        for lo, hi in ((0, half), (half, len(self.values))):
            part = ProducerBatch(self.tp, created=now, deadline=self.deadline, seq=self.seq)
            part.condition = self.condition
            part.keys = self.keys[lo:hi]
            part.values = self.values[lo:hi]
            part.timestamps = self.timestamps[lo:hi]
            part.headers = self.headers[lo:hi]
            part.futures = self.futures[lo:hi]
            part.has_keys = any(k is not None for k in part.keys)
            part.has_headers = any(part.headers)
            part.size = sum(
                RECORD_OVERHEAD + len(v or b"") + len(k or b"")
                for k, v in zip(part.keys, part.values, strict=True)
            )
            part.closed = True
            part.attempts = self.attempts
            out.append(part)
        return out


class Drained:
    """Batches the sender takes for one broker, and what it learned while draining."""

    __slots__ = ("batches", "node", "size")

    def __init__(self, node: int) -> None:
        self.node = node
        self.batches: list[ProducerBatch] = []
        self.size = 0


class RecordAccumulator:
    """Per-partition batch queues, with the sticky partitioner for unkeyed records.

    All state is guarded by :attr:`lock`. The sender waits on :attr:`ready`; ``send()`` (for
    buffer space) and ``flush()`` wait on :attr:`space`, notified whenever batches complete.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        buffer_memory: int,
        delivery_timeout_ms: int,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        self.buffer_memory = buffer_memory
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.clock = clock
        self._rng = rng or random.Random()
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.space = threading.Condition(self.lock)
        self.queues: dict[TpKey, deque[ProducerBatch]] = {}
        self.muted: set[TpKey] = set()
        #: Batches created and not yet completed (queued or in flight).
        self.incomplete: set[ProducerBatch] = set()
        self.buffered_bytes = 0
        self.flushing = 0
        self.closing = False
        self._seq = 0
        #: Set by the producer when linger.ms is 0: append() offers a partition whose batch
        #: became ready to it (the sender's ``dispatch``) before waking the sender thread.
        self.dispatch: Callable[[TpKey], bool] | None = None
        # topic -> (sticky partition, the batch it is filling or None before the first append)
        self._sticky: dict[str, tuple[int, ProducerBatch | object | None]] = {}

    # --- appending (called by send(), under the lock) ---------------------------------------

    @property
    def seq(self) -> int:
        """The sequence number of the newest batch (flush waits for batches up to it)."""
        return self._seq

    def wait_for_space(self, size: int, deadline: float) -> bool:
        """Block (lock held) until ``size`` bytes fit in buffer.memory; False on timeout."""
        while self.buffered_bytes and self.buffered_bytes + size > self.buffer_memory:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return False
            self.space.wait(remaining)
        return True

    def _new_batch(self, tp: TopicPartition, now: float, **kwargs: Any) -> ProducerBatch:
        self._seq += 1
        batch = ProducerBatch(
            tp, created=now, deadline=now + self.delivery_timeout_s, seq=self._seq, **kwargs
        )
        self.incomplete.add(batch)
        return batch

    def sticky_partition(
        self, topic: str, available: Sequence[int], num_partitions: int, *, chunk: bool = False
    ) -> int:
        """KIP-480: keep the partition whose batch is still open; switch once it is closed.

        With ``chunk`` (a whole batch from send_arrow) the partition is used for one batch
        only: the next call switches.
        """
        current = self._sticky.get(topic)
        if current is not None:
            partition, batch = current
            if partition < num_partitions and (
                batch is None or (isinstance(batch, ProducerBatch) and not batch.closed)
            ):
                if chunk:
                    self._sticky[topic] = (partition, _SWITCH)
                return partition
        choices = list(available) or list(range(num_partitions))
        if current is not None and len(choices) > 1 and current[0] in choices:
            choices.remove(current[0])
        partition = self._rng.choice(choices)
        self._sticky[topic] = (partition, _SWITCH if chunk else None)
        return partition

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Sequence[Header] | None,
        size: int,
        *,
        sticky: bool = False,
    ) -> ProduceFuture:
        """Append one record to its partition's open batch (lock held)."""
        tp_key = (topic, partition)
        queue = self.queues.get(tp_key)
        if queue is None:
            queue = self.queues[tp_key] = deque()
        last = queue[-1] if queue else None
        if last is None or last.closed:
            batch = self._new_batch(TopicPartition(topic, partition), self.clock())
            queue.append(batch)
            new = True
        else:
            batch, new = last, False
        # ProducerBatch.append, inlined: this is the per-record hot path of send().
        future = ProduceFuture(batch.condition)
        batch.keys.append(key)
        batch.values.append(value)
        batch.timestamps.append(timestamp)
        batch.headers.append(headers)
        batch.futures.append(future)
        if key is not None:
            batch.has_keys = True
        if headers:
            batch.has_headers = True
        batch.size += size
        self.buffered_bytes += size
        if sticky:
            self._sticky[topic] = (partition, batch)
        if batch.size >= self.batch_size:
            batch.closed = True
            new = True
        # a batch the sender has not seen, or one now full
        if new and (self.dispatch is None or not self.dispatch(tp_key)):
            self.ready.notify()
        return future

    def append_table(
        self, tp: TopicPartition, table: pa.RecordBatch | pa.Table, size: int
    ) -> ProduceFuture:
        """Queue a ready-made Arrow batch behind the partition's records (lock held)."""
        queue = self.queues.get(tp)
        if queue is None:
            queue = self.queues[tp] = deque()
        if queue:
            queue[-1].closed = True  # keep order: the open batch goes first
        batch = self._new_batch(tp, self.clock(), table=table, size=size)
        queue.append(batch)
        self.buffered_bytes += size
        self.ready.notify()
        assert batch.future is not None
        return batch.future

    # --- draining (called by the sender, under the lock) -------------------------------------

    def drain(
        self,
        now: float,
        leader_of: Callable[[TpKey], int | None],
        can_send: Callable[[int], bool],
        max_request_size: int,
        hold: Collection[TpKey] = (),
    ) -> tuple[dict[int, Drained], float | None, bool]:
        """Take the ready head batch of every unmuted partition whose leader can take a request.

        Partitions in ``hold`` are skipped (a transaction is adding them). Returns the batches
        per broker, when to look again (None: when notified), and whether some ready batch has
        no known leader (the caller refreshes metadata).
        """
        plans: dict[int, Drained] = {}
        wake: float | None = None
        unknown_leader = False
        force = self.flushing > 0 or self.closing
        linger = self.linger_s
        for tp_key, queue in self.queues.items():
            if not queue or tp_key in self.muted or tp_key in hold:
                continue
            batch = queue[0]
            if batch.retry_at > now:
                wake = batch.retry_at if wake is None else min(wake, batch.retry_at)
                continue
            if not (batch.closed or force or len(queue) > 1 or now >= batch.created + linger):
                at = batch.created + linger
                wake = at if wake is None else min(wake, at)
                continue
            node = leader_of(tp_key)
            if node is None:
                unknown_leader = True
                continue
            plan = plans.get(node)
            if plan is None:
                if not can_send(node):
                    continue
                plan = plans[node] = Drained(node)
            elif plan.size + batch.size > max_request_size:
                continue
            queue.popleft()
            batch.closed = True
            self.muted.add(tp_key)
            plan.batches.append(batch)
            plan.size += batch.size
        return plans, wake, unknown_leader

    def take_one(self, tp_key: TpKey, now: float) -> ProducerBatch | None:
        """Take a partition's batch as drain() would, if it is the partition's only queued one,
        the partition is not muted and the batch is not waiting to be retried (lock held)."""
        queue = self.queues.get(tp_key)
        if not queue or len(queue) > 1 or tp_key in self.muted or queue[0].retry_at > now:
            return None
        batch = queue.popleft()
        batch.closed = True
        self.muted.add(tp_key)
        return batch

    def expire(self, now: float) -> list[ProducerBatch]:
        """Remove queued (not in-flight) batches past delivery.timeout.ms (lock held)."""
        expired: list[ProducerBatch] = []
        for queue in self.queues.values():
            if queue and queue[0].deadline <= now:
                keep = [b for b in queue if b.deadline > now]
                expired.extend(b for b in queue if b.deadline <= now)
                queue.clear()
                queue.extend(keep)
        return expired

    def reenqueue(self, batch: ProducerBatch) -> None:
        """Put a batch to retry back at the head of its queue (lock held)."""
        queue = self.queues.get(batch.tp)
        if queue is None:
            queue = self.queues[batch.tp] = deque()
        queue.appendleft(batch)

    def unmute(self, tps: Iterable[TpKey]) -> None:
        self.muted.difference_update(tps)

    def completed(self, batches: Iterable[ProducerBatch]) -> None:
        """Forget completed batches and free their buffer space (lock held)."""
        for batch in batches:
            if batch in self.incomplete:
                self.incomplete.discard(batch)
                self.buffered_bytes -= batch.size
        self.space.notify_all()

    def replace(self, batch: ProducerBatch, parts: Sequence[ProducerBatch]) -> None:
        """Account for a batch split into ``parts`` (lock held)."""
        if batch in self.incomplete:
            self.incomplete.discard(batch)
            self.buffered_bytes -= batch.size
        for part in parts:
            self.incomplete.add(part)
            self.buffered_bytes += part.size

    def abort_all(self) -> list[ProducerBatch]:
        """Remove every queued batch (lock held); the caller fails them."""
        out = [b for queue in self.queues.values() for b in queue]
        for queue in self.queues.values():
            queue.clear()
        return out

    def has_queued(self) -> bool:
        return any(self.queues.values())

    def pending_before(self, seq: int) -> int:
        """Records of incomplete batches created up to ``seq`` (flush waits for them)."""
        return sum(b.record_count for b in self.incomplete if b.seq <= seq)
