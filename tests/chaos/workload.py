"""The workloads that run while the nemesis injects faults, each in its own thread, each
appending what it was told to a shared :class:`~tests.chaos.history.History`:

- :class:`IdempotentWriter`: an idempotent producer (acks=all) writing ``p<n>-<seq>`` values
  round-robin over the partitions of a topic, recording every ack (partition, offset, time)
  and every failed send.
- :class:`TransactionalWriter`: a transactional producer writing 1-3 records per transaction
  over the partitions of a second topic, committing or aborting at random, recording what it
  was told (committed, aborted, unknown).
- :class:`Reader`: a consumer (read_uncommitted or read_committed) assigned every partition,
  recording every record it is given, every high watermark its fetches report, and every
  batch it was given that failed its CRC check.

After the run, :func:`read_all` reads whole partitions through their leaders.
"""

from __future__ import annotations

import abc
import logging
import random
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future

from logstore.errors import CorruptRecordError, OffsetOutOfRangeError, ReplogError
from replication.client import Consumer, Producer, RecordMetadata, TopicPartition
from tests.chaos.history import (
    Ack,
    CorruptRead,
    HighWatermark,
    History,
    Isolation,
    Outcome,
    OutOfRange,
    Read,
    SendFailure,
    Transaction,
    producer_value,
    txn_value,
)
from tests.readback import read_to_end

log = logging.getLogger(__name__)

#: Client timeouts short enough that a client notices a fault within seconds.
CLIENT_SETTINGS = {
    "request_timeout_ms": 5000,
    "retry_backoff_max_ms": 500,
    "metadata_max_age_ms": 2000,
}


class Worker(abc.ABC):
    """A thread running :meth:`run` until :meth:`stop`."""

    name = "worker"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"chaos-{self.name}", daemon=True)
        self.error: BaseException | None = None

    def init(self) -> None:  # noqa: B027 - a hook most workers need not override
        """What must be done on the healthy cluster before the faults (by default nothing)."""

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to finish; False if it still runs after ``timeout``."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _run(self) -> None:
        try:
            self.run()
        except BaseException as err:  # reported by the runner: a harness bug, not an anomaly
            self.error = err
            log.exception("chaos worker %s failed", self.name)

    @abc.abstractmethod
    def run(self) -> None:
        """The workload's loop, until :attr:`stopping` is set."""


