"""The transaction coordinator, as Kafka's TransactionCoordinator, plus the Spark sink commit.

Durable state lives in an internal replicated topic, ``__transaction_state`` (one partition,
replication factor min(3, brokers), min.insync.replicas min(2, RF)), as in Kafka, and not in
the metadata store: a transaction changes state three or four times, and Spark writes one
transaction per task per micro-batch, which is more than the few dozen conditional writes per
second object storage gives the metadata store. Every state change is one record batch
appended with acks=all, so it survives whatever a produce survives. The broker leading that
partition is the coordinator; a new leader reads the topic back and finishes any commit or
abort it finds half done (markers are idempotent). Its coordinator epoch is the partition's
leader epoch.

A transaction may have several producers (one per Spark task), and a sink commits them as one:
``commit_sink_batch`` writes, in a single record batch, the commit decision for every one of
them and "batch N of sink S is committed" — unless batch N of S already was, in which case it
aborts them. So a replayed micro-batch writes nothing twice, whatever fails and whenever.

The log stays bounded as ``__consumer_offsets`` does (:mod:`replication.coordinator.snapshots`):
once it has taken :data:`SNAPSHOT_MIN_RECORDS` records (and at least twice the live keys) since
the last snapshot, the coordinator appends one record per live transactional id and per sink,
and moves the log start to it; a new coordinator reads from the log start. A transactional id
whose transaction is complete and untouched for ``transactional.id.expiration.ms`` is removed
(a tombstone, then left out of snapshots), as Kafka expires it: its next producer starts over
with a new producer id at epoch 0. A sink's last committed batch is kept for as long as the
log is (it is one small record per streaming query): a replay of that batch, however late,
is still recognised and aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from logstore.batch import Record, build, iter_batches
from logstore.errors import ReplogError
from replication import events
from replication import protocol as p
from replication.broker.partition import Partition
from replication.common import TopicPartition
from replication.coordinator.records import versioned_json
from replication.coordinator.snapshots import (
    SnapshotSchedule,
    WriteGate,
    hold_all,
    take_snapshot,
)
from replication.errors import (
    BrokerUnreachableError,
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    NotCoordinatorError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
    for_code,
)
from replication.metadata.image import MetadataImage
from replication.protocol.rpc import AsyncConnection
from replication.security.connector import Connector

log = logging.getLogger(__name__)

TRANSACTION_TOPIC = "__transaction_state"
MAX_EPOCH = 32766
#: records appended to the transaction log since its last snapshot before the next one
SNAPSHOT_MIN_RECORDS = 1000
#: Kafka's transactional.id.expiration.ms default (7 days)
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 604_800_000
#: the states in which a transactional id may expire (nothing open, nothing completing)
_EXPIRABLE = frozenset(("Empty", "CompleteCommit", "CompleteAbort"))
#: transactional ids removed per tombstone batch
_EXPIRE_BATCH = 500


def _now_ms() -> int:
    """The wall clock: the times kept in the transaction log (start, last update)."""
    return time.time_ns() // 1_000_000


def _monotonic_ms() -> int:
    """The clock of transaction.timeout.ms: a step of the coordinator's wall clock neither
    aborts every open transaction nor keeps an abandoned one open."""
    return time.monotonic_ns() // 1_000_000


class TxnState(enum.StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


#: The format of the JSON values in the transaction log (``txn:`` and ``sink:`` records).
#: Version 0 is a record written before the field existed; it reads as version 1.
TXN_RECORD_FORMAT_VERSION = 1


def _record_doc(value: bytes, where: str) -> dict[str, Any]:
    """A transaction-log record's JSON value, refused if a newer replog wrote it."""
    return versioned_json(value, where, "transaction log", TXN_RECORD_FORMAT_VERSION)


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    update_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": TXN_RECORD_FORMAT_VERSION,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "timeout": self.timeout_ms,
            "state": self.state.value,
            "partitions": sorted([t, i] for t, i in self.partitions),
            "start": self.start_ms,
            "update": self.update_ms,
        }

    @classmethod
    def from_json(cls, transactional_id: str, doc: dict[str, Any]) -> TransactionMetadata:
        return cls(
            transactional_id,
            int(doc["pid"]),
            int(doc["epoch"]),
            int(doc["timeout"]),
            TxnState(doc["state"]),
            {TopicPartition(str(t), int(i)) for t, i in doc["partitions"]},
            int(doc["start"]),
            int(doc["update"]),
        )


