"""Messages of the consumer group APIs, as Kafka's classic group protocol: JoinGroup (11),
SyncGroup (14), Heartbeat (12), LeaveGroup (13), OffsetCommit (8), OffsetFetch (9),
ListGroups (16), DescribeGroups (15), DeleteGroups (42), OffsetDelete (47): a group's offsets of
some partitions, and TxnOffsetCommit (28): offsets committed inside a transaction
(``send_offsets_to_transaction``); and the consumer group protocol's (KIP-848)
ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69), at v1.

Field names and order are Kafka's (JoinGroup v5, SyncGroup v3, Heartbeat v3, LeaveGroup v3,
OffsetCommit v7, OffsetFetch v7, ListGroups v3, DescribeGroups v4, DeleteGroups v1: the last
versions before flexible encodings). FindCoordinator (10) with ``key_type`` 0 finds a group's
coordinator.
"""

from __future__ import annotations

import uuid
from dataclasses import field

from replication.protocol.codec import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    STRING,
    UUID,
    Array,
    array_field,
    message,
    wire,
)

#: FindCoordinator key types
GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1

#: OffsetCommit's generation and member of a commit from outside the group (``assign()``)
NO_GENERATION = -1
NO_MEMBER_ID = ""

# --- JoinGroup (11) ---------------------------------------------------------------------------


@message
class JoinGroupRequestProtocol:
    name: str = field(metadata=wire(STRING))
    metadata: bytes = field(default=b"", metadata=wire(BYTES))


