"""Offsets of the source: the streaming offset JSON, starting/ending specs, and rate limiting.

A streaming offset says, for every topic-partition, the offset of the next record to read. It
travels through Spark's offset log as JSON with string keys (Spark's Kafka source format)::

    {"events": {"0": 42, "1": 7}}

:class:`SourceOffset` is that document as a value; :func:`rate_limit` is Kafka's
``maxOffsetsPerTrigger`` arithmetic. The ``*Offsets`` / ``*Timestamp*`` classes are what the
``startingOffsets`` / ``endingOffsets`` family of options asks for, before the brokers turn
them into offsets (see :mod:`datasource.planner`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from replication.client import TopicPartition

__all__ = [
    "EARLIEST",
    "LATEST",
    "EarliestOffsets",
    "GlobalTimestamp",
    "LatestOffsets",
    "OffsetSpec",
    "SourceOffset",
    "SpecificOffsets",
    "SpecificTimestamps",
    "rate_limit",
]

#: In a JSON offsets option, -2 means the earliest offset and -1 the latest, as in Kafka.
EARLIEST = -2
LATEST = -1

#: What to do when no record has a timestamp at or after the one asked for.
TimestampStrategy = Literal["error", "latest"]


@dataclass(frozen=True)
class SourceOffset:
    """The next offset to read of each topic-partition (a streaming offset).

    Examples
    --------
    >>> offset = SourceOffset.from_json({"events": {"0": 42, "1": 7}})
    >>> offset.offsets[TopicPartition("events", 1)]
    7
    >>> offset.to_json()
    {'events': {'0': 42, '1': 7}}
    """

    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, dict[str, int]]:
        """The JSON document (topics and partitions sorted, so equal offsets serialise alike)."""
        doc: dict[str, dict[str, int]] = {}
        for tp in sorted(self.offsets):
            doc.setdefault(tp.topic, {})[str(tp.partition)] = int(self.offsets[tp])
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | str) -> SourceOffset:
        """Parse an offset document (a dict, or its JSON text); ValueError says what is wrong."""
        if isinstance(doc, str):
            try:
                doc = json.loads(doc)
            except ValueError as err:
                raise ValueError(f"offset {doc!r} is not JSON: {err}") from None
        return cls(parse_partition_map(doc, "offset", minimum=0))

    def __len__(self) -> int:
        return len(self.offsets)


def parse_partition_map(doc: Any, what: str, *, minimum: int) -> dict[TopicPartition, int]:
    """``{"topic": {"0": n}}`` as {TopicPartition: n}, every n at least ``minimum``."""
    # Malformed documents are ValueErrors (bad values), not a caller's TypeError.
    if not isinstance(doc, Mapping):
        raise ValueError(f'{what} must be a JSON object like {{"topic": {{"0": 42}}}}')  # noqa: TRY004
    out: dict[TopicPartition, int] = {}
    for topic, partitions in doc.items():
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"{what}: topic names must be non-empty strings, got {topic!r}")
        if not isinstance(partitions, Mapping):
            raise ValueError(  # noqa: TRY004
                f'{what}: topic {topic!r} must map partitions to numbers, like {{"0": 42}}'
            )
        for key, value in partitions.items():
            try:
                partition = int(key)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{what}: partition {key!r} of topic {topic!r} is not a number"
                ) from None
            if partition < 0:
                raise ValueError(f"{what}: partition {key!r} of topic {topic!r} is negative")
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(  # noqa: TRY004
                    f"{what}: {topic}-{partition} has {value!r}, expected an integer"
                )
            if value < minimum:
                raise ValueError(f"{what}: {topic}-{partition} has {value}, expected >= {minimum}")
            out[TopicPartition(topic, partition)] = value
    return out


# --- what the options ask for -----------------------------------------------------------------


@dataclass(frozen=True)
class EarliestOffsets:
    """Every partition from its log start offset."""


@dataclass(frozen=True)
class LatestOffsets:
    """Every partition from its end: the high watermark, or the LSO with read_committed."""


@dataclass(frozen=True)
class SpecificOffsets:
    """Offsets per partition; -2 (:data:`EARLIEST`) and -1 (:data:`LATEST`) as in Kafka."""

    offsets: Mapping[TopicPartition, int]


@dataclass(frozen=True)
class SpecificTimestamps:
    """Per partition, the first offset whose record timestamp is at least the one given (ms)."""

    timestamps: Mapping[TopicPartition, int]
    strategy: TimestampStrategy = "error"


@dataclass(frozen=True)
class GlobalTimestamp:
    """Every partition from its first record with a timestamp at least ``timestamp`` (ms)."""

    timestamp: int
    strategy: TimestampStrategy = "error"


OffsetSpec = (
    EarliestOffsets | LatestOffsets | SpecificOffsets | SpecificTimestamps | GlobalTimestamp
)


# --- admission control ------------------------------------------------------------------------


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_rows: int
) -> dict[TopicPartition, int]:
    """End offsets reading at most ``max_rows`` records, split by backlog (Kafka's source).

    Each partition gets a share of ``max_rows`` in proportion to its backlog ``latest -
    start``. Kafka rounds shares below one up so that small partitions are not starved, which
    can exceed the limit; here the shares are rounded down and the remainder goes to the largest
    fractions (largest remainder method), so the total never exceeds ``max_rows`` and every
    partition with a backlog gets a record whenever ``max_rows`` allows one per partition.
    ``start`` must hold every partition of ``latest`` (new partitions with the offset they
    start from); one missing from it is not limited.
    """
    if max_rows < 0:
        raise ValueError(f"max_rows={max_rows} must be >= 0")
    backlog = {tp: end - start.get(tp, end) for tp, end in latest.items()}
    backlog = {tp: size for tp, size in backlog.items() if size > 0}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: max_rows * size // total for tp, size in backlog.items()}
    left = max_rows - sum(shares.values())
    # Largest fraction first; ties to the partition with the larger backlog, then by name.
    order = sorted(
        backlog,
        key=lambda tp: (-(max_rows * backlog[tp] % total), -backlog[tp], tp),
    )
    for tp in order:
        if left <= 0:
            break
        if shares[tp] < backlog[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: (start[tp] + shares[tp] if tp in backlog else end) for tp, end in latest.items()}
