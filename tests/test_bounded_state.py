"""Internal state stays bounded: ``__transaction_state`` (snapshots that move its log start,
transactional id expiry) and the metadata store (pruned versions; a broker start reads a
bounded number of objects whatever the history).

In process, on local files: a real TransactionCoordinator writes to a real Partition's log
and its markers to a real data partition; a real Controller commits to a real MetadataStore.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from logstore.batch import iter_batches
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import ObjectInfo, Storage
from replication import protocol as p
from replication.broker.partition import Partition, TopicPolicy
from replication.common import TopicPartition
from replication.controller.controller import Controller
from replication.coordinator import transaction as txn_module
from replication.coordinator.transaction import (
    SNAPSHOT_MIN_RECORDS,
    TRANSACTION_TOPIC,
    TransactionCoordinator,
    TxnState,
)
from replication.errors import InvalidProducerIdMappingError, ProducerFencedError
from replication.metadata.image import MetadataImage, PartitionState, TopicInfo
from replication.metadata.store import (
    METADATA_DIR,
    PRUNE_INTERVAL_VERSIONS,
    RETAINED_VERSIONS,
    MetadataStore,
)
from tests.faulty_fs import FaultyStorage
from tests.helpers import register_live

pytestmark = [pytest.mark.unit, pytest.mark.timeout(900)]

#: 3 records each: 63,000 records, some 57 snapshots and log-start moves (one per
#: SNAPSHOT_MIN_RECORDS), and about 1 ms of coordinator work per transaction in process.
#: A multiple of 50 * 7, so each id's last transaction (i % 7 == 6) commits.
N_TXNS = 21_000
LEADER = PartitionState((0,), (0,), 0, 1, 0)
DATA = TopicPartition("events", 0)


#: small segments, deleted at once: what the log holds on storage follows its log start
LOG_CONFIG = LogConfig(segment_bytes=256 * 1024, file_delete_delay_ms=0)


def _partition(root: Path, topic: str, index: int) -> Partition:
    # In memory: the bounds are on what the log holds and stores, not on a file system, and
    # the transaction run writes a new object per group commit (on local files, a file
    # create each).
    storage = Storage.from_url(f"memory://bounded-{root.name}-{uuid.uuid4().hex}/{topic}/{index}")
    return Partition(topic, index, Log.open(storage, LOG_CONFIG), 0, TopicPolicy(), LEADER)


def _maintain(plog: Log) -> None:
    """What the ReplicaManager's maintenance does for every log (run_maintenance)."""
    plog.delete_retained_segments()
    plog.merge_segments()
    plog.delete_due_objects()


