"""API keys, the request header, and protocol constants (ListOffsets timestamps, isolation
levels), as Kafka names them."""

from __future__ import annotations

from dataclasses import field
from enum import IntEnum
from typing import Final

from replication.protocol.codec import INT16, INT32, NULLABLE_STRING, message, wire

#: ListOffsets timestamps with a special meaning (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2
#: the offset and timestamp of the record with the largest timestamp (KIP-734, ListOffsets v7)
MAX_TIMESTAMP: Final = -3

#: Fetch/ListOffsets isolation levels, and the replica id of a consumer (not a broker).
READ_UNCOMMITTED: Final = 0
READ_COMMITTED: Final = 1
CONSUMER_REPLICA_ID: Final = -1


# --- API keys -----------------------------------------------------------------------------------


class ApiKey(IntEnum):
    """Kafka's API keys, for the APIs replog speaks."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    CREATE_PARTITIONS = 37
    INCREMENTAL_ALTER_CONFIGS = 44
    ELECT_LEADERS = 43
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    DESCRIBE_CLUSTER = 60
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    ALTER_PARTITION = 56
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    DESCRIBE_LOG_DIRS = 35
    FIND_COORDINATOR = 10
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    ALLOCATE_PRODUCER_IDS = 67
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    SASL_HANDSHAKE = 17
    SASL_AUTHENTICATE = 36
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    #: replog: commit a set of transactions as batch N of a sink, atomically (Spark sink)
    COMMIT_SINK_BATCH = 1001
    #: replog: the last batch of a sink that was committed
    DESCRIBE_SINK = 1002
    #: replog: where a replica's batches of an offset range are on its storage (Spark)
    DESCRIBE_LOG_OBJECTS = 1003

    @property
    def kafka_name(self) -> str:
        """Kafka's name of the API (``ApiKeys.name``): ``LEADER_AND_ISR`` -> ``LeaderAndIsr``;
        the ``request`` label of the request metrics."""
        return "".join(word.capitalize() for word in self.name.split("_"))


# --- headers ------------------------------------------------------------------------------------


@message
class RequestHeader:
    """Kafka's request header v1 (no tagged fields)."""

    api_key: int = field(metadata=wire(INT16))
    api_version: int = field(metadata=wire(INT16))
    correlation_id: int = field(metadata=wire(INT32))
    client_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
