"""The log cleaner of a compacted log (Kafka's Cleaner and LogCleanerManager's choice of what
to clean), over object storage: docs/storage.md §2.10.1.

One round over one :class:`~logstore.log.Log` (:func:`clean_log`):

1. **Plan** (:func:`plan_cleaning`, Kafka's ``cleanableOffsets``): the cleanable range is the
   log's first extents from the log start, below the first *uncleanable* offset: never the
   active segment (the last one), never at or above the high watermark or the last stable
   offset, never an extent with a record younger than ``min.compaction.lag.ms``. Its
   *dirty section* starts where the last committed clean ended (``Log.cleaned_end``). The round
   runs when dirty bytes / cleanable bytes reaches ``min.cleanable.dirty.ratio``, when the
   first dirty extent is older than ``max.compaction.lag.ms``, or, dirty data or not, once the
   earliest delete horizon the last clean kept has passed (KIP-534; known while the log is
   open). At most ``max_dirty_bytes`` of
   dirty extents are taken per round (the bound on the offset map's memory).
2. **Transactions**: a first pass over the range's batches (CRC-checked as they are read).
   A transaction whose marker is not in the range cuts the range before its first batch, so
   the outcome of every transaction with data in the range is known; aborted transactions'
   data is removed. Each pass walks the extents in offset order; their bytes are kept for the
   next pass only within ``max_dirty_bytes`` (the rest is read again), so a round's memory is
   bounded however large the log's clean section is.
3. **Offset map** (Kafka's SkimpyOffsetMap, here a dict): key -> its latest offset in the dirty
   section, from committed data only.
4. **Rewrite** (Kafka's ``cleanInto`` / ``MemoryRecords.filterTo``): each batch keeps its
   records that are not superseded by a later offset of their key (and have a key);
   tombstones are kept until their batch's delete horizon (KIP-534: set to now +
   ``delete.retention.ms`` by the clean that first keeps them) has passed; a COMMIT marker is
   kept while its transaction has data left in the log, then until its own delete horizon;
   an ABORT marker is kept (``_Rewrite.marker`` says why). Offsets never change: a batch
   that lost records keeps its base offset and last offset delta (a batch with gaps,
   :func:`~logstore.batch.build_retained`), one that lost them all is an empty batch. The
   rewritten extents are grouped into new objects of up to ``segment.bytes``, named by
   generation (:func:`~logstore.segment.cleaned_object_name`).
5. **Swap** (:meth:`~logstore.log_retention.LogRetention.replace_cleaned`): the new objects
   are on storage first; then one checkpoint naming the generation is the commit point. A crash
   before it leaves the old log (recovery deletes the uncommitted objects); after it, the new
   one (recovery voids the replaced objects and chunks).

The whole cleanable range, clean section included, is rewritten each round, as Kafka's
cleaner recopies the clean segments it groups with the dirty ones: the cost of a round is the
bytes of the live log below the dirty section's end, read once and written once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from logstore.batch import (
    ControlType,
    RecordBatch,
    build_empty,
    build_retained,
    iter_batches,
    parse_header,
)
from logstore.log import Log
from logstore.segment import BatchIndex, Extent, LogSegment, cleaned_object_name

__all__ = ["CleanerStats", "CleaningPlan", "clean_log", "plan_cleaning"]

log = logging.getLogger(__name__)

#: the dirty bytes one round takes at most by default (Kafka bounds a round by its offset
#: map, log.cleaner.dedupe.buffer.size: 128 MiB of 24-byte entries)
DEFAULT_MAX_DIRTY_BYTES = 256 * 1024 * 1024


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class CleaningPlan:
    """What one round cleans: the log's first extents ``sources``, whose dirty section
    starts at ``first_dirty_offset``."""

    sources: tuple[Extent, ...]
    first_dirty_offset: int
    dirty_bytes: int
    cleanable_bytes: int
    #: the log's truncations when the plan was made (a swap after another one is refused)
    rewinds: int = 0
    #: due because a delete horizon passed (the clean section alone is worth cleaning)
    horizon_due: bool = False

    @property
    def end_offset(self) -> int:
        return self.sources[-1].next_offset

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / max(self.cleanable_bytes, 1)


@dataclass(frozen=True, slots=True)
class CleanerStats:
    """What one round did (Kafka's CleanerStats): the bytes it read and wrote, the storage
    requests it made (one GET per extent read from storage, one PUT per object written), the
    records it read and kept, and whether its swap committed."""

    start_offset: int
    end_offset: int
    first_dirty_offset: int
    dirty_ratio: float
    generation: int
    extents_read: int
    bytes_read: int
    bytes_written: int
    objects_written: int
    records_read: int
    records_kept: int
    committed: bool


def _groups(extents: Sequence[Extent]) -> list[list[Extent]]:
    """The extents as segments (runs opened by a ``rolled`` extent)."""
    groups: list[list[Extent]] = []
    for extent in extents:
        if extent.rolled or not groups:
            groups.append([])
        groups[-1].append(extent)
    return groups


def _first_timestamp(extent: Extent) -> int:
    """The first batch's largest timestamp (the extent's, before its index is loaded)."""
    index = extent.index
    if index is not None and index.max_timestamps:
        return index.max_timestamps[0]
    return extent.max_timestamp


def plan_cleaning(
    log_: Log,
    now_ms: int,
    last_stable_offset: int | None = None,
    *,
    max_dirty_bytes: int = DEFAULT_MAX_DIRTY_BYTES,
) -> CleaningPlan | None:
    """The range one round would clean now, or None if the log needs no clean (not
    compacted, nothing dirty and cleanable, or a dirty ratio below ``min.cleanable.dirty.ratio``
    with no extent older than ``max.compaction.lag.ms``)."""
    config = log_.config
    if not config.compact:
        return None
    now = now_ms
    upper = log_.high_watermark
    if last_stable_offset is not None:
        upper = min(upper, last_stable_offset)
    rewinds = log_.rewinds  # before the extents: a truncation after this is noticed
    first_dirty = max(log_.cleaned_end, log_.log_start_offset)
    sources: list[Extent] = []
    dirty_bytes = 0
    for group in _groups(log_.extents())[:-1]:  # never the active segment
        if group[-1].next_offset > upper:
            break
        if any(e.max_timestamp > now - config.min_compaction_lag_ms for e in group):
            break
        if dirty_bytes >= max_dirty_bytes:
            break
        for extent in group:
            sources.append(extent)
            if extent.next_offset > first_dirty:
                dirty_bytes += extent.size
    # nothing dirty, but tombstones or markers whose delete horizon has passed: clean anyway
    horizon = log_.next_delete_horizon_ms
    due = horizon is not None and now >= horizon and bool(sources)
    if not dirty_bytes and not due:
        return None
    plan = CleaningPlan(
        tuple(sources), first_dirty, dirty_bytes, sum(e.size for e in sources), rewinds, due
    )
    if due:
        return plan
    first = next(e for e in sources if e.next_offset > first_dirty)  # there is dirty data
    overdue = now - _first_timestamp(first) > config.max_compaction_lag_ms
    if plan.dirty_ratio < config.min_cleanable_dirty_ratio and not overdue:
        return None
    return plan


class _Extents:
    """The extents of a round, read from storage as each pass walks them: kept in memory
    while they fit ``budget`` bytes, read again by a later pass beyond it, so a round's
    memory is bounded whatever the size of the log's clean section."""

    def __init__(self, log_: Log, sources: Sequence[Extent], budget: int) -> None:
        self.log = log_
        self.sources = list(sources)
        self.budget = budget
        self.cache: dict[int, bytes] = {}
        self.bytes_read = 0
        self.reads = 0

    def batches(self, s: int) -> list[RecordBatch]:
        data = self.cache.get(s)
        if data is None:
            data = self.log.read_extent(self.sources[s])  # every batch CRC-checked
            self.bytes_read += len(data)
            self.reads += 1
            if sum(map(len, self.cache.values())) + len(data) <= self.budget:
                self.cache[s] = data
        return list(iter_batches(data, validate=False))

    def walk(self, upto: int | None = None) -> Iterator[tuple[int, int, RecordBatch]]:
        """(source, batch number in the round, batch) in offset order, over the sources
        (the first ``upto``)."""
        i = 0
        for s in range(len(self.sources) if upto is None else upto):
            for batch in self.batches(s):
                yield s, i, batch
                i += 1


