"""Messages of the metadata and topic APIs: ApiVersions (18), Metadata (3), CreateTopics (19),
DeleteTopics (20), DescribeLogDirs (35)."""

from __future__ import annotations

from dataclasses import field

from replication.protocol.codec import (
    BOOL,
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

# --- ApiVersions (18) ----------------------------------------------------------------------------


@message
class ApiVersionsRequest:
    """Which APIs and versions does the broker speak? (v1 adds the client's software.)"""

    client_software_name: str = field(default="", metadata=wire(STRING, since=1, ignorable=True))
    client_software_version: str = field(default="", metadata=wire(STRING, since=1, ignorable=True))


@message
class ApiVersionsResponseKey:
    api_key: int = field(metadata=wire(INT16))
    min_version: int = field(metadata=wire(INT16))
    max_version: int = field(metadata=wire(INT16))


@message
class ApiVersionsResponse:
    """The broker's versions. With UNSUPPORTED_VERSION it answers at v0, as Kafka does."""

    error_code: int = field(default=0, metadata=wire(INT16))
    api_keys: list[ApiVersionsResponseKey] = array_field(ApiVersionsResponseKey)
    throttle_time_ms: int = field(default=0, metadata=wire(INT32, since=1, ignorable=True))


# --- Metadata (3) -----------------------------------------------------------------------------


@message
class MetadataRequestTopic:
    name: str = field(metadata=wire(STRING))


@message
class MetadataRequest:
    """Brokers, controller and partition leaders; ``topics=None`` asks for every topic."""

    topics: list[MetadataRequestTopic] | None = field(
        default=None, metadata=wire(Array(MetadataRequestTopic, nullable=True))
    )
    allow_auto_topic_creation: bool = field(default=False, metadata=wire(BOOL, since=1))


@message
class MetadataResponseBroker:
    node_id: int = field(metadata=wire(INT32))
    host: str = field(metadata=wire(STRING))
    port: int = field(metadata=wire(INT32))
    rack: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class MetadataResponsePartition:
    error_code: int = field(default=0, metadata=wire(INT16))
    partition_index: int = field(metadata=wire(INT32))
    leader_id: int = field(metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    replica_nodes: list[int] = array_field(INT32)
    isr_nodes: list[int] = array_field(INT32)
    offline_replicas: list[int] = array_field(INT32)


@message
class MetadataResponseTopic:
    error_code: int = field(default=0, metadata=wire(INT16))
    name: str = field(metadata=wire(STRING))
    is_internal: bool = field(default=False, metadata=wire(BOOL))
    partitions: list[MetadataResponsePartition] = array_field(MetadataResponsePartition)


@message
class MetadataResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    brokers: list[MetadataResponseBroker] = array_field(MetadataResponseBroker)
    cluster_id: str | None = field(
        default=None, metadata=wire(NULLABLE_STRING, since=1, ignorable=True)
    )
    controller_id: int = field(default=-1, metadata=wire(INT32))
    topics: list[MetadataResponseTopic] = array_field(MetadataResponseTopic)


# --- CreateTopics (19) ----------------------------------------------------------------------------


@message
class CreatableReplicaAssignment:
    partition_index: int = field(metadata=wire(INT32))
    broker_ids: list[int] = array_field(INT32)


@message
class CreatableTopicConfig:
    name: str = field(metadata=wire(STRING))
    value: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class CreatableTopic:
    """A topic to create; -1 partitions / replication factor take the broker's defaults."""

    name: str = field(metadata=wire(STRING))
    num_partitions: int = field(default=-1, metadata=wire(INT32))
    replication_factor: int = field(default=-1, metadata=wire(INT16))
    assignments: list[CreatableReplicaAssignment] = array_field(CreatableReplicaAssignment)
    configs: list[CreatableTopicConfig] = array_field(CreatableTopicConfig)


@message
class CreateTopicsRequest:
    topics: list[CreatableTopic] = array_field(CreatableTopic)
    timeout_ms: int = field(default=60000, metadata=wire(INT32))
    validate_only: bool = field(default=False, metadata=wire(BOOL, since=1))


@message
class CreatableTopicResult:
    name: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    num_partitions: int = field(default=-1, metadata=wire(INT32))
    replication_factor: int = field(default=-1, metadata=wire(INT16))


@message
class CreateTopicsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[CreatableTopicResult] = array_field(CreatableTopicResult)


# --- DeleteTopics (20) ----------------------------------------------------------------------------


@message
class DeleteTopicsRequest:
    topic_names: list[str] = array_field(STRING)
    timeout_ms: int = field(default=60000, metadata=wire(INT32))


@message
class DeletableTopicResult:
    name: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class DeleteTopicsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    responses: list[DeletableTopicResult] = array_field(DeletableTopicResult)


# --- DescribeLogDirs (35): each replica's offsets, for `replog topics describe` ------------------


@message
class DescribableLogDirTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[int] = array_field(INT32)


@message
class DescribeLogDirsRequest:
    """The replicas this broker holds; ``topics=None`` asks for all of them."""

    topics: list[DescribableLogDirTopic] | None = field(
        default=None, metadata=wire(Array(DescribableLogDirTopic, nullable=True))
    )


@message
class DescribeLogDirsPartition:
    partition_index: int = field(metadata=wire(INT32))
    partition_size: int = field(default=0, metadata=wire(INT64))
    #: replog: how far this replica's LEO is behind its leader's (0 on the leader)
    offset_lag: int = field(default=0, metadata=wire(INT64))
    is_future_key: bool = field(default=False, metadata=wire(BOOL))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    log_end_offset: int = field(default=-1, metadata=wire(INT64))
    durable_end_offset: int = field(default=-1, metadata=wire(INT64))
    high_watermark: int = field(default=-1, metadata=wire(INT64))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    is_leader: bool = field(default=False, metadata=wire(BOOL))


@message
class DescribeLogDirsTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[DescribeLogDirsPartition] = array_field(DescribeLogDirsPartition)


@message
class DescribeLogDirsResult:
    error_code: int = field(default=0, metadata=wire(INT16))
    log_dir: str = field(default="", metadata=wire(STRING))
    topics: list[DescribeLogDirsTopic] = array_field(DescribeLogDirsTopic)


@message
class DescribeLogDirsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    results: list[DescribeLogDirsResult] = array_field(DescribeLogDirsResult)
