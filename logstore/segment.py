"""Segment objects: immutable objects of whole record batches, named by their base offset.

A segment object holds batches ``[base_offset, next_offset)`` back to back, exactly as they
travel on the wire. :class:`LogSegment` is the in-memory view of one object: its name, offsets,
size, and (once loaded) a per-batch index of positions, so that finding a batch never lists
storage or scans bytes twice.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from logstore.batch import RecordBatch, iter_batches

if TYPE_CHECKING:
    from logstore.wal_index import ChunkExtent

SUFFIX = ".seg"


def object_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


def base_offset_of(name: str) -> int | None:
    """The base offset encoded in a segment object's name, or None if it is not one."""
    stem = name.rsplit("/", 1)[-1]
    if not stem.endswith(SUFFIX) or len(stem) != 20 + len(SUFFIX):
        return None
    digits = stem[:20]
    return int(digits) if digits.isdigit() else None


def cleaned_object_name(base_offset: int, generation: int) -> str:
    """The name of an object the log cleaner wrote in ``generation`` (docs/storage.md §2.10.1):
    not a plain segment object's name, so only a checkpoint naming the generation makes
    recovery use it, and it never collides with the object it replaces."""
    return f"{base_offset:020d}-{generation:010d}{SUFFIX}"


def cleaned_object_of(name: str) -> tuple[int, int] | None:
    """(base offset, generation) of a cleaned object's name, or None if it is not one."""
    stem = name.rsplit("/", 1)[-1]
    if not stem.endswith(SUFFIX) or len(stem) != 31 + len(SUFFIX) or stem[20] != "-":
        return None
    base, generation = stem[:20], stem[21:31]
    if not (base.isdigit() and generation.isdigit()):
        return None
    return int(base), int(generation)


@dataclass(slots=True)
class BatchIndex:
    """Per-batch positions inside one object (parallel lists, ordered by offset)."""

    base_offsets: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    max_timestamps: list[int] = field(default_factory=list)

    def add(self, batch: RecordBatch, position: int) -> None:
        self.base_offsets.append(batch.base_offset)
        self.positions.append(position)
        self.sizes.append(batch.size_in_bytes)
        self.max_timestamps.append(batch.max_timestamp)

    def extend(self, other: BatchIndex, shift: int) -> None:
        self.base_offsets.extend(other.base_offsets)
        self.positions.extend(p + shift for p in other.positions)
        self.sizes.extend(other.sizes)
        self.max_timestamps.extend(other.max_timestamps)

    def slot_for(self, offset: int) -> int:
        """Index of the batch that holds ``offset`` (the caller checks the object covers it)."""
        return max(bisect.bisect_right(self.base_offsets, offset) - 1, 0)

    @classmethod
    def scan(cls, data: bytes | memoryview, *, validate: bool) -> BatchIndex:
        """Index every batch of ``data`` (CorruptRecordError on a broken header chain, and
        with ``validate`` on any CRC mismatch)."""
        index = cls()
        position = 0
        for batch in iter_batches(data, validate=validate):
            index.add(batch, position)
            position += batch.size_in_bytes
        return index


@dataclass(slots=True)
class LogSegment:
    """One live segment object of a partition log."""

    name: str
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int
    rolled: bool = False
    created_ms: int = 0
    #: None until the object's batches were indexed (scanned or written by this process).
    index: BatchIndex | None = None

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1

    def __repr__(self) -> str:
        return f"LogSegment({self.name}, [{self.base_offset}, {self.next_offset}), {self.size} B)"


@dataclass(slots=True)
class ChunkSegment:
    """A log's batches in a byte range of a shared WAL or packed object (a
    :class:`~logstore.wal_index.ChunkExtent`), kept beside :class:`LogSegment` objects in the
    log's ordered extent list, with the same fields a read needs.

    Why a separate kind: the object is shared with other partitions, so nothing of it may be
    deleted or rewritten for one partition. Truncation cuts a chunk in memory only (a new,
    shorter extent of the same bytes; docs/storage.md §2.7), retention and compaction drop its
    reference (the garbage collector deletes the object once nobody refers to it). Each chunk
    is its own segment for retention (``rolled``) and is never merged with its neighbours.
    """

    chunk: ChunkExtent
    #: None until the chunk's batches were indexed (read, or built from the appended batches)
    index: BatchIndex | None = None
    rolled: bool = True
    created_ms: int = 0

    @property
    def name(self) -> str:
        """The tail cache's key (never a name on the partition's storage)."""
        c = self.chunk
        return f"{c.object}@{c.position}+{c.size}"

    @property
    def base_offset(self) -> int:
        return self.chunk.base_offset

    @property
    def next_offset(self) -> int:
        return self.chunk.next_offset

    @property
    def size(self) -> int:
        return self.chunk.size

    @property
    def max_timestamp(self) -> int:
        return self.chunk.max_timestamp

    @property
    def last_offset(self) -> int:
        return self.chunk.next_offset - 1

    def __repr__(self) -> str:
        c = self.chunk
        return (
            f"ChunkSegment({c.object}@{c.position}, [{c.base_offset}, {c.next_offset}), "
            f"{c.size} B, seqs [{c.first_seq}, {c.last_seq}])"
        )


#: one entry of a log's ordered extent list
Extent = LogSegment | ChunkSegment
