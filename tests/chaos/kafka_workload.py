"""Workloads on confluent-kafka (librdkafka), through the brokers' Kafka listeners (each behind
its own proxy: :attr:`~tests.chaos.cluster.ChaosCluster.kafka_bootstrap`), recording into the
same :class:`~tests.chaos.history.History` as replog's own clients, so the checker judges
them by the same rules:

- :class:`KafkaIdempotentWriter`: an idempotent producer (``enable.idempotence``, acks=all)
  writing ``pk<n>.<k>-<seq>`` values round-robin over the partitions of a topic, recording
  every delivery report: an :class:`~tests.chaos.history.Ack` with the acked offset, or a
  :class:`~tests.chaos.history.SendFailure`.
- :class:`KafkaTransformer`: a consume-transform-produce loop, as Kafka's exactly-once
  examples: a member of a consumer group (read_committed) reads a few records of one topic,
  and one transaction writes a record per input to the same partition of another topic and
  commits the group's offsets past those inputs (``send_offsets_to_transaction``); it commits
  ~70 % of them and aborts the rest (then goes back to the committed offsets), recording each
  :class:`~tests.chaos.history.Transaction` and what it was told. An output names its input:
  ``kt<txn:06d>-<i>:<partition>@<offset>`` is output ``i`` of transaction ``txn``, made from
  the record at ``offset`` of ``partition`` of the source (and written to that partition of
  the sink; :func:`~tests.chaos.history.parse_transformed_value` reads it back). A record
  with an empty value is skipped: no output, though the offsets committed pass it. After a
  rebalance the loop drops what it read and goes back to the committed offsets, so every
  input is transformed once in the read_committed sink, up to the group's committed offset.
- :class:`KafkaReader`: a member of a consumer group (one group per isolation level) that
  subscribes to the topics and commits its offsets (auto commit), recording every record it
  is given (:class:`~tests.chaos.history.Read`), every batch its CRC check refused, and after
  each consume the high watermark librdkafka last got from a fetch of each partition it is
  assigned (:class:`~tests.chaos.history.HighWatermark`, under its own name). That is the
  fetch response's HighWatermark with read_committed too; a read_committed member also
  records the LastStableOffset librdkafka got (its statistics' ``ls_offset``), as the series
  ``<name>/lso``: it must not go down either.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from tests.chaos.history import (
    NO_OFFSET,
    TP,
    Ack,
    CorruptRead,
    HighWatermark,
    History,
    Isolation,
    Outcome,
    Read,
    Transaction,
    producer_value,
    transformed_value,
)
from tests.chaos.workload import IdempotentWriter, Worker

log = logging.getLogger(__name__)

#: Where librdkafka's own log lines go (it logs every refused connection of a fault).
LIBRDKAFKA_LOG = logging.getLogger("tests.chaos.librdkafka")
#: librdkafka timeouts short enough that a client notices a fault within seconds.
CLIENT_SETTINGS: dict[str, Any] = {
    "logger": LIBRDKAFKA_LOG,
    "request.timeout.ms": 5000,
    "retry.backoff.max.ms": 500,
    "topic.metadata.refresh.interval.ms": 2000,
    "socket.connection.setup.timeout.ms": 5000,
}
#: A group member's session: the broker's smallest (group.min.session.timeout.ms), so a
#: member on a broker that was cut off is replaced within seconds.
GROUP_SETTINGS: dict[str, Any] = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1000,
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": 200,
    "check.crcs": True,
}
#: How long a transactional call may take before its outcome counts as unknown.
TXN_CALL_S = 10.0
#: How many times the transformer calls commit or abort while librdkafka says retry.
END_ATTEMPTS = 3
#: The most records the transformer reads for one transaction.
BATCH = 20
#: How long the transformer may take to join its group on the healthy cluster.
JOIN_TIMEOUT_S = 30.0
#: How often a read_committed KafkaReader's librdkafka reports its statistics (with the LSOs).
STATS_INTERVAL_MS = 500
#: How long the transformer waits before asking again for the group's committed offsets.
RETRY_S = 0.5


def committed(
    consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
) -> list[confluent_kafka.TopicPartition]:
    """The group's committed offsets of ``partitions`` (negative: none), asked as a
    read_committed consumer asks (OffsetFetch with require_stable: the offsets of a transaction
    not yet ended are refused). KafkaException if any partition's could not be read."""
    found = consumer.committed(partitions, timeout=5)
    errors = [tp for tp in found if tp.error is not None]
    if errors:
        raise confluent_kafka.KafkaException(
            ", ".join(f"{tp.topic}-{tp.partition}: {tp.error}" for tp in errors)
        )
    return found


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int, timeout_s: float
) -> dict[TP, int]:
    """``group``'s committed offset of each partition of ``topic`` (negative: none), asked
    again until the answer has no error; TimeoutError after ``timeout_s``."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"chaos-final-{group}",
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            **CLIENT_SETTINGS,
        }
    )
    deadline = time.monotonic() + timeout_s
    tps = [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)]
    try:
        while True:
            try:
                return {(tp.topic, tp.partition): tp.offset for tp in committed(consumer, tps)}
            except confluent_kafka.KafkaException as err:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the offsets of group {group}: {err}") from err
            time.sleep(RETRY_S)
    finally:
        consumer.close()


class KafkaIdempotentWriter(IdempotentWriter):
    """Sends ``pk<n>.<k>-<seq>`` values (``k`` counts the producers it had to replace after a
    fatal error: order holds per producer id), one every ``interval_s``, at most ``window``
    undelivered (:class:`~tests.chaos.workload.IdempotentWriter`'s arguments)."""

    #: the fatal error librdkafka reported (error_cb), until the producer is replaced
    fatal: confluent_kafka.KafkaError | None = None

    def _producer(self) -> confluent_kafka.Producer:  # type: ignore[override]
        return confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": self.name,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 30000,
                "error_cb": self._error,
                **CLIENT_SETTINGS,
            }
        )

    def _error(self, err: confluent_kafka.KafkaError) -> None:
        if err.fatal():
            self.fatal = err
        else:
            log.info("%s: %s", self.name, err)

    def run(self) -> None:
        producer = self._producer()
        incarnation = 0  # a new producer (new producer id) writes under a new name: pk1.1-...
        seq = 0
        while not self.stopping.is_set():
            self._poll(producer, 0)  # serves the delivery reports
            if self.fatal is not None:  # the producer is unusable: a new one
                log.info("%s: fatal error, a new producer: %s", self.name, self.fatal)
                with contextlib.suppress(confluent_kafka.KafkaException):
                    producer.flush(10)  # fails what it still holds, reporting each
                producer = self._producer()
                self.fatal = None
                incarnation += 1
                continue
            if not self.unacked.acquire(blocking=False):  # released by the delivery reports
                self._poll(producer, 0.2)
                continue
            value = producer_value(f"{self.name}.{incarnation}", seq)
            partition = seq % self.partitions
            seq += 1
            try:
                producer.produce(
                    self.topic,
                    value=value.encode(),
                    partition=partition,
                    on_delivery=self._report(value, partition),
                )
            except (BufferError, confluent_kafka.KafkaException) as err:
                self._failed(value, partition, err)
            self._poll(producer, self.interval_s)
        left = producer.flush(30)
        if left:
            log.info("%s: %d records undelivered at the end", self.name, left)

    def _poll(self, producer: confluent_kafka.Producer, timeout_s: float) -> None:
        """Serve delivery reports; a fatal error poll() raises (as well as reporting it to
        error_cb) makes the producer one to replace."""
        try:
            producer.poll(timeout_s)
        except confluent_kafka.KafkaException as err:
            error = err.args[0] if err.args else None
            if not (isinstance(error, confluent_kafka.KafkaError) and error.fatal()):
                raise
            self.fatal = error

    def _report(
        self, value: str, partition: int
    ) -> Callable[[confluent_kafka.KafkaError | None, confluent_kafka.Message], None]:
        return lambda err, message: self._delivered(err, message, value, partition)

    def _delivered(
        self,
        err: confluent_kafka.KafkaError | None,
        message: confluent_kafka.Message,
        value: str,
        partition: int,
    ) -> None:
        if err is not None:
            self._failed(value, partition, confluent_kafka.KafkaException(err))
            return
        self.unacked.release()
        offset = message.offset()  # None: delivered, at an offset librdkafka did not learn
        self.history.acks.append(
            Ack(
                self.name,
                value,
                self.topic,
                partition,
                NO_OFFSET if offset is None else offset,
                time.monotonic(),
            )
        )


