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
    RangeRetainedError,
    ReplicaRangeError,
    SegmentReader,
)
from logstore.storage import Data, ObjectInfo, Storage
from tests.conftest import S3Location

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