@dataclass(slots=True)
class _Transactions:
    """The transactions of a round's batches (by their number in the round): which data
    batches were aborted, which transaction each marker ends and the data batches of each."""

    aborted: set[int]
    marker_of: dict[int, int]
    members: dict[int, list[int]]
    #: the base offset of the earliest data batch whose transaction has no marker in range
    first_open: int | None
    #: producer id -> its last batch in the range (kept, if empty, for its sequence)
    last_of_producer: dict[int, int] = field(default_factory=dict)


def _transactions(walk: Iterable[tuple[int, int, RecordBatch]]) -> _Transactions:
    aborted: set[int] = set()
    marker_of: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    starts: dict[int, int] = {}  # transaction -> its first batch's base offset
    ongoing: dict[int, int] = {}  # producer id -> transaction
    last_of_producer: dict[int, int] = {}
    for _, i, batch in walk:
        if batch.producer_id >= 0:
            last_of_producer[batch.producer_id] = i
        if batch.producer_id < 0 or not batch.is_transactional:
            continue
        if batch.is_control:
            txn = ongoing.pop(batch.producer_id, None)
            if txn is None:
                txn = len(members)  # its data is gone already (or below the log start)
                members[txn] = []
            marker_of[i] = txn
            if batch.control_type() is ControlType.ABORT:
                aborted.update(members[txn])
            continue
        txn = ongoing.get(batch.producer_id)
        if txn is None:
            txn = ongoing[batch.producer_id] = len(members)
            members[txn] = []
            starts[txn] = batch.base_offset
        members[txn].append(i)
    first_open = min((starts[t] for t in ongoing.values()), default=None)
    return _Transactions(aborted, marker_of, members, first_open, last_of_producer)


