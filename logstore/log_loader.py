"""Recovery: a partition log's extents rebuilt from what is on storage (Kafka's LogLoader).

Recovery trusts only what a checkpoint or a valid scan says. ``checkpoint.json`` records the
objects (name, size, offsets), the high watermark, log start offset and leader-epoch cache; a
listed object whose size matches is trusted, any other object is scanned, CRC-checked and cut
at its last valid batch. Objects wholly covered by an earlier one (left by a crash mid-merge)
or below the log start offset (left by a crash mid-retention) are deleted.

Over the broker WAL (docs/storage.md §2.6), :meth:`LogLoader.load_over_wal` walks the segment
objects and the index's chunks together in offset order: covered copies are skipped, the copy
reaching furthest wins, a copy overlapping the end is entered at its batch starting exactly
there, and a gap ends the log (with a truncation record, so nothing past it comes back).
Chunks that ``wal_start_seq`` or a truncation record voids are not candidates. Epochs come from
the checkpoint and the chunks' footers.

The loader returns a :class:`LoadedLog`; :meth:`Log.open <logstore.log.Log.open>` opens the log
on it and writes the checkpoint if recovery changed what it says.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from logstore.batch import RecordBatch, iter_batches, valid_prefix
from logstore.checkpoint import CHECKPOINT_NAME, WAL_FORMAT_VERSION, Checkpoint
from logstore.epoch_cache import EpochEntry, LeaderEpochCache
from logstore.errors import CorruptRecordError, LogLayoutError, ObjectNotFoundError
from logstore.local_log import WalLink
from logstore.segment import (
    BatchIndex,
    ChunkSegment,
    Extent,
    LogSegment,
    base_offset_of,
    cleaned_object_of,
)
from logstore.storage import ObjectInfo, Storage
from logstore.wal_index import ChunkExtent

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedLog:
    """What recovery found: the log's extents in offset order and the state to open it with."""

    extents: Sequence[Extent]
    log_start_offset: int
    high_watermark: int
    epochs: LeaderEpochCache
    #: over the WAL: chunks first written before this seq are void
    wal_start_seq: int = 0
    #: over the WAL: (S, X), chunks with last_seq <= S are void at offsets >= X
    truncations: list[tuple[int, int]] = field(default_factory=list)
    #: recovery changed what the checkpoint says (or found none): write one
    checkpoint_needed: bool = False
    #: the log cleaner's committed generation and the end of what it cleaned
    clean_generation: int = 0
    cleaned_end: int = 0


