"""Leader-epoch cache: leader epoch -> start offset, as Kafka's LeaderEpochFileCache.

Every batch a leader appends carries its leader epoch; the cache records the first offset of
each epoch so that OffsetsForLeaderEpoch (KIP-101, KIP-279) can tell a follower where an epoch
ended on this replica. It lives in the log's checkpoint object and is rebuilt from batch headers
for whatever recovery scanned.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Ordered (epoch, start offset) entries; epochs and start offsets both strictly increase."""

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = list(entries or [])

    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        with self._lock:
            return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (no-op if not newer than the latest)."""
        if epoch < 0:
            return
        with self._lock:
            if self._entries:
                last = self._entries[-1]
                if epoch <= last.epoch:
                    return
                # A newer epoch starting at or below an older one's start makes the older
                # entries meaningless (they were truncated away): drop them, as Kafka does.
                while self._entries and self._entries[-1].start_offset >= start_offset:
                    self._entries.pop()
            self._entries.append(EpochEntry(epoch, start_offset))

    def start_offset_of(self, epoch: int) -> int | None:
        with self._lock:
            for entry in self._entries:
                if entry.epoch == epoch:
                    return entry.start_offset
        return None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= requested, end offset of that epoch), Kafka's endOffsetFor.

        The end offset is the start offset of the first epoch above ``requested_epoch``, or the
        log end offset when the requested epoch is the latest. An epoch above the latest gives
        (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET).
        """
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH or not self._entries:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if requested_epoch == self._entries[-1].epoch:
                return requested_epoch, log_end_offset
            epochs = [e.epoch for e in self._entries]
            higher = bisect.bisect_right(epochs, requested_epoch)
            if higher == len(self._entries):
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            floor = higher - 1
            end = self._entries[higher].start_offset
            if floor < 0:
                return requested_epoch, end
            return self._entries[floor].epoch, end

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was truncated there)."""
        with self._lock:
            while self._entries and self._entries[-1].start_offset >= end_offset:
                self._entries.pop()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop epochs wholly below ``start_offset``; the one holding it now starts there."""
        with self._lock:
            keep: list[EpochEntry] = []
            for i, entry in enumerate(self._entries):
                nxt = self._entries[i + 1].start_offset if i + 1 < len(self._entries) else None
                if nxt is not None and nxt <= start_offset:
                    continue
                keep.append(EpochEntry(entry.epoch, max(entry.start_offset, start_offset)))
            self._entries = keep

    def clear(self) -> None:
        with self._lock:
            self._entries = []
