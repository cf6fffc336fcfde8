"""Messages of Produce (0)."""

from __future__ import annotations

from dataclasses import field

from replication.protocol.codec import (
    INT16,
    INT32,
    INT64,
    NULLABLE_BYTES,
    NULLABLE_STRING,
    STRING,
    Bytes,
    array_field,
    message,
    wire,
)

# --- Produce (0) --------------------------------------------------------------------------------


@message
class ProduceRequestPartition:
    index: int = field(metadata=wire(INT32))
    records: Bytes | None = field(default=None, repr=False, metadata=wire(NULLABLE_BYTES))


@message
class ProduceRequestTopic:
    name: str = field(metadata=wire(STRING))
    partition_data: list[ProduceRequestPartition] = array_field(ProduceRequestPartition)


@message
class ProduceRequest:
    """Append record batches. acks: 0 (no response), 1 (leader), -1 (all in-sync replicas)."""

    transactional_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    acks: int = field(default=-1, metadata=wire(INT16))
    timeout_ms: int = field(default=30000, metadata=wire(INT32))
    topic_data: list[ProduceRequestTopic] = array_field(ProduceRequestTopic)


@message
class BatchIndexAndErrorMessage:
    """Which batch of the partition's records was refused, and why."""

    batch_index: int = field(metadata=wire(INT32))
    batch_index_error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class ProduceResponsePartition:
    index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    base_offset: int = field(default=-1, metadata=wire(INT64))
    log_append_time_ms: int = field(default=-1, metadata=wire(INT64))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    record_errors: list[BatchIndexAndErrorMessage] = array_field(BatchIndexAndErrorMessage)
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class ProduceResponseTopic:
    name: str = field(metadata=wire(STRING))
    partition_responses: list[ProduceResponsePartition] = array_field(ProduceResponsePartition)


@message
class ProduceResponse:
    responses: list[ProduceResponseTopic] = array_field(ProduceResponseTopic)
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
