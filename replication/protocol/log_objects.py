"""Messages of replog's DescribeLogObjects (1003): where a replica's batches are on its storage.

Spark's planner reads partitions straight from a replica's storage. With the broker's
write-ahead log, recent batches are not in per-partition ``<topic>/<p>/*.seg`` objects but in
byte ranges (chunks) of shared ``_replog/wal/...`` objects, which a LIST of the partition's
directory cannot find; and listing storage once per partition per micro-batch is what made
direct reads cost a LIST request each (docs/storage.md §1.4, §2.9). The broker holding the replica
knows its extents in memory, so it answers from there: no storage request.

An answer names, per partition, the broker's storage root (``log.dir``), the replica's high
watermark, durable end and log start, and the extents covering ``[start, end)`` in offset
order: segment objects as ``<topic>/<partition>/<name>`` at position 0, chunks as their
``_replog/wal/...`` path with their byte range. Paths are relative to the root.
"""

from __future__ import annotations

from dataclasses import field

from replication.protocol.codec import (
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    STRING,
    array_field,
    message,
    wire,
)

# --- replog: DescribeLogObjects (1003) ------------------------------------------------------------


@message
class DescribeLogObjectsPartition:
    """Offsets ``[start_offset, end_offset)`` of one partition (end -1: to the log end)."""

    partition_index: int = field(metadata=wire(INT32))
    start_offset: int = field(default=0, metadata=wire(INT64))
    end_offset: int = field(default=-1, metadata=wire(INT64))


@message
class DescribeLogObjectsTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[DescribeLogObjectsPartition] = array_field(DescribeLogObjectsPartition)


@message
class DescribeLogObjectsRequest:
    topics: list[DescribeLogObjectsTopic] = array_field(DescribeLogObjectsTopic)


@message
class LogObjectExtent:
    """Bytes ``[position, position + size)`` of the object at ``path`` (relative to the log
    dir) hold the partition's whole batches ``[base_offset, next_offset)``."""

    path: str = field(metadata=wire(STRING))
    position: int = field(default=0, metadata=wire(INT64))
    size: int = field(default=0, metadata=wire(INT64))
    base_offset: int = field(default=0, metadata=wire(INT64))
    next_offset: int = field(default=0, metadata=wire(INT64))


@message
class DescribeLogObjectsPartitionResponse:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    high_watermark: int = field(default=-1, metadata=wire(INT64))
    #: the end of what is durable in this replica's store (what a direct read may reach)
    durable_end_offset: int = field(default=-1, metadata=wire(INT64))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    extents: list[LogObjectExtent] = array_field(LogObjectExtent)


@message
class DescribeLogObjectsTopicResponse:
    name: str = field(metadata=wire(STRING))
    partitions: list[DescribeLogObjectsPartitionResponse] = array_field(
        DescribeLogObjectsPartitionResponse
    )


@message
class DescribeLogObjectsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    #: a refusal of the whole request (CLUSTER_AUTHORIZATION_FAILED)
    error_code: int = field(default=0, metadata=wire(INT16))
    #: the broker's storage root (``log.dir``): the extents' paths are relative to it
    log_dir: str = field(default="", metadata=wire(STRING))
    topics: list[DescribeLogObjectsTopicResponse] = array_field(DescribeLogObjectsTopicResponse)
