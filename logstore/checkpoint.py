"""The log's checkpoint object: what recovery may trust without reading segment objects.

Kafka keeps three small files per log directory (recovery-point, high-watermark and
leader-epoch checkpoints). On object storage every write is a whole object, so replog keeps one
object per partition log, ``checkpoint.json``, written atomically. It is a frozen, versioned
model: a newer reader can refuse or migrate an older file.

Recovery trusts a segment object listed here only if its size on storage still matches; any
other object is scanned batch by batch and CRC-checked.

Format 2 (written by logs whose data lives in the broker's WAL, docs/storage.md §2.6-2.7, 2.11)
adds what recovery needs to pick the partition's chunks out of the shared WAL objects:
``topic_id`` (a topic re-created under the same name never inherits old chunks),
``wal_start_seq`` (chunks first written before it are void: the log was emptied then) and
``truncations`` (``[S, X]``: chunks whose last seq is <= S are void at offsets >= X). A log
without a WAL still writes format 1, so an older replog keeps reading its directories; a
format-1 checkpoint reads as "no topic id, wal_start_seq 0, no truncations".

A compacted log that the log cleaner has cleaned adds ``clean_generation`` and
``cleaned_end``: the log's offsets below ``cleaned_end`` are in the cleaned objects of that
generation (listed in ``segments``) and nowhere else; any other copy of them (segment objects
and WAL chunks the cleaner replaced, or cleaned objects of another generation, left by a crash
before or after the swap) is void. Its checkpoint is written as format 3 (over format 1) or 4
(over format 2), so a replog without the cleaner refuses it rather than misread it; in memory
``format_version`` stays 1 or 2. A log never cleaned writes neither key, so its checkpoint is
byte-identical to what it was before the cleaner existed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from logstore.errors import CorruptRecordError

CHECKPOINT_NAME = "checkpoint.json"
FORMAT_VERSION = 1
#: the format of logs over the broker WAL (adds topic_id, wal_start_seq, truncations)
WAL_FORMAT_VERSION = 2
#: a cleaned log's checkpoint is written as format 3 (format 1 plus the cleaner's fields) or 4
#: (format 2 plus them), which a replog without the log cleaner refuses rather than misread
CLEANED_FORMAT_VERSIONS = {FORMAT_VERSION: 3, WAL_FORMAT_VERSION: 4}
_BASE_FORMAT = {v: k for k, v in CLEANED_FORMAT_VERSIONS.items()}
_READABLE = (FORMAT_VERSION, WAL_FORMAT_VERSION, *CLEANED_FORMAT_VERSIONS.values())


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """One segment object as the checkpoint remembers it."""

    name: str
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int
    #: True if this object opens a new segment (merges never cross such a boundary).
    rolled: bool = False
    #: wall-clock ms at which the segment this object opens was rolled
    created_ms: int = 0


@dataclass(frozen=True, slots=True)
class Checkpoint:
    log_start_offset: int = 0
    high_watermark: int = 0
    recovery_point: int = 0
    epochs: tuple[tuple[int, int], ...] = ()
    segments: tuple[SegmentEntry, ...] = field(default_factory=tuple)
    format_version: int = FORMAT_VERSION
    #: format 2 only: the topic's id (None: unknown, format 1)
    topic_id: str | None = None
    #: format 2 only: WAL chunks with first_seq below this are void
    wal_start_seq: int = 0
    #: format 2 only: (S, X) truncation records, oldest first
    truncations: tuple[tuple[int, int], ...] = ()
    #: the log cleaner's last committed generation (0: never cleaned)
    clean_generation: int = 0
    #: offsets below this are in the cleaned objects of ``clean_generation`` only
    cleaned_end: int = 0

    def to_bytes(self) -> bytes:
        doc = asdict(self)
        doc["epochs"] = [list(e) for e in self.epochs]
        if self.clean_generation:
            doc["format_version"] = CLEANED_FORMAT_VERSIONS[self.format_version]
        else:
            del doc["clean_generation"], doc["cleaned_end"]
        if self.format_version == FORMAT_VERSION:
            for key in ("topic_id", "wal_start_seq", "truncations"):
                del doc[key]  # byte-identical to what format-1 code writes
        else:
            doc["truncations"] = [list(t) for t in self.truncations]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = CHECKPOINT_NAME) -> Checkpoint:
        try:
            doc: dict[str, Any] = json.loads(data)
            version = doc.get("format_version")
            if version not in _READABLE:
                raise CorruptRecordError(
                    f"{where}: checkpoint format_version {version!r} is not supported "
                    f"(this replog reads versions {', '.join(map(str, _READABLE))}); "
                    "upgrade replog"
                )
            extra: dict[str, Any] = {}
            if version in _BASE_FORMAT:
                extra["clean_generation"] = int(doc["clean_generation"])
                extra["cleaned_end"] = int(doc["cleaned_end"])
                version = _BASE_FORMAT[version]
            if version == WAL_FORMAT_VERSION:
                topic_id = doc.get("topic_id")
                extra |= {
                    "format_version": WAL_FORMAT_VERSION,
                    "topic_id": None if topic_id is None else str(topic_id),
                    "wal_start_seq": int(doc.get("wal_start_seq", 0)),
                    "truncations": tuple((int(s), int(x)) for s, x in doc.get("truncations", ())),
                }
            return cls(
                log_start_offset=int(doc["log_start_offset"]),
                high_watermark=int(doc["high_watermark"]),
                recovery_point=int(doc["recovery_point"]),
                epochs=tuple((int(e), int(o)) for e, o in doc["epochs"]),
                segments=tuple(SegmentEntry(**s) for s in doc["segments"]),
                **extra,
            )
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptRecordError(f"{where}: unreadable checkpoint: {err}") from err


#: the broker checkpoint's name under a broker root (beside ``_replog/wal/``)
BROKER_CHECKPOINT_NAME = "_replog/checkpoint.json"
BROKER_CHECKPOINT_VERSION = 1


@dataclass(frozen=True, slots=True)
class BrokerCheckpoint:
    """The high watermarks of every partition a broker keeps over its WAL, in one object
    (Kafka's replication-offset-checkpoint file, one per log directory).

    A log over the WAL leaves its high watermark out of its own checkpoint's change test:
    otherwise every partition whose HW moved would rewrite its checkpoint every
    ``log.checkpoint.interval.ms`` (one PUT per active partition, a rate that grows with the
    partition count). The broker writes this one object instead, only when some HW moved. An
    HW is a hint at recovery (a leader recomputes it from its followers, a follower learns it
    from its leader), so a missing or unreadable broker checkpoint costs nothing but a late HW.
    """

    #: "<topic_id>:<partition>" -> high watermark
    high_watermarks: dict[str, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        doc = {
            "format_version": BROKER_CHECKPOINT_VERSION,
            "high_watermarks": self.high_watermarks,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = BROKER_CHECKPOINT_NAME) -> BrokerCheckpoint:
        try:
            doc: dict[str, Any] = json.loads(data)
            version = doc.get("format_version")
            if version != BROKER_CHECKPOINT_VERSION:
                raise CorruptRecordError(
                    f"{where}: broker checkpoint format_version {version!r} is not supported "
                    f"(this replog reads version {BROKER_CHECKPOINT_VERSION}); upgrade replog"
                )
            return cls({str(k): int(v) for k, v in doc["high_watermarks"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CorruptRecordError(f"{where}: unreadable broker checkpoint: {err}") from err