class IdempotentWriter(Worker):
    """Sends ``p<n>.<k>-<seq>`` values (``k`` counts the producers it had to replace: order
    holds per producer id), one every ``interval_s``, at most ``window`` unacked."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        topic: str,
        partitions: int,
        history: History,
        *,
        interval_s: float = 0.03,
        window: int = 50,
    ) -> None:
        self.name = name
        super().__init__()
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.interval_s = interval_s
        self.unacked = threading.BoundedSemaphore(window)

    def _producer(self) -> Producer:
        return Producer(
            bootstrap_servers=self.bootstrap,
            client_id=self.name,
            acks=-1,
            linger_ms=5,
            delivery_timeout_ms=30000,
            max_block_ms=10000,
            **CLIENT_SETTINGS,
        )

    def run(self) -> None:
        producer = self._producer()
        incarnation = 0  # a new producer (new producer id) writes under a new name: p1.1-...
        seq = 0
        while not self.stopping.is_set():
            if not self.unacked.acquire(timeout=0.2):
                continue
            value = producer_value(f"{self.name}.{incarnation}", seq)
            partition = seq % self.partitions
            seq += 1
            try:
                future = producer.send(self.topic, value.encode(), partition=partition)
            except ReplogError as err:  # the producer is unusable (fatal state): a new one
                self._failed(value, partition, err)
                producer.close(timeout=5)
                producer = self._producer()
                incarnation += 1
                continue
            future.add_done_callback(
                lambda f, v=value, p=partition: self._done(f, v, p)  # type: ignore[misc]
            )
            self.stopping.wait(self.interval_s)
        try:
            producer.flush(timeout=30)
        except ReplogError as err:
            log.info("%s: flush at the end failed: %s", self.name, err)
        producer.close(timeout=10)

    def _failed(self, value: str, partition: int, err: BaseException) -> None:
        self.unacked.release()
        self.history.send_failures.append(
            SendFailure(self.name, value, partition, f"{type(err).__name__}: {err}")
        )

    def _done(self, future: Future[RecordMetadata], value: str, partition: int) -> None:
        err = future.exception()
        if err is not None:
            self._failed(value, partition, err)
            return
        self.unacked.release()
        meta = future.result()
        self.history.acks.append(
            Ack(self.name, value, meta.topic, meta.partition, meta.offset, time.monotonic())
        )


class TransactionalWriter(Worker):
    """Small transactions over every partition of ``topic``; commits ~70 % of them."""

    name = "txn"

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, history: History, seed: int
    ) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.rng = random.Random(seed)
        self.producer: Producer | None = None

    def _producer(self) -> Producer:
        producer = Producer(
            bootstrap_servers=self.bootstrap,
            client_id="chaos-txn",
            transactional_id="chaos-txn",
            transaction_timeout_ms=10000,
            delivery_timeout_ms=20000,
            max_block_ms=15000,
            **CLIENT_SETTINGS,
        )
        try:
            producer.init_transactions()
        except ReplogError:
            producer.close(timeout=5)
            raise
        return producer

    def init(self) -> None:
        """Register the transactional id (creates __transaction_state on first use)."""
        self.producer = self._producer()

    def run(self) -> None:
        txn = 0
        while not self.stopping.is_set():
            if self.producer is None:
                try:
                    self.producer = self._producer()
                except ReplogError as err:
                    log.info("txn: init_transactions failed: %s", err)
                    self.stopping.wait(0.5)
                    continue
            records = tuple(
                (self.rng.randrange(self.partitions), txn_value(txn, i))
                for i in range(self.rng.randint(1, 3))
            )
            commit = self.rng.random() < 0.7
            outcome = self._one(self.producer, records, commit)
            self.history.transactions.append(Transaction(txn, self.topic, records, outcome))
            if outcome == "unknown":  # start over with a new producer: it fences this one
                self.producer.close(timeout=5)
                self.producer = None
            txn += 1
            self.stopping.wait(0.05)
        if self.producer is not None:
            self.producer.close(timeout=10)

    def _one(self, producer: Producer, records: Iterable[tuple[int, str]], commit: bool) -> Outcome:
        try:
            producer.begin_transaction()
            for partition, value in records:
                producer.send(self.topic, value.encode(), partition=partition)
            if commit:
                producer.commit_transaction(timeout=15)
                return "committed"
            producer.abort_transaction(timeout=15)
            return "aborted"
        except ReplogError as err:
            log.info("txn: transaction failed, outcome unknown: %s", err)
            return "unknown"


class Reader(Worker):
    """Polls every partition of ``topics`` from offset 0, recording records and HWs."""

    def __init__(
        self, isolation: Isolation, bootstrap: str, tps: list[TopicPartition], history: History
    ) -> None:
        self.name = isolation
        super().__init__()
        self.isolation: Isolation = isolation
        self.bootstrap = bootstrap
        self.tps = tps
        self.history = history

    def run(self) -> None:
        consumer = Consumer(
            bootstrap_servers=self.bootstrap,
            client_id=f"chaos-{self.isolation}",
            isolation_level=self.isolation,
            auto_offset_reset="none",
            fetch_max_wait_ms=200,
            default_api_timeout_ms=5000,
            **CLIENT_SETTINGS,
        )
        consumer.assign(self.tps)
        for tp in self.tps:
            consumer.seek(tp, 0)
        seen: dict[TopicPartition, int] = {}
        try:
            while not self.stopping.is_set():
                try:
                    records = consumer.poll(timeout_ms=200)
                except OffsetOutOfRangeError:
                    self._out_of_range(consumer)
                    continue
                except CorruptRecordError as err:
                    self.history.corrupt_reads.append(
                        CorruptRead(self.isolation, str(err), time.monotonic())
                    )
                    self.stopping.wait(0.2)
                    continue
                except ReplogError as err:
                    log.info("%s: poll failed: %s", self.name, err)
                    self.stopping.wait(0.2)
                    continue
                now = time.monotonic()
                self.history.reads.extend(
                    Read(self.isolation, r.topic, r.partition, r.offset, r.value.decode(), now)
                    for r in records
                    if r.value is not None
                )
                for tp in self.tps:
                    hw = consumer.highwater(tp)
                    if hw is not None and hw != seen.get(tp):
                        seen[tp] = hw
                        self.history.high_watermarks.append(
                            HighWatermark(self.isolation, tp.topic, tp.partition, hw, now)
                        )
        finally:
            consumer.close()

    def _out_of_range(self, consumer: Consumer) -> None:
        """A fetch was refused as out of range: find which positions are past the end the
        cluster now gives, record them, and go on from that end."""
        try:
            ends = consumer.end_offsets(self.tps, timeout_ms=5000)
            positions = {tp: consumer.position(tp) for tp in self.tps}
        except ReplogError as err:
            log.info("%s: looking up the end after OffsetOutOfRange failed: %s", self.name, err)
            self.stopping.wait(0.2)
            return
        for tp, position in positions.items():
            end = ends.get(tp)
            if end is not None and position > end:
                self.history.out_of_range.append(
                    OutOfRange(
                        self.isolation, tp.topic, tp.partition, position, end, time.monotonic()
                    )
                )
                consumer.seek(tp, end)


def read_all(
    bootstrap: str, tps: list[TopicPartition], isolation: Isolation, deadline: float
) -> tuple[dict[tuple[str, int], dict[int, str]], dict[tuple[str, int], int]]:
    """Every record of ``tps`` below the end (HW, or LSO with read_committed), read through
    the leaders: ``({tp: {offset: value}}, {tp: end})``. TimeoutError at ``deadline``."""
    read = read_to_end(
        bootstrap,
        tps,
        isolation_level=isolation,
        timeout=deadline - time.monotonic(),
        client_id=f"chaos-final-{isolation}",
        default_api_timeout_ms=10000,
        **CLIENT_SETTINGS,
    )
    out: dict[tuple[str, int], dict[int, str]] = {(tp.topic, tp.partition): {} for tp in tps}
    for r in read.records:
        if r.value is not None:
            out[(r.topic, r.partition)][r.offset] = r.value.decode()
    return out, {(tp.topic, tp.partition): end for tp, end in read.ends.items()}
