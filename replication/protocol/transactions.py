"""Messages of the transaction APIs: InitProducerId (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26),
WriteTxnMarkers (27), FindCoordinator (10), AllocateProducerIds (67), ListTransactions (66),
DescribeTransactions (65), DescribeProducers (61), and
replog's own CommitSinkBatch (1001) and DescribeSink (1002)."""

from __future__ import annotations

from dataclasses import field

from replication.protocol.codec import (
    BOOL,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    STRING,
    array_field,
    message,
    wire,
)

# --- transactions: InitProducerId (22), AddPartitionsToTxn (24), EndTxn (26) ----------------------


@message
class InitProducerIdRequest:
    """Get a producer id and epoch (-1/-1 for a new one; the current pair to bump the epoch)."""

    transactional_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    transaction_timeout_ms: int = field(default=60000, metadata=wire(INT32))
    producer_id: int = field(default=-1, metadata=wire(INT64))
    producer_epoch: int = field(default=-1, metadata=wire(INT16))


@message
class InitProducerIdResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    producer_id: int = field(default=-1, metadata=wire(INT64))
    producer_epoch: int = field(default=-1, metadata=wire(INT16))


@message
class AddOffsetsToTxnRequest:
    """Add the group's offsets partition to the transaction (before a TxnOffsetCommit)."""

    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    group_id: str = field(metadata=wire(STRING))


@message
class AddOffsetsToTxnResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class AddPartitionsToTxnTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[int] = array_field(INT32)


@message
class AddPartitionsToTxnRequest:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    topics: list[AddPartitionsToTxnTopic] = array_field(AddPartitionsToTxnTopic)


@message
class AddPartitionsToTxnPartitionResult:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class AddPartitionsToTxnTopicResult:
    name: str = field(metadata=wire(STRING))
    results: list[AddPartitionsToTxnPartitionResult] = array_field(
        AddPartitionsToTxnPartitionResult
    )


@message
class AddPartitionsToTxnResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    results: list[AddPartitionsToTxnTopicResult] = array_field(AddPartitionsToTxnTopicResult)


@message
class EndTxnRequest:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    committed: bool = field(metadata=wire(BOOL))


@message
class EndTxnResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


# --- WriteTxnMarkers (27) -------------------------------------------------------------------------


@message
class WritableTxnMarkerTopic:
    name: str = field(metadata=wire(STRING))
    partition_indexes: list[int] = array_field(INT32)


@message
class WritableTxnMarker:
    """A COMMIT (transaction_result true) or ABORT marker to write for one producer."""

    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    transaction_result: bool = field(metadata=wire(BOOL))
    topics: list[WritableTxnMarkerTopic] = array_field(WritableTxnMarkerTopic)
    coordinator_epoch: int = field(metadata=wire(INT32))


@message
class WriteTxnMarkersRequest:
    markers: list[WritableTxnMarker] = array_field(WritableTxnMarker)


@message
class WritableTxnMarkerPartitionResult:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class WritableTxnMarkerTopicResult:
    name: str = field(metadata=wire(STRING))
    partitions: list[WritableTxnMarkerPartitionResult] = array_field(
        WritableTxnMarkerPartitionResult
    )


@message
class WritableTxnMarkerResult:
    producer_id: int = field(metadata=wire(INT64))
    topics: list[WritableTxnMarkerTopicResult] = array_field(WritableTxnMarkerTopicResult)


@message
class WriteTxnMarkersResponse:
    markers: list[WritableTxnMarkerResult] = array_field(WritableTxnMarkerResult)


# --- FindCoordinator (10), AllocateProducerIds (67) ----------------------------------------------


@message
class FindCoordinatorRequest:
    key: str = field(metadata=wire(STRING))
    #: 0: consumer group, 1: transaction (replog has transaction coordinators only)
    key_type: int = field(default=1, metadata=wire(INT8))


@message
class FindCoordinatorResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    node_id: int = field(default=-1, metadata=wire(INT32))
    host: str = field(default="", metadata=wire(STRING))
    port: int = field(default=-1, metadata=wire(INT32))


@message
class AllocateProducerIdsRequest:
    broker_id: int = field(metadata=wire(INT32))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))


@message
class AllocateProducerIdsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    producer_id_start: int = field(default=-1, metadata=wire(INT64))
    producer_id_len: int = field(default=0, metadata=wire(INT32))