@message
class JoinGroupRequest:
    group_id: str = field(metadata=wire(STRING))
    session_timeout_ms: int = field(default=45000, metadata=wire(INT32))
    rebalance_timeout_ms: int = field(default=300000, metadata=wire(INT32))
    member_id: str = field(default="", metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    protocol_type: str = field(default="consumer", metadata=wire(STRING))
    protocols: list[JoinGroupRequestProtocol] = array_field(JoinGroupRequestProtocol)


@message
class JoinGroupResponseMember:
    member_id: str = field(metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    metadata: bytes = field(default=b"", metadata=wire(BYTES))


@message
class JoinGroupResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    generation_id: int = field(default=-1, metadata=wire(INT32))
    protocol_name: str = field(default="", metadata=wire(STRING))
    leader: str = field(default="", metadata=wire(STRING))
    member_id: str = field(default="", metadata=wire(STRING))
    #: every member's metadata, for the leader only (empty for the others)
    members: list[JoinGroupResponseMember] = array_field(JoinGroupResponseMember)


# --- SyncGroup (14) ---------------------------------------------------------------------------


@message
class SyncGroupRequestAssignment:
    member_id: str = field(metadata=wire(STRING))
    assignment: bytes = field(default=b"", metadata=wire(BYTES))


@message
class SyncGroupRequest:
    group_id: str = field(metadata=wire(STRING))
    generation_id: int = field(metadata=wire(INT32))
    member_id: str = field(metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    #: the leader's assignment of every member; empty from the others
    assignments: list[SyncGroupRequestAssignment] = array_field(SyncGroupRequestAssignment)


@message
class SyncGroupResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    assignment: bytes = field(default=b"", metadata=wire(BYTES))


# --- Heartbeat (12), LeaveGroup (13) ----------------------------------------------------------


@message
class HeartbeatRequest:
    group_id: str = field(metadata=wire(STRING))
    generation_id: int = field(metadata=wire(INT32))
    member_id: str = field(metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class HeartbeatResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class MemberIdentity:
    member_id: str = field(metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class LeaveGroupRequest:
    group_id: str = field(metadata=wire(STRING))
    members: list[MemberIdentity] = array_field(MemberIdentity)


@message
class MemberResponse:
    member_id: str = field(metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class LeaveGroupResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    members: list[MemberResponse] = array_field(MemberResponse)


# --- OffsetCommit (8), OffsetFetch (9) --------------------------------------------------------


@message
class OffsetCommitRequestPartition:
    partition_index: int = field(metadata=wire(INT32))
    committed_offset: int = field(metadata=wire(INT64))
    committed_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    committed_metadata: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class OffsetCommitRequestTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[OffsetCommitRequestPartition] = array_field(OffsetCommitRequestPartition)


@message
class OffsetCommitRequest:
    group_id: str = field(metadata=wire(STRING))
    generation_id: int = field(default=NO_GENERATION, metadata=wire(INT32))
    member_id: str = field(default=NO_MEMBER_ID, metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    topics: list[OffsetCommitRequestTopic] = array_field(OffsetCommitRequestTopic)


@message
class OffsetCommitResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class OffsetCommitResponseTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[OffsetCommitResponsePartition] = array_field(OffsetCommitResponsePartition)


@message
class OffsetCommitResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[OffsetCommitResponseTopic] = array_field(OffsetCommitResponseTopic)


@message
class OffsetFetchRequestTopic:
    name: str = field(metadata=wire(STRING))
    partition_indexes: list[int] = array_field(INT32)


@message
class OffsetFetchRequest:
    group_id: str = field(metadata=wire(STRING))
    #: null: every partition the group has an offset for
    topics: list[OffsetFetchRequestTopic] | None = field(
        default=None, metadata=wire(Array(OffsetFetchRequestTopic, nullable=True))
    )
    require_stable: bool = field(default=False, metadata=wire(BOOL))


@message
class OffsetFetchResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    committed_offset: int = field(default=-1, metadata=wire(INT64))
    committed_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    metadata: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class OffsetFetchResponseTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[OffsetFetchResponsePartition] = array_field(OffsetFetchResponsePartition)


@message
class OffsetFetchResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[OffsetFetchResponseTopic] = array_field(OffsetFetchResponseTopic)
    error_code: int = field(default=0, metadata=wire(INT16))


# --- ListGroups (16), DescribeGroups (15), DeleteGroups (42) ----------------------------------


@message
class ListGroupsRequest:
    #: only groups in these states (empty: all), ListGroups v4
    states_filter: list[str] = array_field(STRING)
    #: only groups of these types, "classic" or "consumer" (empty: all), ListGroups v5
    types_filter: list[str] = array_field(STRING)


@message
class ListedGroup:
    group_id: str = field(metadata=wire(STRING))
    protocol_type: str = field(default="", metadata=wire(STRING))
    group_state: str = field(default="", metadata=wire(STRING))
    group_type: str = field(default="", metadata=wire(STRING))


@message
class ListGroupsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    groups: list[ListedGroup] = array_field(ListedGroup)


@message
class DescribeGroupsRequest:
    groups: list[str] = array_field(STRING)
    include_authorized_operations: bool = field(default=False, metadata=wire(BOOL))


@message
class DescribedGroupMember:
    member_id: str = field(metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    client_id: str = field(default="", metadata=wire(STRING))
    client_host: str = field(default="", metadata=wire(STRING))
    member_metadata: bytes = field(default=b"", metadata=wire(BYTES))
    member_assignment: bytes = field(default=b"", metadata=wire(BYTES))


@message
class DescribedGroup:
    error_code: int = field(default=0, metadata=wire(INT16))
    group_id: str = field(default="", metadata=wire(STRING))
    group_state: str = field(default="", metadata=wire(STRING))
    protocol_type: str = field(default="", metadata=wire(STRING))
    protocol_data: str = field(default="", metadata=wire(STRING))
    members: list[DescribedGroupMember] = array_field(DescribedGroupMember)
    authorized_operations: int = field(default=-2147483648, metadata=wire(INT32))


@message
class DescribeGroupsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    groups: list[DescribedGroup] = array_field(DescribedGroup)


@message
class DeleteGroupsRequest:
    groups_names: list[str] = array_field(STRING)


@message
class DeletableGroupResult:
    group_id: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class DeleteGroupsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    results: list[DeletableGroupResult] = array_field(DeletableGroupResult)


# --- OffsetDelete (47) -------------------------------------------------------------------------


@message
class OffsetDeleteRequestPartition:
    partition_index: int = field(metadata=wire(INT32))


@message
class OffsetDeleteRequestTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[OffsetDeleteRequestPartition] = array_field(OffsetDeleteRequestPartition)


@message
class OffsetDeleteRequest:
    group_id: str = field(metadata=wire(STRING))
    topics: list[OffsetDeleteRequestTopic] = array_field(OffsetDeleteRequestTopic)


@message
class OffsetDeleteResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class OffsetDeleteResponseTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[OffsetDeleteResponsePartition] = array_field(OffsetDeleteResponsePartition)


@message
class OffsetDeleteResponse:
    #: the group's error (not found, not empty, not authorized, not its coordinator)
    error_code: int = field(default=0, metadata=wire(INT16))
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[OffsetDeleteResponseTopic] = array_field(OffsetDeleteResponseTopic)


# --- TxnOffsetCommit (28) -----------------------------------------------------------------------


@message
class TxnOffsetCommitRequest:
    """Offsets committed as part of a transaction: visible once its commit marker is written
    to the group's offsets partition, never if it aborts (Kafka's TxnOffsetCommit v3)."""

    transactional_id: str = field(metadata=wire(STRING))
    group_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    generation_id: int = field(default=NO_GENERATION, metadata=wire(INT32))
    member_id: str = field(default=NO_MEMBER_ID, metadata=wire(STRING))
    group_instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    topics: list[OffsetCommitRequestTopic] = array_field(OffsetCommitRequestTopic)


@message
class TxnOffsetCommitResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[OffsetCommitResponseTopic] = array_field(OffsetCommitResponseTopic)


# --- ConsumerGroupHeartbeat (68), ConsumerGroupDescribe (69): KIP-848 ------------------------


@message
class ConsumerGroupTopicPartitions:
    topic_id: uuid.UUID = field(metadata=wire(UUID))
    partitions: list[int] = array_field(INT32)


@message
class ConsumerGroupHeartbeatRequest:
    group_id: str = field(metadata=wire(STRING))
    member_id: str = field(default="", metadata=wire(STRING))
    #: 0 to join, -1 to leave, -2 for a static member that will come back
    member_epoch: int = field(default=0, metadata=wire(INT32))
    instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    rack_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    #: -1: unchanged since the last heartbeat (as every null field below)
    rebalance_timeout_ms: int = field(default=-1, metadata=wire(INT32))
    subscribed_topic_names: list[str] | None = field(
        default=None, metadata=wire(Array(STRING, nullable=True))
    )
    subscribed_topic_regex: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    server_assignor: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    #: the partitions the member owns
    topic_partitions: list[ConsumerGroupTopicPartitions] | None = field(
        default=None, metadata=wire(Array(ConsumerGroupTopicPartitions, nullable=True))
    )


@message
class ConsumerGroupHeartbeatResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    member_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    member_epoch: int = field(default=0, metadata=wire(INT32))
    heartbeat_interval_ms: int = field(default=0, metadata=wire(INT32))
    #: the member's partitions (Kafka's nullable Assignment struct: null when unchanged)
    assignment: list[ConsumerGroupTopicPartitions] | None = field(
        default=None, metadata=wire(Array(ConsumerGroupTopicPartitions, nullable=True))
    )


@message
class ConsumerGroupDescribeRequest:
    group_ids: list[str] = array_field(STRING)
    include_authorized_operations: bool = field(default=False, metadata=wire(BOOL))


@message
class DescribedTopicPartitions:
    topic_id: uuid.UUID = field(metadata=wire(UUID))
    topic_name: str = field(default="", metadata=wire(STRING))
    partitions: list[int] = array_field(INT32)


@message
class DescribedAssignment:
    topic_partitions: list[DescribedTopicPartitions] = array_field(DescribedTopicPartitions)


@message
class ConsumerGroupDescribedMember:
    member_id: str = field(metadata=wire(STRING))
    instance_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    rack_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    member_epoch: int = field(default=0, metadata=wire(INT32))
    client_id: str = field(default="", metadata=wire(STRING))
    client_host: str = field(default="", metadata=wire(STRING))
    subscribed_topic_names: list[str] = array_field(STRING)
    subscribed_topic_regex: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    assignment: DescribedAssignment = field(
        default_factory=DescribedAssignment, metadata=wire(DescribedAssignment)
    )
    target_assignment: DescribedAssignment = field(
        default_factory=DescribedAssignment, metadata=wire(DescribedAssignment)
    )
    #: 1: a member of the consumer protocol (0: classic), ConsumerGroupDescribe v1
    member_type: int = field(default=1, metadata=wire(INT8))


@message
class ConsumerGroupDescribedGroup:
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    group_id: str = field(default="", metadata=wire(STRING))
    group_state: str = field(default="", metadata=wire(STRING))
    group_epoch: int = field(default=0, metadata=wire(INT32))
    assignment_epoch: int = field(default=0, metadata=wire(INT32))
    assignor_name: str = field(default="", metadata=wire(STRING))
    members: list[ConsumerGroupDescribedMember] = array_field(ConsumerGroupDescribedMember)
    authorized_operations: int = field(default=-2147483648, metadata=wire(INT32))


@message
class ConsumerGroupDescribeResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    groups: list[ConsumerGroupDescribedGroup] = array_field(ConsumerGroupDescribedGroup)