class TxnHarness:
    """A transaction coordinator on broker 0, which leads both its log and ``events``-0."""

    def __init__(self, root: Path, expiration_ms: int = 604_800_000) -> None:
        self.root = root
        self.expiration_ms = expiration_ms
        self.log_partition = _partition(root, TRANSACTION_TOPIC, 0)
        self.data = _partition(root, DATA.topic, DATA.partition)
        self.image = MetadataImage(
            topics=(TopicInfo(DATA.topic, "id-events", (LEADER,)),),
        )
        self._next_pid = itertools.count(1000, 1000)
        self.appends = 0
        self.coordinator = self._coordinator()

    def _coordinator(self) -> TransactionCoordinator:
        return TransactionCoordinator(
            0,
            900_000,
            lambda: self.image,
            self.append,
            self.write_markers,
            self.allocate,
            transactional_id_expiration_ms=self.expiration_ms,
        )

    async def append(self, batch: bytes) -> int:
        partition = self.log_partition
        info = partition.append_as_leader(batch, -1)
        # the acks=all round trip: other writers append meanwhile, and one flush writes the
        # batches of all (the broker's group commit)
        await asyncio.sleep(0)
        partition.log.flush()
        partition.maybe_increment_high_watermark()
        self.appends += 1
        if self.appends % 100 == 0:
            _maintain(partition.log)
            _maintain(self.data.log)
        return info.first_offset

    async def write_markers(self, request: p.WriteTxnMarkersRequest) -> p.WriteTxnMarkersResponse:
        results = []
        for marker in request.markers:
            topics = []
            for topic in marker.topics:
                assert (topic.name, topic.partition_indexes) == (DATA.topic, [DATA.partition])
                self.data.append_marker(
                    marker.producer_id,
                    marker.producer_epoch,
                    marker.transaction_result,
                    marker.coordinator_epoch,
                )
                await asyncio.sleep(0)  # group commit, as for the transaction log
                self.data.log.flush()
                self.data.maybe_increment_high_watermark()
                topics.append(
                    p.WritableTxnMarkerTopicResult(
                        name=topic.name,
                        partitions=[
                            p.WritableTxnMarkerPartitionResult(partition_index=DATA.partition)
                        ],
                    )
                )
            results.append(p.WritableTxnMarkerResult(producer_id=marker.producer_id, topics=topics))
        return p.WriteTxnMarkersResponse(markers=results)

    async def allocate(self) -> range:
        start = next(self._next_pid)
        return range(start, start + 1000)

    async def failover(self) -> TransactionCoordinator:
        """A new coordinator (a new process) loads the log this one wrote."""
        self.coordinator.unload()
        await self.coordinator.stop()
        self.log_partition.apply_state(
            PartitionState((0,), (0,), 0, self.log_partition.leader_epoch + 1, 1)
        )
        self.coordinator = self._coordinator()
        await self.coordinator.load(self.log_partition)
        return self.coordinator

    async def transaction(self, transactional_id: str, pid: int, epoch: int, commit: bool) -> None:
        c = self.coordinator
        await c.add_partitions(transactional_id, pid, epoch, [DATA])
        await c.end_txn(transactional_id, pid, epoch, commit)

    def log_records(self) -> Iterator[tuple[str, bytes | None]]:
        """(key, value) of every record from the log start to the log end."""
        plog = self.log_partition.log
        offset, end = plog.log_start_offset, plog.log_end_offset
        while offset < end:
            batches = list(iter_batches(plog.read(offset, 8 * 1024 * 1024, max_offset=end)))
            for batch in batches:
                for record in batch.records():
                    if record.offset >= offset:
                        yield (record.key or b"").decode(), record.value
            offset = batches[-1].next_offset


def run(root: Path, test: Callable[[TxnHarness], Coroutine[Any, Any, None]], **kw: Any) -> None:
    async def main() -> None:
        h = TxnHarness(root, **kw)
        await h.coordinator.load(h.log_partition)
        try:
            await test(h)
        finally:
            await h.coordinator.stop()

    asyncio.run(main())


