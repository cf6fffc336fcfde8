"""Read-only access to one partition replica's segment objects, for readers outside the broker.

Spark executors read a partition straight from a replica's storage with :class:`SegmentReader`:
given the replica's storage root, a topic, a partition and an offset range ``[start, end)``, it
lists the partition's ``<base:020d>.seg`` objects, reads the objects covering the range in
chunks (range reads: an object is never read whole unless the range needs it), CRC-checks every
batch it serves, and yields the records as Arrow record batches with an ``offset`` column.

It never writes: no recovery, no checkpoint, no cleanup. It relies on what the log promises
readers (see :mod:`logstore.log`):

* Segment objects are immutable, except that a merge rewrites a segment's first object under
  the same name as a longer object *that starts with the very same bytes*. So reading an object
  chunk by chunk stays consistent even if it is merged meanwhile: later chunks either continue
  the old bytes or belong to the merged tail.
* Objects merged away (or retained away) stay readable for ``file.delete.delay.ms``. If one is
  gone anyway, the reader lists the objects again and carries on from where it was (once per
  place; a second miss in a row is an error).
* Only whole, CRC-valid batches are served. A corrupt batch is a
  :class:`~logstore.errors.CorruptRecordError` naming the object and the offset; nothing of it
  is returned.

With the broker's write-ahead log, a partition's recent batches are byte ranges (chunks) of
shared ``_replog/wal/...`` objects that no listing of ``<topic>/<partition>`` finds. The
replica's broker knows where they are (DescribeLogObjects answers from memory), and a reader
given its :class:`ObjectExtent` s (``objects=``) range-reads each extent's bytes only: a
chunk costs the partition's bytes, never the whole shared object's, with the same CRC check per
batch. Chunks live in immutable objects, but compaction deletes them after
``file.delete.delay.ms``: an extent whose object is gone is a :class:`ReplicaRangeError` after
the whole batches before it, so the caller asks for fresh extents or reads elsewhere.

The first object of the range must start at or before ``start``; if it starts later, retention
removed the beginning of the range (:class:`RangeRetainedError`, carrying the first offset
still there). If the objects end before ``end``, this replica does not hold the whole range
(:class:`ReplicaRangeError`): ask another replica or the broker.

Examples
--------
>>> from logstore.batch import Record, build
>>> from logstore.log import Log
>>> log = Log.open(Storage.from_url("memory://doc-reader/root/events/0"))
>>> _ = log.append(build([Record(b"k", b"v%d" % i, 1) for i in range(5)]), leader_epoch=0)
>>> _ = log.flush()
>>> with SegmentReader.open("memory://doc-reader/root", "events", 0) as reader:
...     [b.column("offset").to_pylist() for b in reader.read_arrow(1, 4)]
[[1, 2, 3]]
"""

from __future__ import annotations

import bisect
import heapq
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from logstore.batch import (
    HEADER_SIZE,
    HEADERS_TYPE,
    LOG_OVERHEAD,
    MAGIC,
    ControlType,
    RecordBatch,
    TimestampType,
    parse_header,
)
from logstore.errors import (
    CorruptRecordError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    ReplogError,
)
from logstore.log_loader import live_segment_objects, load_checkpoint
from logstore.segment import ChunkSegment, Extent, base_offset_of, cleaned_object_of
from logstore.storage import LocalStorage, MemoryStorage, Storage

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "LOCAL_CHUNK_BYTES",
    "READ_SCHEMA",
    "AbortedTxnRange",
    "Located",
    "ObjectExtent",
    "RangeRetainedError",
    "ReadChunk",
    "Rediscover",
    "ReplicaRangeError",
    "SegmentObject",
    "SegmentReader",
]

#: The largest range read from object storage: a segment object costs few requests (each
#: costs a round trip of tens of ms on S3) and a reader holds little memory.
DEFAULT_CHUNK_BYTES: Final = 16 * 1024 * 1024
#: The largest read from local files and memory, where a request costs microseconds: a read
#: that fits the CPU's caches is CRC-checked and decoded while still in them (2 MiB reads
#: decode 1,000,000 records about twice as fast here as 16 MiB ones).
LOCAL_CHUNK_BYTES: Final = 2 * 1024 * 1024
#: The first read of an object (and the first after a hop); reads then double up to a chunk.
_FIRST_READ_BYTES: Final = 64 * 1024

