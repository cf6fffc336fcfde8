"""Messages of the administrative APIs: DeleteRecords (21), DescribeConfigs (32),
AlterConfigs (33), CreatePartitions (37), IncrementalAlterConfigs (44)."""

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
    Array,
    array_field,
    message,
    wire,
)

# --- DeleteRecords (21) --------------------------------------------------------------------------


@message
class DeleteRecordsPartition:
    """Delete the records before ``offset`` (-1: the high watermark)."""

    partition_index: int = field(metadata=wire(INT32))
    offset: int = field(metadata=wire(INT64))


@message
class DeleteRecordsTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[DeleteRecordsPartition] = array_field(DeleteRecordsPartition)


@message
class DeleteRecordsRequest:
    topics: list[DeleteRecordsTopic] = array_field(DeleteRecordsTopic)
    timeout_ms: int = field(default=30000, metadata=wire(INT32))


@message
class DeleteRecordsPartitionResult:
    partition_index: int = field(metadata=wire(INT32))
    low_watermark: int = field(default=-1, metadata=wire(INT64))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class DeleteRecordsTopicResult:
    name: str = field(metadata=wire(STRING))
    partitions: list[DeleteRecordsPartitionResult] = array_field(DeleteRecordsPartitionResult)


@message
class DeleteRecordsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[DeleteRecordsTopicResult] = array_field(DeleteRecordsTopicResult)


# --- DescribeConfigs (32) ------------------------------------------------------------------------

#: DescribeConfigs resource types (Kafka's ConfigResource.Type).
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4

#: Where a config's value comes from (Kafka's DescribeConfigsResponse.ConfigSource).
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5


@message
class DescribeConfigsResource:
    resource_type: int = field(metadata=wire(INT8))
    resource_name: str = field(metadata=wire(STRING))
    #: None: every config
    configuration_keys: list[str] | None = field(
        default=None, metadata=wire(Array(STRING, nullable=True))
    )


@message
class DescribeConfigsRequest:
    resources: list[DescribeConfigsResource] = array_field(DescribeConfigsResource)
    include_synonyms: bool = field(default=False, metadata=wire(BOOL))
    include_documentation: bool = field(default=False, metadata=wire(BOOL))


@message
class DescribeConfigsResourceResult:
    name: str = field(metadata=wire(STRING))
    value: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    read_only: bool = field(default=False, metadata=wire(BOOL))
    config_source: int = field(default=-1, metadata=wire(INT8))
    is_sensitive: bool = field(default=False, metadata=wire(BOOL))
    documentation: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class DescribeConfigsResult:
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    resource_type: int = field(default=0, metadata=wire(INT8))
    resource_name: str = field(default="", metadata=wire(STRING))
    configs: list[DescribeConfigsResourceResult] = array_field(DescribeConfigsResourceResult)


@message
class DescribeConfigsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    results: list[DescribeConfigsResult] = array_field(DescribeConfigsResult)


# --- AlterConfigs (33) ---------------------------------------------------------------------------


@message
class AlterableConfig:
    """One key of an AlterConfigs resource: every key given becomes the resource's whole set."""

    name: str = field(metadata=wire(STRING))
    value: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class AlterConfigsResource:
    resource_type: int = field(metadata=wire(INT8))
    resource_name: str = field(metadata=wire(STRING))
    configs: list[AlterableConfig] = array_field(AlterableConfig)


@message
class AlterConfigsRequest:
    resources: list[AlterConfigsResource] = array_field(AlterConfigsResource)
    validate_only: bool = field(default=False, metadata=wire(BOOL))


@message
class AlterConfigsResourceResponse:
    """The outcome for one resource (of AlterConfigs and IncrementalAlterConfigs alike)."""

    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    resource_type: int = field(default=0, metadata=wire(INT8))
    resource_name: str = field(default="", metadata=wire(STRING))


@message
class AlterConfigsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    responses: list[AlterConfigsResourceResponse] = array_field(AlterConfigsResourceResponse)


# --- IncrementalAlterConfigs (44) -----------------------------------------------------------------

#: IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType).
CONFIG_OP_SET = 0
CONFIG_OP_DELETE = 1
CONFIG_OP_APPEND = 2
CONFIG_OP_SUBTRACT = 3


@message
class IncrementalAlterableConfig:
    name: str = field(metadata=wire(STRING))
    config_operation: int = field(default=CONFIG_OP_SET, metadata=wire(INT8))
    value: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class IncrementalAlterConfigsResource:
    resource_type: int = field(metadata=wire(INT8))
    resource_name: str = field(metadata=wire(STRING))
    configs: list[IncrementalAlterableConfig] = array_field(IncrementalAlterableConfig)


@message
class IncrementalAlterConfigsRequest:
    resources: list[IncrementalAlterConfigsResource] = array_field(IncrementalAlterConfigsResource)
    validate_only: bool = field(default=False, metadata=wire(BOOL))


@message
class IncrementalAlterConfigsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    responses: list[AlterConfigsResourceResponse] = array_field(AlterConfigsResourceResponse)


# --- CreatePartitions (37) -----------------------------------------------------------------------


@message
class CreatePartitionsAssignment:
    broker_ids: list[int] = array_field(INT32)


@message
class CreatePartitionsTopic:
    """Grow topic ``name`` to ``count`` partitions (the new ones' replicas chosen by the
    controller unless ``assignments`` names them)."""

    name: str = field(metadata=wire(STRING))
    count: int = field(metadata=wire(INT32))
    assignments: list[CreatePartitionsAssignment] | None = field(
        default=None, metadata=wire(Array(CreatePartitionsAssignment, nullable=True))
    )


@message
class CreatePartitionsRequest:
    topics: list[CreatePartitionsTopic] = array_field(CreatePartitionsTopic)
    timeout_ms: int = field(default=30000, metadata=wire(INT32))
    validate_only: bool = field(default=False, metadata=wire(BOOL))


@message
class CreatePartitionsTopicResult:
    name: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class CreatePartitionsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    results: list[CreatePartitionsTopicResult] = array_field(CreatePartitionsTopicResult)