# --- ListTransactions (66) ------------------------------------------------------------------------


@message
class TransactionPartition:
    topic: str = field(metadata=wire(STRING))
    partition: int = field(metadata=wire(INT32))


@message
class TransactionListing:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(default=-1, metadata=wire(INT16))
    transaction_state: str = field(default="", metadata=wire(STRING))
    transaction_timeout_ms: int = field(default=0, metadata=wire(INT32))
    transaction_start_time_ms: int = field(default=-1, metadata=wire(INT64))
    partitions: list[TransactionPartition] = array_field(TransactionPartition)


@message
class ListTransactionsRequest:
    #: states to list (empty: all)
    state_filters: list[str] = array_field(STRING)


@message
class ListTransactionsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    transactions: list[TransactionListing] = array_field(TransactionListing)


# --- DescribeTransactions (65) --------------------------------------------------------------------


@message
class DescribeTransactionsRequest:
    transactional_ids: list[str] = array_field(STRING)


@message
class TopicData:
    topic: str = field(metadata=wire(STRING))
    partitions: list[int] = array_field(INT32)


@message
class TransactionState:
    error_code: int = field(default=0, metadata=wire(INT16))
    transactional_id: str = field(default="", metadata=wire(STRING))
    transaction_state: str = field(default="", metadata=wire(STRING))
    transaction_timeout_ms: int = field(default=0, metadata=wire(INT32))
    transaction_start_time_ms: int = field(default=-1, metadata=wire(INT64))
    producer_id: int = field(default=-1, metadata=wire(INT64))
    producer_epoch: int = field(default=-1, metadata=wire(INT16))
    topics: list[TopicData] = array_field(TopicData)


@message
class DescribeTransactionsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    transaction_states: list[TransactionState] = array_field(TransactionState)


# --- DescribeProducers (61) -----------------------------------------------------------------------


@message
class DescribeProducersTopic:
    name: str = field(metadata=wire(STRING))
    partition_indexes: list[int] = array_field(INT32)


@message
class DescribeProducersRequest:
    topics: list[DescribeProducersTopic] = array_field(DescribeProducersTopic)


@message
class ProducerState:
    """A producer the partition's leader knows. ``current_txn_start_offset`` is the first
    offset of its open transaction on the partition (-1: none); ``last_timestamp`` is the
    timestamp of that transaction's first batch (-1 when none is open)."""

    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT32))
    last_sequence: int = field(default=-1, metadata=wire(INT32))
    last_timestamp: int = field(default=-1, metadata=wire(INT64))
    coordinator_epoch: int = field(default=-1, metadata=wire(INT32))
    current_txn_start_offset: int = field(default=-1, metadata=wire(INT64))


@message
class DescribeProducersPartitionResponse:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    active_producers: list[ProducerState] = array_field(ProducerState)


@message
class DescribeProducersTopicResponse:
    name: str = field(metadata=wire(STRING))
    partitions: list[DescribeProducersPartitionResponse] = array_field(
        DescribeProducersPartitionResponse
    )


@message
class DescribeProducersResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[DescribeProducersTopicResponse] = array_field(DescribeProducersTopicResponse)


# --- replog: CommitSinkBatch (1001), DescribeSink (1002) ------------------------------------------


@message
class SinkTransaction:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))


@message
class CommitSinkBatchRequest:
    """Commit these transactions as batch ``batch_id`` of sink ``sink_id`` in one atomic step,
    unless that batch of the sink is already committed: then abort them."""

    sink_id: str = field(metadata=wire(STRING))
    batch_id: int = field(metadata=wire(INT64))
    transactions: list[SinkTransaction] = array_field(SinkTransaction)
    #: abort the transactions instead (the sink's abort())
    abort: bool = field(default=False, metadata=wire(BOOL))


@message
class CommitSinkBatchResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    #: True if this call committed the batch; False if it aborted (a replay, or abort=True)
    committed: bool = field(default=False, metadata=wire(BOOL))
    last_committed_batch: int = field(default=-1, metadata=wire(INT64))


@message
class DescribeSinkRequest:
    sink_id: str = field(metadata=wire(STRING))


@message
class DescribeSinkResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    last_committed_batch: int = field(default=-1, metadata=wire(INT64))
