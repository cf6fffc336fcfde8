"""Which operation on which resource each API needs, and what it answers when denied: Kafka's
checks (``KafkaApis.scala``, ``ControllerApis.scala``, ``AuthHelper``) as data.

The handlers (server/apis.py, server/group_apis.py, server/controller_apis.py, and the Kafka
listener's own handlers in kafka/apis.py) make these checks; this table is what they follow,
what docs/security.md's recipes come from, and what ``tests/test_security_authz.py`` holds them to:
every API any handler table or the Kafka listener serves must have a row, so an API added
without a thought about authorization fails CI.

Resources: Topic, Group, Cluster (the one named ``kafka-cluster``), TransactionalId. An ALLOW
of Read, Write, Delete or Alter implies Describe, and AlterConfigs implies DescribeConfigs
(the authorizer applies that). "filter" means names the principal may not see are left out
of the answer, as Kafka's listings do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from replication.protocol.api import ApiKey
from replication.security.acl import AclOperation, ResourceType

__all__ = ["REQUIRED", "Check"]

_R = ResourceType
_O = AclOperation


@dataclass(frozen=True, slots=True)
class Check:
    """One check of an API: ``operation`` on ``resource_type``, the resource named by ``on``
    (a field of the request, or ``kafka-cluster``); ``when`` says when it applies (empty:
    always); ``denied`` is what the answer carries when it fails."""

    operation: AclOperation
    resource_type: ResourceType
    on: str
    denied: str
    when: str = ""


def _c(op: AclOperation, rt: ResourceType, on: str, denied: str, when: str = "") -> Check:
    return Check(op, rt, on, denied, when)


_CLUSTER = "kafka-cluster"
_TOPIC_FAILED = "TOPIC_AUTHORIZATION_FAILED"
_GROUP_FAILED = "GROUP_AUTHORIZATION_FAILED"
_CLUSTER_FAILED = "CLUSTER_AUTHORIZATION_FAILED"
_TXN_FAILED = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


def _config_checks(op: AclOperation) -> tuple[Check, ...]:
    """The checks of the config APIs: ``op`` on each resource, a topic or the cluster (for a
    broker resource)."""
    return (
        _c(
            op,
            _R.TOPIC,
            "resources[].resource_name",
            f"{_TOPIC_FAILED} per resource",
            when="a topic resource",
        ),
        _c(op, _R.CLUSTER, _CLUSTER, f"{_CLUSTER_FAILED} per resource", when="a broker resource"),
    )


#: Every API: the checks it makes, in order. An empty tuple: none (before authentication, or
#: nothing to protect).
REQUIRED: Final[dict[ApiKey, tuple[Check, ...]]] = {
    # --- no checks ------------------------------------------------------------------------------
    ApiKey.API_VERSIONS: (),
    ApiKey.SASL_HANDSHAKE: (),
    ApiKey.SASL_AUTHENTICATE: (),
    # the answer's authorized-operations field would need Describe Cluster; replog sends none
    ApiKey.DESCRIBE_CLUSTER: (),
    # --- records ----------------------------------------------------------------------------
    ApiKey.PRODUCE: (
        _c(
            _O.WRITE,
            _R.TRANSACTIONAL_ID,
            "transactional_id",
            f"{_TXN_FAILED} on every partition",
            when="a transactional id (or transactional batches)",
        ),
        _c(_O.WRITE, _R.TOPIC, "topic_data[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    ApiKey.FETCH: (
        _c(
            _O.READ,
            _R.TOPIC,
            "topics[].topic",
            f"{_TOPIC_FAILED} per partition",
            when="a consumer (replica_id < 0)",
        ),
        _c(
            _O.CLUSTER_ACTION,
            _R.CLUSTER,
            _CLUSTER,
            f"{_TOPIC_FAILED} on every partition",
            when="a follower (replica_id >= 0; the Kafka listener forces -1)",
        ),
    ),
    ApiKey.LIST_OFFSETS: (
        _c(_O.DESCRIBE, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (
        # Kafka: ClusterAction (not logged when denied) or else Describe on each topic
        _c(_O.CLUSTER_ACTION, _R.CLUSTER, _CLUSTER, "then the topic check"),
        _c(
            _O.DESCRIBE,
            _R.TOPIC,
            "topics[].topic",
            f"{_TOPIC_FAILED} per partition",
            when="without ClusterAction",
        ),
    ),
    ApiKey.DELETE_RECORDS: (
        _c(_O.DELETE, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    ApiKey.DESCRIBE_PRODUCERS: (
        _c(_O.READ, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    # --- metadata and topics ------------------------------------------------------------------
    ApiKey.METADATA: (
        _c(_O.DESCRIBE, _R.TOPIC, "topics[].name", f"named: {_TOPIC_FAILED}; all topics: filter"),
        _c(
            _O.CREATE,
            _R.CLUSTER,
            _CLUSTER,
            "then Create Topic",
            when="auto-creating a missing topic",
        ),
        _c(
            _O.CREATE,
            _R.TOPIC,
            "topics[].name",
            _TOPIC_FAILED,
            when="auto-creating a missing topic without Create Cluster",
        ),
    ),
    ApiKey.CREATE_TOPICS: (
        _c(_O.CREATE, _R.CLUSTER, _CLUSTER, "then Create Topic"),
        _c(
            _O.CREATE,
            _R.TOPIC,
            "topics[].name",
            f"{_TOPIC_FAILED} per topic",
            when="without Create Cluster",
        ),
    ),
    ApiKey.DELETE_TOPICS: (_c(_O.DELETE, _R.TOPIC, "topic_names[]", f"{_TOPIC_FAILED} per topic"),),
    ApiKey.CREATE_PARTITIONS: (
        _c(_O.ALTER, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per topic"),
    ),
    ApiKey.DESCRIBE_CONFIGS: _config_checks(_O.DESCRIBE_CONFIGS),
    ApiKey.ALTER_CONFIGS: _config_checks(_O.ALTER_CONFIGS),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _config_checks(_O.ALTER_CONFIGS),
    ApiKey.DESCRIBE_LOG_DIRS: (
        _c(_O.DESCRIBE, _R.CLUSTER, _CLUSTER, f"{_CLUSTER_FAILED} (top level)"),
        # replog: a log dir is where direct segment reads start, so it shows only topics the
        # principal may read
        _c(_O.READ, _R.TOPIC, "the topics of the answer", "filter"),
    ),
    ApiKey.ELECT_LEADERS: (_c(_O.ALTER, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (_c(_O.ALTER, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (_c(_O.DESCRIBE, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    ApiKey.UNREGISTER_BROKER: (_c(_O.ALTER, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    # --- groups ------------------------------------------------------------------------------
    ApiKey.FIND_COORDINATOR: (
        _c(_O.DESCRIBE, _R.GROUP, "key", f"{_GROUP_FAILED} (per key)", when="key_type 0"),
        _c(_O.DESCRIBE, _R.TRANSACTIONAL_ID, "key", f"{_TXN_FAILED} (per key)", when="key_type 1"),
    ),
    ApiKey.JOIN_GROUP: (_c(_O.READ, _R.GROUP, "group_id", _GROUP_FAILED),),
    ApiKey.SYNC_GROUP: (_c(_O.READ, _R.GROUP, "group_id", _GROUP_FAILED),),
    ApiKey.HEARTBEAT: (_c(_O.READ, _R.GROUP, "group_id", _GROUP_FAILED),),
    ApiKey.LEAVE_GROUP: (_c(_O.READ, _R.GROUP, "group_id", _GROUP_FAILED),),
    ApiKey.OFFSET_COMMIT: (
        _c(_O.READ, _R.GROUP, "group_id", f"{_GROUP_FAILED} on every partition"),
        _c(_O.READ, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    ApiKey.OFFSET_FETCH: (
        _c(_O.DESCRIBE, _R.GROUP, "group_id", f"{_GROUP_FAILED} (top level)"),
        _c(
            _O.DESCRIBE,
            _R.TOPIC,
            "topics[].name",
            f"named: {_TOPIC_FAILED} per partition; all: filter",
        ),
    ),
    ApiKey.DESCRIBE_GROUPS: (_c(_O.DESCRIBE, _R.GROUP, "groups[]", f"{_GROUP_FAILED} per group"),),
    ApiKey.LIST_GROUPS: (
        _c(_O.DESCRIBE, _R.CLUSTER, _CLUSTER, "then the group filter"),
        _c(_O.DESCRIBE, _R.GROUP, "each group", "filter", when="without Describe Cluster"),
    ),
    ApiKey.DELETE_GROUPS: (
        _c(_O.DELETE, _R.GROUP, "groups_names[]", f"{_GROUP_FAILED} per group"),
    ),
    ApiKey.OFFSET_DELETE: (
        _c(_O.DELETE, _R.GROUP, "group_id", f"{_GROUP_FAILED} (top level)"),
        _c(_O.READ, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (
        _c(_O.READ, _R.GROUP, "group_id", _GROUP_FAILED),
        _c(_O.DESCRIBE, _R.TOPIC, "subscribed_topic_names[]", f"{_TOPIC_FAILED} (top level)"),
    ),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (
        _c(_O.DESCRIBE, _R.GROUP, "group_ids[]", f"{_GROUP_FAILED} per group"),
    ),
    # --- transactions -------------------------------------------------------------------------
    ApiKey.INIT_PRODUCER_ID: (
        _c(
            _O.WRITE,
            _R.TRANSACTIONAL_ID,
            "transactional_id",
            _TXN_FAILED,
            when="a transactional id",
        ),
        # KIP-679: idempotence needs IdempotentWrite on the cluster or Write on any topic
        _c(
            _O.IDEMPOTENT_WRITE,
            _R.CLUSTER,
            _CLUSTER,
            "then Write on any topic",
            when="no transactional id",
        ),
        _c(
            _O.WRITE,
            _R.TOPIC,
            "any topic",
            _CLUSTER_FAILED,
            when="no transactional id, without IdempotentWrite",
        ),
    ),
    ApiKey.ADD_PARTITIONS_TO_TXN: (
        _c(_O.WRITE, _R.TRANSACTIONAL_ID, "transactional_id", f"{_TXN_FAILED} on every partition"),
        _c(
            _O.WRITE,
            _R.TOPIC,
            "topics[].name",
            f"{_TOPIC_FAILED} per partition, OPERATION_NOT_ATTEMPTED on the others",
        ),
    ),
    ApiKey.ADD_OFFSETS_TO_TXN: (
        _c(_O.WRITE, _R.TRANSACTIONAL_ID, "transactional_id", _TXN_FAILED),
        _c(_O.READ, _R.GROUP, "group_id", _GROUP_FAILED),
    ),
    ApiKey.END_TXN: (_c(_O.WRITE, _R.TRANSACTIONAL_ID, "transactional_id", _TXN_FAILED),),
    ApiKey.TXN_OFFSET_COMMIT: (
        _c(_O.WRITE, _R.TRANSACTIONAL_ID, "transactional_id", f"{_TXN_FAILED} on every partition"),
        _c(_O.READ, _R.GROUP, "group_id", f"{_GROUP_FAILED} on every partition"),
        _c(_O.READ, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    ApiKey.WRITE_TXN_MARKERS: (
        _c(_O.CLUSTER_ACTION, _R.CLUSTER, _CLUSTER, f"{_CLUSTER_FAILED} on every partition"),
    ),
    ApiKey.DESCRIBE_TRANSACTIONS: (
        _c(_O.DESCRIBE, _R.TRANSACTIONAL_ID, "transactional_ids[]", f"{_TXN_FAILED} per id"),
        _c(_O.DESCRIBE, _R.TOPIC, "the partitions of the answer", "filter"),
    ),
    ApiKey.LIST_TRANSACTIONS: (
        _c(_O.DESCRIBE, _R.TRANSACTIONAL_ID, "each transactional id", "filter"),
    ),
    # replog's sink: committing a batch of sink S marks S's batch committed, which decides what
    # S's replays abort; so the sink's own id is checked too, not only the transactions'
    ApiKey.COMMIT_SINK_BATCH: (
        _c(_O.WRITE, _R.TRANSACTIONAL_ID, "transactions[].transactional_id", _TXN_FAILED),
        _c(_O.WRITE, _R.TRANSACTIONAL_ID, "replog-sink/<sink_id>", _TXN_FAILED),
    ),
    ApiKey.DESCRIBE_SINK: (
        _c(_O.DESCRIBE, _R.TRANSACTIONAL_ID, "replog-sink/<sink_id>", _TXN_FAILED),
    ),
    # replog: where a replica's batches are on storage, as DescribeLogDirs (which it refines):
    # the answer leads to the topic's bytes, so Read on each topic too
    ApiKey.DESCRIBE_LOG_OBJECTS: (
        _c(_O.DESCRIBE, _R.CLUSTER, _CLUSTER, f"{_CLUSTER_FAILED} (top level)"),
        _c(_O.READ, _R.TOPIC, "topics[].name", f"{_TOPIC_FAILED} per partition"),
    ),
    # --- ACLs and SCRAM credentials (answered by the controller) ------------------------------
    ApiKey.DESCRIBE_ACLS: (
        _c(
            _O.DESCRIBE,
            _R.CLUSTER,
            _CLUSTER,
            f"{_CLUSTER_FAILED}; SECURITY_DISABLED without an authorizer",
        ),
    ),
    ApiKey.CREATE_ACLS: (
        _c(
            _O.ALTER,
            _R.CLUSTER,
            _CLUSTER,
            f"{_CLUSTER_FAILED} per entry; SECURITY_DISABLED without an authorizer",
        ),
    ),
    ApiKey.DELETE_ACLS: (
        _c(
            _O.ALTER,
            _R.CLUSTER,
            _CLUSTER,
            f"{_CLUSTER_FAILED} per filter; SECURITY_DISABLED without an authorizer",
        ),
    ),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (
        _c(_O.DESCRIBE, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),
    ),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (_c(_O.ALTER, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (
        _c(_O.DESCRIBE_CONFIGS, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),
    ),
    ApiKey.ALTER_CLIENT_QUOTAS: (
        _c(_O.ALTER_CONFIGS, _R.CLUSTER, _CLUSTER, f"{_CLUSTER_FAILED} per entry"),
    ),
    # --- between brokers and controllers ------------------------------------------------------
    ApiKey.LEADER_AND_ISR: (  # not served (KRaft has none); listed for completeness
        _c(_O.CLUSTER_ACTION, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),
    ),
    ApiKey.BROKER_REGISTRATION: (_c(_O.CLUSTER_ACTION, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    ApiKey.BROKER_HEARTBEAT: (_c(_O.CLUSTER_ACTION, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    ApiKey.ALTER_PARTITION: (_c(_O.CLUSTER_ACTION, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
    ApiKey.ALLOCATE_PRODUCER_IDS: (_c(_O.CLUSTER_ACTION, _R.CLUSTER, _CLUSTER, _CLUSTER_FAILED),),
}
