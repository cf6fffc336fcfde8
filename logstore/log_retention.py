"""What a partition log drops and rewrites below its head: retention (``retention.ms``,
``retention.bytes``, DeleteRecords), merging a segment's small objects into one, and the swap
that commits a log cleaner's round (:meth:`LogRetention.replace_cleaned`).

Both change only whole extents below the high watermark and checkpoint the new shape before
the old objects go: a retired segment object stays readable for ``file.delete.delay.ms``
(Kafka's delayed segment deletion), a retired chunk extent releases its reference in the
:class:`~logstore.wal_index.WalIndex` (the collector deletes its object once nobody refers to
it). A merged object begins with the very bytes of the segment's first object, under its
name, so a reader holding that name and its byte positions still reads the same bytes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from logstore.epoch_cache import LeaderEpochCache
from logstore.local_log import LocalLog
from logstore.segment import BatchIndex, Extent, LogSegment

log = logging.getLogger(__name__)


class LogRetention(LocalLog):
    """Retention and merging for :class:`~logstore.log.Log`, which provides the high
    watermark, the leader-epoch cache, the maintenance lock and checkpoints."""

    _maintenance_lock: threading.Lock
    _high_watermark: int
    _clean_generation: int
    _cleaned_end: int
    _rewinds: int
    _closed: bool
    _written_key: tuple[object, ...] | None
    _next_delete_horizon_ms: int | None
    leader_epoch_cache: LeaderEpochCache

    def checkpoint(self) -> bool:
        """Write checkpoint.json (:meth:`Log.checkpoint <logstore.log.Log.checkpoint>`)."""
        raise NotImplementedError

    # --- retention --------------------------------------------------------------------------

    def delete_retained_segments(self) -> int:
        """Apply retention.ms / retention.bytes to whole segments below the HW, unless
        cleanup.policy is compact alone (as in Kafka, a compacted log is not deleted by age or
        size).

        Returns how many objects were retired. The log start offset advances and is
        checkpointed before the objects go, so recovery never brings them back; the objects
        stay readable for file.delete.delay.ms.
        """
        cfg = self.config
        if not cfg.delete:
            return 0
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

    # --- the log cleaner's swap -------------------------------------------------------------

    @property
    def clean_generation(self) -> int:
        """The log cleaner's last committed generation (0: never cleaned)."""
        return self._clean_generation

    @property
    def cleaned_end(self) -> int:
        """The end of the offsets the last committed clean covered (its dirty section ends
        there; the next clean's dirty section starts there)."""
        return self._cleaned_end

    @property
    def next_delete_horizon_ms(self) -> int | None:
        """When a tombstone or marker the last clean kept may go (None: none, or not known
        since the log opened: the next clean with dirty data finds them)."""
        return self._next_delete_horizon_ms

    @property
    def rewinds(self) -> int:
        """How many truncations removed data so far (the cleaner's plan notes it: a swap
        after another one is refused, whatever the extents look like)."""
        return self._rewinds

    def _committed(self, shape_version: int) -> bool:
        """Whether a checkpoint of shape ``shape_version`` or later is on storage (a
        checkpoint's key starts with the shape version it describes)."""
        with self._lock:
            key = self._written_key
            return key is not None and int(key[0]) >= shape_version  # type: ignore[call-overload]

    def read_extent(self, extent: Extent) -> bytes:
        """The whole bytes of one of the log's extents, every batch CRC-checked."""
        return self._read_range(extent, 0, extent.size)

    def replace_cleaned(
        self,
        sources: Sequence[Extent],
        cleaned: Sequence[LogSegment],
        generation: int,
        rewinds: int,
        *,
        next_delete_horizon_ms: int | None = None,
    ) -> bool:
        """Swap the log's first extents, which hold the offsets of ``sources`` (the extents
        the cleaner read, when the log had seen ``rewinds`` truncations), for ``cleaned``,
        the objects the cleaner wrote from them (on storage already, covering the same
        offsets). False, and nothing changes, if a truncation came between or the log no
        longer starts with those offsets (retention); a WAL compaction that packed some of
        the chunks meanwhile does not matter, as long as an extent still ends where
        ``sources`` end: every copy of an offset holds the same bytes.

        The checkpoint written here is the commit point (docs/storage.md §2.10.1): it names
        ``generation`` and the cleaned objects, so recovery reads the old extents before it
        and the cleaned objects after it, never a mix. Readers in this process see the old
        list or the new one (a swap under the state lock); the replaced segment objects stay
        readable for file.delete.delay.ms and chunk extents release their reference after
        the commit, so a read holding them finishes. ``next_delete_horizon_ms``: the earliest
        delete horizon of the tombstones and markers the clean kept, when the next clean is due
        even with nothing dirty."""
        start, end = sources[0].base_offset, sources[-1].next_offset
        if not cleaned or cleaned[0].base_offset != start or cleaned[-1].next_offset != end:
            raise ValueError(f"{self.storage.url}: cleaned objects do not cover [{start}, {end})")
        with self._maintenance_lock:
            with self._lock:
                ends = [e.next_offset for e in self._segments]
                if (
                    self._closed
                    or self._rewinds != rewinds
                    or not self._segments
                    or self._segments[0].base_offset != start
                    or end not in ends
                ):
                    return False
                count = ends.index(end) + 1
                live = self._segments[:count]
                self._segments[:count] = cleaned
                self._bases[:count] = [c.base_offset for c in cleaned]
                if len(self._segments) > len(cleaned):
                    self._segments[len(cleaned)].rolled = True
                self._shape_version += 1
                swapped = self._shape_version
                self._clean_generation = generation
                self._cleaned_end = end
                self._next_delete_horizon_ms = next_delete_horizon_ms
            self.checkpoint()  # the commit point (or a checkpoint after it, written first)
            if not self._committed(swapped):
                # closed meanwhile, before a checkpoint of the swap (the broker is stopping):
                # the replaced objects must stay; recovery deletes the cleaned ones
                return False
            self._retire(live)
        log.info(
            "%s: cleaned offsets [%d, %d) into %d object(s), generation %d",
            self.storage.url,
            start,
            end,
            len(cleaned),
            generation,
        )
        return True
