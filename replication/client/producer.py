"""The producer: ``send()`` records, a background sender delivers them in batches.

Threads: the caller's ``send()`` appends to the :class:`RecordAccumulator` (no I/O once the
topic's metadata is known); one *sender* thread drains ready batches per leader broker and
hands each produce request to an I/O thread (one request in flight per broker connection,
``max.in.flight.requests.per.connection`` connections per broker); the I/O thread completes the
futures, or puts retriable failures back at the head of their partition's queue after
retry.backoff.ms (exponential up to retry.backoff.max.ms). Callbacks added to the futures run
in an I/O thread, as Kafka's run in its sender thread: keep them short.

Errors reach the futures as named classes of the one error tree: RecordTooLargeError,
UnknownTopicOrPartitionError, NotEnoughReplicasError, BrokerUnreachableError, ... Retriable
ones are retried until ``retries`` or ``delivery.timeout.ms`` runs out; the future then fails
with the last error's class, whose message says how long it tried.

Idempotence (``enable.idempotence``, on by default) and transactions (``transactional.id``):
the producer id, epoch and sequence numbers, and the transaction's state and partitions, live
in a :class:`~replication.client.transactions.TransactionManager`; the sender gets the producer
id before the first batch, adds a transaction's new partitions before their first batch, and
stamps every batch when it is first sent.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from logstore.batch import Compression, to_record_schema
from replication.client.accumulator import (
    HEADER_OVERHEAD,
    RECORD_OVERHEAD,
    Drained,
    ProducerBatch,
    RecordAccumulator,
)
from replication.client.cluster import Cluster, MetadataSnapshot
from replication.client.config import ProducerConfig, load
from replication.client.errors import (
    ClientClosedError,
    DeliveryTimeoutError,
    TransactionAbortedError,
)
from replication.client.futures import failed_future
from replication.client.partitioner import KeyHashCache, partitions_for_keys
from replication.client.transactions import FENCED_ERRORS, TransactionManager, TxnState
from replication.client.types import (
    BatchMetadata,
    Header,
    RecordMetadata,
    TopicPartition,
    TransactionHandle,
)
from replication.errors import (
    BrokerUnreachableError,
    DuplicateSequenceNumberError,
    NetworkError,
    RecordTooLargeError,
    ReplogError,
    UnknownTopicOrPartitionError,
    for_code,
)
from replication.protocol import (
    ApiKey,
    ProduceRequest,
    ProduceRequestPartition,
    ProduceRequestTopic,
    ProduceResponse,
)

__all__ = ["Producer"]

log = logging.getLogger(__name__)

_IO_THREADS: Final = 16
_PRODUCE_VERSION: Final = 0
_DUPLICATE_SEQUENCE: Final = DuplicateSequenceNumberError.code
#: Marks I/O threads (``producer`` attribute), so close() from a callback does not deadlock.
_IO_LOCAL: Final = threading.local()


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


def _leader_of(snapshot: MetadataSnapshot, key: tuple[str, int]) -> int | None:
    return snapshot.leader(key[0], key[1])


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
        self._compression = Compression[c.compression_type.upper()]
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
        self._free_slots: dict[int, list[int]] = {}
        self._closed = False
        self._force_close = False
        self._io = ThreadPoolExecutor(
            max_workers=_IO_THREADS, thread_name_prefix=f"{c.client_id}-io"
        )
        self._sender = threading.Thread(target=self._run, name=f"{c.client_id}-sender", daemon=True)
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
    ) -> list[Future[BatchMetadata]]:
        """Queue a whole Arrow table; one future per batch, giving its :class:`BatchMetadata`.

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
        futures: list[Future[BatchMetadata]] = []
        for p, indices in self._group(parts):
            chunk_data = data if indices is None else data.take(indices)
            chunk_sizes = sizes if indices is None else sizes.take(indices)
            tp = TopicPartition(topic, p)
            for start, length, nbytes in self._chunks(chunk_sizes):
                piece = chunk_data.slice(start, length)
                futures.append(self._append_table(tp, piece, nbytes))
        return futures

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
            self._finish([], [(b, error) for b in queued])

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
        in_io_thread = (
            threading.current_thread() is self._sender
            or getattr(_IO_LOCAL, "producer", None) is self
        )
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
        self._sender.join(timeout)
        if self._sender.is_alive():
            with self._acc.lock:
                self._force_close = True
                self._acc.ready.notify()
            self._sender.join()
        self._io.shutdown(wait=True)  # in-flight requests complete or fail their futures
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
        max_block = self.config.max_block_ms
        deadline = time.monotonic() + max_block / 1000
        attempt = 0
        last: ReplogError | None = None
        while True:
            attempt += 1
            try:
                cluster.refresh([topic], allow_auto_topic_creation=True)
            except BrokerUnreachableError as err:
                if not cluster.bootstrapped:
                    return err  # never reached any broker: say so at once
                last = err
            except ReplogError as failure:
                if not failure.retriable:
                    return failure
                last = failure
            snapshot = cluster.snapshot
            count = snapshot.partition_counts.get(topic)
            if count is not None:
                return count
            meta = snapshot.topics.get(topic)
            if meta is not None and meta.error_code:
                cls = for_code(meta.error_code) or UnknownTopicOrPartitionError
                topic_error = cls(f"topic {topic!r}: {cls()}")
                if not cls.retriable:
                    return topic_error
                last = topic_error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if isinstance(last, BrokerUnreachableError):
                    return last
                return UnknownTopicOrPartitionError(
                    f"topic {topic!r} not present in metadata after {max_block} ms "
                    "(max.block.ms): create it (`replog topics create`) or check its name"
                    + (f"; last error: {last}" if last is not None else "")
                )
            time.sleep(min(self.config.backoff_s(attempt), remaining))

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
    ) -> Future[BatchMetadata]:
        acc = self._acc
        with acc.lock:
            if not acc.wait_for_space(nbytes, acc.clock() + self.config.max_block_ms / 1000):
                return failed_future(self._buffer_exhausted())
            if self._txn.transactional:
                self._txn.note_partition(tp)
            return acc.append_table(tp, piece, nbytes)

    # --- the sender thread ------------------------------------------------------------------

    def _can_send(self, node: int) -> bool:
        slots = self._free_slots.get(node)
        if slots is None:
            slots = self._free_slots[node] = list(
                range(self.config.max_in_flight_requests_per_connection)
            )
        return bool(slots)

    def _run(self) -> None:
        acc = self._acc
        cluster = self._cluster
        txn = self._txn
        backoff = self.config.retry_backoff_ms / 1000
        try:
            while True:
                if cluster.needs_update:
                    cluster.maybe_refresh()
                if (
                    txn.needs_producer_id()
                    and acc.clock() >= txn.init_retry_at
                    and (acc.has_queued() or acc.incomplete)
                ):  # on first use, as records wait for it
                    txn.init_idempotent(acc.clock())
                snapshot = cluster.snapshot
                now = acc.clock()
                doomed: list[ProducerBatch] = []
                to_add: list[tuple[str, int]] = []
                with acc.lock:
                    if self._force_close:
                        aborted = acc.abort_all()
                        break
                    if acc.closing and not acc.incomplete:
                        aborted = []
                        break
                    expired, next_deadline = self._expire(now)
                    doomed_error = txn.doomed_error()
                    if doomed_error is not None:
                        doomed = acc.abort_all()
                    if txn.sendable():
                        to_add = txn.take_partitions_to_add()
                        plans, wake, unknown = acc.drain(
                            now,
                            functools.partial(_leader_of, snapshot),
                            self._can_send,
                            self.config.max_request_size,
                            hold=txn.held(),
                        )
                    else:
                        # no producer id yet (retry at init_retry_at), or a transaction is
                        # ending: wait to be notified
                        plans, unknown = {}, False
                        waiting = txn.needs_producer_id() and acc.has_queued()
                        wake = txn.init_retry_at if waiting else None
                    if unknown:
                        cluster.request_update()
                    if not plans and not expired and not doomed and not to_add:
                        if next_deadline is not None:
                            wake = next_deadline if wake is None else min(wake, next_deadline)
                        timeout = None if wake is None else max(wake - now, 0.0)
                        if unknown or cluster.needs_update:
                            timeout = backoff if timeout is None else min(timeout, backoff)
                        if timeout is None or timeout > 0:
                            acc.ready.wait(timeout)
                        continue
                    slots = {node: self._free_slots[node].pop() for node in plans}
                if expired:
                    self._finish([], [(b, self._expired_error(b, b.last_error)) for b in expired])
                if doomed and doomed_error is not None:
                    self._finish([], [(b, doomed_error) for b in doomed])
                if to_add:
                    self._io.submit(txn.add_partitions, to_add)
                for node, plan in plans.items():
                    self._io.submit(self._produce, plan, slots[node])
        except Exception as err:  # queued futures must fail, not hang
            log.exception("producer sender thread failed; failing every queued record")
            self._closed = True
            with acc.lock:
                aborted = acc.abort_all()
            self._finish([], [(b, err) for b in aborted])
            return
        closed = ClientClosedError("the producer was closed before these records were delivered")
        self._finish([], [(b, closed) for b in aborted])

    def _expire(self, now: float) -> tuple[list[ProducerBatch], float | None]:
        acc = self._acc
        expired = acc.expire(now)
        next_deadline: float | None = None
        for queue in acc.queues.values():
            if queue:
                d = queue[0].deadline
                next_deadline = d if next_deadline is None else min(next_deadline, d)
        return expired, next_deadline

    def _expired_error(self, batch: ProducerBatch, last: BaseException | None) -> BaseException:
        text = (
            f"{batch.record_count} record(s) for {batch.tp} not delivered within "
            f"delivery.timeout.ms={self.config.delivery_timeout_ms}"
        )
        if last is None:
            snapshot = self._cluster.snapshot
            meta = snapshot.topics.get(batch.tp.topic)
            if meta is None or batch.tp.partition not in meta.partitions:
                error: BaseException = UnknownTopicOrPartitionError(
                    f"{text}: {batch.tp} is not in the cluster metadata"
                )
            else:
                error = DeliveryTimeoutError(f"{text}: the partition had no reachable leader")
        elif isinstance(last, BrokerUnreachableError):
            error = BrokerUnreachableError(last.host, last.port, f"{last.reason}; {text}")
        elif isinstance(last, ReplogError) and type(last).__init__ is ReplogError.__init__:
            error = type(last)(f"{text}: {last}")
        else:
            error = DeliveryTimeoutError(f"{text}: last error: {last}")
        error.__cause__ = last
        return error

    # --- I/O threads ----------------------------------------------------------------------

    def _produce(self, plan: Drained, slot: int) -> None:
        _IO_LOCAL.producer = self
        done: list[tuple[ProducerBatch, int, int]] = []
        failed: list[tuple[ProducerBatch, BaseException]] = []
        retry: list[ProducerBatch] = []
        c = self.config
        try:
            encoded: list[ProducerBatch] = []
            for batch in plan.batches:
                try:
                    self._txn.stamp(batch)
                    batch.encode(self._compression)
                except (ValueError, TypeError, pa.ArrowException) as err:
                    failed.append((batch, err))
                else:
                    encoded.append(batch)
            if not encoded:
                return
            by_topic: dict[str, list[ProduceRequestPartition]] = {}
            for batch in encoded:
                by_topic.setdefault(batch.tp.topic, []).append(
                    ProduceRequestPartition(index=batch.tp.partition, records=batch.payload)
                )
            request = ProduceRequest(
                transactional_id=self._txn.transactional_id,
                acks=c.acks,
                timeout_ms=c.request_timeout_ms,
                topic_data=[
                    ProduceRequestTopic(name=name, partition_data=parts)
                    for name, parts in by_topic.items()
                ],
            )
            try:
                conn = self._cluster.connection(plan.node, slot)
                if c.acks == 0:
                    conn.send(ApiKey.PRODUCE, _PRODUCE_VERSION, request, expect_response=False)
                    done.extend((batch, -1, -1) for batch in encoded)
                    return
                response: ProduceResponse = conn.send(
                    ApiKey.PRODUCE,
                    _PRODUCE_VERSION,
                    request,
                    timeout_ms=c.request_timeout_ms + min(c.request_timeout_ms, 5000),
                )
            except ReplogError as err:
                if err.refresh_metadata or isinstance(err, NetworkError):
                    self._cluster.request_update()
                for batch in encoded:
                    self._retry_or_fail(batch, err, retry, failed)
                return
            results = {
                (t.name, p.index): p for t in response.responses for p in t.partition_responses
            }
            for batch in encoded:
                result = results.get(batch.tp)
                if result is None:
                    error: ReplogError = NetworkError(
                        f"the produce response of broker {plan.node} has no result for {batch.tp}"
                    )
                    self._retry_or_fail(batch, error, retry, failed)
                elif result.error_code in (0, _DUPLICATE_SEQUENCE):
                    # DUPLICATE_SEQUENCE_NUMBER: a retry of a batch already in the log
                    done.append((batch, result.base_offset, result.log_append_time_ms))
                else:
                    cls = for_code(result.error_code) or ReplogError
                    message = result.error_message or str(cls())
                    if result.record_errors:
                        message += (
                            " ("
                            + "; ".join(
                                f"batch {e.batch_index}: {e.batch_index_error_message}"
                                for e in result.record_errors
                            )
                            + ")"
                        )
                    error = cls(f"produce to {batch.tp} failed: {message}")
                    if cls.refresh_metadata:
                        self._cluster.request_update()
                    self._retry_or_fail(batch, error, retry, failed)
        except Exception as err:  # every future must complete, whatever broke
            log.exception("producing to broker %d failed unexpectedly", plan.node)
            handled = (
                {id(b) for b, *_ in done} | {id(b) for b, _ in failed} | {id(b) for b in retry}
            )
            failed.extend((b, err) for b in plan.batches if id(b) not in handled)
        finally:
            self._finish(done, failed, retry=retry, plan=plan, slot=slot)

    def _retry_or_fail(
        self,
        batch: ProducerBatch,
        error: ReplogError,
        retry: list[ProducerBatch],
        failed: list[tuple[ProducerBatch, BaseException]],
    ) -> None:
        now = self._acc.clock()
        if isinstance(error, FENCED_ERRORS):
            error = self._txn.fenced_error(error)
        batch.last_error = error
        if (
            isinstance(error, RecordTooLargeError)
            and batch.table is None
            and batch.record_count > 1
        ):
            self._txn.rewind(batch)  # nothing was written: the halves take its sequences
            parts = batch.split(now)
            log.warning(
                "batch of %d records for %s is too large for the broker; splitting it in two",
                batch.record_count,
                batch.tp,
            )
            with self._acc.lock:
                self._acc.replace(batch, parts)
            retry.extend(parts)
            return
        if not error.retriable:
            failed.append((batch, error))
            return
        if batch.attempts >= self.config.retries or now >= batch.deadline:
            failed.append((batch, self._expired_error(batch, error)))
            return
        batch.attempts += 1
        delay = self.config.backoff_s(batch.attempts)
        batch.retry_at = now + delay
        log.warning(
            "produce to %s failed (attempt %d, retrying in %d ms): %s",
            batch.tp,
            batch.attempts,
            round(delay * 1000),
            error,
        )
        retry.append(batch)

    def _finish(
        self,
        done: list[tuple[ProducerBatch, int, int]],
        failed: list[tuple[ProducerBatch, BaseException]],
        *,
        retry: Sequence[ProducerBatch] = (),
        plan: Drained | None = None,
        slot: int | None = None,
    ) -> None:
        """Complete futures (outside the lock), then requeue, unmute and free space."""
        for batch, base_offset, log_append_time in done:
            batch.complete(base_offset, log_append_time)
        for batch, error in failed:
            batch.fail(error)
        if retry and self._force_close:
            # Nobody drains the queues any more: what would be retried fails instead.
            closed = ClientClosedError("the producer was closed before these records were sent")
            for batch in retry:
                batch.fail(closed)
            failed = [*failed, *((b, closed) for b in retry)]
            retry = ()
        acc = self._acc
        with acc.lock:
            for batch, error in failed:
                self._txn.batch_failed(batch, error)
            for batch in reversed(retry):
                acc.reenqueue(batch)
            if plan is not None:
                acc.unmute(b.tp for b in plan.batches)
                if slot is not None:
                    self._free_slots[plan.node].append(slot)
            acc.completed([b for b, *_ in done])
            acc.completed([b for b, _ in failed])
            acc.ready.notify()