def _record_offsets(batch: RecordBatch, count: int) -> list[int]:
    base = batch.base_offset
    deltas = batch.offset_deltas()
    return list(range(base, base + count)) if deltas is None else [base + d for d in deltas]


def _offset_map(
    walk: Iterable[tuple[int, int, RecordBatch]], first_dirty: int, aborted: set[int]
) -> dict[bytes, int]:
    """Key -> its latest offset among the committed data records at or above ``first_dirty``."""
    latest: dict[bytes, int] = {}
    for _, i, batch in walk:
        if batch.next_offset <= first_dirty or batch.is_control or i in aborted:
            continue
        if not batch.record_count:
            continue
        keys = batch.to_arrow().column(0).to_pylist()
        for key, offset in zip(keys, _record_offsets(batch, len(keys)), strict=True):
            if key is not None and offset >= first_dirty:
                latest[key] = offset
    return latest


class _Rewrite:
    """The retained bytes of each batch (:func:`clean_log` step 4)."""

    def __init__(self, latest: dict[bytes, int], txns: _Transactions, now: int, retention: int):
        self.latest = latest
        self.txns = txns
        self.now = now
        self.retention = retention
        self.kept: dict[int, int] = {}
        self.records_read = 0
        #: the earliest delete horizon of what stays for one (kept tombstones, markers with
        #: no data left): a later round must run by then, dirty data or not
        self.next_horizon: int | None = None

    def _pending(self, horizon: int) -> None:
        self.next_horizon = (
            horizon if self.next_horizon is None else min(self.next_horizon, horizon)
        )

    def data(self, i: int, batch: RecordBatch) -> bytes:
        if not batch.record_count:
            return bytes(batch.buffer)  # an empty batch stays
        self.records_read += batch.record_count
        if i in self.txns.aborted:
            self.kept[i] = 0
            return build_retained(batch, [])
        data = batch.to_arrow()
        keys = data.column(0).to_pylist()
        tombstones = data.column(1).is_null().to_pylist()
        horizon = batch.delete_horizon_ms
        expired = horizon is not None and self.now >= horizon
        latest = self.latest
        keep: list[int] = []
        tombstone_kept = False
        offsets = _record_offsets(batch, len(keys))
        for position, (key, offset, tombstone) in enumerate(
            zip(keys, offsets, tombstones, strict=True)
        ):
            if key is None or latest.get(key, offset) > offset or (tombstone and expired):
                continue
            keep.append(position)
            tombstone_kept = tombstone_kept or tombstone
        self.kept[i] = len(keep)
        new_horizon = None
        if tombstone_kept:
            if horizon is None:
                horizon = new_horizon = self.now + self.retention
            self._pending(horizon)
        return build_retained(batch, keep, delete_horizon_ms=new_horizon)

    def marker(self, i: int, batch: RecordBatch) -> bytes:
        """A COMMIT marker stays while its transaction has data left, then until its horizon.
        An ABORT marker stays for good. Kafka removes it too, rebuilding the transaction index
        of the segments it rewrites without its entry in the same swap; replog's aborted index
        lives in the partition's producer state, beside the log, so no swap of objects can
        change both at once, and a reader given the index entry without the marker (the
        partition's leader answers a fetch from both) would drop that producer's later records."""
        if batch.control_type() is ControlType.ABORT:
            return bytes(batch.buffer)
        txn = self.txns.marker_of.get(i)
        members = self.txns.members.get(txn, []) if txn is not None else []
        if any(self.kept.get(j, 0) for j in members):
            return bytes(batch.buffer)
        horizon = batch.delete_horizon_ms
        if horizon is not None and self.now >= horizon:
            return build_retained(batch, [])
        if horizon is None:
            horizon = self.now + self.retention
            self._pending(horizon)
            return build_retained(batch, [0], delete_horizon_ms=horizon)
        self._pending(horizon)
        return bytes(batch.buffer)


