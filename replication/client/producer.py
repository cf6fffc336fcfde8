"""The producer: ``send()`` records; its :class:`~replication.client.sender.Sender` delivers them.

As Kafka's KafkaProducer (and aiokafka's producer.py): this module holds the public API —
``send()``, ``send_arrow()`` (and how rows are spread over partitions), ``flush()``, the
transactions API and ``close()``. The caller's ``send()`` appends to the
:class:`~replication.client.accumulator.RecordAccumulator` (no I/O once the topic's metadata is
known); the sender thread (replication/client/sender.py) drains it, sends produce requests,
retries or fails them, expires old batches and completes the futures.

Errors reach the futures as named classes of the one error tree: RecordTooLargeError,
UnknownTopicOrPartitionError, NotEnoughReplicasError, BrokerUnreachableError, ... Retriable
ones are retried until ``retries`` or ``delivery.timeout.ms`` runs out; the future then fails
with the last error's class, whose message says how long it tried.

Idempotence (``enable.idempotence``, on by default) and transactions (``transactional.id``):
the producer id, epoch and sequence numbers, and the transaction's state and partitions, live
in a :class:`~replication.client.transactions.TransactionManager` shared with the sender.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from logstore.batch import to_record_schema
from replication.client.accumulator import HEADER_OVERHEAD, RECORD_OVERHEAD, RecordAccumulator
from replication.client.cluster import Cluster
from replication.client.config import ProducerConfig, load
from replication.client.errors import (
    ClientClosedError,
    DeliveryTimeoutError,
    TransactionAbortedError,
    denied,
)
from replication.client.futures import failed_future
from replication.client.metrics import ProducerMetrics
from replication.client.partitioner import KeyHashCache, partitions_for_keys
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.sender import Sender
from replication.client.transactions import TransactionManager, TxnState
from replication.client.types import (
    ConsumerGroupMetadata,
    Header,
    OffsetAndMetadata,
    RecordBatchMetadata,
    RecordMetadata,
    TopicPartition,
    TransactionHandle,
)
from replication.errors import (
    RecordTooLargeError,
    ReplogError,
    UnknownTopicOrPartitionError,
    for_code,
)

__all__ = ["Producer"]

log = logging.getLogger(__name__)


def _as_bytes(value: object, what: str) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"{what} must be bytes, str or None, not {type(value).__name__}: serialize it first"
    )


def _as_timestamp(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"timestamp must be an int (ms since the epoch), not {value!r}")
    return int(value)


def _check_headers(headers: object) -> list[Header]:
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)  # type: ignore[call-overload]
    out: list[Header] = []
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise TypeError(
                f"headers must be (str, bytes | None) pairs or a mapping, got {item!r}"
            ) from None
        if not isinstance(name, str):
            raise TypeError(f"header key {name!r} must be a str")
        out.append((name, _as_bytes(value, f"header {name!r} value")))
    return out


class Producer:
    """Send records to replog topics (Kafka's producer semantics, a synchronous API).

    Parameters
    ----------
    config
        Kafka-named settings (see :class:`~replication.client.config.ProducerConfig`); keyword
        arguments with underscores for dots are merged over it.

    Examples
    --------
    >>> producer = Producer(bootstrap_servers="127.0.0.1:9092", linger_ms=5)  # doctest: +SKIP
    >>> with producer:  # doctest: +SKIP
    ...     future = producer.send("events", b"hello", key=b"user-1")
    ...     future.result(timeout=10)
    RecordMetadata(topic='events', partition=0, offset=0, timestamp=1700000000000)

    Transactions (all records of a transaction become visible to read_committed consumers
    at once, or never):

    >>> producer = Producer(bootstrap_servers="127.0.0.1:9092",  # doctest: +SKIP
    ...                     transactional_id="orders-writer-1")
    >>> producer.init_transactions()  # doctest: +SKIP
    >>> producer.begin_transaction()  # doctest: +SKIP
    >>> for i in range(3):  # doctest: +SKIP
    ...     producer.send("orders", b"order-%d" % i, partition=i)
    >>> producer.commit_transaction()  # doctest: +SKIP
    """

    def __init__(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self.config = load(ProducerConfig, config, kwargs)
        c = self.config
        self._cluster = Cluster(c)
        self._acc = RecordAccumulator(
            batch_size=c.batch_size,
            linger_ms=c.linger_ms,
            buffer_memory=c.buffer_memory,
            delivery_timeout_ms=c.delivery_timeout_ms,
        )
        self._txn = TransactionManager(c, self._cluster, self._acc.lock, self._acc.ready)
        self._key_hashes = KeyHashCache()
        self._max_request_size = c.max_request_size
        self._max_block_s = c.max_block_ms / 1000
        self._closed = False
        self._metrics = ProducerMetrics(c)
        self._sender = Sender(
            c, self._cluster, self._acc, self._txn, on_crash=self._crashed, metrics=self._metrics
        )
        if c.linger_ms == 0:  # a ready batch goes from send() straight to an I/O thread
            self._acc.dispatch = self._sender.dispatch
        self._sender.start()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Producer({self.config.bootstrap_servers!r}, client_id={self.config.client_id!r})"

    # --- sending ------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Sequence[Header] | Mapping[str, bytes | None] | None = None,
        timestamp: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queue one record; the future gives its :class:`RecordMetadata` once acknowledged.

        The partition is ``partition`` if given, else ``murmur2(key)`` for keyed records, else
        the sticky partition. ``timestamp`` is ms since the epoch (default: now). Blocks only
        when the topic's metadata is not known yet or buffer.memory is full (both at most
        max.block.ms). Errors that concern the record (unknown topic, record too large) fail
        the returned future; a closed producer raises ClientClosedError.
        """
        if self._closed:
            raise ClientClosedError("cannot send: the producer is closed")
        txn = self._txn
        if txn.idempotent:
            txn.check_send()
        if type(value) is not bytes and value is not None:
            value = _as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key, "key")
        num_partitions = self._cluster.snapshot.partition_counts.get(topic)
        if num_partitions is None:
            found = self._wait_for_topic(topic)
            if isinstance(found, BaseException):
                return failed_future(found)
            num_partitions = found
        size = RECORD_OVERHEAD + (len(value) if value is not None else 0)
        if key is not None:
            size += len(key)
        checked: list[Header] | None = None
        if headers:
            checked = _check_headers(headers)
            size += sum(HEADER_OVERHEAD + len(k) + len(v or b"") for k, v in checked)
        if size > self._max_request_size:
            return failed_future(
                RecordTooLargeError(
                    f"the record is {size} bytes, larger than max.request.size="
                    f"{self.config.max_request_size}; raise max.request.size (and the topic's "
                    "max.message.bytes) or send smaller records"
                )
            )
        if timestamp is None:
            timestamp = time.time_ns() // 1_000_000
        elif type(timestamp) is not int:
            timestamp = _as_timestamp(timestamp)
        sticky = False
        if partition is None:
            if key is not None:
                partition = self._key_hashes.partition(key, num_partitions)
            else:
                sticky = True
        elif not 0 <= partition < num_partitions:
            return failed_future(self._no_such_partition(topic, partition, num_partitions))
        acc = self._acc
        with acc.lock:
            if size + acc.buffered_bytes > acc.buffer_memory and not acc.wait_for_space(
                size, acc.clock() + self._max_block_s
            ):
                return failed_future(self._buffer_exhausted())
            if sticky:
                meta = self._cluster.snapshot.topics.get(topic)
                available = meta.available_partitions if meta is not None else ()
                partition = acc.sticky_partition(topic, available, num_partitions)
            if txn.transactional:
                txn.note_partition((topic, partition))  # type: ignore[arg-type]
            return acc.append(
                topic,
                partition,  # type: ignore[arg-type]
                key,
                value,
                timestamp,
                checked,
                size,
                sticky=sticky,
            )

    def send_arrow(
        self, topic: str, table: pa.Table | pa.RecordBatch, partition: int | None = None
    ) -> list[Future[RecordBatchMetadata]]:
        """Queue a whole Arrow table; one future per batch, giving its :class:`RecordBatchMetadata`.

        Columns: ``value`` (binary or string, required), and optionally ``key``, ``timestamp``
        (int64 ms or a timestamp type; null or absent: now), ``headers`` (list of struct<key
        string, value binary>) and ``partition`` (int; null: not set). Other columns are
        ignored. A row goes to its ``partition`` value, else to ``partition``, else to
        ``murmur2(key)`` if it has a key, else to a sticky partition that changes every
        batch.size bytes. Rows are split into batches of about batch.size bytes per partition,
        in table order, without a per-row Python loop.

        Problems found before anything is queued (unknown topic, bad columns, bad partition,
        a row over max.request.size) are raised here; delivery errors fail the futures.
        """
        if self._closed:
            raise ClientClosedError("cannot send: the producer is closed")
        if self._txn.idempotent:
            self._txn.check_send()
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        rows = table.num_rows
        if rows == 0:
            return []
        num_partitions = self._partition_count(topic)
        data = to_record_schema(table)  # ValueError naming the bad column
        parts = self._row_partitions(topic, table, data, partition, num_partitions)
        sizes = self._row_sizes(data)
        biggest = pc.max(sizes).as_py()
        if biggest > self.config.max_request_size:
            raise RecordTooLargeError(
                f"a row is {biggest} bytes, larger than max.request.size="
                f"{self.config.max_request_size}; raise max.request.size or send smaller rows"
            )
        futures: list[Future[RecordBatchMetadata]] = []
        for p, indices in self._group(parts):
            chunk_data = data if indices is None else data.take(indices)
            chunk_sizes = sizes if indices is None else sizes.take(indices)
            tp = TopicPartition(topic, p)
            for start, length, nbytes in self._chunks(chunk_sizes):
                piece = chunk_data.slice(start, length)
                futures.append(self._append_table(tp, piece, nbytes))
        return futures

    def metrics(self) -> dict[str, float]:
        """This producer's metrics, by Kafka's names (its ``producer-metrics`` group).

        ``record-send-rate``/``-total`` (records put in produce requests, every attempt),
        ``record-retry-*`` and ``record-error-*`` (records of batches retried, and failed for
        good), ``batch-size-avg``/``-max`` (bytes), ``records-per-request-avg``,
        ``request-rate``/``-total`` and ``request-latency-avg``/``-max`` (ms, produce
        requests with acks 1 or all). Rates, averages and maxima cover the last
        ``metrics.num.samples`` x ``metrics.sample.window.ms`` (see
        :mod:`replication.client.metrics`); totals cover the producer's life.

        Examples
        --------
        >>> producer.send("events", b"hello").result(timeout=10)  # doctest: +SKIP
        >>> producer.metrics()["record-send-total"]  # doctest: +SKIP
        1.0
        """
        return self._metrics.snapshot()

    def partitions_for(self, topic: str) -> list[int]:
        """The partition ids of ``topic`` (waits up to max.block.ms for its metadata)."""
        return list(range(self._partition_count(topic)))

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until it is acknowledged (or failed).

        Raises DeliveryTimeoutError if ``timeout`` seconds pass first.
        """
        acc = self._acc
        deadline = None if timeout is None else acc.clock() + timeout
        with acc.lock:
            target = acc.seq
            acc.flushing += 1
            acc.ready.notify()
            try:
                while True:
                    pending = acc.pending_before(target)
                    if not pending:
                        return
                    if not self._sender.is_alive():
                        raise ClientClosedError(
                            f"flush(): {pending} records pending and the producer is closed"
                        )
                    remaining = None if deadline is None else deadline - acc.clock()
                    if remaining is not None and remaining <= 0:
                        raise DeliveryTimeoutError(
                            f"flush() timed out after {timeout} s with {pending} records not "
                            "yet acknowledged; check the brokers (`replog cluster status`)"
                        )
                    acc.space.wait(0.5 if remaining is None else min(remaining, 0.5))
            finally:
                acc.flushing -= 1

    # --- transactions -------------------------------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register ``transactional.id`` with its coordinator, once, before any transaction.

        The coordinator gives this producer the id's producer id and a new epoch: an older
        producer with the same transactional.id is fenced from then on, and a transaction it
        left open is aborted. Waits up to ``timeout`` seconds (default max.block.ms); retriable
        errors are retried meanwhile. InvalidTransactionTimeoutError if transaction.timeout.ms
        is above the broker's transaction.max.timeout.ms.
        """
        self._check_open()
        self._txn.init_transactions(timeout)

    def begin_transaction(self) -> None:
        """Start a transaction: records sent until commit or abort belong to it."""
        self._check_open()
        self._txn.begin()

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group: ConsumerGroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer group's offsets (the next record to read, per partition) as part
        of the open transaction: they become the group's committed offsets when it commits,
        and never if it aborts. The consume-transform-produce loop of Kafka's transactions.

        ``group`` is the consumer's :meth:`Consumer.group_metadata` (its member and generation
        are checked, so a consumer that lost its partitions cannot commit them), or a group id.

        Examples
        --------
        >>> producer.begin_transaction()  # doctest: +SKIP
        >>> for record in consumer.poll(1000):  # doctest: +SKIP
        ...     producer.send("out", transform(record.value))
        >>> producer.send_offsets_to_transaction(  # doctest: +SKIP
        ...     {tp: consumer.position(tp) for tp in consumer.assignment()},
        ...     consumer.group_metadata(),
        ... )
        >>> producer.commit_transaction()  # doctest: +SKIP
        """
        self._check_open()
        metadata = ConsumerGroupMetadata(group) if isinstance(group, str) else group
        values = {
            TopicPartition(*tp): v if isinstance(v, OffsetAndMetadata) else OffsetAndMetadata(v)
            for tp, v in offsets.items()
        }
        self._txn.send_offsets(values, metadata, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Deliver the transaction's records (flush), then commit it (EndTxn): they become
        visible to read_committed consumers all at once.

        Raises CommitFailedError if it did not happen (a record failed; call
        abort_transaction()), CommitStateUnknownError if it may have happened (call
        commit_transaction() again, which only asks again), ProducerFencedError if this
        producer was fenced (close it). Waits up to ``timeout`` seconds (default max.block.ms).
        """
        self._check_open()
        deadline = self._acc.clock() + (
            self.config.max_block_ms / 1000 if timeout is None else timeout
        )
        txn = self._txn
        if not txn.start_commit():
            self.flush(max(deadline - self._acc.clock(), 0.0))
        txn.end(True, max(deadline - self._acc.clock(), 0.001))

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: records not yet sent fail with TransactionAbortedError, sent
        ones are never visible to read_committed consumers. Waits for requests in flight, then
        for the coordinator to write the ABORT markers (up to ``timeout`` s, default
        max.block.ms). ProducerFencedError if this producer was fenced.
        """
        self._check_open()
        deadline = self._acc.clock() + (
            self.config.max_block_ms / 1000 if timeout is None else timeout
        )
        txn = self._txn
        txn.start_abort()
        self._fail_queued(TransactionAbortedError("not sent: the transaction was aborted"))
        acc = self._acc
        with acc.lock:
            while not txn.in_flight_done(acc.muted):
                remaining = deadline - acc.clock()
                if remaining <= 0:
                    raise DeliveryTimeoutError(
                        f"abort_transaction() timed out after waiting for {len(acc.muted)} "
                        "produce request(s) in flight; call it again"
                    )
                acc.space.wait(min(remaining, 0.5))
        # retried batches came back to their queues meanwhile
        self._fail_queued(TransactionAbortedError("not sent: the transaction was aborted"))
        txn.end(False, max(deadline - acc.clock(), 0.001))

    def transaction_handle(self, timeout: float | None = None) -> TransactionHandle:
        """Deliver the transaction's records (flush), then hand the open transaction over.

        For several producers whose transactions commit together (one per Spark task): the
        task sends the returned :class:`TransactionHandle` to whoever commits, which passes
        the handles of all tasks to :meth:`Admin.commit_sink_batch`. This producer sends
        nothing more in the transaction; close it (closing does not abort a handed-off
        transaction). Calling it again returns the same handle. Raises CommitFailedError if a
        record failed (nothing of the transaction is visible; abort it).
        """
        self._check_open()
        self.flush(timeout)
        return self._txn.hand_off()

    def _fail_queued(self, error: BaseException) -> None:
        with self._acc.lock:
            queued = self._acc.abort_all()
        if queued:
            self._sender.fail(queued, error)

    def _crashed(self) -> None:
        self._closed = True  # the sender thread died: refuse further sends

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the producer is closed")

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (up to ``timeout`` seconds), then stop; idempotent.

        Records still undelivered after ``timeout`` fail with ClientClosedError. An open
        transaction (not handed off) is aborted first, as Kafka's producer does.
        """
        if self._closed and not self._sender.is_alive():
            return
        in_io_thread = self._sender.in_own_thread()
        if (
            not self._closed
            and not in_io_thread
            and self._txn.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR)
        ):
            try:
                self.abort_transaction(timeout)
            except ReplogError as err:
                log.warning("closing: aborting the open transaction failed: %s", err)
        self._closed = True
        acc = self._acc
        with acc.lock:
            acc.closing = True
            acc.ready.notify()
        # From a callback (an I/O thread) or the sender: finish closing in another thread, so
        # we do not wait for ourselves.
        if in_io_thread:
            threading.Thread(
                target=self._finish_close, args=(timeout,), name="replog-producer-close"
            ).start()
            return
        self._finish_close(timeout)

    def _finish_close(self, timeout: float | None) -> None:
        self._sender.close(timeout)
        self._cluster.close()

    # --- metadata -------------------------------------------------------------------------

    def _partition_count(self, topic: str) -> int:
        """The topic's partition count (waiting up to max.block.ms), or raise why not."""
        count = self._cluster.snapshot.partition_counts.get(topic)
        if count is None:
            found = self._wait_for_topic(topic)
            if isinstance(found, BaseException):
                raise found
            count = found
        return count

    def _wait_for_topic(self, topic: str) -> int | ReplogError:
        """The topic's partition count, waiting up to max.block.ms; else the error to report."""
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        cluster = self._cluster
        cluster.add_interest([topic])

        def attempt() -> int:
            cluster.refresh([topic], allow_auto_topic_creation=True)
            snapshot = cluster.snapshot
            count = snapshot.partition_counts.get(topic)
            if count is not None:
                return count
            meta = snapshot.topics.get(topic)
            why = ""
            if meta is not None and meta.error_code:
                cls = for_code(meta.error_code) or UnknownTopicOrPartitionError
                if not cls.retriable:
                    raise cls(f"topic {topic!r}: {denied(self.config, cls, 'Topic', topic)}")
                if cls is not UnknownTopicOrPartitionError:
                    why = f" ({cls.__name__}: {cls()})"
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} not present in metadata{why}: create it "
                "(`replog topics create`) or check its name"
            )

        try:
            return call_with_retries(
                f"waiting for the metadata of topic {topic!r}",
                attempt,
                RetryPolicy.of(self.config, self.config.max_block_ms, "max.block.ms"),
                retriable=cluster.retriable,
            )
        except ReplogError as err:
            return err

    @staticmethod
    def _no_such_partition(topic: str, partition: int, count: int) -> ReplogError:
        return UnknownTopicOrPartitionError(
            f"partition {partition} of topic {topic!r} does not exist: the topic has {count} "
            f"partitions (0 to {count - 1})"
        )

    def _buffer_exhausted(self) -> DeliveryTimeoutError:
        return DeliveryTimeoutError(
            f"buffer.memory={self.config.buffer_memory} bytes stayed full for max.block.ms="
            f"{self.config.max_block_ms}: the brokers do not keep up or are down; raise "
            "buffer.memory or check `replog cluster status`"
        )

    # --- Arrow path -----------------------------------------------------------------------

    def _row_partitions(
        self,
        topic: str,
        table: pa.Table,
        data: pa.RecordBatch,
        partition: int | None,
        num_partitions: int,
    ) -> pa.Array:
        rows = data.num_rows
        if partition is not None and not 0 <= partition < num_partitions:
            raise self._no_such_partition(topic, partition, num_partitions)
        parts: pa.Array
        if "partition" in table.column_names:
            column = table.column("partition")
            try:
                parts = column.combine_chunks().cast(pa.int32())
            except pa.ArrowException as err:
                raise ValueError(
                    f"column 'partition' has type {column.type}, expected int"
                ) from err
            bad = pc.or_(pc.less(parts, 0), pc.greater_equal(parts, num_partitions))
            if pc.any(bad).as_py():
                first = parts.filter(pc.fill_null(bad, False))[0].as_py()
                raise self._no_such_partition(topic, first, num_partitions)
        else:
            parts = pa.nulls(rows, pa.int32())
        if partition is not None:
            parts = parts.fill_null(partition)
        keys = data.column(0)
        if parts.null_count and keys.null_count < rows:
            hashed = partitions_for_keys(keys, num_partitions)
            keyed = pc.and_(pc.is_null(parts), pc.is_valid(keys))
            parts = pc.if_else(keyed, hashed, parts)
        if parts.null_count:
            parts = self._sticky_rows(topic, data, parts, num_partitions)
        return parts

    def _sticky_rows(
        self, topic: str, data: pa.RecordBatch, parts: pa.Array, num_partitions: int
    ) -> pa.Array:
        """Unkeyed rows without a partition: one sticky partition per batch.size bytes."""
        missing = pc.is_null(parts)
        indices = pc.indices_nonzero(missing)
        sizes = self._row_sizes(data).take(indices)
        chunk_ids = self._chunk_ids(sizes)
        chunks = (pc.max(chunk_ids).as_py() or 0) + 1
        meta = self._cluster.snapshot.topics.get(topic)
        available = meta.available_partitions if meta is not None else ()
        chosen: list[int] = []
        with self._acc.lock:
            for _ in range(chunks):
                chosen.append(
                    self._acc.sticky_partition(topic, available, num_partitions, chunk=True)
                )
        values = pa.array(chosen, pa.int32()).take(chunk_ids)
        return pc.replace_with_mask(parts, missing, values)

    @staticmethod
    def _row_sizes(data: pa.RecordBatch) -> pa.Array:
        sizes = pc.add(
            pc.fill_null(pc.binary_length(data.column(1)), 0).cast(pa.int64()),
            pc.fill_null(pc.binary_length(data.column(0)), 0).cast(pa.int64()),
        )
        headers = data.column(3)
        if headers.null_count < len(headers):
            flat = headers.flatten()
            if len(flat):
                per_header = pc.add(
                    pc.binary_length(flat.field(0)).cast(pa.int64()),
                    pc.fill_null(pc.binary_length(flat.field(1)), 0).cast(pa.int64()),
                )
                # Sum per row: cumulative sums at the list offsets.
                totals = pc.cumulative_sum(pc.add(per_header, HEADER_OVERHEAD))
                totals = pa.concat_arrays([pa.array([0], pa.int64()), totals])
                offsets = headers.offsets
                per_row = pc.subtract(
                    totals.take(offsets.slice(1)), totals.take(offsets.slice(0, len(headers)))
                )
                sizes = pc.add(sizes, per_row)
        return pc.add(sizes, RECORD_OVERHEAD)

    def _chunk_ids(self, sizes: pa.Array) -> pa.Array:
        """Consecutive rows in chunks of about batch.size bytes: the chunk id of every row."""
        if len(sizes) == 0:
            return pa.array([], pa.int64())
        ends = pc.cumulative_sum(sizes)
        starts = pc.subtract(ends, sizes)
        return pc.divide(starts, pa.scalar(self.config.batch_size, pa.int64()))

    def _chunks(self, sizes: pa.Array) -> Iterable[tuple[int, int, int]]:
        """(start, length, bytes) of each chunk of consecutive rows."""
        ids = self._chunk_ids(sizes)
        counts = pc.value_counts(ids)  # ids ascend, so counts come in order
        start = 0
        ends = pc.cumulative_sum(sizes)
        for count in counts.field("counts").to_pylist():
            end = start + count
            nbytes = ends[end - 1].as_py() - (ends[start - 1].as_py() if start else 0)
            yield start, count, nbytes
            start = end

    @staticmethod
    def _group(parts: pa.Array) -> Iterable[tuple[int, pa.Array | None]]:
        """(partition, row indices in table order) for each partition; None: every row."""
        minimum, maximum = pc.min_max(parts).values()
        if minimum.as_py() == maximum.as_py():
            yield int(minimum.as_py()), None
            return
        order = pc.sort_indices(parts)  # stable: rows keep their order within a partition
        sorted_parts = parts.take(order)
        counts = pc.value_counts(sorted_parts)
        start = 0
        for value, count in zip(
            counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True
        ):
            yield int(value), order.slice(start, count)
            start += count

    def _append_table(
        self, tp: TopicPartition, piece: pa.RecordBatch, nbytes: int
    ) -> Future[RecordBatchMetadata]:
        acc = self._acc
        with acc.lock:
            if not acc.wait_for_space(nbytes, acc.clock() + self.config.max_block_ms / 1000):
                return failed_future(self._buffer_exhausted())
            if self._txn.transactional:
                self._txn.note_partition(tp)
            return acc.append_table(tp, piece, nbytes)
