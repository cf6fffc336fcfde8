"""One replica's log of one partition, as immutable segment objects on fsspec storage.

Kafka's UnifiedLog appends to the active segment file in place. Object storage has no append
and no rename, so this log works differently while keeping Kafka's contracts:

* Appends are buffered in memory (readable at once) and group-committed by :meth:`Log.flush`
  as one new object named by its base offset. ``durable_end_offset`` is the end of what is
  on storage; ``log_end_offset`` (LEO) includes the buffer.
* A *segment* is a run of objects opened by a roll (``segment.bytes``, ``segment.ms`` or
  :meth:`Log.roll`). :meth:`Log.merge_segments` rewrites a segment's small objects as one
  object under the first object's name. The merged object begins with the very bytes of that
  first object, so a reader holding its name and byte positions still reads the same bytes; the
  other objects stay readable for ``file.delete.delay.ms`` (Kafka's delayed segment deletion)
  before they go.
* The live objects are held in memory, with a per-batch index once loaded: finding the batch
  for an offset never lists storage. ``checkpoint.json`` records the objects (name, size,
  offsets), the high watermark, log start offset and leader-epoch cache. Recovery trusts a
  listed object whose size matches; any other object is scanned, CRC-checked and cut at its
  last valid batch. Objects wholly covered by an earlier one (left by a crash mid-merge) or
  below the log start offset (left by a crash mid-retention) are deleted.
* Every batch served from storage is CRC-checked on the way out; a corrupt batch raises
  :class:`CorruptRecordError` naming the object and offset and is never returned. Batches
  still in memory (unflushed, or in the tail cache as this process wrote them) were checked
  on append and are served by :meth:`Log.read_from_memory` without a second check or a
  thread hop.
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
  extents by releasing their reference in the :class:`~logstore.wal_index.WalIndex`; the collector
  deletes an object once nobody refers to it;
* recovery walks the segment objects and the index's chunks together in offset order (see
  :meth:`Log._open_over_wal`): covered copies are skipped, the copy reaching furthest wins, a
  copy overlapping the end is entered at its batch starting exactly there, and a gap ends the
  log (with a truncation record, so nothing past it comes back). Epochs come from the
  checkpoint and the chunks' footers; the checkpoint is not rewritten because of a flush.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from logstore.batch import (
    RecordBatch,
    iter_batches,
    set_base_offset,
    set_partition_leader_epoch,
    valid_prefix,
)
from logstore.checkpoint import CHECKPOINT_NAME, WAL_FORMAT_VERSION, Checkpoint, SegmentEntry
from logstore.config import LogConfig
from logstore.epoch_cache import EpochEntry, LeaderEpochCache
from logstore.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogLayoutError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from logstore.segment import (
    BatchIndex,
    ChunkSegment,
    Extent,
    LogSegment,
    base_offset_of,
    object_name,
)
from logstore.storage import Storage
from logstore.wal import PendingChunk, WalClosedError, WalWriter
from logstore.wal_index import ChunkExtent, WalIndex

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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
class _PendingBatch:
    """A batch appended but not yet in a segment object."""

    base_offset: int
    next_offset: int
    max_timestamp: int
    data: bytes


class Log:
    """A partition replica's log. Thread-safe; storage I/O happens outside the state lock.

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
    ) -> None:
        self.storage = storage
        self.config = config
        self._time_ms = time_ms
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        #: orders checkpoint writes: a checkpoint built earlier is never written after a later
        #: one (taken last, after any other lock; nothing is taken while holding it)
        self._checkpoint_write_lock = threading.Lock()
        #: bumped whenever the list of live objects or an object's checkpointed fields change
        self._shape_version = 0
        #: checkpoints built so far, and of the one last written: its number and state key
        self._checkpoint_seq = 0
        self._written_seq = 0
        self._written_key: tuple[object, ...] | None = None
        self._maintenance_lock = threading.Lock()
        self._segments: list[Extent] = list(segments)
        self._bases = [s.base_offset for s in segments]
        self._pending: list[_PendingBatch] = []
        self._log_start_offset = log_start_offset
        self._durable_end = segments[-1].next_offset if segments else log_start_offset
        self._leo = self._durable_end
        self._high_watermark = min(max(high_watermark, log_start_offset), self._leo)
        self.leader_epoch_cache = epochs
        self._roll_requested = False
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        #: cached objects whose every batch is known CRC-valid (written from appended batches,
        #: which were checked on append, or merged from checked ones): read_from_memory
        #: serves them as they are; other cached bytes (read from storage) are checked on read
        self._cache_checked: set[str] = set()
        self._cache_bytes = 0
        self._delayed_deletes: list[tuple[int, str]] = []
        self._closed = False
        #: the broker WAL this log's batches go to (None: standalone, its own segment objects)
        self.wal = wal
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

    # --- opening and recovery --------------------------------------------------------------

    @classmethod
    def open(
        cls,
        storage: Storage,
        config: LogConfig | None = None,
        *,
        time_ms: Callable[[], int] = _now_ms,
        topic_id: str | None = None,
        topic: str = "",
        partition: int | None = None,
        wal_writer: WalWriter | None = None,
        wal_index: WalIndex | None = None,
        read_only: bool = False,
        high_watermark_hint: int = 0,
    ) -> Log:
        """Open (and recover) the log stored under ``storage``'s root.

        With ``wal_writer`` and ``wal_index`` (and the partition's ``topic_id``, ``topic``
        name and ``partition``), the log's appended batches go to the broker's WAL instead of
        its own segment objects, and recovery takes its chunks from ``wal_index`` beside the
        segment objects (:meth:`_open_over_wal`). Without them the log is standalone.

        ``read_only``: recovery changes nothing on storage (no cut, no delete, no
        checkpoint), so a tool or test may open a replica beside the broker running on it; the
        log sees what was on storage when it opened and must not be written to.
        ``high_watermark_hint``: over the WAL, the HW the broker checkpoint recorded (the
        partition checkpoint's may be older); the larger one is taken, within the log."""
        config = config or LogConfig()
        if wal_writer is not None or wal_index is not None or topic_id is not None:
            if wal_writer is None or wal_index is None or topic_id is None or partition is None:
                raise ValueError(
                    f"{storage.url}: a log over the WAL needs wal_writer, wal_index, topic_id "
                    "and partition together"
                )
            link = WalLink(wal_writer, wal_index, topic, topic_id, partition)
            return cls._open_over_wal(
                storage,
                config,
                time_ms,
                link,
                read_only=read_only,
                high_watermark_hint=high_watermark_hint,
            )
        checkpoint = cls._load_checkpoint(storage)
        if checkpoint.format_version == WAL_FORMAT_VERSION:
            # Its recent batches are chunks of the broker's WAL objects, which a standalone
            # log never reads: opening it alone would serve a log with its tail missing.
            raise LogLayoutError(
                f"{storage.url} holds a log written through the broker WAL (checkpoint format "
                f"{WAL_FORMAT_VERSION}); open it over the WAL (broker config "
                "log.wal.enable=true), or use `replog log dump` on the broker root to read it"
            )
        trusted = {s.name: s for s in checkpoint.segments}
        epochs = LeaderEpochCache([EpochEntry(e, o) for e, o in checkpoint.epochs])
        found = sorted(
            (base, info.path, info.size)
            for info in storage.list()
            if "/" not in info.path and (base := base_offset_of(info.path)) is not None
        )
        segments: list[LogSegment] = []
        changed = False
        expected: int | None = None
        cut = False
        for base, name, size in found:
            if cut:
                log.warning("%s: deleting %s, which follows a cut in the log", storage.url, name)
                if not read_only:
                    storage.delete(name)
                changed = True
                continue
            entry = trusted.get(name)
            segment: LogSegment | None
            if entry is not None and entry.size == size and entry.base_offset == base:
                segment = LogSegment(
                    name,
                    base,
                    entry.next_offset,
                    size,
                    entry.max_timestamp,
                    entry.rolled,
                    entry.created_ms,
                )
            else:
                segment, cut = cls._recover_object(storage, name, base, epochs, read_only=read_only)
                changed = True
            if segment is None:
                continue
            if expected is not None and segment.base_offset != expected:
                if segment.next_offset <= expected:
                    log.info(
                        "%s: deleting %s, covered by the object before it (a merge was "
                        "interrupted)",
                        storage.url,
                        name,
                    )
                    if not read_only:
                        storage.delete(name)
                    changed = True
                    continue
                log.warning(
                    "%s: %s starts at offset %d but the log before it ends at %d; cutting the "
                    "log at %d (the replica refetches the rest)",
                    storage.url,
                    name,
                    segment.base_offset,
                    expected,
                    expected,
                )
                if not read_only:
                    storage.delete(name)
                cut = True
                changed = True
                continue
            segments.append(segment)
            expected = segment.next_offset
        # Objects wholly below the log start offset were retained away before a crash.
        log_start = checkpoint.log_start_offset
        while segments and segments[0].next_offset <= log_start:
            retired = segments.pop(0)
            if not read_only:
                storage.delete(retired.name)
            changed = True
        if segments:
            log_start = max(log_start, segments[0].base_offset)
            segments[0].rolled = True
        end = segments[-1].next_offset if segments else log_start
        epochs.truncate_from_end(end)
        epochs.truncate_from_start(log_start)
        result = cls(
            storage, config, segments, log_start, checkpoint.high_watermark, epochs, time_ms
        )
        if (changed or (not checkpoint.segments and segments)) and not read_only:
            result.checkpoint()
        log.debug("%s: opened, log start %d, LEO %d", storage.url, log_start, end)
        return result

    @classmethod
    def _open_over_wal(
        cls,
        storage: Storage,
        config: LogConfig,
        time_ms: Callable[[], int],
        link: WalLink,
        *,
        read_only: bool = False,
        high_watermark_hint: int = 0,
    ) -> Log:
        """Recover a log whose batches live in segment objects and WAL chunks (docs/storage.md
        §2.6 step 3).

        Candidates: the partition's segment objects (checkpointed ones trusted by size, the
        others scanned, as a standalone log does) and its chunks in ``link.index`` first
        written at or after ``wal_start_seq``, cut by the truncation records. One walk over
        both in offset order: a candidate that ends at or below the next expected offset is
        covered (the same bytes are elsewhere) and skipped; among those holding the expected
        offset the one reaching furthest wins (then a segment before a chunk, then a higher
        level); a chunk starting below it is entered at its batch starting exactly there
        (every non-void copy of an offset holds the same batch); if no candidate has a batch
        starting there, the log ends there: later segment objects are deleted and a
        truncation record keeps later chunks from coming back. Each chunk kept takes one
        reference in the index; leader epochs come from the checkpoint and the chunks'
        footers.
        """
        wal_storage = link.storage
        try:
            found_checkpoint: Checkpoint | None = Checkpoint.from_bytes(
                storage.read(CHECKPOINT_NAME), where=f"{storage.url}/{CHECKPOINT_NAME}"
            )
        except ObjectNotFoundError:
            found_checkpoint = None
        except CorruptRecordError as err:
            log.warning("%s; every segment object will be scanned", err)
            found_checkpoint = Checkpoint()
        changed = found_checkpoint is None or found_checkpoint.format_version != WAL_FORMAT_VERSION
        checkpoint = found_checkpoint or Checkpoint()
        if checkpoint.topic_id is not None and checkpoint.topic_id != link.topic_id:
            raise LogLayoutError(
                f"{storage.url} holds the log of topic id {checkpoint.topic_id}, not "
                f"{link.topic_id} (a topic of the same name deleted and re-created?); delete "
                "the directory or open it with its own topic id"
            )
        if found_checkpoint is None:
            # A new partition: chunks of an earlier incarnation of it (moved away, then
            # back) are older than this seq and void; the checkpoint written below says so
            # before anything is appended.
            wal_start_seq = link.seq_bound() + 1
        else:
            wal_start_seq = checkpoint.wal_start_seq
        truncations = list(checkpoint.truncations)
        trusted = {s.name: s for s in checkpoint.segments}
        epochs = LeaderEpochCache([EpochEntry(e, o) for e, o in checkpoint.epochs])
        log_start = checkpoint.log_start_offset

        segments: list[LogSegment] = []
        scanned_epochs: dict[str, list[EpochEntry]] = {}
        for info in storage.list():
            base = base_offset_of(info.path) if "/" not in info.path else None
            if base is None:
                continue
            entry = trusted.get(info.path)
            if entry is not None and entry.size == info.size and entry.base_offset == base:
                segments.append(
                    LogSegment(
                        info.path,
                        base,
                        entry.next_offset,
                        info.size,
                        entry.max_timestamp,
                        entry.rolled,
                        entry.created_ms,
                    )
                )
                continue
            # a torn object is cut to its valid prefix; the walk decides what follows it
            own = LeaderEpochCache()
            segment, _ = cls._recover_object(storage, info.path, base, own, read_only=read_only)
            changed = True
            if segment is not None:
                segments.append(segment)
                scanned_epochs[segment.name] = own.entries()
        segments.sort(key=lambda s: s.base_offset)

        chunks = [
            c
            for c in link.index.chunks_for(link.topic_id, link.partition)
            if c.first_seq >= wal_start_seq
        ]
        # A record voids only chunks of seqs up to its S: once no chunk that old is left
        # (the collector deleted their objects) it voids nothing and goes. Only here, before
        # any compaction of this incarnation runs: a packed object being written (not yet
        # in the index) may hold chunks that old.
        oldest = min((c.last_seq for c in chunks), default=None)
        pruned = [(seq, cut) for seq, cut in truncations if oldest is not None and seq >= oldest]
        if pruned != truncations:
            truncations = pruned
            changed = True
        for seq, cut in truncations:
            chunks = [v for c in chunks if (v := cls._void(wal_storage, c, seq, cut)) is not None]

        chosen: list[Extent] = []
        seg_candidates = [s for s in segments if s.next_offset > log_start]
        chunk_candidates = [c for c in chunks if c.next_offset > log_start]
        # by base offset; ``active`` holds those starting at or below ``expected`` that
        # still reach past it (a few: the copies of one range), so the walk is
        # O(candidates log candidates) however many chunks a partition has
        pool: list[LogSegment | ChunkExtent] = sorted(
            [*seg_candidates, *chunk_candidates], key=lambda e: e.base_offset
        )
        expected = max(log_start, pool[0].base_offset) if pool else log_start
        first = True
        upcoming = 0
        active: list[LogSegment | ChunkExtent] = []
        while True:
            while upcoming < len(pool) and pool[upcoming].base_offset <= expected:
                active.append(pool[upcoming])
                upcoming += 1
            active = [e for e in active if e.next_offset > expected]
            # (reach, segment before chunk, level) decides; a segment must start exactly at
            # ``expected`` (only the first extent may hold the log start inside it)
            options: list[tuple[tuple[int, int, int], LogSegment | ChunkExtent]] = []
            for e in active:
                if isinstance(e, LogSegment):
                    if e.base_offset == expected or first:
                        options.append(((e.next_offset, 1, 0), e))
                else:
                    options.append(((e.next_offset, 0, e.level), e))
            options.sort(key=lambda o: o[0], reverse=True)
            taken: Extent | None = None
            for _, option in options:
                if isinstance(option, LogSegment):
                    taken = option
                    break
                chunk: ChunkExtent | None = option
                if option.base_offset < expected and not first:
                    chunk = cls._enter(wal_storage, option, expected)
                if chunk is not None:
                    taken = ChunkSegment(chunk)
                    break
            if taken is None:
                break
            if isinstance(taken, LogSegment) and chosen and isinstance(chosen[-1], ChunkSegment):
                taken.rolled = True  # a chunk is a segment of its own: never merged across
            chosen.append(taken)
            expected = taken.next_offset
            first = False
        end = expected if chosen else log_start
        if chosen:
            log_start = max(log_start, chosen[0].base_offset)
            chosen[0].rolled = True
        kept = {s.name for s in chosen if isinstance(s, LogSegment)}
        for s in segments:
            if s.name in kept:
                continue
            covered_by_segment = any(
                isinstance(k, LogSegment)
                and k.base_offset <= s.base_offset
                and s.next_offset <= k.next_offset
                for k in chosen
            )
            if s.next_offset <= log_start or s.base_offset >= end or covered_by_segment:
                # below the log start (retention), after the end (a cut), or left by a
                # merge: as a standalone log does
                log.info("%s: deleting %s, not part of the recovered log", storage.url, s.name)
                if not read_only:
                    storage.delete(s.name)
                changed = True
            # else: a segment whose bytes a chunk holds too; left alone (harmless)
        if any(c.next_offset > end for c in chunk_candidates):
            # data past the end (a gap before it, or voided copies): never bring it back
            log.warning("%s: the log ends at offset %d; chunks past it are void", storage.url, end)
            truncations.append((link.seq_bound(), end))
            changed = True
        for extent in chosen:  # epochs in offset order (assign keeps only newer ones)
            if isinstance(extent, ChunkSegment):
                link.index.acquire(extent.chunk.object)
                for epoch, start in _chunk_epochs(extent.chunk):
                    epochs.assign(epoch, start)
            else:
                for scanned in scanned_epochs.get(extent.name, ()):
                    epochs.assign(scanned.epoch, scanned.start_offset)
        epochs.truncate_from_end(end)
        epochs.truncate_from_start(log_start)
        result = cls(
            storage,
            config,
            chosen,
            log_start,
            max(checkpoint.high_watermark, high_watermark_hint),
            epochs,
            time_ms,
            wal=link,
            wal_start_seq=wal_start_seq,
            truncations=truncations,
        )
        if changed and not read_only:
            result.checkpoint()
        log.debug(
            "%s: opened over the WAL, log start %d, LEO %d, %d extent(s)",
            storage.url,
            log_start,
            end,
            len(chosen),
        )
        return result

    @staticmethod
    def _chunk_batches(storage: Storage, chunk: ChunkExtent) -> list[tuple[int, RecordBatch]]:
        """(position in the chunk, batch) of each batch of ``chunk``, CRC-checked."""
        data = chunk.read(storage)
        out = []
        position = 0
        for batch in iter_batches(data, validate=True):
            out.append((position, batch))
            position += batch.size_in_bytes
        return out

    @classmethod
    def _enter(cls, storage: Storage, chunk: ChunkExtent, offset: int) -> ChunkExtent | None:
        """The part of ``chunk`` from its batch starting exactly at ``offset`` (None: no
        batch starts there, or the chunk cannot be read)."""
        try:
            batches = cls._chunk_batches(storage, chunk)
        except (CorruptRecordError, ObjectNotFoundError) as err:
            log.warning("%s: cannot enter %s at offset %d: %s", storage.url, chunk, offset, err)
            return None
        for position, batch in batches:
            if batch.base_offset == offset:
                return replace(
                    chunk,
                    position=chunk.position + position,
                    size=chunk.size - position,
                    base_offset=offset,
                )
        return None

    @classmethod
    def _void(cls, storage: Storage, chunk: ChunkExtent, seq: int, cut: int) -> ChunkExtent | None:
        """``chunk`` under the truncation record ``(seq, cut)``: whole if written after it
        or wholly below the cut, None if wholly void, else its batches ending at or below
        the cut (read once; rare)."""
        if chunk.last_seq > seq or chunk.next_offset <= cut:
            return chunk
        if chunk.base_offset >= cut:
            return None
        try:
            batches = cls._chunk_batches(storage, chunk)
        except (CorruptRecordError, ObjectNotFoundError) as err:
            log.warning("%s: %s is unreadable, not used: %s", storage.url, chunk, err)
            return None
        kept = [(p, b) for p, b in batches if b.next_offset <= cut]
        if not kept:
            return None
        position, last = kept[-1]
        return replace(
            chunk,
            size=position + last.size_in_bytes,
            next_offset=last.next_offset,
            max_timestamp=max(b.max_timestamp for _, b in kept),
        )

    @staticmethod
    def _load_checkpoint(storage: Storage) -> Checkpoint:
        try:
            data = storage.read(CHECKPOINT_NAME)
        except ObjectNotFoundError:
            return Checkpoint()
        try:
            return Checkpoint.from_bytes(data, where=f"{storage.url}/{CHECKPOINT_NAME}")
        except CorruptRecordError as err:
            log.warning("%s; every segment object will be scanned", err)
            return Checkpoint()

    @staticmethod
    def _recover_object(
        storage: Storage,
        name: str,
        base: int,
        epochs: LeaderEpochCache,
        *,
        read_only: bool = False,
    ) -> tuple[LogSegment | None, bool]:
        """Scan one object; cut it at its last valid batch (``read_only``: only in memory).
        Returns (segment, was_cut)."""
        data = storage.read(name)
        batches, valid_len, reason = valid_prefix(data)
        if batches and batches[0].base_offset != base:
            reason = f"first batch has base offset {batches[0].base_offset}, name says {base}"
            batches, valid_len = [], 0
        if reason is not None:
            at = batches[-1].next_offset if batches else base
            log.warning(
                "%s: %s is invalid at byte %d (offset %d): %s; cutting the log there",
                storage.url,
                name,
                valid_len,
                at,
                reason,
            )
            if valid_len == 0:
                if not read_only:
                    storage.delete(name)
                return None, True
            if not read_only:
                storage.write(name, data[:valid_len])
        index = BatchIndex()
        position = 0
        for batch in batches:
            index.add(batch, position)
            position += batch.size_in_bytes
            epochs.assign(batch.partition_leader_epoch, batch.base_offset)
        segment = LogSegment(
            name,
            base,
            batches[-1].next_offset,
            valid_len,
            max(b.max_timestamp for b in batches),
            index=index,
        )
        return segment, reason is not None

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
    def high_watermark(self) -> int:
        return self._high_watermark

    def update_high_watermark(self, offset: int) -> int:
        """Set the HW (clamped to [log start, LEO]); returns the value set."""
        with self._lock:
            self._high_watermark = min(max(offset, self._log_start_offset), self._leo)
            return self._high_watermark

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
                    _PendingBatch(
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
                    _PendingBatch(
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

    def _add_pending(self, pending: list[_PendingBatch], batches: list[RecordBatch]) -> AppendInfo:
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

    # --- the WAL (WalSource, ExtentHolder) ---------------------------------------------------

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
        return PendingChunk(
            link.topic,
            link.topic_id,
            link.partition,
            tuple(p.data for p in fresh),
            fresh[0].base_offset,
            fresh[-1].next_offset,
        )

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
            done = 0
            while (
                done < len(self._pending) and self._pending[done].next_offset <= extent.next_offset
            ):
                done += 1
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
            self._taken = next(
                (i for i, b in enumerate(self._pending) if b.base_offset >= pending.base_offset),
                len(self._pending),
            )
            self._wal_idle.notify_all()

    def _wait_wal_idle_locked(self) -> None:
        """Wait (state lock held, released meanwhile) until no taken chunk is in flight: its
        bytes are in an object being written, so a cut must wait for the outcome (§2.7)."""
        self._wal_idle.wait_for(lambda: self._taken == 0)

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
        name = ChunkSegment(extent).name
        with self._lock:
            if name not in self._cache_checked:
                return None
            return self._cache.get(name)

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
        with self._lock:
            cached = [self._cache.get(name) for name in names]
            checked = all(name in self._cache_checked for name in names)
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
                data = self._cache.get(segment.name)
                if index is None or data is None or segment.name not in self._cache_checked:
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
        self._leo = end
        self._high_watermark = min(self._high_watermark, end)
        self.leader_epoch_cache.truncate_from_end(end)

    def _cut_chunk_locked(self, chunk: ChunkSegment, offset: int) -> None:
        """Shorten ``chunk`` in memory to its batches below the one holding ``offset`` (its
        object is shared: its bytes stay, recovery voids them by the truncation record)."""
        index = chunk.index if chunk.index is not None else self._index_of(chunk)
        slot = index.slot_for(offset)
        cut_position = index.positions[slot]
        i = self._segments.index(chunk)
        cached = self._cache.get(chunk.name)
        checked = chunk.name in self._cache_checked
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
        self.storage.delete_all()

    # --- retention --------------------------------------------------------------------------

    def delete_retained_segments(self) -> int:
        """Apply retention.ms / retention.bytes to whole segments below the HW.

        Returns how many objects were retired. The log start offset advances and is
        checkpointed before the objects go, so recovery never brings them back; the objects
        stay readable for file.delete.delay.ms.
        """
        cfg = self.config
        with self._maintenance_lock:
            with self._lock:
                now = self._time_ms()
                total = sum(s.size for s in self._segments)
                retire: list[Extent] = []
                for group in self._groups():
                    members = [self._segments[i] for i in group]
                    if members[-1].next_offset > self._high_watermark:
                        break
                    size = sum(s.size for s in members)
                    expired = cfg.retention_ms >= 0 and (
                        max(s.max_timestamp for s in members) < now - cfg.retention_ms
                    )
                    oversized = cfg.retention_bytes >= 0 and total - size >= cfg.retention_bytes
                    if not (expired or oversized):
                        break
                    retire.extend(members)
                    total -= size
                if not retire:
                    return 0
                del self._segments[: len(retire)]
                self._shape_version += 1
                del self._bases[: len(retire)]
                if self._segments:
                    self._segments[0].rolled = True
                self._log_start_offset = retire[-1].next_offset
                self.leader_epoch_cache.truncate_from_start(self._log_start_offset)
                self._high_watermark = max(self._high_watermark, self._log_start_offset)
            self.checkpoint()
            self._retire(retire)
            log.info(
                "%s: retention removed %d objects; log start offset now %d",
                self.storage.url,
                len(retire),
                self._log_start_offset,
            )
            return len(retire)

    def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset (Kafka's DeleteRecords); whole objects below it go."""
        with self._maintenance_lock:
            with self._lock:
                offset = min(offset, self._high_watermark)
                if offset <= self._log_start_offset:
                    return self._log_start_offset
                self._log_start_offset = offset
                retire = []
                while self._segments and self._segments[0].next_offset <= offset:
                    retire.append(self._segments.pop(0))
                    self._shape_version += 1
                    self._bases.pop(0)
                if self._segments:
                    self._segments[0].rolled = True
                    self._shape_version += 1
                self.leader_epoch_cache.truncate_from_start(offset)
            self.checkpoint()
            self._retire(retire)
            return offset

    # --- merging small objects --------------------------------------------------------------

    def merge_segments(self) -> int:
        """Merge each segment's small objects into one; returns how many merges were done.

        A segment is merged once it is closed (a newer segment exists) or has
        ``segment.merge.min.objects`` objects. The merged object replaces the first object
        under its name and starts with its exact bytes; the others are deleted after
        file.delete.delay.ms so that readers holding them finish.
        """
        merges = 0
        with self._maintenance_lock:
            with self._lock:
                groups = self._groups()
                runs = [
                    [s for i in g if isinstance(s := self._segments[i], LogSegment)]
                    for n, g in enumerate(groups)
                    if len(g) > 1
                    and (n < len(groups) - 1 or len(g) >= self.config.merge_min_objects)
                    # a chunk is a segment of its own; this guards a group that holds one
                    and all(isinstance(self._segments[i], LogSegment) for i in g)
                ]
            for run in runs:
                self._merge_run(run)
                merges += 1
            if merges:
                self.checkpoint()
        return merges

    def _merge_run(self, run: list[LogSegment]) -> None:
        parts: list[bytes] = []
        merged_index = BatchIndex()
        shift = 0
        for segment in run:
            data = self._cache_get(segment.name) or self.storage.read(segment.name)
            index = BatchIndex.scan(
                data, validate=True
            )  # CRC-checks everything that goes into the merge
            merged_index.extend(index, shift)
            parts.append(data)
            shift += len(data)
        merged = b"".join(parts)
        head = run[0]
        self.storage.write(head.name, merged)
        with self._lock:
            i = self._segments.index(head)
            replacement = LogSegment(
                head.name,
                head.base_offset,
                run[-1].next_offset,
                len(merged),
                max(s.max_timestamp for s in run),
                head.rolled,
                head.created_ms,
                merged_index,
            )
            self._segments[i : i + len(run)] = [replacement]
            self._shape_version += 1
            self._bases[i : i + len(run)] = [head.base_offset]
            for segment in run:
                self._cache_drop(segment.name)
            self._cache_put(head.name, merged, checked=True)
        self._schedule_deletes(s.name for s in run[1:])
        log.debug("%s: merged %d objects into %s", self.storage.url, len(run), head.name)

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
            )
        return (
            self._shape_version,
            self._log_start_offset,
            self._high_watermark,
            self._durable_end,
            tuple(self.leader_epoch_cache.entries()),
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
            if self.wal is not None:
                wal_fields = {
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

    # --- tail cache -------------------------------------------------------------------------

    def _cache_put(self, name: str, data: bytes, *, checked: bool = False) -> None:
        limit = self.config.tail_cache_bytes
        if len(data) > limit:
            return
        with self._lock:
            self._cache_drop(name)
            self._cache[name] = data
            self._cache_bytes += len(data)
            if checked:
                self._cache_checked.add(name)
            while self._cache_bytes > limit:
                evicted, old = self._cache.popitem(last=False)
                self._cache_bytes -= len(old)
                self._cache_checked.discard(evicted)

    def _cache_get(self, name: str) -> bytes | None:
        with self._lock:
            data = self._cache.get(name)
            if data is not None:
                self._cache.move_to_end(name)
            return data

    def _cache_drop(self, name: str) -> None:
        with self._lock:
            old = self._cache.pop(name, None)
            self._cache_checked.discard(name)
            if old is not None:
                self._cache_bytes -= len(old)


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
    pending: list[_PendingBatch],
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
        timestamps = batch.to_arrow().column("timestamp").to_pylist()
        for i, ts in enumerate(timestamps):
            if ts >= timestamp:
                return batch.base_offset + i, ts
    return None


def _chunk_epochs(chunk: ChunkExtent) -> list[tuple[int, int]]:
    """The (epoch, start offset) entries of ``chunk``'s footer within its (possibly entered or
    cut) offsets: an epoch that started before the chunk's base starts there for it."""
    out = []
    entries = chunk.epochs
    for i, (epoch, start) in enumerate(entries):
        following = entries[i + 1][1] if i + 1 < len(entries) else chunk.next_offset
        if following <= chunk.base_offset or start >= chunk.next_offset:
            continue
        out.append((epoch, max(start, chunk.base_offset)))
    return out


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
    checkpoint = Log._load_checkpoint(storage)
    if checkpoint.format_version != WAL_FORMAT_VERSION or checkpoint.topic_id is None:
        return Log.open(storage, config, read_only=read_only)
    index = WalIndex.load(root, delete_temp_files=not read_only)
    writer = WalWriter(
        root, broker_id=-1, broker_epoch=-1, next_seq=index.next_seq, autostart=False, fence=False
    )
    link = WalLink(writer, index, topic, checkpoint.topic_id, partition)
    return Log._open_over_wal(storage, config or LogConfig(), _now_ms, link, read_only=read_only)