def test_the_transaction_log_stays_bounded_over_21000_transactions(tmp_path: Path) -> None:
    ids = [f"app-{i}" for i in range(50)]

    async def test(h: TxnHarness) -> None:
        c = h.coordinator
        producers = {t: await c.init_producer_id(t, 60_000) for t in ids}
        longest = longest_between = 0

        async def worker(t: str, n: int) -> None:
            nonlocal longest, longest_between
            pid, epoch = producers[t]
            for i in range(n):
                await h.transaction(t, pid, epoch, commit=i % 7 != 0)
                plog = h.log_partition.log
                length = plog.log_end_offset - plog.log_start_offset
                longest = max(longest, length)
                if not c._schedule.snapshotting:
                    longest_between = max(longest_between, length)

        # the 50 ids run concurrently, so snapshots race with state changes in flight
        await asyncio.gather(*(worker(t, N_TXNS // len(ids)) for t in ids))
        for _ in range(10):
            await asyncio.sleep(0)
        await asyncio.gather(*c._tasks)
        plog = h.log_partition.log
        assert plog.log_end_offset >= 3 * N_TXNS  # three records per transaction
        # Between snapshots the log holds, from its start, at most: the last snapshot (the
        # live keys), the records that make the next one due, and the appends in flight when
        # it fell due (one per concurrent writer: new ones wait for it). While a snapshot is
        # taken and the log cut, writers go on: at most twice that.
        live = len(ids)
        bound = live + max(SNAPSHOT_MIN_RECORDS, 2 * live) + len(ids)
        assert longest_between <= bound, (longest_between, bound)
        assert longest <= 2 * bound, (longest, bound)
        held = list(h.log_records())
        assert len(held) <= bound
        # and its bytes: each record is well under 300 bytes
        assert sum(len(k) + len(v or b"") for k, v in held) <= 300 * bound
        # on storage: those records, and at most the one segment the log start falls in
        _maintain(plog)
        stored = sum(i.size for i in plog.storage.list() if i.path.endswith(".seg"))
        assert stored <= 2 * LOG_CONFIG.segment_bytes + 300 * bound, stored

        # a new coordinator reads only from the log start, and finds every id where it was
        before = {t: (m.producer_id, m.producer_epoch, m.state) for t, m in c.txns.items()}
        new = await h.failover()
        assert {t: (m.producer_id, m.producer_epoch, m.state) for t, m in new.txns.items()} == (
            before
        )
        assert new._schedule.records_since_snapshot == len(held)  # what its load read
        assert all(m.state is TxnState.COMPLETE_COMMIT for m in new.txns.values())
        pid, epoch = producers[ids[0]]
        await h.transaction(ids[0], pid, epoch, commit=True)  # the producer goes on
        assert new._locks == {}  # no lock outlives its users

    run(tmp_path, test)


# --- transactional id expiry -------------------------------------------------------------------


def test_an_expired_transactional_id_is_gone_and_its_next_producer_starts_fresh(
    tmp_path: Path,
) -> None:
    async def test(h: TxnHarness) -> None:
        c = h.coordinator
        old_pid, old_epoch = await c.init_producer_id("idle", 60_000)
        await h.transaction("idle", old_pid, old_epoch, commit=True)
        open_pid, open_epoch = await c.init_producer_id("open", 60_000)
        await c.add_partitions("open", open_pid, open_epoch, [DATA])
        # every id is past its expiration; only the complete one may go
        c.transactional_id_expiration_ms = 0
        await asyncio.sleep(0.01)
        assert await c.remove_expired_transactional_ids() == 1
        assert set(c.txns) == {"open"}
        assert ("txn:idle", None) in list(h.log_records())  # its tombstone
        with pytest.raises(InvalidProducerIdMappingError, match="init_transactions"):
            await c.add_partitions("idle", old_pid, old_epoch, [DATA])
        # a new coordinator does not bring it back either
        c = await h.failover()
        assert set(c.txns) == {"open"}
        assert c.txns["open"].state is TxnState.ONGOING
        pid, epoch = await c.init_producer_id("idle", 60_000)
        assert (epoch, pid != old_pid) == (0, True)
        await h.transaction("idle", pid, epoch, commit=True)
        # an id not idle for long enough stays, and its producer is fenced as before
        c.transactional_id_expiration_ms = 3_600_000
        assert await c.remove_expired_transactional_ids() == 0
        again, bumped = await c.init_producer_id("idle", 60_000)
        assert (again, bumped) == (pid, 1)
        with pytest.raises(ProducerFencedError):
            await c.add_partitions("idle", pid, epoch, [DATA])

    run(tmp_path, test)


def test_expired_ids_are_left_out_of_snapshots_and_sinks_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txn_module, "SNAPSHOT_MIN_RECORDS", 20)

    async def test(h: TxnHarness) -> None:
        c = h.coordinator
        sink_pid, sink_epoch = await c.init_producer_id("replog-sink/q/0", 60_000)
        await c.add_partitions("replog-sink/q/0", sink_pid, sink_epoch, [DATA])
        result = await c.commit_sink_batch("q", 7, [("replog-sink/q/0", sink_pid, sink_epoch)])
        assert result.committed
        for i in range(10):
            pid, epoch = await c.init_producer_id(f"short-{i}", 60_000)
            await h.transaction(f"short-{i}", pid, epoch, commit=True)
        c.transactional_id_expiration_ms = 0
        await asyncio.sleep(0.01)
        assert await c.remove_expired_transactional_ids() == 11  # the sink's producer too
        # enough records for snapshots: one producer, many transactions
        pid, epoch = await c.init_producer_id("busy", 60_000)
        c.transactional_id_expiration_ms = 3_600_000
        for _ in range(30):
            await h.transaction("busy", pid, epoch, commit=True)
        await asyncio.gather(*c._tasks)
        plog = h.log_partition.log
        assert plog.log_start_offset > 0
        keys = {k for k, _ in h.log_records()}
        assert keys == {"txn:busy", "sink:q"}
        c = await h.failover()
        assert set(c.txns) == {"busy"}
        # the sink's batch 7 survived: a replay of it is recognised and aborted
        assert c.last_committed_batch("q") == 7
        tid = "replog-sink/q/0"
        pid, epoch = await c.init_producer_id(tid, 60_000)
        assert epoch == 0
        await c.add_partitions(tid, pid, epoch, [DATA])
        replay = await c.commit_sink_batch("q", 7, [(tid, pid, epoch)])
        assert (replay.committed, replay.last_committed_batch) == (False, 7)
        assert c.txns[tid].state is TxnState.COMPLETE_ABORT

    run(tmp_path, test)


# --- the metadata store ------------------------------------------------------------------------


class CountingStorage(FaultyStorage):
    """Counts storage calls (``calls``) and the objects listings return (``listed``)."""

    listed = 0

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        out = super().list(prefix)
        CountingStorage.listed += len(out)
        return out


def _metadata_objects(storage: Storage) -> int:
    return len(storage.list(METADATA_DIR))


def _broker_start_reads(root: Path) -> tuple[dict[str, int], int]:
    """The storage calls (by kind) and objects listed of what a broker does at start to learn
    the metadata (BrokerLifecycle.refresh_metadata, then finding the controller)."""
    storage = CountingStorage(Storage.from_url(f"file://{root}", fsync=False))
    CountingStorage.listed = 0
    store = MetadataStore(storage)
    image = store.read_latest()
    assert store.latest_claim() is not None
    assert image.version > 0
    return dict(storage._plan.calls), CountingStorage.listed


def test_metadata_store_stays_bounded_over_10000_isr_changes(tmp_path: Path) -> None:
    store = MetadataStore(Storage.from_url(f"file://{tmp_path}", fsync=False))
    controller = Controller(store, 0, "127.0.0.1", 9000)
    controller.activate()
    for broker in range(3):
        register_live(controller, broker, "127.0.0.1", 9100 + broker, None, f"b{broker}")
    controller.create_topic("events", 3, 3)
    bound = RETAINED_VERSIONS + PRUNE_INTERVAL_VERSIONS
    reads: dict[int, tuple[dict[str, int], int]] = {}
    for change in range(1, 10_001):
        info = controller.image.topic("events")
        assert info is not None
        state = info.partitions[change % 3]
        isr = state.replicas if len(state.isr) < 3 else state.replicas[:2]
        controller.alter_partition(
            state.leader, "events", change % 3, state.leader_epoch, state.partition_epoch, isr
        )
        if change % 500 == 0:
            assert _metadata_objects(store.storage) <= bound, change
        if change in (1_000, 10_000):
            reads[change] = _broker_start_reads(tmp_path)
    assert controller.image.version > 10_000
    assert _metadata_objects(store.storage) <= bound
    # a broker's start reads the same few objects after 1,000 changes as after 10,000
    assert reads[1_000] == reads[10_000]
    calls, listed = reads[10_000]
    # the head version, the newest snapshot and the deltas after it (a snapshot is written at
    # least every PRUNE_INTERVAL_VERSIONS), and the newest claim (read twice)
    assert calls.get("read", 0) <= 4 + PRUNE_INTERVAL_VERSIONS
    # the versions kept, the newest snapshot and the claims (one per controller epoch)
    assert listed <= bound + 3
    fresh = MetadataStore(Storage.from_url(f"file://{tmp_path}", fsync=False)).read_latest()
    assert fresh == controller.image
