"""Segment objects: immutable objects of whole record batches, named by their base offset.

A segment object holds batches ``[base_offset, next_offset)`` back to back, exactly as they
travel on the wire. :class:`LogSegment` is the in-memory view of one object: its name, offsets,
size, and (once loaded) a per-batch index of positions, so that finding a batch never lists
storage or scans bytes twice.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from logstore.batch import RecordBatch, iter_batches

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