class LogLoader:
    """Recovers the log stored under ``storage``'s root (a partition's directory).

    ``read_only``: recovery changes nothing on storage (no cut, no delete), so a tool or test
    may open a replica beside the broker running on it.
    """

    def __init__(self, storage: Storage, *, read_only: bool = False) -> None:
        self.storage = storage
        self.read_only = read_only

    def load(self) -> LoadedLog:
        """Recover a standalone log: its segment objects, checkpointed ones trusted by size,
        the others scanned and cut at their last valid batch."""
        storage, read_only = self.storage, self.read_only
        checkpoint = load_checkpoint(storage)
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
        found, changed = _listed_objects(storage, checkpoint, read_only=read_only)
        segments: list[LogSegment] = []
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
                segment, cut = self._recover_object(
                    storage, name, base, epochs, read_only=read_only
                )
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
        return LoadedLog(
            segments,
            log_start,
            checkpoint.high_watermark,
            epochs,
            checkpoint_needed=changed or (not checkpoint.segments and bool(segments)),
            clean_generation=checkpoint.clean_generation,
            cleaned_end=min(checkpoint.cleaned_end, end),
        )

    def load_over_wal(self, link: WalLink, *, high_watermark_hint: int = 0) -> LoadedLog:
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
        storage, read_only = self.storage, self.read_only
        wal_storage = link.storage
        unreadable = False
        try:
            found_checkpoint: Checkpoint | None = Checkpoint.from_bytes(
                storage.read(CHECKPOINT_NAME), where=f"{storage.url}/{CHECKPOINT_NAME}"
            )
        except ObjectNotFoundError:
            found_checkpoint = None
        except CorruptRecordError as err:
            log.warning("%s; every segment object will be scanned", err)
            found_checkpoint = Checkpoint()
            unreadable = True
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
        listed, voided = _listed_objects(storage, checkpoint, read_only=read_only)
        changed = changed or voided
        for base, name, size in listed:
            entry = trusted.get(name)
            if entry is not None and entry.size == size and entry.base_offset == base:
                segments.append(
                    LogSegment(
                        name,
                        base,
                        entry.next_offset,
                        size,
                        entry.max_timestamp,
                        entry.rolled,
                        entry.created_ms,
                    )
                )
                continue
            # a torn object is cut to its valid prefix; the walk decides what follows it
            own = LeaderEpochCache()
            segment, _ = self._recover_object(storage, name, base, own, read_only=read_only)
            changed = True
            if segment is not None:
                segments.append(segment)
                scanned_epochs[segment.name] = own.entries()
        segments.sort(key=lambda s: s.base_offset)

        # chunks wholly below the cleaned end were replaced by the cleaner's objects
        chunks = [
            c
            for c in link.index.chunks_for(link.topic_id, link.partition)
            if c.first_seq >= wal_start_seq and c.next_offset > checkpoint.cleaned_end
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
        if unreadable:
            # its truncation records are lost: the chunks' order proves them again
            truncations = _truncations_from_order(chunks)
        for seq, cut in truncations:
            chunks = [v for c in chunks if (v := self._void(wal_storage, c, seq, cut)) is not None]

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
                    chunk = self._enter(wal_storage, option, expected)
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
        return LoadedLog(
            chosen,
            log_start,
            max(checkpoint.high_watermark, high_watermark_hint),
            epochs,
            wal_start_seq=wal_start_seq,
            truncations=truncations,
            checkpoint_needed=changed,
            clean_generation=checkpoint.clean_generation,
            cleaned_end=min(checkpoint.cleaned_end, end),
        )

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

    def _enter(self, storage: Storage, chunk: ChunkExtent, offset: int) -> ChunkExtent | None:
        """The part of ``chunk`` from its batch starting exactly at ``offset`` (None: no
        batch starts there, or the chunk cannot be read)."""
        try:
            batches = self._chunk_batches(storage, chunk)
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

    def _void(self, storage: Storage, chunk: ChunkExtent, seq: int, cut: int) -> ChunkExtent | None:
        """``chunk`` under the truncation record ``(seq, cut)``: whole if written after it
        or wholly below the cut, None if wholly void, else its batches ending at or below
        the cut (read once; rare)."""
        if chunk.last_seq > seq or chunk.next_offset <= cut:
            return chunk
        if chunk.base_offset >= cut:
            return None
        try:
            batches = self._chunk_batches(storage, chunk)
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


def _listed_objects(
    storage: Storage, checkpoint: Checkpoint, *, read_only: bool
) -> tuple[list[tuple[int, str, int]], bool]:
    """The partition's live segment objects (:func:`live_segment_objects`); the void ones are
    deleted (unless ``read_only``). Also returns whether any was void."""
    found, void = live_segment_objects(storage.list(), checkpoint)
    for name in void:
        log.info("%s: deleting %s, not part of the cleaned log", storage.url, name)
        if not read_only:
            storage.delete(name)
    return found, bool(void)


def live_segment_objects(
    listing: Iterable[ObjectInfo], checkpoint: Checkpoint
) -> tuple[list[tuple[int, str, int]], list[str]]:
    """A partition directory's segment objects as (base offset, name, size), by base offset,
    under the cleaner's rule (docs/storage.md §2.10.1), and the names of the void ones: below
    the checkpoint's ``cleaned_end`` only the cleaned objects of its ``clean_generation``
    count. Plain objects there (replaced by a committed clean) and cleaned objects of another
    generation (a clean that crashed before its commit, or one replaced since) are void."""
    found: list[tuple[int, str, int]] = []
    void: list[str] = []
    for info in listing:
        if "/" in info.path:
            continue
        base = base_offset_of(info.path)
        if base is not None:
            live = base >= checkpoint.cleaned_end
        else:
            cleaned = cleaned_object_of(info.path)
            if cleaned is None:
                continue
            base, generation = cleaned
            live = generation == checkpoint.clean_generation and base < checkpoint.cleaned_end
        if live:
            found.append((base, info.path, info.size))
        else:
            void.append(info.path)
    return sorted(found), void


def load_checkpoint(storage: Storage) -> Checkpoint:
    """The partition checkpoint under ``storage`` (an empty one if there is none, or if it is
    corrupt: then every segment object is scanned)."""
    try:
        data = storage.read(CHECKPOINT_NAME)
    except ObjectNotFoundError:
        return Checkpoint()
    try:
        return Checkpoint.from_bytes(data, where=f"{storage.url}/{CHECKPOINT_NAME}")
    except CorruptRecordError as err:
        log.warning("%s; every segment object will be scanned", err)
        return Checkpoint()


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


def _truncations_from_order(chunks: Sequence[ChunkExtent]) -> list[tuple[int, int]]:
    """Truncation records ``(S, cut)`` proven by the chunks alone, for a log whose checkpoint
    (which holds the records) is unreadable. A log appends at its end, so a chunk first
    written at seq F starting at offset B means the log ended at B then: every chunk last
    written before F is void from B on (a truncation cut it there, or it holds the same
    batches). The records voiding nothing are left out."""
    by_seq = sorted(chunks, key=lambda c: c.first_seq)
    firsts = [c.first_seq for c in by_seq]
    # lowest[i]: the lowest base offset of the chunks first written at by_seq[i] or later
    lowest = [c.base_offset for c in by_seq]
    for i in range(len(lowest) - 2, -1, -1):
        lowest[i] = min(lowest[i], lowest[i + 1])
    records: set[tuple[int, int]] = set()
    for chunk in by_seq:
        later = bisect.bisect_right(firsts, chunk.last_seq)
        if later < len(by_seq) and lowest[later] < chunk.next_offset:
            records.add((chunk.last_seq, lowest[later]))
    return sorted(records)
