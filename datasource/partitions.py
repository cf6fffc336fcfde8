"""Input partitions: what one Spark task reads, and how offset ranges are cut into them.

read() runs on an executor, in another process than the planner, with nothing but its input
partition; so a :class:`OffsetRangePartition` carries everything: the range, the replicas whose
storage holds it (leader first), where the first one holds it (the extents its broker
described, or the segment objects the planner listed), the aborted transactions a
read_committed read must drop, and the read settings (:class:`ReadSettings`). All are small
frozen dataclasses of primitives, picklable.

Cutting (:func:`split_ranges`): a partition's range is cut at object or extent boundaries (so
no object, or chunk of a shared WAL object, is read by two tasks) into the fewest pieces of at
most about ``target_bytes``, as even as whole objects allow; then, as Kafka's source does,
ranges above ``maxRecordsPerPartition`` are divided evenly, and if there are fewer than
``minPartitions`` pieces, every range is divided in proportion to its size.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pyspark.sql.datasource import InputPartition

from logstore.reader import AbortedTxnRange, Located, ObjectExtent

__all__ = [
    "TARGET_PARTITION_BYTES",
    "OffsetRange",
    "OffsetRangePartition",
    "ReadSettings",
    "ReplicaLocation",
    "extents_problem",
    "split_ranges",
]

#: Bytes one task reads at most when ranges are cut at object boundaries: one full segment
#: (segment.bytes' default), so merged segments map to one task each.
TARGET_PARTITION_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class ReadSettings:
    """How an executor reads: the same for every partition of a query."""

    bootstrap_servers: str
    read_committed: bool
    include_headers: bool
    #: auto, direct or broker (see :mod:`datasource.reader`)
    mode: str
    #: fsspec options for the replicas' storage (none for local files; credentials among
    #: them, so never printed)
    storage_options: tuple[tuple[str, Any], ...] = field(default=(), repr=False)
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    #: the clients' security settings by Kafka name (never printed), for reads through the
    #: brokers
    client_security: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: the ``kafka.<name>`` consumer settings of the read (SOURCE_CONSUMER_SETTINGS)
    consumer_settings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ReplicaLocation:
    """A replica that holds a range on its storage: its broker and storage root (log.dir)."""

    broker_id: int
    log_dir: str


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition, with the objects holding them (if known)."""

    topic: str
    partition: int
    start: int
    end: int
    objects: tuple[Located, ...] = ()

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class OffsetRangePartition(InputPartition):
    """One Spark task: offsets ``[start, end)`` of ``topic``-``partition``.

    Examples
    --------
    >>> settings = ReadSettings("127.0.0.1:9092", True, False, "auto")
    >>> p = OffsetRangePartition("events", 0, 0, 1000, settings)
    >>> import pickle
    >>> pickle.loads(pickle.dumps(p)) == p
    True
    """

    topic: str
    partition: int
    start: int
    end: int
    settings: ReadSettings
    #: replicas to read from directly, in order of preference (leader first); empty: broker
    replicas: tuple[ReplicaLocation, ...] = ()
    #: where the first replica holds the range, as the planner learned it (a hint): extents
    #: its broker described (segment objects and WAL chunks), or segment objects it listed
    objects: tuple[Located, ...] = ()
    #: read_committed: (producer id, first offset) of aborted transactions from ``start`` on
    aborted: tuple[AbortedTxnRange, ...] = ()

    def __repr__(self) -> str:
        return f"OffsetRangePartition({self.topic}-{self.partition} [{self.start}, {self.end}))"


def extents_problem(extents: Sequence[ObjectExtent], start: int, end: int) -> str | None:
    """Why ``extents`` (a broker's DescribeLogObjects answer) cannot be read for ``[start,
    end)``, or None if they can: they must follow one another from at or before ``start`` to
    at least ``end`` (a replica truncated or retained since it was chosen answers less)."""
    if not extents or extents[0].base_offset > start or extents[-1].next_offset < end:
        reach = f"[{extents[0].base_offset}, {extents[-1].next_offset})" if extents else "nothing"
        return f"do not cover [{start}, {end}) (they hold {reach})"
    for before, after in itertools.pairwise(extents):
        if before.next_offset != after.base_offset:
            return f"have a gap at offset {before.next_offset}"
    return None


