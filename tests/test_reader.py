"""logstore.reader: read-only range reads of a replica's segment objects (what executors run).

One conformance suite, run against memory, local files and S3 over HTTP (moto): exact ranges
across objects, range reads that hop over unwanted batches, CRC checks, objects merged away
under a reader, retention, a replica that ends early, read_committed filtering, and that the
reader never writes.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from logstore.batch import ControlType, Record, TimestampType, build, build_control
from logstore.config import LogConfig
from logstore.errors import CorruptRecordError
from logstore.log import Log
from logstore.reader import (
    READ_SCHEMA,
    AbortedTxnRange,
    ObjectExtent,
    RangeRetainedError,
    ReadChunk,
    ReplicaRangeError,
    SegmentReader,
)
from logstore.storage import Data, ObjectInfo, Storage
from tests.conftest import S3Location
from tests.readback import log_values as values
from tests.test_wal_log import Node

TOPIC = "events"


def batch_of(first: int, count: int, **kwargs: Any) -> bytes:
    """``count`` records whose values name their offsets from ``first`` (if appended there)."""
    return build(
        [Record(b"k%d" % i, b"v%d" % i, 1_000 + i) for i in range(first, first + count)], **kwargs
    )


def offsets_and_values(batches: Iterator[pa.RecordBatch]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for batch in batches:
        assert batch.schema.equals(READ_SCHEMA)
        out.extend(
            zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
        )
    return out


def collect(chunks: Iterator[ReadChunk], into: list[ReadChunk]) -> None:
    """Append what a read yields to ``into`` (kept when the read then fails)."""
    for chunk in chunks:
        into.append(chunk)


def expected(start: int, end: int) -> list[tuple[int, bytes]]:
    return [(i, b"v%d" % i) for i in range(start, end)]


class ReadOnlyStorage(Storage):
    """Delegates reads to ``inner``, counts the bytes read, and fails every write."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.url = inner.url
        self.bytes_read = 0

    def read(self, path: str) -> bytes:
        data = self.inner.read(path)
        self.bytes_read += len(data)
        return data

    def read_range(self, path: str, start: int, end: int) -> bytes:
        data = self.inner.read_range(path, start, end)
        self.bytes_read += len(data)
        return data

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def write(self, path: str, data: Data) -> None:
        raise AssertionError(f"the reader wrote {path}")

    def put_if_absent(self, path: str, data: Data) -> None:
        raise AssertionError(f"the reader wrote {path}")

    def delete(self, path: str) -> None:
        raise AssertionError(f"the reader deleted {path}")

    def child(self, prefix: str) -> Storage:
        return ReadOnlyStorage(self.inner.child(prefix))