class _Parts:
    """One extent's rewritten batches. A run of empty batches (of one leader epoch) becomes
    one empty batch holding all their offsets, so what a compacted log keeps does not grow
    with the batches it was ever sent; an empty batch that is its producer's last in the range
    stays as it is, for the producer's sequence (as Kafka keeps it)."""

    def __init__(self, last_of_producer: dict[int, int]) -> None:
        self.last_of_producer = last_of_producer
        self.parts: list[bytes] = []
        self.run: list[RecordBatch] = []  # empty batches to merge

    def add(self, i: int, data: bytes) -> None:
        batch = parse_header(data)
        mergeable = not batch.record_count and (
            batch.producer_id < 0 or self.last_of_producer.get(batch.producer_id) != i
        )
        if not mergeable or (
            self.run and self.run[-1].partition_leader_epoch != batch.partition_leader_epoch
        ):
            self._flush()
        if mergeable:
            self.run.append(batch)
        else:
            self.parts.append(data)

    def _flush(self) -> None:
        run = self.run
        if len(run) == 1:
            self.parts.append(bytes(run[0].buffer))
        elif run:
            self.parts.append(
                build_empty(
                    run[0].base_offset,
                    run[-1].next_offset,
                    partition_leader_epoch=run[0].partition_leader_epoch,
                    max_timestamp=max(b.max_timestamp for b in run),
                )
            )
        self.run = []

    def take(self) -> bytes:
        self._flush()
        data = b"".join(self.parts)
        self.parts = []
        return data


