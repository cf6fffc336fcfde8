"""Messages between brokers and the controller: LeaderAndIsr (4), AlterPartition (56),
BrokerRegistration (62), BrokerHeartbeat (63)."""

from __future__ import annotations

import uuid
from dataclasses import field

from replication.protocol.codec import (
    BOOL,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    STRING,
    UUID,
    array_field,
    message,
    wire,
)

# --- controller to broker: LeaderAndIsr (4) -------------------------------------------------------


@message
class LeaderAndIsrPartitionState:
    partition_index: int = field(metadata=wire(INT32))
    controller_epoch: int = field(metadata=wire(INT32))
    leader: int = field(metadata=wire(INT32))
    leader_epoch: int = field(metadata=wire(INT32))
    isr: list[int] = array_field(INT32)
    partition_epoch: int = field(metadata=wire(INT32))
    replicas: list[int] = array_field(INT32)
    adding_replicas: list[int] = array_field(INT32)
    removing_replicas: list[int] = array_field(INT32)
    is_new: bool = field(default=False, metadata=wire(BOOL))


@message
class LeaderAndIsrTopicState:
    topic_name: str = field(metadata=wire(STRING))
    partition_states: list[LeaderAndIsrPartitionState] = array_field(LeaderAndIsrPartitionState)


@message
class LeaderAndIsrLiveLeader:
    broker_id: int = field(metadata=wire(INT32))
    host_name: str = field(metadata=wire(STRING))
    port: int = field(metadata=wire(INT32))


@message
class LeaderAndIsrRequest:
    """The controller tells a broker which partitions it leads or follows, at which epochs."""

    controller_id: int = field(metadata=wire(INT32))
    controller_epoch: int = field(metadata=wire(INT32))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))
    topic_states: list[LeaderAndIsrTopicState] = array_field(LeaderAndIsrTopicState)
    live_leaders: list[LeaderAndIsrLiveLeader] = array_field(LeaderAndIsrLiveLeader)


@message
class LeaderAndIsrPartitionError:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class LeaderAndIsrTopicError:
    topic_name: str = field(metadata=wire(STRING))
    partition_errors: list[LeaderAndIsrPartitionError] = array_field(LeaderAndIsrPartitionError)


@message
class LeaderAndIsrResponse:
    error_code: int = field(default=0, metadata=wire(INT16))
    topics: list[LeaderAndIsrTopicError] = array_field(LeaderAndIsrTopicError)


# --- broker to controller: AlterPartition (56) ----------------------------------------------------


@message
class AlterPartitionRequestPartition:
    partition_index: int = field(metadata=wire(INT32))
    leader_epoch: int = field(metadata=wire(INT32))
    new_isr: list[int] = array_field(INT32)
    leader_recovery_state: int = field(default=0, metadata=wire(INT8))
    partition_epoch: int = field(metadata=wire(INT32))


@message
class AlterPartitionRequestTopic:
    topic_name: str = field(metadata=wire(STRING))
    partitions: list[AlterPartitionRequestPartition] = array_field(AlterPartitionRequestPartition)


@message
class AlterPartitionRequest:
    """A leader asks the controller to commit an ISR change (checked against partition_epoch)."""

    broker_id: int = field(metadata=wire(INT32))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))
    topics: list[AlterPartitionRequestTopic] = array_field(AlterPartitionRequestTopic)


@message
class AlterPartitionResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    leader_id: int = field(default=-1, metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    isr: list[int] = array_field(INT32)
    leader_recovery_state: int = field(default=0, metadata=wire(INT8))
    partition_epoch: int = field(default=-1, metadata=wire(INT32))


@message
class AlterPartitionResponseTopic:
    topic_name: str = field(metadata=wire(STRING))
    partitions: list[AlterPartitionResponsePartition] = array_field(AlterPartitionResponsePartition)


@message
class AlterPartitionResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    topics: list[AlterPartitionResponseTopic] = array_field(AlterPartitionResponseTopic)


# --- broker lifecycle: BrokerRegistration (62), BrokerHeartbeat (63) ------------------------------


@message
class BrokerRegistrationListener:
    name: str = field(metadata=wire(STRING))
    host: str = field(metadata=wire(STRING))
    port: int = field(metadata=wire(INT32))
    security_protocol: int = field(default=0, metadata=wire(INT16))


@message
class BrokerRegistrationRequest:
    broker_id: int = field(metadata=wire(INT32))
    cluster_id: str = field(metadata=wire(STRING))
    incarnation_id: uuid.UUID = field(metadata=wire(UUID))
    listeners: list[BrokerRegistrationListener] = array_field(BrokerRegistrationListener)
    rack: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class BrokerRegistrationResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))


@message
class BrokerHeartbeatRequest:
    broker_id: int = field(metadata=wire(INT32))
    broker_epoch: int = field(metadata=wire(INT64))
    current_metadata_offset: int = field(default=-1, metadata=wire(INT64))
    want_fence: bool = field(default=False, metadata=wire(BOOL))
    want_shut_down: bool = field(default=False, metadata=wire(BOOL))


@message
class BrokerHeartbeatResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    is_caught_up: bool = field(default=False, metadata=wire(BOOL))
    is_fenced: bool = field(default=True, metadata=wire(BOOL))
    should_shut_down: bool = field(default=False, metadata=wire(BOOL))
    #: replog: the newest metadata version; the broker reads it from the metadata store
    metadata_version: int = field(default=-1, metadata=wire(INT64))
    #: replog: the epoch of the controller answering (brokers ignore stale controllers)
    controller_epoch: int = field(default=-1, metadata=wire(INT32))