class ReaderTests:
    """The reader's contract; subclasses provide ``root`` (url, storage options)."""

    @pytest.fixture
    def root(self) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    @pytest.fixture
    def storage(self, root: tuple[str, dict[str, Any]]) -> Storage:
        url, options = root
        return Storage.from_url(url, **options).child(f"{TOPIC}/0")

    def make_log(self, storage: Storage, objects: list[int], **config: Any) -> Log:
        """A log whose objects hold ``objects[i]`` records each, in batches of 5 records."""
        log = Log.open(storage, LogConfig(**config))
        for count in objects:
            for _ in range(0, count, 5):
                start = log.log_end_offset
                log.append(batch_of(start, 5), leader_epoch=0)
            log.flush()
        return log

    def reader(self, root: tuple[str, dict[str, Any]], **kwargs: Any) -> SegmentReader:
        url, options = root
        return SegmentReader.open(url, TOPIC, 0, **options, **kwargs)

    # --- ranges -----------------------------------------------------------------------------

    def test_lists_segment_objects_only(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        log = self.make_log(storage, [10, 20, 5])
        log.checkpoint()
        with self.reader(root) as reader:
            listed = reader.list_objects()
        assert [(o.base_offset, o.size) for o in listed] == [
            (s.base_offset, s.size) for s in log.segments()
        ]

    @pytest.mark.parametrize(
        ("start", "end"),
        [(0, 35), (0, 1), (3, 4), (7, 23), (10, 30), (12, 35), (34, 35), (9, 11)],
    )
    def test_reads_exactly_the_range(
        self, root: tuple[str, dict[str, Any]], storage: Storage, start: int, end: int
    ) -> None:
        self.make_log(storage, [10, 20, 5])
        with self.reader(root) as reader:
            assert offsets_and_values(reader.read_arrow(start, end)) == expected(start, end)

    def test_empty_range(self, root: tuple[str, dict[str, Any]], storage: Storage) -> None:
        self.make_log(storage, [10])
        with self.reader(root) as reader:
            assert list(reader.read_arrow(4, 4)) == []
            with pytest.raises(ValueError, match="0 <= start <= end"):
                list(reader.read_arrow(5, 4))

    def test_small_chunks_hop_over_batches_before_the_start(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        self.make_log(storage, [200])  # one object of 40 batches
        size = storage.size(storage.list()[0].path)
        counting = ReadOnlyStorage(storage)
        reader = SegmentReader(counting, chunk_bytes=128)  # a tenth of a batch
        assert offsets_and_values(reader.read_arrow(190, 200)) == expected(190, 200)
        # Batches below the start are hopped over by their headers, never read whole.
        assert counting.bytes_read < size / 4
        # Reading everything in small chunks still returns every record once.
        assert offsets_and_values(reader.read_arrow(0, 200)) == expected(0, 200)

    def test_listing_from_a_planner_saves_a_list(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        self.make_log(storage, [10, 10])
        with self.reader(root) as reader:
            listing = reader.list_objects()
            assert offsets_and_values(reader.read_arrow(5, 15, objects=listing)) == expected(5, 15)

    def test_log_append_time_stamps_every_record_with_the_batch_time(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        log = Log.open(storage)
        log.append(batch_of(0, 3, timestamp_type=TimestampType.LOG_APPEND_TIME), leader_epoch=0)
        log.flush()
        with self.reader(root) as reader:
            (batch,) = reader.read_arrow(0, 3)
        assert batch.column("timestamp").to_pylist() == [1_002] * 3
        assert batch.column("timestamp_type").to_pylist() == [1] * 3

    # --- failures -----------------------------------------------------------------------------

    def test_corrupt_batch_is_never_served(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        self.make_log(storage, [10, 10])
        name = storage.list()[1].path  # holds offsets 10..19, in two batches
        data = bytearray(storage.read(name))
        data[-3] ^= 0xFF  # inside the payload of the batch holding 15..19
        storage.write(name, bytes(data))
        got: list[tuple[int, bytes]] = []
        with self.reader(root) as reader, pytest.raises(CorruptRecordError) as caught:
            got.extend(offsets_and_values(reader.read_arrow(0, 20)))
        message = str(caught.value)
        assert name in message
        assert "offset 15" in message
        assert "CRC" in message
        # Nothing from the corrupt batch on: reading stops before it.
        assert all(offset < 15 for offset, _ in got)

    def test_object_cut_short_is_corrupt(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        self.make_log(storage, [10])
        name = storage.list()[0].path
        storage.write(name, storage.read(name)[:-10])
        with self.reader(root) as reader, pytest.raises(CorruptRecordError, match=name):
            list(reader.read_arrow(0, 10))

    def test_objects_merged_away_under_the_reader(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        log = self.make_log(storage, [10, 10, 10, 10], file_delete_delay_ms=0)
        log.roll()
        log.append(batch_of(40, 5), leader_epoch=0)
        log.flush()  # a new segment: the first four objects are a closed segment
        with self.reader(root) as reader:
            stale = reader.list_objects()
            assert len(stale) == 5
            assert log.merge_segments() == 1
            assert len(reader.list_objects()) == 2  # the merged-away objects are deleted
            # A listing from before the merge still reads: missing objects make it relist.
            assert offsets_and_values(reader.read_arrow(15, 45, objects=stale)) == expected(15, 45)

    def test_every_object_gone(self, root: tuple[str, dict[str, Any]], storage: Storage) -> None:
        self.make_log(storage, [10])
        with self.reader(root) as reader:
            listing = reader.list_objects()
            storage.delete(listing[0].name)
            with pytest.raises(RangeRetainedError, match="no segment objects") as caught:
                list(reader.read_arrow(0, 10, objects=listing))
            assert caught.value.first_available is None

    def test_range_removed_by_retention(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        log = self.make_log(storage, [10, 10])
        storage.delete(log.segments()[0].name)  # what retention does, once the delay is over
        with self.reader(root) as reader:
            with pytest.raises(RangeRetainedError, match="retention") as caught:
                list(reader.read_arrow(5, 15))
            assert caught.value.first_available == 10
            again = pickle.loads(pickle.dumps(caught.value))
            assert again.first_available == 10
            assert str(again) == str(caught.value)

    def test_replica_that_ends_before_the_range(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        self.make_log(storage, [10])
        with self.reader(root) as reader, pytest.raises(ReplicaRangeError, match="holds"):
            list(reader.read_arrow(5, 15))

    def test_never_writes(self, root: tuple[str, dict[str, Any]], storage: Storage) -> None:
        log = self.make_log(storage, [10, 10])
        name = log.segments()[1].name
        data = storage.read(name)
        storage.write(name, data[:-4])  # a torn object: recovery would rewrite it
        reader = SegmentReader(ReadOnlyStorage(storage))
        with pytest.raises(CorruptRecordError):
            list(reader.read_arrow(0, 20))
        assert storage.read(name) == data[:-4]

    # --- transactions -------------------------------------------------------------------------

    def test_read_committed_drops_aborted_transactions_and_markers(
        self, root: tuple[str, dict[str, Any]], storage: Storage
    ) -> None:
        log = Log.open(storage)

        def append(data: bytes) -> int:
            return log.append(data, leader_epoch=0).first_offset

        def txn(pid: int, first: int, count: int) -> bytes:
            return batch_of(
                first,
                count,
                producer_id=pid,
                producer_epoch=0,
                base_sequence=0,
                is_transactional=True,
            )

        def marker(pid: int, kind: ControlType) -> bytes:
            return build_control(
                kind, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp=9
            )

        append(batch_of(0, 2))  # 0-1 plain
        a = append(txn(7, 2, 3))  # 2-4 producer 7, aborted below
        append(txn(8, 5, 2))  # 5-6 producer 8, committed below
        append(marker(7, ControlType.ABORT))  # 7
        append(marker(8, ControlType.COMMIT))  # 8
        append(batch_of(9, 2))  # 9-10 plain
        b = append(txn(7, 11, 2))  # 11-12 producer 7 again, a new transaction, committed
        append(marker(7, ControlType.COMMIT))  # 13
        c = append(txn(9, 14, 3))  # 14-16 producer 9, aborted, marker past the range's end
        append(marker(9, ControlType.ABORT))  # 17
        log.flush()
        aborted = [AbortedTxnRange(7, a), AbortedTxnRange(9, c)]
        assert b == 11
        with self.reader(root) as reader:
            committed = offsets_and_values(
                reader.read_arrow(0, 17, read_committed=True, aborted_transactions=aborted)
            )
            everything = offsets_and_values(reader.read_arrow(0, 18))
            from_middle = offsets_and_values(
                reader.read_arrow(3, 18, read_committed=True, aborted_transactions=aborted)
            )
        visible = [0, 1, 5, 6, 9, 10, 11, 12]
        assert [o for o, _ in committed] == visible
        assert [o for o, _ in from_middle] == [o for o in visible if o >= 3]
        # read_uncommitted: every data record, never a marker.
        assert [o for o, _ in everything] == [*range(7), 9, 10, 11, 12, 14, 15, 16]

    # --- extents over the broker WAL (DescribeLogObjects' answer) ---------------------------

    def wal_node(self, root: tuple[str, dict[str, Any]]) -> tuple[Storage, Node]:
        """A broker root with a WalWriter and logs of events-0, events-1 and orders-0 over it
        (tests/test_wal_log.py's Node: objects are written when it flushes)."""
        url, options = root
        storage = Storage.from_url(url, **options)
        node = Node(storage, [(TOPIC, 0), (TOPIC, 1), ("orders", 0)])
        node.start()
        return storage, node

    def fill_wal(self, node: Node, flushes: int, per_flush: int = 3) -> None:
        """``flushes`` WAL objects, each with ``per_flush`` 5-record batches of every log."""
        for _ in range(flushes):
            for log in node.logs.values():
                for _ in range(per_flush):
                    log.append(batch_of(log.log_end_offset, 5), leader_epoch=0)
            node.flush()

    def test_extents_of_l0_and_packed_chunks_read_back_as_the_log_reads(
        self, root: tuple[str, dict[str, Any]]
    ) -> None:
        storage, node = self.wal_node(root)
        self.fill_wal(node, 3)
        node.compactor().compact()  # the three L0 objects into one packed L1 object
        self.fill_wal(node, 2)  # two more L0 objects beside it
        log = node.logs[(TOPIC, 0)]
        extents = [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]
        levels = sorted({e.path.split("/")[2] for e in extents})
        assert levels == ["L0", "L1"]
        assert all(e.position > 0 for e in extents)  # chunks of shared objects, not segments
        end = log.log_end_offset
        assert end == 5 * 3 * 5
        assert values(log) == expected(0, end)  # what the broker serves
        with self.reader(root) as reader:
            for start, stop in [(0, end), (0, 1), (7, 23), (44, 46), (end - 1, end), (15, 60)]:
                got = offsets_and_values(reader.read_arrow(start, stop, objects=extents))
                assert got == expected(start, stop), (start, stop)
        node.stop()
        storage.close()

    def test_an_extent_read_reads_only_the_chunks_bytes(
        self, root: tuple[str, dict[str, Any]]
    ) -> None:
        storage, node = self.wal_node(root)
        self.fill_wal(node, 2, per_flush=20)
        log = node.logs[(TOPIC, 1)]
        extents = [ObjectExtent.of(e, f"{TOPIC}/1") for e in log.extents()]
        assert len(extents) == 2
        counting = ReadOnlyStorage(storage)
        reader = SegmentReader(counting.child(f"{TOPIC}/1"), root=counting)
        got = offsets_and_values(reader.read_arrow(0, log.log_end_offset, objects=extents))
        assert got == expected(0, 200)
        # Each WAL object holds three partitions' chunks: the reader read only events-1's.
        assert counting.bytes_read == sum(e.size for e in extents)
        objects = {e.path for e in extents}
        assert counting.bytes_read * 3 <= sum(storage.size(path) for path in objects)
        node.stop()
        storage.close()

    def test_a_chunk_whose_object_was_deleted_is_a_replica_range_error_after_whole_batches(
        self, root: tuple[str, dict[str, Any]]
    ) -> None:
        storage, node = self.wal_node(root)
        self.fill_wal(node, 3)
        log = node.logs[(TOPIC, 0)]
        stale = [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]
        # Compaction (delete delay 0) deletes the L0 objects: the second one is read below
        node.compactor().compact()
        assert not storage.exists(stale[1].path)
        got: list[tuple[int, bytes]] = []
        with self.reader(root) as reader:
            with pytest.raises(ReplicaRangeError, match=r"is gone .* at offset 0\b"):
                got.extend(offsets_and_values(reader.read_arrow(0, 45, objects=stale)))
            assert got == []  # the first extent's object is gone too: nothing served
            # Fresh extents (what the broker answers now) read it all.
            fresh = [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]
            assert offsets_and_values(reader.read_arrow(0, 45, objects=fresh)) == expected(0, 45)
            # An object gone after the first extent: the read stops at the first offset it
            # cannot read, having served whole batches only.
            self.fill_wal(node, 1)
            fresh = [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]
            assert [e.path.split("/")[2] for e in fresh] == ["L1", "L0"]
            storage.delete(fresh[1].path)
            served: list[ReadChunk] = []
            with pytest.raises(ReplicaRangeError, match=r"is gone .* at offset 45\b"):
                collect(reader.read(0, 60, objects=fresh), served)
            assert served[-1].next_offset == 45
            got = offsets_and_values(c.records for c in served if c.records is not None)
            assert got == expected(0, 45)
        node.stop()
        storage.close()

    def test_an_extent_that_holds_less_than_described_is_never_served_in_part(
        self, root: tuple[str, dict[str, Any]]
    ) -> None:
        storage, node = self.wal_node(root)
        self.fill_wal(node, 1)
        log = node.logs[(TOPIC, 0)]
        (extent,) = [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]
        with self.reader(root) as reader:
            # The range cut inside the last batch: the whole batches before it, then an error.
            cut = replace(extent, size=extent.size - 10)
            served: list[ReadChunk] = []
            with pytest.raises(CorruptRecordError, match="ends inside a batch"):
                collect(reader.read(0, 15, objects=[cut]), served)
            assert [c.next_offset for c in served] == [5, 10]
            # A range that ends on a batch boundary before next_offset: a replica range error.
            short = replace(extent, size=extent.size * 2 // 3)
            with pytest.raises(ReplicaRangeError, match="hold batches up to offset 10, not 15"):
                list(reader.read(0, 15, objects=[short]))
            # Bytes of another partition's chunk: not the batches described.
            other = next(iter(node.logs[("orders", 0)].extents()))
            wrong = replace(extent, position=ObjectExtent.of(other, "orders/0").position)
            wrong = replace(wrong, base_offset=3, next_offset=18)
            with pytest.raises(CorruptRecordError, match="expected 3"):
                list(reader.read(3, 18, objects=[wrong]))
            # Past the extents: not this replica's to serve.
            with pytest.raises(ReplicaRangeError, match="in none of the extents"):
                list(reader.read(0, 20, objects=[extent]))
            with pytest.raises(RangeRetainedError) as retained:
                list(reader.read(0, 5, objects=[replace(extent, base_offset=5)]))
            assert retained.value.first_available == 5
        node.stop()
        storage.close()

    def test_rediscovered_extents_continue_one_read_committed_pass(
        self, root: tuple[str, dict[str, Any]]
    ) -> None:
        """An object compacted away mid-read: the read asks for fresh extents and goes on in
        the same pass, so the read_committed filter remembers the ABORT marker it passed (a
        new read from the break would take producer 7's later, committed transaction for the
        aborted one)."""
        storage, node = self.wal_node(root)
        log = node.logs[(TOPIC, 0)]

        def append(data: bytes) -> int:
            return log.append(data, leader_epoch=0).first_offset

        def txn(pid: int, first: int, count: int) -> bytes:
            return batch_of(
                first, count, producer_id=pid, producer_epoch=0, base_sequence=0,
                is_transactional=True,
            )  # fmt: skip

        def marker(pid: int, kind: ControlType) -> bytes:
            return build_control(
                kind, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp=9
            )

        append(batch_of(0, 2))  # 0-1 plain
        a = append(txn(7, 2, 3))  # 2-4 producer 7, aborted
        append(marker(7, ControlType.ABORT))  # 5
        node.flush()  # the first WAL object
        append(batch_of(6, 2))  # 6-7 plain
        b = append(txn(7, 8, 2))  # 8-9 producer 7 again, committed
        append(marker(7, ControlType.COMMIT))  # 10
        node.flush()  # the second
        assert b == 8
        stale = [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]
        assert len(stale) == 2
        node.compactor().compact([stale[1].path])  # the second object, deleted at once
        assert not storage.exists(stale[1].path)
        asked: list[int] = []

        def rediscover(at: int) -> list[ObjectExtent]:
            asked.append(at)
            return [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]

        with self.reader(root) as reader:
            chunks = reader.read(
                0,
                11,
                objects=stale,
                read_committed=True,
                aborted_transactions=[AbortedTxnRange(7, a)],
                rediscover=rediscover,
            )
            got = offsets_and_values(c.records for c in chunks if c.records is not None)
            assert [o for o, _ in got] == [0, 1, 6, 7, 8, 9]
            assert asked == [6]
            # Without fresh extents: the error, after the batches before the gone object.
            served: list[ReadChunk] = []
            with pytest.raises(ReplicaRangeError, match="at offset 6"):
                collect(reader.read(0, 11, objects=stale, rediscover=lambda at: None), served)
            assert served[-1].next_offset == 6
        node.stop()
        storage.close()

    def test_segment_objects_and_chunks_of_one_log_read_as_one_range(
        self, root: tuple[str, dict[str, Any]]
    ) -> None:
        """A partition written before the WAL (segment objects) and after it (chunks)."""
        url, options = root
        storage = Storage.from_url(url, **options)
        before = self.make_log(storage.child(f"{TOPIC}/0"), [10, 20])
        before.close()
        node = Node(storage, [(TOPIC, 0), ("orders", 0)])
        node.start()
        log = node.logs[(TOPIC, 0)]
        assert log.log_end_offset == 30
        self.fill_wal(node, 2, per_flush=2)
        extents = [ObjectExtent.of(e, f"{TOPIC}/0") for e in log.extents()]
        assert [e.is_segment for e in extents] == [True, True, False, False]
        assert extents[0].path == f"{TOPIC}/0/{0:020d}.seg"
        with self.reader(root) as reader:
            got = offsets_and_values(reader.read_arrow(5, 45, objects=extents))
            assert got == expected(5, 45)
            # Old listings still read (SegmentObject), up to where the segments end.
            listed = reader.list_objects()
            assert [o.base_offset for o in listed] == [0, 10]
            assert offsets_and_values(reader.read_arrow(0, 30, objects=listed)) == expected(0, 30)
            with pytest.raises(TypeError, match="mixes"):
                list(reader.read(0, 30, objects=[*extents[:1], *listed[1:]]))
        node.stop()
        storage.close()


@pytest.mark.unit
class TestMemory(ReaderTests):
    @pytest.fixture
    def root(self) -> tuple[str, dict[str, Any]]:
        return f"memory://test-reader-{uuid.uuid4().hex}/broker-0", {}


@pytest.mark.unit
class TestLocalFiles(ReaderTests):
    @pytest.fixture
    def root(self, tmp_path: Path) -> tuple[str, dict[str, Any]]:
        return (tmp_path / "broker-0").as_uri(), {}


@pytest.mark.s3
class TestS3(ReaderTests):
    @pytest.fixture
    def root(self, s3_url: S3Location) -> tuple[str, dict[str, Any]]:
        return s3_url.sub("broker-0"), dict(s3_url.storage_options)