# The header fields a reader needs to hop over a batch it does not want without reading it:
_PEEK: Final = struct.Struct(
    ">"
    "q"  # baseOffset            int64
    "i"  # batchLength           int32  (bytes after this field)
    "i"  # partitionLeaderEpoch  int32
    "b"  # magic                 int8
)
_LAST_OFFSET_DELTA: Final = struct.Struct(">i")
#: lastOffsetDelta follows magic, crc (uint32) and attributes (int16).
_LAST_OFFSET_DELTA_OFFSET: Final = struct.calcsize(">qiibIh")
_MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD


class AbortedTxnRange(NamedTuple):
    """An aborted transaction as a read_committed Fetch reports it: its producer's records
    from ``first_offset`` up to that producer's ABORT marker are dropped.

    Not the wire struct (``replication.protocol.fetch.AbortedTransaction``): a plain pair, so
    Spark input partitions that carry them pickle small.
    """

    producer_id: int
    first_offset: int


#: What :meth:`SegmentReader.read_arrow` yields: the record columns of
#: :data:`logstore.batch.RECORD_SCHEMA`, plus each record's offset and timestamp type.
#: LogAppendTime batches carry the batch's max timestamp for every record, as Kafka's consumer.
READ_SCHEMA: Final = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("key", pa.binary(), nullable=True),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("timestamp_type", pa.int32(), nullable=False),
        pa.field("headers", HEADERS_TYPE, nullable=True),
    ]
)


class RangeRetainedError(OffsetOutOfRangeError):
    """The replica no longer holds the start of the range: retention removed it."""

    def __init__(self, message: str, *, first_available: int | None) -> None:
        super().__init__(message)
        #: The first offset the replica still holds, or None if it holds nothing of the range.
        self.first_available = first_available

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce passes only the message back to __init__; keep the offset.
        return (_rebuild_retained, (str(self), self.first_available))


def _rebuild_retained(message: str, first_available: int | None) -> RangeRetainedError:
    return RangeRetainedError(message, first_available=first_available)


class ReplicaRangeError(ReplogError):
    """This replica's segment objects do not hold the whole range; read it from another
    replica or through the broker."""

    retriable = True


@dataclass(frozen=True, slots=True)
class SegmentObject:
    """One segment object as a listing (or a planner that listed) saw it."""

    name: str
    base_offset: int
    size: int


@dataclass(frozen=True, slots=True)
class ObjectExtent:
    """Whole batches ``[base_offset, next_offset)`` of one partition at bytes ``[position,
    position + size)`` of the object at ``path``, relative to the replica's storage root (as
    the replica's broker describes them: DescribeLogObjects).

    A segment object is ``<topic>/<partition>/<base:020d>.seg`` at position 0; a chunk of a
    shared write-ahead or packed object is a byte range of ``_replog/wal/...``. Knowing the
    byte range is what lets a reader fetch only the partition's bytes of a shared object.
    """

    path: str
    position: int
    size: int
    base_offset: int
    next_offset: int

    @classmethod
    def of(cls, extent: Extent, partition_dir: str) -> ObjectExtent:
        """The extent of a log's :class:`~logstore.segment.LogSegment` (an object of the
        partition's directory ``partition_dir``, ``<topic>/<partition>`` under the root) or
        :class:`~logstore.segment.ChunkSegment` (a byte range of a shared object whose path
        is relative to the root already)."""
        if isinstance(extent, ChunkSegment):
            c = extent.chunk
            return cls(c.object, c.position, c.size, c.base_offset, c.next_offset)
        return cls(
            f"{partition_dir}/{extent.name}", 0, extent.size, extent.base_offset, extent.next_offset
        )

    @property
    def name(self) -> str:
        """The object's name (the last part of its path), as :class:`SegmentObject`'s."""
        return self.path.rsplit("/", 1)[-1]

    @property
    def is_segment(self) -> bool:
        """A whole segment object of the partition (not a chunk of a shared object)."""
        return self.position == 0 and base_offset_of(self.path) is not None

    def __post_init__(self) -> None:
        if self.position < 0 or self.size < 0 or self.next_offset < self.base_offset:
            raise ValueError(
                f"extent {self.path}@{self.position}+{self.size} [{self.base_offset}, "
                f"{self.next_offset}) is not an extent: position and size must be >= 0 and "
                "next_offset >= base_offset"
            )