@dataclass(frozen=True, slots=True)
class SinkCommitResult:
    committed: bool
    last_committed_batch: int


class TransactionCoordinator:
    """Lives in every broker; active on the one that leads ``__transaction_state``-0."""

    def __init__(
        self,
        broker_id: int,
        max_timeout_ms: int,
        image: Callable[[], MetadataImage],
        append: Callable[[bytes], Awaitable[int]],
        write_markers_locally: Callable[
            [p.WriteTxnMarkersRequest], Awaitable[p.WriteTxnMarkersResponse]
        ],
        allocate_producer_ids: Callable[[], Awaitable[range]],
        *,
        transactional_id_expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
        connect: Connector | None = None,
    ) -> None:
        """``append`` writes a record batch to ``__transaction_state``-0 with acks=all and
        returns its base offset."""
        self.broker_id = broker_id
        self.max_timeout_ms = max_timeout_ms
        self.transactional_id_expiration_ms = transactional_id_expiration_ms
        #: how markers reach other brokers (node.py passes broker_connector(config))
        self._connect = connect
        self.image = image
        self._append = append
        self._write_markers_locally = write_markers_locally
        self._allocate = allocate_producer_ids
        self.txns: dict[str, TransactionMetadata] = {}
        #: transactional id -> (start_ms of its open transaction, _monotonic_ms() when this
        #: coordinator saw it open): its timeout counts from there, so one begun under a
        #: predecessor gets its whole timeout again from the takeover
        self._open_since: dict[str, tuple[int, int]] = {}
        self.sinks: dict[str, int] = {}
        self.coordinator_epoch = -1
        self.active = False
        self.loading = False
        self._pids: range = range(0)
        self._pid_lock = asyncio.Lock()
        #: a lock per transactional id (and sink) in use, dropped when its last user leaves
        self._locks: dict[str, _KeyLock] = {}
        self._connections: dict[int, AsyncConnection] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        #: the partition whose leader this coordinator is (its log is cut at each snapshot)
        self._partition: Partition | None = None
        self._schedule = SnapshotSchedule()
        #: every append with its in-memory update shares it; a snapshot holds it alone
        self._gate = WriteGate()

    # --- becoming (and stopping being) the coordinator -----------------------------------------

    async def load(self, partition: Partition) -> None:
        """Read the transaction log back and take over; finish half-done commits and aborts."""
        self.loading = True
        self.active = False
        try:
            # Read the whole log this leader holds, once it is committed: a new leader's HW can
            # trail its log end (it learnt the HW from the old leader's fetch answers), and
            # reading only to it would miss the last decisions of the previous coordinator.
            end, epoch = partition.log.log_end_offset, partition.leader_epoch
            while partition.high_watermark < end:
                if not partition.is_leader or partition.leader_epoch != epoch:
                    return  # leadership moved on while waiting; the next load takes over
                partition.maybe_increment_high_watermark()  # nothing else moves it if alone
                await asyncio.sleep(0.05)
            txns, sinks, records = await asyncio.to_thread(_read_state, partition, end)
            self.txns, self.sinks = txns, sinks
            self.coordinator_epoch = partition.leader_epoch
            self._partition = partition
            # what this log holds beyond the snapshot counts toward the next one
            self._schedule = SnapshotSchedule()
            self._schedule.records_since_snapshot = records
            self.active = True
            log.info(
                "transaction coordinator active (epoch %d): %d transactions, %d sinks",
                self.coordinator_epoch,
                len(txns),
                len(sinks),
            )
        finally:
            self.loading = False
        for meta in list(self.txns.values()):
            if meta.state == TxnState.ONGOING:  # its timeout counts from the takeover
                self._opened_ms(meta, _monotonic_ms())
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                log.info(
                    "completing %s of %r left by the previous coordinator",
                    meta.state.value,
                    meta.transactional_id,
                )
                self._spawn(self._complete(meta))

    def unload(self) -> None:
        self.active = False
        self._partition = None
        self.txns.clear()
        self._open_since.clear()
        self.sinks.clear()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in self._connections.values():
            await conn.close()

    def _check_active(self) -> None:
        if self.loading:
            raise CoordinatorLoadInProgressError()
        if not self.active:
            raise NotCoordinatorError(
                f"broker {self.broker_id} is not the transaction coordinator; find it again"
            )

    @contextlib.asynccontextmanager
    async def _locked(self, *keys: str) -> AsyncIterator[None]:
        """Hold the locks of ``keys`` (transactional ids, ``sink:`` ids), in a fixed order.
        A key's lock lives only while someone holds or waits for it, so the map stays as
        small as the work in flight (expired ids leave nothing behind)."""
        ordered = sorted(set(keys))
        entries = [self._locks.setdefault(k, _KeyLock()) for k in ordered]
        for entry in entries:
            entry.users += 1
        try:
            async with hold_all([e.lock for e in entries]):
                yield
        finally:
            for key, entry in zip(ordered, entries, strict=True):
                entry.users -= 1
                if entry.users == 0 and self._locks.get(key) is entry:
                    del self._locks[key]

    # --- producer ids -------------------------------------------------------------------------

    async def next_producer_id(self) -> int:
        async with self._pid_lock:
            if not self._pids:
                self._pids = await self._allocate()
            pid = self._pids[0]
            self._pids = self._pids[1:]
            return pid

    # --- writing the transaction log ----------------------------------------------------------

    async def _write(
        self,
        txns: Iterable[TransactionMetadata],
        sinks: dict[str, int] | None = None,
        *,
        removed: Iterable[str] = (),
    ) -> None:
        """Append the new state of ``txns`` (and sinks; tombstones of ``removed`` transactional
        ids) as ONE record batch, acks=all, then apply it in memory. The two happen under the
        write gate, so a snapshot never sees a state change appended but not applied."""
        now = _now_ms()
        txns = list(txns)
        removed = list(removed)
        records = [
            Record(f"txn:{m.transactional_id}".encode(), json.dumps(m.to_json()).encode(), now)
            for m in txns
        ]
        records += [Record(f"txn:{t}".encode(), None, now) for t in removed]
        records += [_sink_record(s, b, now) for s, b in (sinks or {}).items()]
        if not records:
            return
        async with self._gate.shared():
            await self._append(build(records))
            for m in txns:
                self.txns[m.transactional_id] = m
                if m.state == TxnState.ONGOING:
                    self._opened_ms(m, _monotonic_ms())
                else:
                    self._open_since.pop(m.transactional_id, None)
            for t in removed:
                self.txns.pop(t, None)
                self._open_since.pop(t, None)
            for s, b in (sinks or {}).items():
                self.sinks[s] = max(self.sinks.get(s, -1), b)
        if self._schedule.note(len(records), self.live_keys(), SNAPSHOT_MIN_RECORDS):
            self._gate.reserve()  # no append starts from now until the snapshot is in
            self._spawn(self._snapshot())

    def live_keys(self) -> int:
        """Records a snapshot of the current state holds: one per transactional id and sink."""
        return len(self.txns) + len(self.sinks)

    async def _snapshot(self) -> None:
        partition = self._partition

        def records() -> list[Record] | None:
            if partition is None or not self.active or self._partition is not partition:
                return None
            now = _now_ms()
            out = [
                Record(f"txn:{m.transactional_id}".encode(), json.dumps(m.to_json()).encode(), now)
                for m in self.txns.values()
            ]
            return out + [_sink_record(s, b, now) for s, b in self.sinks.items()]

        await take_snapshot(
            f"{TRANSACTION_TOPIC}-0",
            self._schedule,
            self._gate.exclusive,
            records,
            self._append,
            partition,
            lambda: self.active and self._partition is partition,
        )

    # --- InitProducerId -------------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str | None, timeout_ms: int
    ) -> tuple[int, int]:
        if transactional_id is None:
            return await self.next_producer_id(), 0
        self._check_active()
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction.timeout.ms={timeout_ms} must be in 1..{self.max_timeout_ms} "
                "(transaction.max.timeout.ms)"
            )
        async with self._locked(transactional_id):
            meta = self.txns.get(transactional_id)
            if meta is None:
                meta = TransactionMetadata(
                    transactional_id,
                    await self.next_producer_id(),
                    0,
                    timeout_ms,
                    update_ms=_now_ms(),
                )
                await self._write([meta])
                return meta.producer_id, meta.producer_epoch
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                raise ConcurrentTransactionsError(
                    f"transaction {transactional_id!r} is completing ({meta.state.value}); retry"
                )
            if meta.state == TxnState.ONGOING:
                # a new instance fences the old one: abort its transaction with a bumped epoch
                await self._end(meta, commit=False, bump_epoch=True)
                meta = self.txns[transactional_id]
            new = TransactionMetadata(
                transactional_id,
                meta.producer_id,
                meta.producer_epoch + 1,
                timeout_ms,
                update_ms=_now_ms(),
            )
            if new.producer_epoch > MAX_EPOCH:
                new.producer_id, new.producer_epoch = await self.next_producer_id(), 0
            await self._write([new])
            return new.producer_id, new.producer_epoch

    def _validate(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> TransactionMetadata:
        self._check_active()
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise InvalidProducerIdMappingError(
                f"transaction {transactional_id!r} is not held by producer id {producer_id}; "
                "call init_transactions()"
            )
        if producer_epoch < meta.producer_epoch:
            events.event(
                log,
                events.PRODUCER_FENCED,
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                current_producer_epoch=meta.producer_epoch,
            )
            raise ProducerFencedError(
                f"transaction {transactional_id!r}: producer epoch {producer_epoch} was fenced "
                f"by a newer instance (epoch {meta.producer_epoch})"
            )
        if producer_epoch > meta.producer_epoch:
            raise InvalidProducerEpochError(
                f"transaction {transactional_id!r}: producer epoch {producer_epoch} is unknown"
            )
        return meta

    # --- AddPartitionsToTxn ---------------------------------------------------------------------

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> None:
        async with self._locked(transactional_id):
            meta = self._validate(transactional_id, producer_id, producer_epoch)
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                raise ConcurrentTransactionsError(
                    f"transaction {transactional_id!r} is completing; retry"
                )
            wanted = set(partitions)
            if meta.state == TxnState.ONGOING and wanted <= meta.partitions:
                return
            now = _now_ms()
            new = TransactionMetadata(
                transactional_id,
                producer_id,
                producer_epoch,
                meta.timeout_ms,
                TxnState.ONGOING,
                meta.partitions | wanted if meta.state == TxnState.ONGOING else wanted,
                meta.start_ms if meta.state == TxnState.ONGOING else now,
                now,
            )
            await self._write([new])

    # --- EndTxn ---------------------------------------------------------------------------------

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        async with self._locked(transactional_id):
            meta = self._validate(transactional_id, producer_id, producer_epoch)
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            if meta.state == done or meta.state == TxnState.EMPTY:
                return  # a retry of an EndTxn that completed, or nothing to end
            if meta.state == (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT):
                # a retry while (a new coordinator) completes it: retriable, as Kafka
                raise ConcurrentTransactionsError(
                    f"transaction {transactional_id!r} is completing ({meta.state.value}); retry"
                )
            if meta.state != TxnState.ONGOING:
                raise InvalidTxnStateError(
                    f"transaction {transactional_id!r} is {meta.state.value}; cannot "
                    f"{'commit' if commit else 'abort'} it"
                )
            await self._end(meta, commit=commit)

    async def _end(
        self, meta: TransactionMetadata, *, commit: bool, bump_epoch: bool = False
    ) -> None:
        prepared = self._prepared(meta, commit, bump_epoch)
        await self._write([prepared])
        await self._complete(prepared)

    def _prepared(
        self, meta: TransactionMetadata, commit: bool, bump_epoch: bool = False
    ) -> TransactionMetadata:
        return TransactionMetadata(
            meta.transactional_id,
            meta.producer_id,
            meta.producer_epoch + (1 if bump_epoch else 0),
            meta.timeout_ms,
            TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
            set(meta.partitions),
            meta.start_ms,
            _now_ms(),
        )

    async def _complete(self, meta: TransactionMetadata) -> None:
        """Write the markers to every partition of the transaction, then the final state."""
        commit = meta.state == TxnState.PREPARE_COMMIT
        await self._send_markers(meta.producer_id, meta.producer_epoch, commit, meta.partitions)
        if self.txns.get(meta.transactional_id) is not meta or not self.active:
            return
        complete = TransactionMetadata(
            meta.transactional_id,
            meta.producer_id,
            meta.producer_epoch,
            meta.timeout_ms,
            TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
            set(),
            -1,
            _now_ms(),
        )
        delay = 0.05
        while True:
            try:
                await self._write([complete])
                break
            except ReplogError as err:
                # e.g. NOT_ENOUGH_REPLICAS while the transaction log's ISR recovers: the
                # markers are written, so the final state must follow (as Kafka retries it)
                if self.txns.get(meta.transactional_id) is not meta or not self.active:
                    return
                log.warning(
                    "writing %s of %r failed, retrying: %s",
                    complete.state.value,
                    meta.transactional_id,
                    err,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _send_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: set[TopicPartition]
    ) -> None:
        pending = set(partitions)
        delay = 0.05
        while pending:
            image = self.image()
            by_leader: dict[int, list[TopicPartition]] = {}
            for topic, index in pending:
                info = image.topic(topic)
                if info is None or index >= len(info.partitions):
                    log.warning("marker for %s-%d dropped: the topic is gone", topic, index)
                    continue
                by_leader.setdefault(info.partitions[index].leader, []).append(
                    TopicPartition(topic, index)
                )
            pending = {tp for tps in by_leader.values() for tp in tps}
            for leader, tps in by_leader.items():
                if leader < 0:
                    continue
                done = await self._markers_to(leader, producer_id, producer_epoch, commit, tps)
                pending -= done
            if pending:
                if not self.active:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _markers_to(
        self,
        leader: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        tps: list[TopicPartition],
    ) -> set[TopicPartition]:
        topics: dict[str, list[int]] = {}
        for topic, index in tps:
            topics.setdefault(topic, []).append(index)
        request = p.WriteTxnMarkersRequest(
            markers=[
                p.WritableTxnMarker(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=commit,
                    topics=[
                        p.WritableTxnMarkerTopic(name=t, partition_indexes=ps)
                        for t, ps in topics.items()
                    ],
                    coordinator_epoch=self.coordinator_epoch,
                )
            ]
        )
        try:
            if leader == self.broker_id:
                response = await self._write_markers_locally(request)
            else:
                response = await self._connection(leader).request(
                    p.ApiKey.WRITE_TXN_MARKERS, request
                )
        except BrokerUnreachableError as err:
            log.info("markers to broker %d failed, retrying: %s", leader, err)
            return set()
        done: set[TopicPartition] = set()
        for marker in response.markers:
            for t in marker.topics:
                for part in t.partitions:
                    error = for_code(part.error_code)
                    if error is None or error is InvalidProducerEpochError:
                        # written, or superseded by a newer epoch's marker: done either way
                        done.add(TopicPartition(t.name, part.partition_index))
                    else:
                        log.info(
                            "marker for %s-%d: %s, retrying",
                            t.name,
                            part.partition_index,
                            error.__name__,
                        )
        return done

    def _connection(self, broker_id: int) -> AsyncConnection:
        broker = self.image().broker(broker_id)
        conn = self._connections.get(broker_id)
        if broker is None:
            raise BrokerUnreachableError("?", -1, f"broker {broker_id} is not in the metadata")
        if conn is None or (conn.host, conn.port) != (broker.host, broker.port):
            if self._connect is None:
                raise BrokerUnreachableError(
                    broker.host,
                    broker.port,
                    "this transaction coordinator was built without a connector "
                    "(security.connector.broker_connector)",
                )
            conn = self._connect(
                broker.host, broker.port, client_id=f"txn-coordinator-{self.broker_id}"
            )
            self._connections[broker_id] = conn
        return conn

    # --- the Spark sink commit ------------------------------------------------------------------

    async def commit_sink_batch(
        self, sink_id: str, batch_id: int, txns: list[tuple[str, int, int]], *, abort: bool = False
    ) -> SinkCommitResult:
        """Commit ``txns`` as batch ``batch_id`` of ``sink_id`` in one atomic step, or abort them
        if that batch is already committed (a replay) or ``abort`` is set."""
        self._check_active()
        ids = sorted({t for t, _, _ in txns})
        async with self._locked(*ids, f"sink:{sink_id}"):
            metas = [self._validate(t, pid, epoch) for t, pid, epoch in txns]
            for meta in metas:
                if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                    raise ConcurrentTransactionsError(
                        f"transaction {meta.transactional_id!r} is completing; retry"
                    )
            last = self.sinks.get(sink_id, -1)
            replay = batch_id <= last
            commit = not (replay or abort)
            live = [m for m in metas if m.state == TxnState.ONGOING]
            prepared = [self._prepared(m, commit) for m in live]
            # THE decision: every transaction's outcome and the sink's progress, one batch
            await self._write(prepared, {sink_id: batch_id} if commit else None)
        await asyncio.gather(*(self._complete(m) for m in prepared))
        if replay:
            log.info(
                "sink %r batch %d was already committed (last %d): aborted its replay",
                sink_id,
                batch_id,
                last,
            )
        return SinkCommitResult(commit, self.sinks.get(sink_id, -1))

    def last_committed_batch(self, sink_id: str) -> int:
        self._check_active()
        return self.sinks.get(sink_id, -1)

    # --- timeouts ------------------------------------------------------------------------------

    async def abort_timed_out(self) -> int:
        """Abort (and fence) transactions open longer than their timeout."""
        if not self.active:
            return 0
        now = _monotonic_ms()
        expired = [
            m
            for m in self.txns.values()
            if m.state == TxnState.ONGOING and now - self._opened_ms(m, now) > m.timeout_ms
        ]
        for meta in expired:
            async with self._locked(meta.transactional_id):
                current = self.txns.get(meta.transactional_id)
                if current is not meta:
                    continue
                log.warning(
                    "aborting transaction %r: open for %d ms, timeout %d ms",
                    meta.transactional_id,
                    now - self._opened_ms(meta, now),
                    meta.timeout_ms,
                )
                await self._end(meta, commit=False, bump_epoch=True)
        return len(expired)

    def _opened_ms(self, meta: TransactionMetadata, now: int) -> int:
        """When this coordinator saw ``meta``'s open transaction begin (``now`` if this is
        the first look: it was loaded from the log), on the monotonic clock."""
        seen = self._open_since.get(meta.transactional_id)
        if seen is None or seen[0] != meta.start_ms:
            seen = self._open_since[meta.transactional_id] = (meta.start_ms, now)
        return seen[1]

    async def remove_expired_transactional_ids(self) -> int:
        """Remove the transactional ids whose transaction is complete (Empty, CompleteCommit,
        CompleteAbort) and untouched for ``transactional.id.expiration.ms``, as Kafka does: a
        tombstone each, and gone from memory. Their next producer starts over (a new producer
        id, epoch 0). Returns how many went."""
        if not self.active:
            return 0
        limit = self.transactional_id_expiration_ms

        def expired(meta: TransactionMetadata | None, now: int) -> bool:
            return (
                meta is not None and meta.state.value in _EXPIRABLE and now - meta.update_ms > limit
            )

        now = _now_ms()
        doomed = sorted(t for t, m in self.txns.items() if expired(m, now))
        removed = 0
        for start in range(0, len(doomed), _EXPIRE_BATCH):
            ids = doomed[start : start + _EXPIRE_BATCH]
            async with self._locked(*ids):
                if not self.active:
                    break
                now = _now_ms()
                gone = [t for t in ids if expired(self.txns.get(t), now)]
                await self._write([], removed=gone)
            removed += len(gone)
        if removed:
            log.info(
                "removed %d transactional ids idle longer than transactional.id.expiration.ms=%d",
                removed,
                limit,
            )
        return removed

    def describe(self, transactional_id: str) -> TransactionMetadata:
        """The state of one transactional id (DescribeTransactions)."""
        self._check_active()
        meta = self.txns.get(transactional_id)
        if meta is None:
            raise TransactionalIdNotFoundError(
                f"the transaction coordinator knows no transactional id {transactional_id!r} "
                "(never used, or expired after transactional.id.expiration.ms)"
            )
        return meta

    def listings(self, states: Iterable[str] = ()) -> list[TransactionMetadata]:
        self._check_active()
        wanted = set(states)
        return [m for m in self.txns.values() if not wanted or m.state.value in wanted]


@dataclass(slots=True)
class _KeyLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: holders and waiters
    users: int = 0


def _sink_record(sink_id: str, batch: int, now: int) -> Record:
    value = {"format_version": TXN_RECORD_FORMAT_VERSION, "batch": batch}
    return Record(f"sink:{sink_id}".encode(), json.dumps(value).encode(), now)


def _read_state(
    partition: Partition, end: int
) -> tuple[dict[str, TransactionMetadata], dict[str, int], int]:
    """Replay the transaction log from its start up to ``end`` (the last value of each key
    wins; a null value removes an expired transactional id); also how many records it read."""
    plog = partition.log
    txns: dict[str, TransactionMetadata] = {}
    sinks: dict[str, int] = {}
    read = 0
    offset = plog.log_start_offset
    while offset < end:
        chunk = plog.read(offset, 8 * 1024 * 1024, max_offset=end)
        batches = list(iter_batches(chunk, validate=True))
        if not batches:
            break
        for batch in batches:
            for record in batch.records():
                if record.offset < offset or record.key is None:
                    continue
                read += 1
                key = record.key.decode()
                if record.value is None:
                    if key.startswith("txn:"):
                        txns.pop(key[4:], None)
                    continue
                doc = _record_doc(record.value, f"{partition.key} offset {record.offset}")
                if key.startswith("txn:"):
                    txns[key[4:]] = TransactionMetadata.from_json(key[4:], doc)
                elif key.startswith("sink:"):
                    sinks[key[5:]] = max(sinks.get(key[5:], -1), int(doc["batch"]))
        offset = batches[-1].next_offset
    return txns, sinks, read


__all__ = ["TRANSACTION_TOPIC", "ReplogError", "SinkCommitResult", "TransactionCoordinator"]
