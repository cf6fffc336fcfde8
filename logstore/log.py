"""One replica's log of one partition: appends, flushes, truncation and checkpoints (Kafka's
UnifiedLog), over the extents of :mod:`logstore.local_log`.

Kafka's UnifiedLog appends to the active segment file in place. Object storage has no append
and no rename, so this log works differently while keeping Kafka's contracts:

* Appends are buffered in memory (readable at once) and group-committed by :meth:`Log.flush`
  as one new object named by its base offset. ``durable_end_offset`` is the end of what is
  on storage; ``log_end_offset`` (LEO) includes the buffer.
* A *segment* is a run of objects opened by a roll (``segment.bytes``, ``segment.ms`` or
  :meth:`Log.roll`). :meth:`Log.merge_segments` (:mod:`logstore.log_retention`, with
  retention) rewrites a segment's small objects as one object under the first object's name;
  the other objects stay readable for ``file.delete.delay.ms`` before they go.
* The live objects are held in memory, with a per-batch index once loaded; every batch served
  from storage is CRC-checked on the way out (the read path: :mod:`logstore.local_log`).
  ``checkpoint.json`` records the objects (name, size, offsets), the high watermark, log
  start offset and leader-epoch cache, from which recovery (:mod:`logstore.log_loader`)
  rebuilds the log when it opens.
* ``checkpoint.json`` is rewritten only when what it records changed, and built outside the
  state lock that appends take.

**Over the broker WAL** (``Log.open(..., topic_id=, topic=, partition=, wal_writer=,
wal_index=)``, docs/storage.md §2; without those arguments the log is standalone, as above). The
log no longer writes objects of its own: it is a :class:`~logstore.wal.WalSource`, and the
broker's one :class:`~logstore.wal.WalWriter` takes every dirty log's pending batches into one
object per flush, then hands each log its *chunk extent* (``wal_flushed``); only then does the
durable end move. The log's ordered extent list holds segment objects and chunk extents
(:class:`~logstore.segment.ChunkSegment`: a byte range of a shared object under the broker
root) side by side; reads, the tail cache, sizes and timestamps work over both. Shared objects
are never cut or deleted for one partition:

* truncation waits for a chunk in flight, drops chunk extents past the cut from memory
  (shortening the one holding it) and records ``(S, cut)`` in the checkpoint (format 2) before
  it returns: S is the highest WAL seq that can hold this partition's data, and recovery voids
  chunks with ``last_seq <= S`` from the cut on. ``truncate_fully_and_start_at`` (and a new
  partition's first open) sets ``wal_start_seq`` instead: older chunks are all void;
* retention and compaction (the log is the compactor's
  :class:`~logstore.compaction.ExtentHolder`: ``live_chunks``, ``replace_extents``) drop chunk
  extents by releasing their reference in the :class:`~logstore.wal_index.WalIndex`; the
  collector deletes an object once nobody refers to it;
* recovery walks the segment objects and the index's chunks together in offset order
  (:meth:`LogLoader.load_over_wal <logstore.log_loader.LogLoader.load_over_wal>`). Epochs come
  from the checkpoint and the chunks' footers; the checkpoint is not rewritten because of a
  flush.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from logstore.batch import RecordBatch, iter_batches, set_base_offset, set_partition_leader_epoch
from logstore.checkpoint import CHECKPOINT_NAME, WAL_FORMAT_VERSION, Checkpoint, SegmentEntry
from logstore.config import LogConfig
from logstore.epoch_cache import LeaderEpochCache
from logstore.errors import InvalidRecordError, RecordTooLargeError
from logstore.local_log import PendingBatch, WalLink
from logstore.log_loader import LogLoader, load_checkpoint
from logstore.log_retention import LogRetention
from logstore.segment import BatchIndex, ChunkSegment, Extent, LogSegment, object_name
from logstore.storage import Storage
from logstore.tail_cache import TailCache
from logstore.wal import PendingChunk, WalClosedError, WalWriter, durable_count, still_taken
from logstore.wal_index import ChunkExtent, WalIndex
from logstore.wall_clock import steady_wall_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where an append landed."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    record_count: int
    log_start_offset: int
    #: True when nothing was appended: the batch was a retry of one already in the log
    duplicate: bool = False


class Log(LogRetention):
    """A partition replica's log. Thread-safe; storage I/O happens outside the state lock.

    Its extents, tail cache and reads are :class:`~logstore.local_log.LocalLog`'s, retention
    and merging :class:`~logstore.log_retention.LogRetention`'s; :meth:`open` recovers it
    with a :class:`~logstore.log_loader.LogLoader`.

    Examples
    --------
    >>> from logstore.storage import Storage
    >>> from logstore.batch import Record, build
    >>> log = Log.open(Storage.from_url("memory://doc-example/t/0"))
    >>> log.append(build([Record(b"k", b"v", 1)]), leader_epoch=0).first_offset
    0
    >>> log.flush()
    1
    >>> [r.value for b in iter_batches(log.read(0, 1 << 20)) for r in b.records()]
    [b'v']
    """

    def __init__(
        self,
        storage: Storage,
        config: LogConfig,
        segments: Sequence[Extent],
        log_start_offset: int,
        high_watermark: int,
        epochs: LeaderEpochCache,
        time_ms: Callable[[], int],
        *,
        wal: WalLink | None = None,
        wal_start_seq: int = 0,
        truncations: Iterable[tuple[int, int]] = (),
        clean_generation: int = 0,
        cleaned_end: int = 0,
        tail_cache: TailCache | None = None,
    ) -> None:
        super().__init__(storage, config, segments, log_start_offset, time_ms, wal, tail_cache)
        #: the log cleaner's committed generation, and the end of the offsets it cleaned
        self._clean_generation = clean_generation
        self._cleaned_end = cleaned_end
        #: truncations so far that removed data (a clean planned before one must not commit)
        self._rewinds = 0
        #: the earliest delete horizon the last clean left pending (logstore.log_cleaner)
        self._next_delete_horizon_ms: int | None = None
        self._flush_lock = threading.Lock()
        #: orders checkpoint writes: a checkpoint built earlier is never written after a later
        #: one (taken last, after any other lock; nothing is taken while holding it)
        self._checkpoint_write_lock = threading.Lock()
        #: checkpoints built so far, and of the one last written: its number and state key
        self._checkpoint_seq = 0
        self._written_seq = 0
        self._written_key: tuple[object, ...] | None = None
        self._maintenance_lock = threading.Lock()
        self._high_watermark = min(max(high_watermark, log_start_offset), self._leo)
        self.leader_epoch_cache = epochs
        self._roll_requested = False
        self._closed = False
        #: WAL chunks first written before this seq are void (the log was emptied then)
        self._wal_start_seq = wal_start_seq
        #: (S, X): chunks with last_seq <= S are void at offsets >= X (docs/storage.md §2.7)
        self._truncations = list(truncations)
        #: how many of ``_pending`` the WAL writer has taken and not yet reported
        self._taken = 0
        #: notified when the writer reports a taken chunk (truncation waits for it)
        self._wal_idle = threading.Condition(self._lock)

    def reconfigure(self, config: LogConfig) -> None:
        """Use ``config`` from now on (a topic's configs changed while it is open): retention
        applies it at its next run, segment rolling at the next flush, max.message.bytes at the
        next append, the tail cache at its next insert."""
        with self._lock:
            self.config = config

    # --- opening and recovery ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        storage: Storage,
        config: LogConfig | None = None,
        *,
        time_ms: Callable[[], int] = steady_wall_ms,
        topic_id: str | None = None,
        topic: str = "",
        partition: int | None = None,
        wal_writer: WalWriter | None = None,
        wal_index: WalIndex | None = None,
        read_only: bool = False,
        high_watermark_hint: int = 0,
        tail_cache: TailCache | None = None,
    ) -> Log:
        """Open (and recover) the log stored under ``storage``'s root.

        With ``wal_writer`` and ``wal_index`` (and the partition's ``topic_id``, ``topic``
        name and ``partition``), the log's appended batches go to the broker's WAL instead of
        its own segment objects, and recovery takes its chunks from ``wal_index`` beside the
        segment objects (:meth:`LogLoader.load_over_wal
        <logstore.log_loader.LogLoader.load_over_wal>`). Without them the log is standalone.

        ``read_only``: recovery changes nothing on storage (no cut, no delete, no
        checkpoint), so a tool or test may open a replica beside the broker running on it; the
        log sees what was on storage when it opened and must not be written to.
        ``high_watermark_hint``: over the WAL, the HW the broker checkpoint recorded (the
        partition checkpoint's may be older); the larger one is taken, within the log.
        ``tail_cache``: the cache of recent objects' bytes the log shares with a broker's other
        logs (:mod:`logstore.tail_cache`); without it the log keeps one of its own."""
        config = config or LogConfig()
        link: WalLink | None = None
        if wal_writer is not None or wal_index is not None or topic_id is not None:
            if wal_writer is None or wal_index is None or topic_id is None or partition is None:
                raise ValueError(
                    f"{storage.url}: a log over the WAL needs wal_writer, wal_index, topic_id "
                    "and partition together"
                )
            link = WalLink(wal_writer, wal_index, topic, topic_id, partition)
        loader = LogLoader(storage, read_only=read_only)
        if link is None:
            loaded = loader.load()
        else:
            loaded = loader.load_over_wal(link, high_watermark_hint=high_watermark_hint)
        result = cls(
            storage,
            config,
            loaded.extents,
            loaded.log_start_offset,
            loaded.high_watermark,
            loaded.epochs,
            time_ms,
            wal=link,
            wal_start_seq=loaded.wal_start_seq,
            truncations=loaded.truncations,
            clean_generation=loaded.clean_generation,
            cleaned_end=loaded.cleaned_end,
            tail_cache=tail_cache,
        )
        if loaded.checkpoint_needed and not read_only:
            result.checkpoint()
        if link is None:
            log.debug(
                "%s: opened, log start %d, LEO %d",
                storage.url,
                result.log_start_offset,
                result.log_end_offset,
            )
        else:
            log.debug(
                "%s: opened over the WAL, log start %d, LEO %d, %d extent(s)",
                storage.url,
                result.log_start_offset,
                result.log_end_offset,
                len(loaded.extents),
            )
        return result

    # --- state ------------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def update_high_watermark(self, offset: int) -> int:
        """Set the HW (clamped to [log start, LEO]); returns the value set."""
        with self._lock:
            self._high_watermark = min(max(offset, self._log_start_offset), self._leo)
            return self._high_watermark

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetsForLeaderEpoch answers it."""
        return self.leader_epoch_cache.end_offset_for(epoch, self._leo)

    # --- append -----------------------------------------------------------------------------

    def _validated(
        self, data: bytes | bytearray | memoryview, batches: list[RecordBatch] | None = None
    ) -> list[RecordBatch]:
        """``data``'s batches, CRC-checked (unless the caller passes them, parsed from these
        very bytes and checked already), within max.message.bytes."""
        if batches is None:
            batches = list(iter_batches(data, validate=True))
        if not batches:
            raise InvalidRecordError("an append carried no record batch")
        for batch in batches:
            if batch.size_in_bytes > self.config.max_message_bytes:
                raise RecordTooLargeError(
                    f"record batch of {batch.size_in_bytes} bytes is larger than "
                    f"max.message.bytes={self.config.max_message_bytes}; send smaller batches "
                    "or raise the topic's max.message.bytes"
                )
        return batches

    def append(
        self,
        data: bytes | bytearray | memoryview,
        *,
        leader_epoch: int,
        batches: list[RecordBatch] | None = None,
    ) -> AppendInfo:
        """Append as leader: assign offsets from the LEO and stamp ``leader_epoch``.

        Only header fields outside the CRC are rewritten, so the CRC stays valid. A caller
        that has parsed and CRC-checked ``data`` already (the partition, for its producer
        state checks) passes those ``batches`` and the CRCs are not computed a second time.
        """
        batches = self._validated(data, batches)
        for batch in batches:
            if batch.has_gaps:
                raise InvalidRecordError(
                    f"record batch's last offset delta {batch.last_offset_delta} does not match "
                    f"its record count {batch.record_count}: only the log cleaner writes "
                    "batches with offset gaps"
                )
        buf = bytearray(data)
        with self._lock:
            self._check_open()
            first = self._leo
            offset = first
            position = 0
            pending = []
            for batch in batches:
                size = batch.size_in_bytes
                set_base_offset(buf, offset, position)
                set_partition_leader_epoch(buf, leader_epoch, position)
                next_offset = offset + batch.record_count
                pending.append(
                    PendingBatch(
                        offset,
                        next_offset,
                        batch.max_timestamp,
                        bytes(buf[position : position + size]),
                    )
                )
                offset = next_offset
                position += size
            self.leader_epoch_cache.assign(leader_epoch, first)
            info = self._add_pending(pending, batches)
        self._mark_dirty(position)
        return info

    def append_as_follower(self, data: bytes | bytearray | memoryview) -> AppendInfo:
        """Append batches fetched from the leader: offsets and epochs as the leader set them."""
        batches = self._validated(data)
        with self._lock:
            self._check_open()
            if batches[0].base_offset != self._leo:
                raise InvalidRecordError(
                    f"follower append at offset {batches[0].base_offset} but the log ends at "
                    f"{self._leo}; the fetcher must fetch from the LEO"
                )
            raw = bytes(data)
            position = 0
            pending = []
            expected = self._leo
            for batch in batches:
                if batch.base_offset != expected:
                    raise InvalidRecordError(
                        f"fetched batches are not contiguous: offset {batch.base_offset} "
                        f"follows {expected}"
                    )
                size = batch.size_in_bytes
                pending.append(
                    PendingBatch(
                        batch.base_offset,
                        batch.next_offset,
                        batch.max_timestamp,
                        raw[position : position + size],
                    )
                )
                expected = batch.next_offset
                position += size
            for batch in batches:
                self.leader_epoch_cache.assign(batch.partition_leader_epoch, batch.base_offset)
            info = self._add_pending(pending, batches)
        self._mark_dirty(position)
        return info

    def _mark_dirty(self, nbytes: int) -> None:
        """Tell the WAL writer this log has new pending batches (after the state lock: the
        writer's I/O thread takes it to collect them)."""
        if self.wal is not None:
            self.wal.writer.mark_dirty(self, nbytes)

    def _add_pending(self, pending: list[PendingBatch], batches: list[RecordBatch]) -> AppendInfo:
        self._pending.extend(pending)
        first = pending[0].base_offset
        self._leo = pending[-1].next_offset
        return AppendInfo(
            first_offset=first,
            last_offset=self._leo - 1,
            max_timestamp=max(b.max_timestamp for b in batches),
            record_count=self._leo - first,
            log_start_offset=self._log_start_offset,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRecordError(f"log {self.storage.url} is closed")

    # --- flush (group commit) ---------------------------------------------------------------

    def roll(self) -> None:
        """Make the next flushed object open a new segment."""
        with self._lock:
            self._roll_requested = True

    def flush(self) -> int:
        """Write every buffered batch as one new segment object; returns the durable LEO.

        Over the WAL: wait until the writer made every batch appended so far durable (in a
        WAL object, with every other dirty log's). Not from the writer's event loop."""
        if self.wal is not None:
            with self._lock:
                if not self._pending:
                    return self._durable_end
            self.wal.writer.mark_dirty(self)
            self.wal.writer.flush()
            return self._durable_end
        with self._flush_lock:
            with self._lock:
                pending = list(self._pending)
                if not pending:
                    return self._durable_end
            data = b"".join(p.data for p in pending)
            base = pending[0].base_offset
            name = object_name(base)
            self.storage.write(name, data)
            index = BatchIndex()
            position = 0
            for p in pending:
                index.base_offsets.append(p.base_offset)
                index.positions.append(position)
                index.sizes.append(len(p.data))
                index.max_timestamps.append(p.max_timestamp)
                position += len(p.data)
            with self._lock:
                now = self._time_ms()
                rolled, created = self._roll_decision(len(data), now)
                segment = LogSegment(
                    name,
                    base,
                    pending[-1].next_offset,
                    len(data),
                    max(p.max_timestamp for p in pending),
                    rolled,
                    created,
                    index,
                )
                self._segments.append(segment)
                self._shape_version += 1
                self._bases.append(base)
                del self._pending[: len(pending)]
                self._durable_end = segment.next_offset
                self._delayed_deletes = [(t, n) for t, n in self._delayed_deletes if n != name]
                self._cache_put(name, data, checked=True)
                return self._durable_end

    def _roll_decision(self, size: int, now: int) -> tuple[bool, int]:
        """Whether a new object of ``size`` bytes opens a segment, and the segment's birth."""
        if not self._segments or self._roll_requested:
            self._roll_requested = False
            return True, now
        group = self._group_of(len(self._segments) - 1)
        head = self._segments[group[0]]
        group_bytes = sum(self._segments[i].size for i in group)
        if group_bytes + size > self.config.segment_bytes:
            return True, now
        if now - head.created_ms >= self.config.segment_ms:
            return True, now
        return False, head.created_ms

    # --- the WAL (WalSource) ----------------------------------------------------------------

    def take_pending_for_wal(self) -> PendingChunk | None:
        """The batches neither durable nor taken yet (``WalSource``; the writer's I/O
        thread). A list slice under the state lock: the bytes are not copied."""
        link = self.wal
        if link is None:
            raise InvalidRecordError(f"{self.storage.url} is not a log over the WAL")
        with self._lock:
            fresh = self._pending[self._taken :]
            if not fresh:
                return None
            self._taken = len(self._pending)
        return PendingChunk.of(link.topic, link.topic_id, link.partition, fresh)

    def wal_flushed(self, extent: ChunkExtent) -> None:
        """The taken batches ``[extent.base_offset, extent.next_offset)`` are durable at
        ``extent`` (``WalSource``): they become a chunk extent (holding the reference the
        writer took for it), the durable end moves, and their bytes stay in the tail cache
        as known CRC-valid (they were checked on append)."""
        link = self.wal
        with self._lock:
            if self._closed:
                # deleted while the write was in flight: nothing refers to the chunk
                if link is not None:
                    link.index.release(extent.object)
                self._taken = 0
                self._wal_idle.notify_all()
                return
            if extent.base_offset != self._durable_end:
                self._wal_idle.notify_all()
                raise InvalidRecordError(
                    f"{self.storage.url}: durable chunk starts at {extent.base_offset}, the "
                    f"durable end is {self._durable_end}"
                )
            done = durable_count(self._pending, extent)
            batches = self._pending[:done]
            index = BatchIndex()
            position = 0
            for p in batches:
                index.base_offsets.append(p.base_offset)
                index.positions.append(position)
                index.sizes.append(len(p.data))
                index.max_timestamps.append(p.max_timestamp)
                position += len(p.data)
            chunk = ChunkSegment(extent, index if position == extent.size else None)
            del self._pending[:done]
            self._taken = max(0, self._taken - done)
            self._segments.append(chunk)
            self._bases.append(extent.base_offset)
            self._durable_end = extent.next_offset
            if chunk.index is not None:
                self._cache_put(chunk.name, b"".join(p.data for p in batches), checked=True)
            self._wal_idle.notify_all()

    def wal_aborted(self, pending: PendingChunk) -> None:
        """The writer closed without writing ``pending`` (``WalSource``): it is taken again
        by the next writer."""
        with self._lock:
            self._taken = still_taken(self._pending, pending)
            self._wal_idle.notify_all()

    def _wait_wal_idle_locked(self) -> None:
        """Wait (state lock held, released meanwhile) until no taken chunk is in flight: its
        bytes are in an object being written, so a cut must wait for the outcome (§2.7)."""
        self._wal_idle.wait_for(lambda: self._taken == 0)

    # --- truncation -------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns the new LEO.

        Batches are atomic, so the LEO lands on the base offset of the batch holding
        ``offset`` (it equals ``offset`` whenever ``offset`` is a batch boundary, which
        replication's truncation points always are). Objects past the cut are deleted at
        once (they hold only data the replication protocol has disowned), last first, before
        the object holding the cut is rewritten as its prefix, so a crash leaves a contiguous
        log whose excess the replication protocol truncates again.

        Over the WAL (docs/storage.md §2.7), the objects are shared: a chunk in flight is waited
        for, chunk extents past the cut are dropped from memory (a chunk holding the cut is
        shortened in memory) and the truncation record ``(S, cut)`` (S: the highest seq that
        may hold this partition's data) is in the checkpoint written before this returns,
        so recovery voids those chunks' data past the cut.
        """
        with self._maintenance_lock, self._flush_lock:
            if offset < self._leo and offset > self._log_start_offset:
                offset = self._batch_base(offset)
            with self._lock:
                if self.wal is not None:
                    self._wait_wal_idle_locked()
                if offset >= self._leo:
                    # Nothing to cut, but an epoch may start at the LEO with no batch (it was
                    # assigned, and its append never landed). It must go, or a follower keeps
                    # naming it as its last fetched epoch and the leader keeps answering
                    # "diverged" with the same truncation point (Kafka trims it here too).
                    self.leader_epoch_cache.truncate_from_end(self._leo)
                    return self._leo
                if offset <= self._log_start_offset:
                    end = self._truncate_fully_locked(self._log_start_offset)
                    doomed: list[Extent] = []
                    straddling: Extent | None = None
                elif offset >= self._durable_end:
                    self._pending = [p for p in self._pending if p.next_offset <= offset]
                    end = self._pending[-1].next_offset if self._pending else self._durable_end
                    self._set_end_locked(end)
                    return end
                else:
                    self._pending.clear()
                    keep = bisect.bisect_left(self._bases, offset)
                    doomed = self._segments[keep:]
                    straddling = self._segments[keep - 1]
                    del self._segments[keep:]
                    self._shape_version += 1
                    del self._bases[keep:]
                    if self.wal is not None:
                        self._truncations.append((self.wal.seq_bound(), offset))
                        self._release_chunks(doomed)
                        if isinstance(straddling, ChunkSegment):
                            if straddling.next_offset > offset:
                                self._cut_chunk_locked(straddling, offset)
                            straddling = None
                            end = self._segments[-1].next_offset if self._segments else offset
                            self._durable_end = end
                            self._set_end_locked(end)
            for segment in reversed(doomed):
                if isinstance(segment, LogSegment):
                    self.storage.delete(segment.name)
                    self._cache_drop(segment.name)
            if straddling is not None:
                if straddling.next_offset > offset:
                    assert isinstance(straddling, LogSegment)
                    self._cut_object(straddling, offset)
                with self._lock:
                    end = (
                        self._segments[-1].next_offset
                        if self._segments
                        else (self._log_start_offset)
                    )
                    self._durable_end = end
                    self._set_end_locked(end)
            self.checkpoint()
        log.info("%s: truncated to offset %d (LEO now %d)", self.storage.url, offset, end)
        return end

    def _batch_base(self, offset: int) -> int:
        """Base offset of the batch holding ``offset`` (truncation removes whole batches)."""
        with self._lock:
            for p in self._pending:
                if p.base_offset <= offset < p.next_offset:
                    return p.base_offset
            if offset >= self._durable_end or not self._segments:
                return offset
            segment = self._segments[bisect.bisect_right(self._bases, offset) - 1]
        index = self._index_of(segment)
        return index.base_offsets[index.slot_for(offset)]

    def _set_end_locked(self, end: int) -> None:
        self._rewinds += 1
        self._leo = end
        self._cleaned_end = min(self._cleaned_end, end)
        self._high_watermark = min(self._high_watermark, end)
        self.leader_epoch_cache.truncate_from_end(end)

    def _cut_chunk_locked(self, chunk: ChunkSegment, offset: int) -> None:
        """Shorten ``chunk`` in memory to its batches below the one holding ``offset`` (its
        object is shared: its bytes stay, recovery voids them by the truncation record)."""
        index = chunk.index if chunk.index is not None else self._index_of(chunk)
        slot = index.slot_for(offset)
        cut_position = index.positions[slot]
        i = self._segments.index(chunk)
        cached = self._cache.get(self._cache_owner, chunk.name, touch=False)
        checked = self._cache.checked(self._cache_owner, chunk.name) is not None
        self._cache_drop(chunk.name)
        self._shape_version += 1
        if cut_position == 0:
            del self._segments[i]
            del self._bases[i]
            if self.wal is not None:
                self.wal.index.release(chunk.chunk.object)
            return
        kept = BatchIndex(
            index.base_offsets[:slot],
            index.positions[:slot],
            index.sizes[:slot],
            index.max_timestamps[:slot],
        )
        cut = ChunkSegment(
            replace(
                chunk.chunk,
                size=cut_position,
                next_offset=index.base_offsets[slot],
                max_timestamp=max(kept.max_timestamps),
            ),
            kept,
            chunk.rolled,
            chunk.created_ms,
        )
        self._segments[i] = cut
        if cached is not None:
            self._cache_put(cut.name, cached[:cut_position], checked=checked)

    def _cut_object(self, segment: LogSegment, offset: int) -> None:
        """Rewrite ``segment`` without the batch holding ``offset`` and everything after."""
        index = self._index_of(segment)
        slot = index.slot_for(offset)
        cut_position = index.positions[slot]
        if cut_position == 0:
            self.storage.delete(segment.name)
            self._cache_drop(segment.name)
            with self._lock:
                i = self._segments.index(segment)
                del self._segments[i]
                self._shape_version += 1
                del self._bases[i]
            return
        data = (self._cache_get(segment.name) or self.storage.read(segment.name))[:cut_position]
        self.storage.write(segment.name, data)
        kept = BatchIndex(
            index.base_offsets[:slot],
            index.positions[:slot],
            index.sizes[:slot],
            index.max_timestamps[:slot],
        )
        # A new LogSegment, not an update in place: a checkpoint being built from a snapshot
        # of the list (outside the lock) sees the old entry or the new one, never a mix.
        cut = replace(
            segment,
            next_offset=index.base_offsets[slot],
            size=len(data),
            max_timestamp=max(kept.max_timestamps),
            index=kept,
        )
        with self._lock:
            self._segments[self._segments.index(segment)] = cut
            self._shape_version += 1
            self._cache_drop(segment.name)
            self._cache_put(segment.name, data)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and restart it empty at ``offset`` (Kafka's same-named method)."""
        with self._maintenance_lock, self._flush_lock, self._lock:
            if self.wal is not None:
                self._wait_wal_idle_locked()
            self._truncate_fully_locked(offset)
        self.checkpoint()

    def _truncate_fully_locked(self, offset: int) -> int:
        """(Over the WAL: with no chunk in flight.) Every chunk written so far becomes void
        (``wal_start_seq``), so the truncation records are no longer needed."""
        for segment in reversed(self._segments):
            if isinstance(segment, LogSegment):
                self.storage.delete(segment.name)
                self._cache_drop(segment.name)
        self._release_chunks(self._segments)
        if self.wal is not None:
            self._wal_start_seq = self.wal.seq_bound() + 1
            self._truncations.clear()
        self._segments.clear()
        self._shape_version += 1
        self._bases.clear()
        self._pending.clear()
        self._log_start_offset = offset
        self._durable_end = self._leo = self._high_watermark = offset
        self._cleaned_end = 0
        self._rewinds += 1
        self.leader_epoch_cache.clear()
        return offset

    def delete(self) -> None:
        """Delete the whole log from storage, checkpoint and all, and close it (its replica is
        gone: the topic was deleted or the replica moved to other brokers)."""
        with self._maintenance_lock, self._flush_lock, self._lock:
            if self.wal is not None:
                self._wait_wal_idle_locked()
            self._truncate_fully_locked(0)
            self._closed = True
        self._cache_clear()
        self.storage.delete_all()

    # --- checkpoint and close ---------------------------------------------------------------

    def _checkpoint_key_locked(self) -> tuple[object, ...]:
        """What a checkpoint written now would say, in O(epochs): equal keys, equal docs.
        Over the WAL neither the durable end nor the high watermark is in it: a flush adds a
        chunk, which recovery finds in the WAL index, and the broker keeps every partition's
        HW in its one broker checkpoint (:class:`~logstore.checkpoint.BrokerCheckpoint`), so
        a checkpoint is never written because data arrived or was acknowledged."""
        if self.wal is not None:
            return (
                self._shape_version,
                self._log_start_offset,
                tuple(self.leader_epoch_cache.entries()),
                self._wal_start_seq,
                len(self._truncations),
                self._cleaned_end,
            )
        return (
            self._shape_version,
            self._log_start_offset,
            self._high_watermark,
            self._durable_end,
            tuple(self.leader_epoch_cache.entries()),
            self._cleaned_end,
        )

    def checkpoint_needed(self) -> bool:
        """Whether the log changed since its last checkpoint (cheap: the periodic checkpoint
        asks this on the event loop and skips a log that did not change)."""
        with self._lock:
            return not self._closed and self._checkpoint_key_locked() != self._written_key

    def checkpoint(self) -> bool:
        """Write checkpoint.json describing the durable log (atomic whole-object write), unless
        the last one written already says the same. True if one was written.

        The object list is built outside the state lock (appends on the event loop take it)
        and outside the flush lock, from a snapshot taken under the state lock: the entries of
        the list are not changed in place (truncation replaces a cut object's entry; only
        the ``rolled`` flag flips in place, and whoever flips it checkpoints after). Writes
        are ordered: a checkpoint snapshotted earlier is never written after a later one.
        A closed log writes none: after :meth:`delete` nothing of it may come back."""
        with self._lock:
            if self._closed:
                return False
            key = self._checkpoint_key_locked()
            if key == self._written_key:
                return False
            segments = [s for s in self._segments if isinstance(s, LogSegment)]
            state = (self._log_start_offset, self._high_watermark, self._durable_end)
            epochs = self.leader_epoch_cache.entries()
            self._checkpoint_seq += 1
            seq = self._checkpoint_seq
            wal_fields: dict[str, object] = {}
            if self._clean_generation:
                wal_fields = {
                    "clean_generation": self._clean_generation,
                    "cleaned_end": self._cleaned_end,
                }
            if self.wal is not None:
                wal_fields |= {
                    "format_version": WAL_FORMAT_VERSION,
                    "topic_id": self.wal.topic_id,
                    "wal_start_seq": self._wal_start_seq,
                    "truncations": tuple(self._truncations),
                }
        doc = Checkpoint(
            log_start_offset=state[0],
            high_watermark=state[1],
            recovery_point=state[2],
            epochs=tuple((e.epoch, e.start_offset) for e in epochs),
            segments=tuple(
                SegmentEntry(
                    s.name,
                    s.base_offset,
                    s.next_offset,
                    s.size,
                    s.max_timestamp,
                    s.rolled,
                    s.created_ms,
                )
                for s in segments
            ),
            **wal_fields,  # type: ignore[arg-type]
        )
        data = doc.to_bytes()
        with self._checkpoint_write_lock:
            if seq < self._written_seq:
                return False  # a checkpoint of a later state is on storage already
            self.storage.write(CHECKPOINT_NAME, data)
            self._written_seq = seq
            self._written_key = key
            return True

    def close(self) -> None:
        """Flush and checkpoint. Retired objects not yet deleted are found again on open.

        Over the WAL the chunk extents keep their references in the index: the partition's
        data must not be collected while it is closed (a broker shutting down loses the
        index anyway; reopening in the same process counts them twice, which only delays
        collection; :meth:`delete` releases them)."""
        if self._closed:
            return
        try:
            self.flush()
        except WalClosedError as err:  # the broker is going down: as after a crash
            log.warning("%s: closed without flushing: %s", self.storage.url, err)
        self.checkpoint()
        self._closed = True
        self._cache_clear()


def open_replica_log(
    root: Storage,
    topic: str,
    partition: int,
    config: LogConfig | None = None,
    *,
    read_only: bool = False,
) -> Log:
    """A partition replica's log from its broker root ``root`` (tools and tests): over the
    root's WAL when the partition's checkpoint says the broker wrote it through the WAL
    (format 2), else standalone.

    ``read_only``: recovery changes nothing on storage (no cut, no delete, no checkpoint, no
    cleanup of temporary files), so it is safe beside a running broker; the log sees what was
    on storage when it opened, and must not be appended to. Over the WAL the log never writes
    WAL objects either way (its writer is not started).
    """
    storage = root.child(f"{topic}/{partition}")
    checkpoint = load_checkpoint(storage)
    if checkpoint.format_version != WAL_FORMAT_VERSION or checkpoint.topic_id is None:
        return Log.open(storage, config, read_only=read_only)
    index = WalIndex.load(root, delete_temp_files=not read_only)
    writer = WalWriter(
        root, broker_id=-1, broker_epoch=-1, next_seq=index.next_seq, autostart=False, fence=False
    )
    return Log.open(
        storage,
        config,
        topic_id=checkpoint.topic_id,
        topic=topic,
        partition=partition,
        wal_writer=writer,
        wal_index=index,
        read_only=read_only,
    )