#: what a read may be given as a listing: segment objects, or extents (segments and chunks)
Located = SegmentObject | ObjectExtent
#: ``rediscover(offset)``: the extents holding ``[offset, end)`` now, or None (see
#: :meth:`SegmentReader.batches`)
Rediscover = Callable[[int], Sequence[ObjectExtent] | None]


@dataclass(frozen=True, slots=True)
class ReadChunk:
    """Records read so far, and the offset the read has reached.

    ``records`` is None when a batch was skipped (a transaction marker or aborted data);
    ``next_offset`` still moves, so a caller resuming elsewhere knows where to resume.
    """

    records: pa.RecordBatch | None
    next_offset: int


class _AbortedFilter:
    """Kafka's read_committed rule over a run of batches (its consumer's CompletedFetch).

    Aborted transactions are taken in order of their first offset; once a batch's last offset
    reaches a transaction's first offset, its producer is aborted until that producer's ABORT
    marker. Without an ABORT marker in the range, the producer stays aborted to its end.
    """

    def __init__(self, aborted: Iterable[AbortedTxnRange]) -> None:
        self._queue = [(int(first), int(pid)) for pid, first in aborted]
        heapq.heapify(self._queue)
        self._aborted: set[int] = set()

    def keep(self, batch: RecordBatch) -> bool:
        """Whether the batch's records are visible; call it for every batch, in order."""
        if batch.producer_id < 0:
            return not batch.is_control
        last = batch.last_offset
        while self._queue and self._queue[0][0] <= last:
            self._aborted.add(heapq.heappop(self._queue)[1])
        if batch.is_control:
            if batch.control_type() is ControlType.ABORT:
                self._aborted.discard(batch.producer_id)
            return False
        return not (batch.is_transactional and batch.producer_id in self._aborted)


_ascending: pa.Array = pa.array([], pa.int64())


def _offsets(first: int, count: int) -> pa.Array:
    """``first, first + 1, ...`` (``count`` values): a shared 0, 1, 2, ... array plus ``first``."""
    global _ascending
    ascending = _ascending
    if len(ascending) < count:
        size = max(count, 2 * len(ascending), 1 << 16)
        ascending = pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), size), start=-1)
        _ascending = ascending
    return pc.add(ascending.slice(0, count), pa.scalar(first, pa.int64()))


def to_read_batch(batch: RecordBatch, start: int, end: int) -> pa.RecordBatch | None:
    """The batch's records with offsets in ``[start, end)`` as a :data:`READ_SCHEMA` batch."""
    base = batch.base_offset
    skip = max(start - base, 0)
    stop = min(end, batch.next_offset) - base
    if stop <= skip:
        return None
    if batch.has_gaps:
        return _gapped_read_batch(batch, skip, stop)
    data = batch.to_arrow()
    if skip or stop < data.num_rows:
        data = data.slice(skip, stop - skip)
    return _read_batch(batch, data, _offsets(base + skip, data.num_rows))


def _gapped_read_batch(batch: RecordBatch, low: int, high: int) -> pa.RecordBatch | None:
    """:func:`to_read_batch` of a batch the log cleaner left with offset gaps: its records
    whose offset delta is in ``[low, high)``, each with its own offset."""
    data, deltas = batch.to_arrow_with_deltas()
    assert deltas is not None
    values = deltas.to_pylist()
    first, last = bisect.bisect_left(values, low), bisect.bisect_left(values, high)
    if first == last:
        return None
    data = data.slice(first, last - first)
    offsets = pc.add(deltas.slice(first, last - first).cast(pa.int64()), batch.base_offset)
    return _read_batch(batch, data, offsets)


