"""The log's checkpoint object: what recovery may trust without reading segment objects.

Kafka keeps three small files per log directory (recovery-point, high-watermark and
leader-epoch checkpoints). On object storage every write is a whole object, so replog keeps one
object per partition log, ``checkpoint.json``, written atomically. It is a frozen, versioned
model: a newer reader can refuse or migrate an older file.

Recovery trusts a segment object listed here only if its size on storage still matches; any
other object is scanned batch by batch and CRC-checked.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from logstore.errors import CorruptRecordError

CHECKPOINT_NAME = "checkpoint.json"
FORMAT_VERSION = 1


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

    def to_bytes(self) -> bytes:
        doc = asdict(self)
        doc["epochs"] = [list(e) for e in self.epochs]
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = CHECKPOINT_NAME) -> Checkpoint:
        try:
            doc: dict[str, Any] = json.loads(data)
            version = doc.get("format_version")
            if version != FORMAT_VERSION:
                raise CorruptRecordError(
                    f"{where}: checkpoint format_version {version!r} is not supported "
                    f"(this replog reads version {FORMAT_VERSION}); upgrade replog"
                )
            return cls(
                log_start_offset=int(doc["log_start_offset"]),
                high_watermark=int(doc["high_watermark"]),
                recovery_point=int(doc["recovery_point"]),
                epochs=tuple((int(e), int(o)) for e, o in doc["epochs"]),
                segments=tuple(SegmentEntry(**s) for s in doc["segments"]),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptRecordError(f"{where}: unreadable checkpoint: {err}") from err
