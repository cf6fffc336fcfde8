"""The producer's sender: the background thread that delivers what ``Producer.send()`` queued.

As Kafka's ``Sender`` (and aiokafka's ``sender.py``): one *sender* thread drains ready batches
from the :class:`~replication.client.accumulator.RecordAccumulator` per leader broker and hands
each produce request to an I/O thread (one request in flight per broker connection,
``max.in.flight.requests.per.connection`` connections per broker); the I/O thread completes the
futures, or puts retriable failures back at the head of their partition's queue after
retry.backoff.ms (exponential up to retry.backoff.max.ms). Batches that outlive
``delivery.timeout.ms`` expire here. Callbacks added to the futures run in an I/O thread, as
Kafka's run in its sender thread: keep them short.

Retriable errors are retried until ``retries`` or ``delivery.timeout.ms`` runs out; the future
then fails with the last error's class, whose message says how long it tried. Before the first
batch the sender gets the producer id (idempotence), adds a transaction's new partitions before
their first batch, and stamps every batch when it is first sent, through the
:class:`~replication.client.transactions.TransactionManager` the producer shares with it.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import pyarrow as pa

from logstore.batch import Compression
from replication.client.accumulator import Drained, ProducerBatch, RecordAccumulator
from replication.client.cluster import Cluster, MetadataSnapshot
from replication.client.config import ProducerConfig
from replication.client.errors import ClientClosedError, DeliveryTimeoutError
from replication.client.metrics import ProducerMetrics
from replication.client.retry import RetryPolicy, exhausted
from replication.client.transactions import FENCED_ERRORS, TransactionManager
from replication.errors import (
    DuplicateSequenceNumberError,
    NetworkError,
    RecordTooLargeError,
    ReplogError,
    UnknownProducerIdError,
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

__all__ = ["Sender"]

log = logging.getLogger(__name__)

_IO_THREADS: Final = 16
_PRODUCE_VERSION: Final = 0
_DUPLICATE_SEQUENCE: Final = DuplicateSequenceNumberError.code
#: Marks I/O threads (``sender`` attribute), so close() from a callback does not deadlock.
_IO_LOCAL: Final = threading.local()


def _leader_of(snapshot: MetadataSnapshot, key: tuple[str, int]) -> int | None:
    return snapshot.leader(key[0], key[1])


class Sender:
    """Delivers a producer's queued batches from a background thread (Kafka's ``Sender``).

    The :class:`~replication.client.producer.Producer` creates and owns it, and shares with it
    the cluster metadata, the accumulator and the transaction manager. ``on_crash`` is called
    if the sender thread dies of an unexpected error (after failing every queued record), so
    the producer refuses further sends.
    """

    def __init__(
        self,
        config: ProducerConfig,
        cluster: Cluster,
        accumulator: RecordAccumulator,
        txn: TransactionManager,
        *,
        on_crash: Callable[[], None],
        metrics: ProducerMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else ProducerMetrics(config)
        self._cluster = cluster
        self._acc = accumulator
        self._txn = txn
        self._on_crash = on_crash
        self._compression = Compression[config.compression_type.upper()]
        #: the waits between a batch's attempts (its deadline is delivery.timeout.ms)
        self._backoff = RetryPolicy.of(config, config.delivery_timeout_ms, "delivery.timeout.ms")
        self._free_slots: dict[int, list[int]] = {}
        self._force_close = False
        self._io = ThreadPoolExecutor(
            max_workers=_IO_THREADS, thread_name_prefix=f"{config.client_id}-io"
        )
        self._thread = threading.Thread(
            target=self._run, name=f"{config.client_id}-sender", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def in_own_thread(self) -> bool:
        """Whether the caller is the sender thread or one of its I/O threads (a callback)."""
        return (
            threading.current_thread() is self._thread or getattr(_IO_LOCAL, "sender", None) is self
        )

    def close(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` s for the thread to deliver what is queued (the accumulator
        is closing), then fail the rest; wait for requests in flight."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._acc.lock:
                self._force_close = True
                self._acc.ready.notify()
            self._thread.join()
        self._io.shutdown(wait=True)  # in-flight requests complete or fail their futures

    def fail(self, batches: Sequence[ProducerBatch], error: BaseException) -> None:
        """Fail batches taken out of the accumulator (an aborted transaction's queued ones)."""
        self._finish([], [(b, error) for b in batches])

    # --- the sender thread ------------------------------------------------------------------

    def _can_send(self, node: int) -> bool:
        slots = self._free_slots.get(node)
        if slots is None:
            slots = self._free_slots[node] = list(
                range(self.config.max_in_flight_requests_per_connection)
            )
        return bool(slots)

    def dispatch(self, tp_key: tuple[str, int]) -> bool:
        """Hand a partition's newly ready batch to an I/O thread on the caller's thread
        (``send()``'s, acc.lock held), as the sender thread would; False leaves it to the sender
        thread (a transaction, no producer id yet, metadata to refresh, no known leader, no free
        connection, a batch queued before it, closing).

        The producer sets it as the accumulator's ``dispatch`` when linger.ms is 0. Kafka's
        client always wakes its sender thread; in CPython each thread hand-off is a wake-up and
        a GIL hand-over, and a lone synchronous send made three (caller, sender, I/O thread,
        caller): this makes it two.
        """
        acc = self._acc
        txn = self._txn
        if (
            acc.closing
            or self._force_close
            or txn.transactional
            or not txn.sendable()
            or self._cluster.needs_update
        ):
            return False
        node = self._cluster.snapshot.leader(*tp_key)
        if node is None or not self._can_send(node):
            return False
        batch = acc.take_one(tp_key, acc.clock())
        if batch is None:
            return False
        plan = Drained(node)
        plan.batches.append(batch)
        plan.size = batch.size
        self._io.submit(self._produce, plan, self._free_slots[node].pop())
        return True

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
            self._on_crash()
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
        elif isinstance(last, ReplogError):
            error = exhausted(last, text)  # the last error's class, saying how long it tried
        else:
            error = DeliveryTimeoutError(f"{text}: last error: {last}")
        error.__cause__ = last
        return error

    # --- I/O threads ----------------------------------------------------------------------

    def _produce(self, plan: Drained, slot: int) -> None:
        _IO_LOCAL.sender = self
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
            metrics = self.metrics
            for batch in encoded:
                metrics.record_send.record(batch.record_count)
                metrics.batch_size.record(len(batch.payload or b""))
            metrics.records_per_request.record(sum(b.record_count for b in encoded))
            try:
                conn = self._cluster.connection(plan.node, slot)
                if c.acks == 0:
                    conn.send(ApiKey.PRODUCE, _PRODUCE_VERSION, request, expect_response=False)
                    done.extend((batch, -1, -1) for batch in encoded)
                    return
                sent = time.monotonic()
                response: ProduceResponse = conn.send(
                    ApiKey.PRODUCE,
                    _PRODUCE_VERSION,
                    request,
                    timeout_ms=c.request_timeout_ms + min(c.request_timeout_ms, 5000),
                )
                metrics.request_latency.record((time.monotonic() - sent) * 1000)
                metrics.produce_throttle_time.record(response.throttle_time_ms)
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
        restamped = isinstance(
            error, UnknownProducerIdError
        ) and self._txn.restamp_after_unknown_producer(batch)
        if not error.retriable and not restamped:
            failed.append((batch, error))
            return
        if batch.attempts >= self.config.retries or now >= batch.deadline:
            failed.append((batch, self._expired_error(batch, error)))
            return
        batch.attempts += 1
        delay = self._backoff.backoff_s(batch.attempts, random.random())
        batch.retry_at = now + delay
        log.warning(
            "produce to %s failed (attempt %d, retrying in %d ms): %s",
            batch.tp,
            batch.attempts,
            round(delay * 1000),
            error,
        )
        self.metrics.record_retry.record(batch.record_count)
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
            self.metrics.record_error.record(batch.record_count)
        if retry and self._force_close:
            # Nobody drains the queues any more: what would be retried fails instead.
            closed = ClientClosedError("the producer was closed before these records were sent")
            for batch in retry:
                batch.fail(closed)
                self.metrics.record_error.record(batch.record_count)
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
            # Wake the sender thread only if it has something to do now (batches that waited
            # for this partition or connection, a failure's consequences, closing): a spurious
            # wake competes for the GIL with the thread waiting for this completion.
            if failed or retry or acc.closing or self._force_close or acc.has_queued():
                acc.ready.notify()