def _read_batch(batch: RecordBatch, data: pa.RecordBatch, offsets: pa.Array) -> pa.RecordBatch:
    rows = data.num_rows
    ts_type = batch.timestamp_type
    timestamps = data.column(2)
    if ts_type is TimestampType.LOG_APPEND_TIME:
        timestamps = pa.repeat(pa.scalar(batch.max_timestamp, pa.int64()), rows)
    return pa.RecordBatch.from_arrays(
        [
            offsets,
            data.column(0),
            data.column(1),
            timestamps,
            pa.repeat(pa.scalar(int(ts_type), pa.int32()), rows),
            data.column(3),
        ],
        schema=READ_SCHEMA,
    )


class SegmentReader:
    """Reads offset ranges of one partition replica from its segment objects; never writes.

    Parameters
    ----------
    storage
        The partition's directory: ``<replica root>/<topic>/<partition>``.
    chunk_bytes
        The largest range read (reads start at 64 KiB and double up to it).

    Examples
    --------
    >>> reader = SegmentReader.open("s3://bucket/broker-0", "events", 0,  # doctest: +SKIP
    ...                             endpoint_url="http://127.0.0.1:9000")
    >>> for chunk in reader.read(0, 1000):  # doctest: +SKIP
    ...     print(chunk.next_offset, chunk.records.num_rows if chunk.records else 0)
    """

    def __init__(
        self,
        storage: Storage,
        *,
        root: Storage | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        owns_storage: bool = False,
    ) -> None:
        if chunk_bytes < HEADER_SIZE:
            raise ValueError(f"chunk_bytes={chunk_bytes} is smaller than a batch header")
        self.storage = storage
        #: the replica's storage root, where :class:`ObjectExtent` paths start (None: only
        #: segment objects of ``storage`` can be read)
        self.root = root
        self.chunk_bytes = chunk_bytes
        self._owns_storage = owns_storage

    @classmethod
    def open(
        cls,
        root_url: str,
        topic: str,
        partition: int,
        *,
        chunk_bytes: int | None = None,
        **storage_options: Any,
    ) -> SegmentReader:
        """The reader of ``topic``-``partition`` on the replica whose storage root is
        ``root_url`` (a broker's ``log.dir``); ``storage_options`` go to fsspec. Reads are at
        most ``chunk_bytes``: by default :data:`LOCAL_CHUNK_BYTES` for local files and memory,
        :data:`DEFAULT_CHUNK_BYTES` for object stores."""
        root = Storage.from_url(root_url, fsync=False, **storage_options)
        if chunk_bytes is None:
            local = isinstance(root, LocalStorage | MemoryStorage)
            chunk_bytes = LOCAL_CHUNK_BYTES if local else DEFAULT_CHUNK_BYTES
        storage = root.child(f"{topic}/{partition}")
        return cls(storage, root=root, chunk_bytes=chunk_bytes, owns_storage=True)

    def close(self) -> None:
        if self._owns_storage:
            self.storage.close()
            if self.root is not None:
                self.root.close()  # the client belongs to the root, not to its child

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SegmentReader({self.storage.url!r})"

    # --- listing ------------------------------------------------------------------------------

    def list_objects(self) -> list[SegmentObject]:
        """The partition's segment objects, by base offset (other objects are ignored). Once
        the log cleaner has written objects here, the checkpoint decides which count
        (:func:`~logstore.log_loader.live_segment_objects`): one more GET, only then."""
        listing = self.storage.list()
        if any(cleaned_object_of(info.path) is not None for info in listing):
            live, _ = live_segment_objects(listing, load_checkpoint(self.storage))
            return [SegmentObject(name, base, size) for base, name, size in live]
        found = [
            SegmentObject(info.path, base, info.size)
            for info in listing
            if "/" not in info.path and (base := base_offset_of(info.path)) is not None
        ]
        found.sort(key=lambda o: o.base_offset)
        return found

    # --- batches ------------------------------------------------------------------------------

    def batches(
        self,
        start: int,
        end: int,
        *,
        objects: Sequence[Located] | None = None,
        rediscover: Rediscover | None = None,
    ) -> Iterator[RecordBatch]:
        """Every batch holding offsets of ``[start, end)``, in order, CRC-checked.

        The first batch may begin before ``start`` and the last may end after ``end``
        (batches are atomic). ``objects`` is a listing made earlier (for example by a planner):
        :class:`SegmentObject` s of this partition, or :class:`ObjectExtent` s (as the
        replica's broker described them, segment objects and WAL chunks; see
        :meth:`extent_batches`); without one, the segment objects are listed first. Control
        batches are included.

        ``rediscover(offset)``, with extents: where the replica holds ``[offset, end)`` now
        (asked of its broker again), or None if it cannot say. Called when the extents read
        are stale (an object compacted away), once per place the read got stuck, so the read
        goes on in this one pass (a read_committed filter keeps its state).
        """
        if start < 0 or end < start:
            raise ValueError(f"offset range [{start}, {end}) must have 0 <= start <= end")
        if objects and isinstance(objects[0], ObjectExtent):
            extents = [o for o in objects if isinstance(o, ObjectExtent)]
            if len(extents) != len(objects):
                raise TypeError("objects mixes SegmentObject and ObjectExtent; pass one kind")
            yield from self._rediscovering(start, end, extents, rediscover)
            return
        listing = [o for o in objects or () if isinstance(o, SegmentObject)]
        if len(listing) != len(objects or ()):
            raise TypeError("objects mixes SegmentObject and ObjectExtent; pass one kind")
        if objects is None:
            listing = self.list_objects()
        # A listing may be stale (objects merged or retained away since): on trouble, list
        # again and retry, once per place the read got stuck.
        fresh = objects is None
        current = start
        while current < end:
            i = bisect.bisect_right([o.base_offset for o in listing], current) - 1
            if i < 0:
                if not fresh:
                    listing, fresh = self.list_objects(), True
                    continue
                raise self._missing(listing, current, end)
            obj = listing[i]
            obj_end = listing[i + 1].base_offset if i + 1 < len(listing) else None
            before = current
            try:
                for batch in self._object_batches(obj, obj_end, current, end):
                    yield batch
                    current = batch.next_offset
            except ObjectNotFoundError:
                if fresh and current == before:
                    raise
                listing, fresh = self.list_objects(), True
                continue
            if current > before:
                fresh = False
                continue
            # ``obj`` ends before ``current``: the next object should have started there.
            if not fresh:
                listing, fresh = self.list_objects(), True
                continue
            raise ReplicaRangeError(
                f"{self.storage.url}: offset {current} is in no segment object ({obj.name} ends "
                f"before it); this replica holds [{listing[0].base_offset}, {current}) of the "
                f"range [{start}, {end})"
            )

    def _missing(self, listing: list[SegmentObject], current: int, end: int) -> ReplogError:
        if not listing:
            return RangeRetainedError(
                f"{self.storage.url}: no segment objects: offsets [{current}, {end}) are not on "
                "this replica (deleted by retention, or the topic was deleted)",
                first_available=None,
            )
        first = listing[0].base_offset
        return RangeRetainedError(
            f"{self.storage.url}: offsets [{current}, {min(first, end)}) are gone: the first "
            f"segment object starts at {first} (removed by retention)",
            first_available=first,
        )

    def _rediscovering(
        self,
        start: int,
        end: int,
        extents: Sequence[ObjectExtent],
        rediscover: Rediscover | None,
    ) -> Iterator[RecordBatch]:
        current = start
        stuck_at: int | None = None
        while True:
            try:
                for batch in self.extent_batches(current, end, extents):
                    yield batch
                    current = batch.next_offset
                return
            except ReplicaRangeError:
                if rediscover is None or stuck_at == current:
                    raise
                fresh = rediscover(current)
                if not fresh:
                    raise
                stuck_at, extents = current, list(fresh)

    def extent_batches(
        self, start: int, end: int, extents: Sequence[ObjectExtent]
    ) -> Iterator[RecordBatch]:
        """Every batch holding offsets of ``[start, end)`` from ``extents`` (in offset order,
        as the replica's broker described them: DescribeLogObjects), CRC-checked.

        Each extent is range-read within its bytes only: a chunk of a shared WAL or packed
        object costs the partition's bytes, never the object's. An extent's object may be
        gone (a chunk compacted and deleted after ``file.delete.delay.ms``, a segment merged
        away): :class:`ReplicaRangeError`, after every whole batch before it was yielded, so
        the caller resumes elsewhere (another replica, fresh extents, the brokers) from the
        offset reached. Nothing here lists storage.
        """
        if self.root is None:
            raise ValueError(
                f"{self!r} has no storage root to read extents from; open it with "
                "SegmentReader.open(root_url, topic, partition) or pass root="
            )
        root = self.root
        bases = [e.base_offset for e in extents]
        current = start
        while current < end:
            i = bisect.bisect_right(bases, current) - 1
            if i < 0:
                first = bases[0] if bases else None
                raise RangeRetainedError(
                    f"{root.url}: offsets [{current}, {min(first or end, end)}) are in none of "
                    f"the replica's objects: its extents start at {first} (removed by retention)",
                    first_available=first,
                )
            extent = extents[i]
            if current >= extent.next_offset:
                raise ReplicaRangeError(
                    f"{root.url}: offset {current} is in none of the extents described (the "
                    f"last before it, {extent.path}@{extent.position}, ends at "
                    f"{extent.next_offset}); ask the replica's broker again or read elsewhere"
                )
            try:
                for batch in self._range_batches(
                    root,
                    extent.path,
                    extent.position,
                    extent.position + extent.size,
                    extent.base_offset,
                    extent.next_offset,
                    current,
                    end,
                ):
                    yield batch
                    current = batch.next_offset
            except ObjectNotFoundError as err:
                raise ReplicaRangeError(
                    f"{root.url}/{extent.path} is gone (compacted or merged, then deleted) at "
                    f"offset {current}; ask the replica's broker where the offsets are now "
                    "(DescribeLogObjects) or read through the brokers"
                ) from err
            if current < min(end, extent.next_offset):
                raise ReplicaRangeError(
                    f"{root.url}/{extent.path}: bytes [{extent.position}, "
                    f"{extent.position + extent.size}) hold batches up to offset {current}, not "
                    f"{extent.next_offset} as described (the object was cut or rewritten); "
                    "read the rest elsewhere"
                )

    def _object_batches(
        self, obj: SegmentObject, obj_end: int | None, current: int, end: int
    ) -> Iterator[RecordBatch]:
        """Batches of segment object ``obj`` (which ends at offset ``obj_end``, if known) from
        the one holding ``current`` to the one holding ``end - 1``."""
        return self._range_batches(
            self.storage, obj.name, 0, None, obj.base_offset, obj_end, current, end, obj.size
        )

    def _range_batches(
        self,
        storage: Storage,
        path: str,
        begin: int,
        limit: int | None,
        base_offset: int,
        obj_end: int | None,
        current: int,
        end: int,
        size: int | None = None,
    ) -> Iterator[RecordBatch]:
        """Batches in bytes ``[begin, limit)`` of ``path`` (to its end if ``limit`` is None),
        whose first batch is ``base_offset`` (and whose batches end at offset ``obj_end``, if
        known), from the one holding ``current`` to the one holding ``end - 1``.

        Read sizes follow what is needed: from the start, about the bytes the range takes in
        it (from the size, taking records as of even size); further in, a small read that hops
        from header to header over batches before ``current``, never reading them. Reads then
        double, up to ``chunk_bytes``, so a short range costs little more than its own batches
        and a long one few requests.
        """
        if size is None:
            size = (limit - begin) if limit is not None else 0
        where = f"{storage.url}/{path}"
        if begin or limit is not None:
            where += f" (bytes {begin} to {limit})"
        first_read = min(_FIRST_READ_BYTES, self.chunk_bytes)
        position = begin
        expected = base_offset
        want = first_read
        if current <= base_offset:
            want = self.chunk_bytes
            if obj_end is not None and end < obj_end:
                share = (end - base_offset) / max(obj_end - base_offset, 1)
                want = min(max(int(size * share * 1.1) + first_read, first_read), want)
        while True:
            stop = position + want if limit is None else min(position + want, limit)
            if stop <= position:
                return  # the extent's bytes are all read
            data = storage.read_range(path, position, stop)
            if not data:
                return
            at_eof = len(data) < stop - position or stop == limit
            view = memoryview(data)
            p = 0
            n = len(view)
            hop: int | None = None
            need = 0  # the size of a wanted batch that runs past this read
            while n - p >= HEADER_SIZE:
                base, length, _epoch, magic = _PEEK.unpack_from(view, p)
                if magic != MAGIC or length < _MIN_BATCH_LENGTH:
                    raise CorruptRecordError(
                        f"{where}: malformed batch header at byte {position + p} (magic {magic}, "
                        f"length {length}); the object is not served from there"
                    )
                if base != expected:
                    raise CorruptRecordError(
                        f"{where}: batch at byte {position + p} has base offset {base}, expected "
                        f"{expected}; the object is not served from there"
                    )
                size = LOG_OVERHEAD + length
                (delta,) = _LAST_OFFSET_DELTA.unpack_from(view, p + _LAST_OFFSET_DELTA_OFFSET)
                next_offset = base + delta + 1
                if base >= end:
                    return
                if p + size > n:
                    if next_offset <= current:
                        hop = position + p + size  # not wanted: skip its bytes unread
                        expected = next_offset
                    else:
                        need = size
                    break
                expected = next_offset
                if next_offset > current:
                    batch = parse_header(view, p)
                    batch.position = position + p
                    try:
                        batch.ensure_valid()
                    except CorruptRecordError as err:
                        raise CorruptRecordError(
                            f"{where}: batch at offset {base} (byte {position + p}) is corrupt "
                            f"and was not served: {err}"
                        ) from err
                    yield batch
                p += size
            if at_eof:
                if p < n:
                    raise CorruptRecordError(
                        f"{where}: the object ends inside a batch at byte {position + p} "
                        f"(offset {expected}); the rest is not served"
                    )
                return
            if hop is not None:
                position, want = hop, first_read
                continue
            position += p
            want = max(need, min(want * 2, self.chunk_bytes))

    # --- records ------------------------------------------------------------------------------

    def read(
        self,
        start: int,
        end: int,
        *,
        objects: Sequence[Located] | None = None,
        read_committed: bool = False,
        aborted_transactions: Iterable[AbortedTxnRange] = (),
        rediscover: Rediscover | None = None,
    ) -> Iterator[ReadChunk]:
        """The records with offsets in ``[start, end)``, batch by batch, with progress.

        Transaction markers are never returned. With ``read_committed``, records of the
        ``aborted_transactions`` (as a read_committed Fetch at ``start`` reports them) are
        dropped too. The caller must not ask past the last stable offset: data of a
        transaction still open there would be returned.
        """
        keep = _AbortedFilter(aborted_transactions).keep if read_committed else None
        for batch in self.batches(start, end, objects=objects, rediscover=rediscover):
            next_offset = min(batch.next_offset, end)
            visible = keep(batch) if keep is not None else not batch.is_control
            records = to_read_batch(batch, start, end) if visible else None
            yield ReadChunk(records, next_offset)

    def read_arrow(
        self,
        start: int,
        end: int,
        *,
        objects: Sequence[Located] | None = None,
        read_committed: bool = False,
        aborted_transactions: Iterable[AbortedTxnRange] = (),
    ) -> Iterator[pa.RecordBatch]:
        """Like :meth:`read`, only the record batches (:data:`READ_SCHEMA`)."""
        for chunk in self.read(
            start,
            end,
            objects=objects,
            read_committed=read_committed,
            aborted_transactions=aborted_transactions,
        ):
            if chunk.records is not None:
                yield chunk.records
