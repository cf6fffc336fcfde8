"""Messages of partition reassignment and leader election: ElectLeaders (43),
AlterPartitionReassignments (45), ListPartitionReassignments (46) and UnregisterBroker (64), as
Kafka's (KIP-455, KIP-460), without tagged fields.

replog's AlterPartitionReassignments carries one field Kafka's does not: ``throttled_rate``,
the bytes/s the new replicas of these partitions fetch at while they catch up (0: no throttle
beyond the brokers' follower.replication.throttled.rate). It is kept on each partition's state
in the metadata image until the move completes or is cancelled.
"""

from __future__ import annotations

from dataclasses import field

from replication.protocol.codec import (
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

#: ElectLeaders election types (Kafka's ElectionType)
PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1

# --- AlterPartitionReassignments (45) -----------------------------------------------------------


@message
class ReassignablePartition:
    """Move a partition to ``replicas`` (None: cancel its reassignment in progress)."""

    partition_index: int = field(metadata=wire(INT32))
    replicas: list[int] | None = field(default=None, metadata=wire(Array(INT32, nullable=True)))


@message
class ReassignableTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[ReassignablePartition] = array_field(ReassignablePartition)


@message
class AlterPartitionReassignmentsRequest:
    timeout_ms: int = field(default=60_000, metadata=wire(INT32))
    topics: list[ReassignableTopic] = array_field(ReassignableTopic)
    #: replog: bytes/s the adding replicas fetch at while they catch up (0: no throttle)
    throttled_rate: int = field(default=0, metadata=wire(INT64))


@message
class ReassignablePartitionResponse:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class ReassignableTopicResponse:
    name: str = field(metadata=wire(STRING))
    partitions: list[ReassignablePartitionResponse] = array_field(ReassignablePartitionResponse)


@message
class AlterPartitionReassignmentsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    responses: list[ReassignableTopicResponse] = array_field(ReassignableTopicResponse)


# --- ListPartitionReassignments (46) ------------------------------------------------------------


@message
class ListPartitionReassignmentsTopics:
    name: str = field(metadata=wire(STRING))
    partition_indexes: list[int] = array_field(INT32)


@message
class ListPartitionReassignmentsRequest:
    timeout_ms: int = field(default=60_000, metadata=wire(INT32))
    #: None: every reassignment in progress
    topics: list[ListPartitionReassignmentsTopics] | None = field(
        default=None, metadata=wire(Array(ListPartitionReassignmentsTopics, nullable=True))
    )


@message
class OngoingPartitionReassignment:
    partition_index: int = field(metadata=wire(INT32))
    replicas: list[int] = array_field(INT32)
    adding_replicas: list[int] = array_field(INT32)
    removing_replicas: list[int] = array_field(INT32)


@message
class OngoingTopicReassignment:
    name: str = field(metadata=wire(STRING))
    partitions: list[OngoingPartitionReassignment] = array_field(OngoingPartitionReassignment)


@message
class ListPartitionReassignmentsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    topics: list[OngoingTopicReassignment] = array_field(OngoingTopicReassignment)


# --- ElectLeaders (43) --------------------------------------------------------------------------


@message
class ElectLeadersTopicPartitions:
    topic: str = field(metadata=wire(STRING))
    partitions: list[int] = array_field(INT32)


@message
class ElectLeadersRequest:
    election_type: int = field(default=PREFERRED_ELECTION, metadata=wire(INT8))
    #: None: every partition
    topic_partitions: list[ElectLeadersTopicPartitions] | None = field(
        default=None, metadata=wire(Array(ElectLeadersTopicPartitions, nullable=True))
    )
    timeout_ms: int = field(default=60_000, metadata=wire(INT32))


@message
class ElectLeadersPartitionResult:
    partition_id: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class ElectLeadersReplicaElectionResult:
    topic: str = field(metadata=wire(STRING))
    partition_result: list[ElectLeadersPartitionResult] = array_field(ElectLeadersPartitionResult)


@message
class ElectLeadersResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    replica_election_results: list[ElectLeadersReplicaElectionResult] = array_field(
        ElectLeadersReplicaElectionResult
    )


# --- UnregisterBroker (64) ----------------------------------------------------------------------


@message
class UnregisterBrokerRequest:
    broker_id: int = field(metadata=wire(INT32))


@message
class UnregisterBrokerResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