# --- cutting ranges ---------------------------------------------------------------------------


def _objects_in(
    objects: Sequence[Located], start: int, end: int
) -> list[tuple[Located, int, int, int]]:
    """The objects overlapping [start, end): (object, first and end offset of the range it
    holds, the object's own end offset). An extent knows its end; a listed segment object
    ends where the next begins, the last at ``end``."""
    out: list[tuple[Located, int, int, int]] = []
    for i, obj in enumerate(objects):
        if isinstance(obj, ObjectExtent):
            obj_end = obj.next_offset
        else:
            obj_end = objects[i + 1].base_offset if i + 1 < len(objects) else end
        lo, hi = max(obj.base_offset, start), min(obj_end, end)
        if lo < hi:
            out.append((obj, lo, hi, obj_end))
    return out


def _by_segments(r: OffsetRange, target_bytes: int) -> list[OffsetRange]:
    """``r`` cut at object boundaries into the fewest pieces of at most about
    ``target_bytes``, as even in bytes as whole objects allow (even tasks finish together)."""
    held = _objects_in(r.objects, r.start, r.end)
    if not held or held[0][1] > r.start:
        return [r]  # objects unknown (or not covering the start): cut by offsets only
    # Each object's bytes inside the range, taking its records as of even size.
    shares = [
        obj.size * (hi - lo) / max(obj_end - obj.base_offset, 1) for obj, lo, hi, obj_end in held
    ]
    count = max(math.ceil(sum(shares) / target_bytes), 1)
    goal = sum(shares) / count
    pieces: list[OffsetRange] = []
    piece_start = r.start
    piece_objects: list[Located] = []
    done = 0.0
    for (obj, lo, _hi, _end), share in zip(held, shares, strict=True):
        # Cut before an object whose middle lies past the next piece's even share.
        if (
            piece_objects
            and len(pieces) < count - 1
            and done + share / 2 > goal * (len(pieces) + 1)
        ):
            pieces.append(replace(r, start=piece_start, end=lo, objects=tuple(piece_objects)))
            piece_start, piece_objects = lo, []
        piece_objects.append(obj)
        done += share
    pieces.append(replace(r, start=piece_start, objects=tuple(piece_objects)))
    return pieces


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` in ``parts`` even pieces (Kafka's getDividedPartition)."""
    if parts <= 1 or r.size <= 1:
        return [r]
    parts = min(parts, r.size)
    cuts = [r.start + r.size * i // parts for i in range(parts + 1)]
    return [
        replace(
            r,
            start=lo,
            end=hi,
            objects=tuple(held[0] for held in _objects_in(r.objects, lo, hi)),
        )
        for lo, hi in itertools.pairwise(cuts)
        if hi > lo
    ]


def split_ranges(
    ranges: Sequence[OffsetRange],
    *,
    target_bytes: int = TARGET_PARTITION_BYTES,
    min_partitions: int | None = None,
    max_records: int | None = None,
) -> list[OffsetRange]:
    """Cut ``ranges`` into task-sized pieces (see the module doc); empty ranges are dropped."""
    pieces = [p for r in ranges if r.size > 0 for p in _by_segments(r, target_bytes)]
    if max_records is not None:
        pieces = [p for r in pieces for p in _divide(r, math.ceil(r.size / max_records))]
    if min_partitions is None or len(pieces) >= min_partitions:
        return pieces
    total = sum(p.size for p in pieces)
    return [
        q
        for p in pieces
        for q in _divide(p, max(math.floor(p.size / total * min_partitions + 0.5), 1))
    ]