class KafkaTransformer(Worker):
    """Consume-transform-produce from ``source`` to ``sink`` (as many partitions), up to
    :data:`BATCH` records per transaction."""

    name = "kafka-ctp"

    def __init__(self, bootstrap: str, source: str, sink: str, history: History, seed: int) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self.source = source
        self.sink = sink
        self.history = history
        self.rng = random.Random(seed)
        self.producer: confluent_kafka.Producer | None = None
        self.consumer: confluent_kafka.Consumer | None = None
        #: set by the group's rebalance callbacks (served inside consume())
        self.rebalanced = False

    def _producer(self) -> confluent_kafka.Producer:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": self.name,
                "transactional.id": self.name,
                "transaction.timeout.ms": 10000,
                "message.timeout.ms": 10000,
                "linger.ms": 5,
                **CLIENT_SETTINGS,
            }
        )
        producer.init_transactions(20)  # fences the previous one, aborting its transaction
        return producer

    def init(self) -> None:
        """Register the transactional id (creates __transaction_state on first use), join the
        group, and record where it starts reading each partition."""
        self.producer = self._producer()
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": self.name,
                "group.id": self.name,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                **GROUP_SETTINGS,
                **CLIENT_SETTINGS,
            }
        )
        self.consumer.subscribe(
            [self.source],
            on_assign=self._on_rebalance,
            on_revoke=self._on_rebalance,
            on_lost=self._on_rebalance,
        )
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not self.consumer.assignment():  # in the group before the faults start
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} got no partitions in {JOIN_TIMEOUT_S:.0f} s")
            self.consumer.consume(BATCH, 0.2)
        self.rebalanced = False
        starts = self._rewind(self.consumer, deadline)  # what it was given joining is read again
        for tp in starts:
            offset = tp.offset
            if offset < 0:  # no committed offset: auto.offset.reset=earliest, the log start
                offset, _ = self.consumer.get_watermark_offsets(tp, timeout=5)
            self.history.transformer_starts[(tp.topic, tp.partition)] = offset

    def _on_rebalance(
        self, consumer: confluent_kafka.Consumer, partitions: list[confluent_kafka.TopicPartition]
    ) -> None:
        self.rebalanced = True

    def run(self) -> None:
        assert self.consumer is not None, "init() first"
        consumer = self.consumer
        txn = 0
        try:
            while not self.stopping.is_set():
                if self.producer is None:
                    try:
                        self.producer = self._producer()
                    except confluent_kafka.KafkaException as err:
                        log.info("%s: init_transactions failed: %s", self.name, err)
                        self.stopping.wait(0.5)
                        continue
                messages = [m for m in consumer.consume(BATCH, 0.5) if self._usable(m)]
                if self.rebalanced:
                    # the positions went back to the committed offsets while it consumed (or
                    # will): drop what it read and start again from the group's offsets
                    self.rebalanced = False
                    self._rewind(consumer)
                    continue
                inputs = [m for m in messages if m.value()]
                if not inputs:
                    continue
                records = tuple(
                    (partition, transformed_value(txn, i, partition, offset))
                    for i, (partition, offset) in enumerate(_where(m) for m in inputs)
                )
                ends: dict[int, int] = {}  # partition -> the offset after its last input
                for m in messages:
                    partition, offset = _where(m)
                    ends[partition] = max(ends.get(partition, 0), offset + 1)
                offsets = [
                    confluent_kafka.TopicPartition(self.source, p, o) for p, o in ends.items()
                ]
                commit = self.rng.random() < 0.7
                outcome = self._one(self.producer, consumer, records, offsets, commit)
                self.history.transactions.append(Transaction(txn, self.sink, records, outcome))
                if outcome != "committed":
                    self._rewind(consumer)
                txn += 1
        finally:
            if self.producer is not None:
                self.producer.flush(10)
            # close() waits for the group coordinator, which a fault may keep away: the loop
            # ends (the runner's deadline) and the member leaves when it can
            threading.Thread(target=consumer.close, daemon=True).start()

    def _usable(self, message: confluent_kafka.Message) -> bool:
        err = message.error()
        if err is not None:
            log.info("%s: consume: %s", self.name, err)
            return False
        return True

    def _one(
        self,
        producer: confluent_kafka.Producer,
        consumer: confluent_kafka.Consumer,
        records: tuple[tuple[int, str], ...],
        offsets: list[confluent_kafka.TopicPartition],
        commit: bool,
    ) -> Outcome:
        try:
            producer.begin_transaction()
            for partition, value in records:
                producer.produce(self.sink, value=value.encode(), partition=partition)
            producer.send_offsets_to_transaction(
                offsets, consumer.consumer_group_metadata(), TXN_CALL_S
            )
            if commit:
                self._retried(producer.commit_transaction)
                return "committed"
            self._retried(producer.abort_transaction)
            return "aborted"
        except (BufferError, confluent_kafka.KafkaException) as err:
            log.info("%s: transaction failed, outcome unknown: %s", self.name, err)
            self._recover(producer, err)
            return "unknown"

    def _retried(self, end: Callable[[float], None]) -> None:
        """Commit or abort, calling again while librdkafka says the call may be retried (a
        timeout: "retry call to resume"), until the worker is stopped."""
        for attempt in range(1, END_ATTEMPTS + 1):
            try:
                end(TXN_CALL_S)
                return
            except confluent_kafka.KafkaException as err:
                error = err.args[0] if err.args else None
                retriable = isinstance(error, confluent_kafka.KafkaError) and error.retriable()
                if not retriable or attempt == END_ATTEMPTS or self.stopping.is_set():
                    raise
                log.info("%s: ending the transaction, attempt %d: %s", self.name, attempt, err)

    def _recover(self, producer: confluent_kafka.Producer, err: BaseException) -> None:
        """After a failed call: abort the transaction if librdkafka says it can be, else start
        over with a new producer (it fences this one and aborts what it left open)."""
        error = err.args[0] if err.args else None
        if isinstance(error, confluent_kafka.KafkaError) and error.txn_requires_abort():
            try:
                producer.abort_transaction(TXN_CALL_S)
            except confluent_kafka.KafkaException as abort_err:
                log.info("%s: abort after a failure failed: %s", self.name, abort_err)
            else:
                return
        producer.purge()  # what it holds is part of a transaction that will be aborted
        self.producer = None
        # librdkafka's destroy can wait for the transaction: let a thread of its own drop it
        threading.Thread(target=producer.flush, args=(0,), daemon=True).start()

    def _rewind(
        self, consumer: confluent_kafka.Consumer, deadline: float | None = None
    ) -> list[confluent_kafka.TopicPartition]:
        """Back to the group's committed offsets (the log start where it has none), so what
        an aborted or unknown transaction read is read again; returns them. Asks again while
        they cannot be read (a transaction that has not ended yet keeps them unstable) until
        the worker is stopped, or RuntimeError at ``deadline``: going on from anywhere else
        would skip inputs or transform them twice."""
        while True:
            assignment = consumer.assignment()
            if not assignment:  # revoked: the next assignment starts at the committed offsets
                return []
            try:
                found = committed(consumer, assignment)
                for tp in found:
                    consumer.seek(
                        confluent_kafka.TopicPartition(
                            tp.topic,
                            tp.partition,
                            tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING,
                        )
                    )
                return found
            except confluent_kafka.KafkaException as err:
                log.info("%s: rewinding to the committed offsets failed: %s", self.name, err)
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} could not rewind: {err}") from err
            if self.stopping.wait(RETRY_S):
                return []


