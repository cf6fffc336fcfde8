"""The minimal WAL source: one partition's batches held in memory until the broker's WAL
writer (:mod:`logstore.wal`) makes them durable."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from logstore.batch import iter_batches
from logstore.errors import InvalidRecordError
from logstore.wal import PendingChunk, WalWriter, durable_count, still_taken
from logstore.wal_index import ChunkExtent

__all__ = ["BufferedSource"]


@dataclass(slots=True)
class _Batches:
    base_offset: int
    next_offset: int
    data: bytes


class BufferedSource:
    """One partition's batches in memory until a :class:`~logstore.wal.WalWriter` makes them
    durable.

    The reference implementation of :class:`~logstore.wal.WalSource` (``Log`` implements the
    same hooks over its own pending list), for tools, tests and the SIGKILL worker. Appends
    take whole batches whose offsets are already set (as a follower's), contiguous from the
    end.
    ``on_durable(end)`` is called after each ``wal_flushed``.
    """

    def __init__(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        *,
        next_offset: int = 0,
        writer: WalWriter | None = None,
        on_durable: Callable[[int], None] | None = None,
    ) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self.partition = partition
        self.writer = writer
        self.on_durable = on_durable
        self._lock = threading.Lock()
        self._pending: list[_Batches] = []
        self._taken = 0  # how many of _pending are in the writer's hands
        self._leo = next_offset
        self._durable_end = next_offset
        self.extents: list[ChunkExtent] = []

    @property
    def log_end_offset(self) -> int:
        return self._leo

    @property
    def durable_end_offset(self) -> int:
        return self._durable_end

    def append(self, data: bytes) -> int:
        """Append whole batches starting at the log end offset; returns the new one, and
        marks this source dirty on its writer."""
        with self._lock:
            expected = self._leo
            for batch in iter_batches(data, validate=True):
                if batch.base_offset != expected:
                    raise InvalidRecordError(
                        f"{self.topic}-{self.partition}: batch at offset {batch.base_offset}, "
                        f"the log ends at {expected}"
                    )
                expected = batch.next_offset
            self._pending.append(_Batches(self._leo, expected, bytes(data)))
            self._leo = expected
        if self.writer is not None:
            self.writer.mark_dirty(self, len(data))
        return expected

    def take_pending_for_wal(self) -> PendingChunk | None:
        with self._lock:
            fresh = self._pending[self._taken :]
            if not fresh:
                return None
            self._taken = len(self._pending)
            return PendingChunk.of(self.topic, self.topic_id, self.partition, fresh)

    def wal_flushed(self, extent: ChunkExtent) -> None:
        with self._lock:
            if extent.base_offset != self._durable_end:
                raise InvalidRecordError(
                    f"{self.topic}-{self.partition}: durable chunk starts at "
                    f"{extent.base_offset}, the durable end is {self._durable_end}"
                )
            done = durable_count(self._pending, extent)
            del self._pending[:done]
            self._taken -= done
            self._durable_end = extent.next_offset
            self.extents.append(extent)
        if self.on_durable is not None:
            self.on_durable(extent.next_offset)

    def wal_aborted(self, pending: PendingChunk) -> None:
        with self._lock:
            self._taken = still_taken(self._pending, pending)


# --- the index (recovery) -------------------------------------------------------------------
