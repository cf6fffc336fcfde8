"""A partition log's extents in memory and its read path (Kafka's LocalLog).

A log is an ordered list of *extents*: segment objects of its own
(:class:`~logstore.segment.LogSegment`) and, over the broker WAL, chunk extents of shared
objects (:class:`~logstore.segment.ChunkSegment`), followed by the batches appended and not yet
durable. :class:`LocalLog` holds them with the offsets that bound them (log start, durable end,
LEO), a tail cache of recent extents' bytes, and the objects retired and waiting for
``file.delete.delay.ms``. It is the compactor's :class:`~logstore.compaction.ExtentHolder`
(the compactor swaps chunk extents for their packed copy, as Kafka's cleaner replaces
segments); :class:`~logstore.log.Log` builds the write path, truncation and checkpoints on
it, and :class:`~logstore.log_retention.LogRetention` retention.

Reads: finding the batch for an offset never lists storage (a per-batch index of each extent,
loaded once), and every batch served from storage is CRC-checked on the way out; a corrupt
batch raises :class:`CorruptRecordError` naming the object and offset and is never returned.
Batches still in memory (unflushed, or in the tail cache as this process wrote them) were
checked on append and are served by :meth:`LocalLog.read_from_memory` without a second check or
a thread hop.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from logstore.batch import iter_batches
from logstore.config import LogConfig
from logstore.errors import CorruptRecordError, InvalidRecordError, OffsetOutOfRangeError
from logstore.segment import BatchIndex, ChunkSegment, Extent, LogSegment
from logstore.storage import Storage
from logstore.tail_cache import TailCache
from logstore.wal import WalWriter
from logstore.wal_index import ChunkExtent, WalIndex


@dataclass(frozen=True, slots=True)
class WalLink:
    """How a log over the broker's WAL reaches it: the writer that makes its batches durable
    (its storage is the broker root, where the chunks' objects live), the index holding the
    references its chunk extents take, and the partition's identity in chunk headers.

    The writer should deliver ``wal_flushed`` on its I/O thread (no loop, or
    ``hooks_on_loop=False``), or truncations must not run on its loop: a truncation waits
    for the log's chunk in flight to be reported.
    """

    writer: WalWriter
    index: WalIndex
    topic: str
    topic_id: str
    partition: int

    @property
    def storage(self) -> Storage:
        return self.writer.storage

    def seq_bound(self) -> int:
        """The highest seq any written WAL or packed object of this root can have now."""
        return max(self.writer.next_seq, self.index.next_seq) - 1


@dataclass(slots=True)
class PendingBatch:
    """A batch appended but not yet in a segment object."""

    base_offset: int
    next_offset: int
    max_timestamp: int
    data: bytes


class LocalLog:
    """A partition log's extents, its pending batches and its tail cache, and how they are
    read (see the module doc). Thread-safe; storage I/O happens outside the state lock."""

    def __init__(
        self,
        storage: Storage,
        config: LogConfig,
        segments: Sequence[Extent],
        log_start_offset: int,
        time_ms: Callable[[], int],
        wal: WalLink | None,
        tail_cache: TailCache | None = None,
    ) -> None:
        self.storage = storage
        self.config = config
        self._time_ms = time_ms
        self._lock = threading.RLock()
        #: bumped whenever the list of live objects or an object's checkpointed fields change
        self._shape_version = 0
        self._segments: list[Extent] = list(segments)
        self._bases = [s.base_offset for s in segments]
        self._pending: list[PendingBatch] = []
        self._log_start_offset = log_start_offset
        self._durable_end = segments[-1].next_offset if segments else log_start_offset
        self._leo = self._durable_end
        #: recent objects' bytes, shared with the broker's other logs (a cache of its own if
        #: standalone). Objects whose every batch is known CRC-valid (written from appended
        #: batches, which were checked on append, or merged from checked ones) are marked
        #: checked: read_from_memory serves them as they are; other cached bytes (read from
        #: storage) are checked on read
        self._cache = tail_cache if tail_cache is not None else TailCache(total_bytes=None)
        self._cache_owner = self._cache.owner()
        weakref.finalize(self, self._cache.drop_owner, self._cache_owner)
        self._delayed_deletes: list[tuple[int, str]] = []
        #: the broker WAL this log's batches go to (None: standalone, its own segment objects)
        self.wal = wal

    # --- state ------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """LEO: the next offset to be assigned (appended, flushed or not)."""
        return self._leo

    @property
    def durable_end_offset(self) -> int:
        """End of what is in segment objects on storage (the replica's durable LEO)."""
        return self._durable_end

    @property
    def size_in_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments) + sum(len(p.data) for p in self._pending)

    def segments(self) -> list[LogSegment]:
        """A snapshot of the live segment objects (not the WAL chunks: :meth:`extents`)."""
        with self._lock:
            return [s for s in self._segments if isinstance(s, LogSegment)]

    def extents(self) -> list[Extent]:
        """A snapshot of the live extents in offset order: segment objects and WAL chunks."""
        with self._lock:
            return list(self._segments)

    # --- segments (runs of objects opened by a roll) ----------------------------------------

    def _group_of(self, i: int) -> list[int]:
        """Indexes of the objects forming the segment that holds object ``i``."""
        start = i
        while start > 0 and not self._segments[start].rolled:
            start -= 1
        end = i + 1
        while end < len(self._segments) and not self._segments[end].rolled:
            end += 1
        return list(range(start, end))

    def _groups(self) -> list[list[int]]:
        groups: list[list[int]] = []
        for i, segment in enumerate(self._segments):
            if segment.rolled or not groups:
                groups.append([])
            groups[-1].append(i)
        return groups

    def _release_chunks(self, extents: Iterable[Extent]) -> None:
        """Drop the references of chunk extents no longer in the log (and their cache)."""
        for extent in extents:
            if isinstance(extent, ChunkSegment):
                self._cache_drop(extent.name)
                if self.wal is not None:
                    self.wal.index.release(extent.chunk.object)

    # --- read -------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> bytes:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` in total.

        Batches whose base offset is at or past ``max_offset`` (e.g. the HW) are not returned.
        With ``min_one_batch`` the first batch is returned even if larger than ``max_bytes``
        (Kafka's rule, so a consumer can always make progress).
        """
        with self._lock:
            if offset < self._log_start_offset or offset > self._leo:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is out of range [{self._log_start_offset}, {self._leo}] "
                    f"of {self.storage.url}"
                )
            upper = self._leo if max_offset is None else min(max_offset, self._leo)
            if offset >= upper:
                return b""
            segments = self._segments_from_locked(offset)
            pending = list(self._pending)
        chunks: list[bytes] = []
        budget = max_bytes
        first = min_one_batch
        position_offset = offset
        for segment in segments:
            if position_offset >= upper or (budget <= 0 and not first):
                break
            index = self._index_of(segment)
            start, end, budget, first, next_offset = _plan_range(
                index, segment, position_offset, upper, budget, first
            )
            if end > start:
                chunks.append(self._read_range(segment, start, end))
                position_offset = next_offset
            if position_offset < segment.next_offset:
                break  # budget ran out inside this object
        _take_pending(pending, chunks, position_offset, upper, budget, first)
        return b"".join(chunks)

    def read_from_memory(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> bytes | None:
        """What :meth:`read` returns, if every byte of it is in memory: the appended batches
        not yet flushed, or objects in the tail cache whose batches are known CRC-valid (they
        were checked on append); else None, and the caller reads with :meth:`read` in a
        worker thread. The common case of a follower or a tailing consumer: no thread hop, no
        I/O, no second CRC pass. Out-of-range offsets answer None too (:meth:`read` raises
        the error)."""
        with self._lock:
            if offset < self._log_start_offset or offset > self._leo:
                return None
            upper = self._leo if max_offset is None else min(max_offset, self._leo)
            if offset >= upper:
                return b""
            chunks: list[bytes] = []
            budget = max_bytes
            first = min_one_batch
            position_offset = offset
            for segment in self._segments_from_locked(offset):
                if position_offset >= upper or (budget <= 0 and not first):
                    break
                index = segment.index
                data = self._cache.checked(self._cache_owner, segment.name)
                if index is None or data is None:
                    return None
                start, end, budget, first, next_offset = _plan_range(
                    index, segment, position_offset, upper, budget, first
                )
                if end > start:
                    chunks.append(data[start:end])
                    position_offset = next_offset
                if position_offset < segment.next_offset:
                    break
            _take_pending(self._pending, chunks, position_offset, upper, budget, first)
        return b"".join(chunks)

    def _segments_from_locked(self, offset: int) -> list[Extent]:
        """The objects from the one holding ``offset`` on (none if it is past the durable
        end)."""
        if not self._segments or offset >= self._durable_end:
            return []
        return self._segments[bisect.bisect_right(self._bases, offset) - 1 :]

    def _read_range(self, segment: Extent, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the extent (positions within it), CRC-checked."""
        cached = self._cache_get(segment.name)
        if cached is not None:
            data = cached[start:end]
        elif isinstance(segment, ChunkSegment):
            c = segment.chunk
            data = self._wal_storage().read_range(c.object, c.position + start, c.position + end)
        else:
            data = self.storage.read_range(segment.name, start, end)
        try:
            for _ in iter_batches(data, validate=True):
                pass
        except CorruptRecordError as err:
            raise CorruptRecordError(
                f"{self.storage.url}/{segment.name}: corrupt batch at byte {start} or after "
                f"(object covers offsets [{segment.base_offset}, {segment.next_offset})): {err}"
            ) from err
        return data

    def _wal_storage(self) -> Storage:
        if self.wal is None:
            raise InvalidRecordError(f"{self.storage.url} is not a log over the WAL")
        return self.wal.storage

    def _index_of(self, segment: Extent) -> BatchIndex:
        if segment.index is None:
            if isinstance(segment, ChunkSegment):
                c = segment.chunk
                data = self._wal_storage().read_range(c.object, c.position, c.position + c.size)
                if len(data) != c.size:
                    raise CorruptRecordError(
                        f"{self._wal_storage().url}/{c.object}: {len(data)} bytes at "
                        f"{c.position}, the chunk of offsets [{c.base_offset}, "
                        f"{c.next_offset}) has {c.size}; the batch is not served"
                    )
            else:
                data = self.storage.read(segment.name)
            try:
                # headers only: CRCs are checked on every read of a byte range
                index = BatchIndex.scan(data, validate=False)
            except CorruptRecordError as err:
                raise CorruptRecordError(
                    f"{self.storage.url}/{segment.name}: {err}; the batch is not served"
                ) from err
            with self._lock:
                segment.index = index
                self._cache_put(segment.name, data)
        assert segment.index is not None
        return segment.index

    # --- timestamps -------------------------------------------------------------------------

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp``, or None."""
        with self._lock:
            segments = list(self._segments)
            pending = list(self._pending)
        for segment in segments:
            if segment.max_timestamp < timestamp:
                continue
            index = self._index_of(segment)
            for slot, max_ts in enumerate(index.max_timestamps):
                if max_ts >= timestamp:
                    start = index.positions[slot]
                    data = self._read_range(segment, start, start + index.sizes[slot])
                    found = _first_at_or_after(data, timestamp)
                    if found is not None:
                        return found
        for p in pending:
            if p.max_timestamp >= timestamp:
                found = _first_at_or_after(p.data, timestamp)
                if found is not None:
                    return found
        return None

    def offset_of_max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first data record with the largest timestamp in the log
        (Kafka's ListOffsets MAX_TIMESTAMP, KIP-734), or None if the log holds none. The
        objects' max timestamps point to the one to read; control batches are not records, so
        where a marker holds the largest timestamp the answer is None, as for an empty log."""
        with self._lock:
            stamps = [s.max_timestamp for s in self._segments]
            stamps += [p.max_timestamp for p in self._pending]
        return self.offset_for_timestamp(max(stamps)) if stamps else None

    # --- the compactor's ExtentHolder: swapping chunk extents -------------------------------

    def live_chunks(self, topic_id: str, partition: int) -> list[ChunkExtent]:
        """The live chunk extents in offset order (``ExtentHolder``, for the compactor)."""
        link = self.wal
        if link is None or (topic_id, partition) != (link.topic_id, link.partition):
            return []
        with self._lock:
            return [s.chunk for s in self._segments if isinstance(s, ChunkSegment)]

    def cached_chunk(self, extent: ChunkExtent) -> bytes | None:
        """The chunk extent's bytes from the tail cache, if they are there and were checked
        when appended (``ExtentHolder``: the compactor then need not read its object)."""
        return self._cache.checked(self._cache_owner, ChunkSegment(extent).name)

    def replace_extents(self, old: Sequence[ChunkExtent], new: ChunkExtent) -> bool:
        """Swap the adjacent live chunk extents ``old`` for ``new`` (the same batches in
        another object), only if they are still live (``ExtentHolder``; a truncation or
        retention meanwhile wins). The compactor moves the references."""
        if not old or new.base_offset != old[0].base_offset:
            return False
        if new.next_offset != old[-1].next_offset or new.size != sum(o.size for o in old):
            return False
        # The new chunk's cache entry is the old chunks' cached bytes joined, and joined here,
        # before the swap takes the lock: a round's chunks are megabytes, and with the join
        # under the lock the compactor's thread held this partition's appends and fetches (the
        # event loop's) for a p90 of 5.3 ms and up to 17 ms per swap (3 brokers at 200k
        # records/s on 2 cores: the thread loses the CPU or the GIL while it holds the lock);
        # now at most 0.23 ms. A cache key names immutable bytes (object, position, size), so
        # the bytes looked up now are those of the extents swapped below, if they still are.
        names = [ChunkSegment(extent).name for extent in old]
        cached = [self._cache.get(self._cache_owner, name, touch=False) for name in names]
        checked = all(self._cache.checked(self._cache_owner, name) is not None for name in names)
        joined = b"".join(c for c in cached if c is not None) if None not in cached else None
        with self._lock:
            chunks = [s.chunk if isinstance(s, ChunkSegment) else None for s in self._segments]
            n = len(old)
            for i in range(len(chunks) - n + 1):
                if chunks[i : i + n] == list(old):
                    break
            else:
                return False
            run = self._segments[i : i + n]
            index: BatchIndex | None = BatchIndex()
            shift = 0
            for extent in run:
                if extent.index is None or index is None:
                    index = None
                    break
                index.extend(extent.index, shift)
                shift += extent.size
            replacement = ChunkSegment(new, index, run[0].rolled, run[0].created_ms)
            # (no checkpoint needed: chunk extents are not in it, recovery walks the index)
            self._segments[i : i + n] = [replacement]
            self._bases[i : i + n] = [new.base_offset]
            for extent in run:
                self._cache_drop(extent.name)
            if index is not None and joined is not None:
                self._cache_put(replacement.name, joined, checked=checked)
            return True

    # --- delayed deletes --------------------------------------------------------------------

    def _retire(self, extents: Sequence[Extent]) -> None:
        """Extents below the new log start (checkpointed already): segment objects are
        deleted after file.delete.delay.ms, chunks release their object's reference (the
        garbage collector deletes the object once nobody refers to it)."""
        self._schedule_deletes(s.name for s in extents if isinstance(s, LogSegment))
        with self._lock:
            self._release_chunks(extents)

    def _schedule_deletes(self, names: Iterable[str]) -> None:
        due = self._time_ms() + self.config.file_delete_delay_ms
        with self._lock:
            for name in names:
                self._delayed_deletes.append((due, name))
        self.delete_due_objects()

    def delete_due_objects(self) -> int:
        """Delete retired objects whose file.delete.delay.ms has passed (never a live one)."""
        now = self._time_ms()
        with self._lock:
            live = {s.name for s in self._segments}
            due = [n for t, n in self._delayed_deletes if t <= now and n not in live]
            self._delayed_deletes = [(t, n) for t, n in self._delayed_deletes if t > now]
        for name in due:
            self.storage.delete(name)
            self._cache_drop(name)
        return len(due)

    # --- tail cache -------------------------------------------------------------------------

    def _cache_put(self, name: str, data: bytes, *, checked: bool = False) -> None:
        limit = self.config.tail_cache_bytes
        self._cache.put(self._cache_owner, name, data, limit_bytes=limit, checked=checked)

    def _cache_get(self, name: str) -> bytes | None:
        return self._cache.get(self._cache_owner, name)

    def _cache_drop(self, name: str) -> None:
        self._cache.drop(self._cache_owner, name)

    def _cache_clear(self) -> None:
        """Forget this log's cached bytes (it was closed or deleted)."""
        self._cache.drop_owner(self._cache_owner)


def _plan_range(
    index: BatchIndex, segment: Extent, offset: int, upper: int, budget: int, first: bool
) -> tuple[int, int, int, bool, int]:
    """Which bytes of ``segment`` a read from ``offset`` takes: whole batches below
    ``upper`` within ``budget`` (the first one regardless, if ``first``). Returns (start,
    end, budget left, first, the offset after the last batch taken)."""
    slot = index.slot_for(offset)
    start = index.positions[slot]
    end = start
    next_offset = offset
    n = len(index.base_offsets)
    while slot < n and index.base_offsets[slot] < upper:
        size = index.sizes[slot]
        if size > budget and not first:
            break
        end += size
        budget -= size
        first = False
        slot += 1
        next_offset = index.base_offsets[slot] if slot < n else segment.next_offset
    return start, end, budget, first, next_offset


def _take_pending(
    pending: list[PendingBatch],
    chunks: list[bytes],
    offset: int,
    upper: int,
    budget: int,
    first: bool,
) -> None:
    """Append to ``chunks`` the unflushed batches a read from ``offset`` takes."""
    for p in pending:
        if p.next_offset <= offset:
            continue
        if p.base_offset >= upper:
            break
        if len(p.data) > budget and not first:
            break
        chunks.append(p.data)
        budget -= len(p.data)
        first = False


def _first_at_or_after(data: bytes, timestamp: int) -> tuple[int, int] | None:
    for batch in iter_batches(data, validate=False):
        if batch.max_timestamp < timestamp or batch.is_control:
            continue
        records, deltas = batch.to_arrow_with_deltas()
        timestamps = records.column("timestamp").to_pylist()
        offsets = range(len(timestamps)) if deltas is None else deltas.to_pylist()
        for delta, ts in zip(offsets, timestamps, strict=True):
            if ts >= timestamp:
                return batch.base_offset + delta, ts
    return None