def _where(message: confluent_kafka.Message) -> tuple[int, int]:
    """(partition, offset) of a message that carries no error."""
    partition, offset = message.partition(), message.offset()
    assert partition is not None, message
    assert offset is not None, message
    return partition, offset


class KafkaReader(Worker):
    """Member ``member`` of the group ``chaos-kafka-<isolation>``, subscribed to ``topics``."""

    def __init__(
        self,
        isolation: Isolation,
        member: int,
        bootstrap: str,
        topics: list[str],
        history: History,
    ) -> None:
        self.name = f"kafka-{isolation}-{member}"
        super().__init__()
        self.isolation: Isolation = isolation
        self.bootstrap = bootstrap
        self.topics = topics
        self.history = history
        #: the last value recorded of each series (the HW, and the LSO) of each partition
        self.seen: dict[tuple[str, TP], int] = {}

    def run(self) -> None:
        # librdkafka's get_watermark_offsets() gives the HW with read_committed too; the LSO
        # of the fetch responses is in its statistics only (ls_offset)
        lso: dict[str, Any] = (
            {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self._stats}
            if self.isolation == "read_committed"
            else {}
        )
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": self.name,
                "group.id": f"chaos-kafka-{self.isolation}",
                "isolation.level": self.isolation,
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 1000,
                **GROUP_SETTINGS,
                **CLIENT_SETTINGS,
                **lso,
            }
        )
        consumer.subscribe(self.topics)
        try:
            while not self.stopping.is_set():
                messages = consumer.consume(500, 0.2)
                now = time.monotonic()
                for m in messages:
                    self._record(m, now)
                for tp in consumer.assignment():
                    watermarks = consumer.get_watermark_offsets(tp, cached=True)
                    if watermarks is not None:
                        self._note(self.name, tp.topic, tp.partition, watermarks[1], now)
        finally:
            consumer.close()

    def _note(self, series: str, topic: str, partition: int, offset: int, now: float) -> None:
        """Record a partition's HW (or LSO) as librdkafka last got it from a fetch, when it
        changed; skip what librdkafka does not know (OFFSET_INVALID before a fetch, -1 from a
        fetch that failed for the partition)."""
        key = (series, (topic, partition))
        if offset >= 0 and offset != self.seen.get(key):
            self.seen[key] = offset
            self.history.high_watermarks.append(
                HighWatermark(series, topic, partition, offset, now)
            )

    def _stats(self, stats: str) -> None:
        """librdkafka's statistics (served in consume()): the LSO of each partition, as the
        series ``<name>/lso``."""
        now = time.monotonic()
        for topic, t in json.loads(stats).get("topics", {}).items():
            for partition, p in t.get("partitions", {}).items():
                if int(partition) >= 0:  # -1: librdkafka's unassigned-partition queue
                    self._note(f"{self.name}/lso", topic, int(partition), p["ls_offset"], now)

    def _record(self, message: confluent_kafka.Message, now: float) -> None:
        err = message.error()
        if err is not None:
            if err.code() == confluent_kafka.KafkaError._BAD_MSG:
                self.history.corrupt_reads.append(CorruptRead(self.isolation, str(err), now))
            else:
                log.info("%s: consume: %s", self.name, err)
            return
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        value = message.value()
        if topic is not None and partition is not None and offset is not None and value:
            self.history.reads.append(
                Read(self.isolation, topic, partition, offset, value.decode(), now)
            )


def kafka_workers(
    bootstrap: str,
    topic: str,
    txn_topic: str,
    partitions: int,
    producers: int,
    history: History,
    seed: int,
) -> tuple[list[Worker], list[Worker]]:
    """The Kafka workloads of a schedule: ``(writers, readers)``. The writers are
    ``producers`` idempotent producers on ``topic`` and the transformer from ``topic`` to
    ``txn_topic``; the readers two members of a group per isolation level, on both topics."""
    writers: list[Worker] = [
        KafkaIdempotentWriter(f"pk{i}", bootstrap, topic, partitions, history)
        for i in range(1, producers + 1)
    ]
    writers.append(KafkaTransformer(bootstrap, topic, txn_topic, history, seed))
    isolations: tuple[Isolation, ...] = ("read_uncommitted", "read_committed")
    readers: list[Worker] = [
        KafkaReader(isolation, member, bootstrap, [topic, txn_topic], history)
        for isolation in isolations
        for member in (1, 2)
    ]
    return writers, readers