def clean_log(
    log_: Log,
    *,
    now_ms: int | None = None,
    last_stable_offset: int | None = None,
    max_dirty_bytes: int = DEFAULT_MAX_DIRTY_BYTES,
) -> CleanerStats | None:
    """Clean ``log_`` once if :func:`plan_cleaning` says it needs it (see the module doc);
    None if it did not. ``last_stable_offset``: the partition's LSO (the cleaner never
    reaches it); the high watermark bounds the round in any case."""
    now = _now_ms() if now_ms is None else now_ms
    plan = plan_cleaning(log_, now, last_stable_offset, max_dirty_bytes=max_dirty_bytes)
    if plan is None:
        return None
    extents = _Extents(log_, plan.sources, max_dirty_bytes)
    upto = len(extents.sources)
    while True:
        txns = _transactions(extents.walk(upto))
        if txns.first_open is None:
            break
        # a transaction whose outcome is past the range: clean only what precedes it
        upto = sum(1 for e in extents.sources[:upto] if e.next_offset <= txns.first_open)
        if not upto or (
            not plan.horizon_due
            and extents.sources[upto - 1].next_offset <= plan.first_dirty_offset
        ):
            return None
    sources = extents.sources[:upto]
    latest = _offset_map(extents.walk(upto), plan.first_dirty_offset, txns.aborted)
    rewrite = _Rewrite(latest, txns, now, log_.config.delete_retention_ms)
    generation = log_.clean_generation + 1
    writer = _ObjectWriter(log_, sources, generation)
    current = -1
    parts = _Parts(txns.last_of_producer)
    for s, i, batch in extents.walk(upto):
        if s != current:
            if current >= 0:
                writer.add(current, parts.take())
            current = s
        # a marker comes after its transaction's data, whose fate is decided by then
        parts.add(i, rewrite.marker(i, batch) if batch.is_control else rewrite.data(i, batch))
    writer.add(current, parts.take())
    cleaned = writer.finish()
    committed = log_.replace_cleaned(
        sources, cleaned, generation, plan.rewinds, next_delete_horizon_ms=rewrite.next_horizon
    )
    if not committed:
        for segment in cleaned:  # never named by a checkpoint: nobody reads them
            log_.storage.delete(segment.name)
    return CleanerStats(
        start_offset=sources[0].base_offset,
        end_offset=sources[-1].next_offset,
        first_dirty_offset=plan.first_dirty_offset,
        dirty_ratio=plan.dirty_ratio,
        generation=generation,
        extents_read=extents.reads,
        bytes_read=extents.bytes_read,
        bytes_written=sum(s.size for s in cleaned),
        objects_written=len(cleaned),
        records_read=rewrite.records_read,
        records_kept=sum(rewrite.kept.values()),
        committed=committed,
    )


class _ObjectWriter:
    """The rewritten extents as objects of up to ``segment.bytes`` (each its own segment, so
    merging never rewrites one), each written to storage once full, before the swap."""

    def __init__(self, log_: Log, sources: Sequence[Extent], generation: int) -> None:
        self.log = log_
        self.sources = sources
        self.generation = generation
        self.limit = log_.config.segment_bytes
        self.first = 0  # the source the object being filled starts with
        self.parts: list[bytes] = []
        self.size = 0
        self.cleaned: list[LogSegment] = []

    def add(self, source: int, data: bytes) -> None:
        """Source ``source``'s rewritten bytes (sources come in order)."""
        if self.parts and self.size + len(data) > self.limit:
            self._write(source)
        if not self.parts:
            self.first = source
        self.parts.append(data)
        self.size += len(data)

    def finish(self) -> list[LogSegment]:
        if self.parts:
            self._write(len(self.sources))
        return self.cleaned

    def _write(self, end: int) -> None:
        """Write the object holding sources [first, end)."""
        data = b"".join(self.parts)
        base = self.sources[self.first].base_offset
        name = cleaned_object_name(base, self.generation)
        self.log.storage.write(name, data)
        index = BatchIndex.scan(data, validate=False)
        self.cleaned.append(
            LogSegment(
                name,
                base,
                self.sources[end - 1].next_offset,
                len(data),
                max(index.max_timestamps),
                rolled=True,
                created_ms=self.sources[self.first].created_ms,
                index=index,
            )
        )
        self.parts, self.size = [], 0
