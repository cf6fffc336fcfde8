"""The authorization matrix's cases (tests/test_security_authz_matrix.py): for every API a
broker serves, the request ``User:alice`` sends, to which node, how its refusal looks, and the
ACLs that let it through; with the raw authenticated connections they go over."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from logstore.batch import Record, build
from replication import protocol as p
from replication.client import Admin
from replication.client.config import ClientConfig, load
from replication.client.connection import BrokerConnection
from replication.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    OperationNotAttemptedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from replication.protocol import acls as pa
from replication.protocol import quotas as pq
from replication.protocol.framing import _APIS
from replication.security.acl import (
    CLUSTER_NAME,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from replication.security.api_acls import REQUIRED
from replication.security.connector import client_login_factory, client_ssl_context
from replication.server.controller_apis import FORWARDED_APIS
from tests.cluster import Cluster
from tests.security_env import SecurityEnv

TOPIC_DENIED = TopicAuthorizationFailedError.code
GROUP_DENIED = GroupAuthorizationFailedError.code
CLUSTER_DENIED = ClusterAuthorizationFailedError.code
TXN_DENIED = TransactionalIdAuthorizationFailedError.code
AUTH_CODES = {TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED}
NOT_ATTEMPTED = OperationNotAttemptedError.code

#: no checks (before authentication, or nothing to protect): security/api_acls.py
EXEMPT = {k for k, checks in REQUIRED.items() if not checks}
#: replog's answer to each API (to read the Kafka listener's answers as replog's)
RESPONSES = {key: api.response for key, api in _APIS.items()}

ALICE = "User:alice"
T = "matrix"  # records, offsets, configs
TRIM = "matrix-trim"  # DeleteRecords
GROW = "matrix-grow"  # CreatePartitions
DOOMED = "matrix-doomed"  # DeleteTopics
NEW = "matrix-new"  # CreateTopics
G = "matrix-group"  # committed offsets
DOOMED_GROUP = "matrix-doomed-group"
TRIMMED_GROUP = "matrix-trimmed-group"  # OffsetDelete
KIP848_GROUP = "matrix-kip848-group"  # the consumer group protocol's
TX = "matrix-tx"
SINK = "matrix-sink"
FAKE_BROKER = 42

Op = AclOperation
RT = ResourceType


def client_config(env: SecurityEnv, user: str) -> dict[str, Any]:
    settings: dict[str, Any] = {"sasl.username": user, "sasl.password": env.users[user]}
    return env.client_config("SASL_SSL", **settings)


def connect(env: SecurityEnv, address: str, user: str) -> BrokerConnection:
    """A raw authenticated connection (SASL_SSL, SCRAM-SHA-512) as ``user``."""
    config = load(ClientConfig, client_config(env, user), {"bootstrap_servers": address})
    host, port = address.rsplit(":", 1)
    return BrokerConnection(
        host,
        int(port),
        f"matrix-{user}",
        30_000,
        ssl_context=client_ssl_context(config),
        sasl=client_login_factory(config),
    )


def served(conn: BrokerConnection) -> set[p.ApiKey]:
    """The APIs the broker says it serves (its ApiVersions answer, read on connecting)."""
    conn.max_version(p.ApiKey.API_VERSIONS)
    unknown = set(conn.api_versions) - set(map(int, p.ApiKey))
    assert not unknown, f"the broker serves APIs this test does not know: {sorted(unknown)}"
    return {p.ApiKey(k) for k in conn.api_versions}


def send(conn: BrokerConnection, api: p.ApiKey, body: Any) -> Any:
    return conn.send(api, conn.max_version(api), body)


def error_codes(message: Any) -> list[int]:
    """Every error code in an answer, at any depth."""
    out: list[int] = []
    if is_dataclass(message) and not isinstance(message, type):
        for f in fields(message):
            value = getattr(message, f.name)
            if f.name.endswith("error_code") and isinstance(value, int):
                out.append(value)
            else:
                out.extend(error_codes(value))
    elif isinstance(message, list | tuple):
        for item in message:
            out.extend(error_codes(item))
    return out


# --- the cases ---------------------------------------------------------------------------------


@dataclass
class Ctx:
    """What the cases need: connections as alice to every node, the admin, the cluster."""

    env: SecurityEnv
    cluster: Cluster
    admin: Admin
    alice: dict[str, BrokerConnection] = field(default_factory=dict)
    producer_id: int = -1
    producer_epoch: int = 0

    def as_alice(self, address: str) -> BrokerConnection:
        if address not in self.alice:
            self.alice[address] = connect(self.env, address, "alice")
        return self.alice[address]

    def address(self, node_id: int) -> str:
        if node_id == self.cluster.controller.broker_id:
            return self.cluster.controller.bootstrap
        return self.cluster.brokers[node_id].bootstrap

    def leader(self, topic: str) -> str:
        return self.address(self.admin.describe_topic(topic).partitions[0].leader)

    def coordinator(self, key: str, key_type: int) -> str:
        with closing(connect(self.env, self.cluster.brokers[0].bootstrap, "admin")) as conn:
            response = send(
                conn,
                p.ApiKey.FIND_COORDINATOR,
                p.FindCoordinatorRequest(key=key, key_type=key_type),
            )
        assert response.error_code == 0, response
        return f"{response.host}:{response.port}"

    def any_broker(self) -> str:
        return self.cluster.brokers[1].bootstrap


@dataclass
class Case:
    """One row of the matrix: the request alice sends, where to, how its refusal looks, and
    the ACLs (operation, resource type, name) that let it through."""

    name: str
    api: p.ApiKey
    request: Callable[[Ctx], Any]
    target: Callable[[Ctx], str]
    grants: list[tuple[AclOperation, ResourceType, str]]
    #: for listings: True when the answer shows nothing alice may not see
    filtered: Callable[[Any], bool] | None = None
    #: extra expectations of the allowed answer (beyond "no authorization error")
    allowed: Callable[[Any], bool] = lambda response: True
    #: the one error code the refusal must carry (None: any authorization error)
    denied_code: int | None = None


def records() -> bytes:
    return build([Record(None, b"alice-was-here", 1)])


def produce_request(_: Ctx) -> Any:
    return p.ProduceRequest(
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            p.ProduceRequestTopic(
                name=T, partition_data=[p.ProduceRequestPartition(index=0, records=records())]
            )
        ],
    )


def fetch_request(replica_id: int, topic: str = T) -> Callable[[Ctx], Any]:
    def build_it(_: Ctx) -> Any:
        return p.FetchRequest(
            replica_id=replica_id,
            max_wait_ms=0,
            topics=[
                p.FetchRequestTopic(
                    topic=topic,
                    partitions=[
                        p.FetchRequestPartition(
                            partition=0, fetch_offset=0, partition_max_bytes=1 << 20
                        )
                    ],
                )
            ],
        )

    return build_it


def epochs_request(replica_id: int) -> Callable[[Ctx], Any]:
    def build_it(_: Ctx) -> Any:
        return p.OffsetsForLeaderEpochRequest(
            replica_id=replica_id,
            topics=[
                p.OffsetForLeaderTopic(
                    topic=T, partitions=[p.OffsetForLeaderPartition(partition=0, leader_epoch=0)]
                )
            ],
        )

    return build_it


def join_request(group: str) -> p.JoinGroupRequest:
    return p.JoinGroupRequest(
        group_id=group,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[p.JoinGroupRequestProtocol(name="range", metadata=b"m")],
    )


def commit_request(_: Ctx) -> Any:
    return p.OffsetCommitRequest(
        group_id=G,
        generation_id=-1,
        member_id="",
        topics=[
            p.OffsetCommitRequestTopic(
                name=T,
                partitions=[p.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)],
            )
        ],
    )


def txn_commit_request(ctx: Ctx) -> Any:
    return p.TxnOffsetCommitRequest(
        transactional_id=TX,
        group_id=G,
        producer_id=ctx.producer_id,
        producer_epoch=ctx.producer_epoch,
        topics=[
            p.OffsetCommitRequestTopic(
                name=T,
                partitions=[p.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)],
            )
        ],
    )


def acl_creation() -> Any:
    return pa.CreateAclsRequest(
        creations=[
            pa.AclCreation(
                resource_type=int(RT.TOPIC),
                resource_name="nothing",
                resource_pattern_type=int(PatternType.LITERAL),
                principal="User:nobody",
                host="*",
                operation=int(Op.READ),
                permission_type=int(AclPermissionType.ALLOW),
            )
        ]
    )


def registration(ctx: Ctx) -> Any:
    return p.BrokerRegistrationRequest(
        broker_id=FAKE_BROKER,
        cluster_id=ctx.admin.describe_cluster().cluster_id or "",
        incarnation_id=uuid.uuid4(),
        listeners=[p.BrokerRegistrationListener(name="REPLOG", host="127.0.0.1", port=1)],
    )


def group_coordinator(group: str) -> Callable[[Ctx], str]:
    return lambda ctx: ctx.coordinator(group, p.GROUP_KEY_TYPE)


def txn_coordinator(ctx: Ctx) -> str:
    return ctx.coordinator(TX, p.TRANSACTION_KEY_TYPE)


def controller(ctx: Ctx) -> str:
    return ctx.cluster.controller.bootstrap


def any_broker(ctx: Ctx) -> str:
    return ctx.any_broker()


def leader(topic: str) -> Callable[[Ctx], str]:
    return lambda ctx: ctx.leader(topic)


CLUSTER = CLUSTER_NAME


def cases() -> list[Case]:
    """Every case, and the admin APIs a broker forwards sent to the controller directly as
    well (it checks them before answering them)."""
    listed = broker_cases()
    direct = [
        dataclasses.replace(case, name=f"{case.name} (to the controller)", target=controller)
        for case in listed
        if case.api in (*FORWARDED_APIS, p.ApiKey.DESCRIBE_ACLS) and case.target is any_broker
    ]
    # before the broker-to-controller APIs, whose allowed BrokerRegistration adds a broker
    # that does not run (the state the other cases compare asks every broker)
    first_internal = next(i for i, case in enumerate(listed) if "follower" in case.name)
    return listed[:first_internal] + direct + listed[first_internal:]


def broker_cases() -> list[Case]:
    c = Case
    topic_partitions = [p.DescribeProducersTopic(name=T, partition_indexes=[0])]
    return [
        c("Produce", p.ApiKey.PRODUCE, produce_request, leader(T), [(Op.WRITE, RT.TOPIC, T)]),
        c("Fetch", p.ApiKey.FETCH, fetch_request(-1), leader(T), [(Op.READ, RT.TOPIC, T)]),
        c(
            "ListOffsets",
            p.ApiKey.LIST_OFFSETS,
            lambda _: p.ListOffsetsRequest(
                topics=[
                    p.ListOffsetsRequestTopic(
                        name=T,
                        partitions=[p.ListOffsetsRequestPartition(partition_index=0, timestamp=-1)],
                    )
                ]
            ),
            leader(T),
            [(Op.DESCRIBE, RT.TOPIC, T)],
        ),
        c(
            "Metadata",
            p.ApiKey.METADATA,
            lambda _: p.MetadataRequest(topics=[p.MetadataRequestTopic(name=T)]),
            any_broker,
            [(Op.DESCRIBE, RT.TOPIC, T)],
        ),
        c(
            "Metadata (all topics)",
            p.ApiKey.METADATA,
            lambda _: p.MetadataRequest(topics=None),
            any_broker,
            [(Op.DESCRIBE, RT.TOPIC, T)],
            filtered=lambda r: T not in {t.name for t in r.topics},
            allowed=lambda r: T in {t.name for t in r.topics},
        ),
        c(
            "Metadata (auto-create)",
            p.ApiKey.METADATA,
            lambda _: p.MetadataRequest(
                topics=[p.MetadataRequestTopic(name=NEW + "-auto")], allow_auto_topic_creation=True
            ),
            any_broker,
            [(Op.DESCRIBE, RT.TOPIC, NEW + "-auto"), (Op.CREATE, RT.TOPIC, NEW + "-auto")],
        ),
        c(
            "OffsetCommit",
            p.ApiKey.OFFSET_COMMIT,
            commit_request,
            group_coordinator(G),
            [(Op.READ, RT.GROUP, G), (Op.READ, RT.TOPIC, T)],
        ),
        c(
            "OffsetFetch",
            p.ApiKey.OFFSET_FETCH,
            lambda _: p.OffsetFetchRequest(
                group_id=G, topics=[p.OffsetFetchRequestTopic(name=T, partition_indexes=[0])]
            ),
            group_coordinator(G),
            [(Op.DESCRIBE, RT.GROUP, G), (Op.DESCRIBE, RT.TOPIC, T)],
            allowed=lambda r: r.topics[0].partitions[0].committed_offset >= 0,
        ),
        c(
            "FindCoordinator (group)",
            p.ApiKey.FIND_COORDINATOR,
            lambda _: p.FindCoordinatorRequest(key=G, key_type=p.GROUP_KEY_TYPE),
            any_broker,
            [(Op.DESCRIBE, RT.GROUP, G)],
        ),
        c(
            "FindCoordinator (txn)",
            p.ApiKey.FIND_COORDINATOR,
            lambda _: p.FindCoordinatorRequest(key=TX, key_type=p.TRANSACTION_KEY_TYPE),
            any_broker,
            [(Op.DESCRIBE, RT.TRANSACTIONAL_ID, TX)],
        ),
        c(
            "JoinGroup",
            p.ApiKey.JOIN_GROUP,
            lambda _: join_request(G + "-join"),
            group_coordinator(G + "-join"),
            [(Op.READ, RT.GROUP, G + "-join")],
        ),
        c(
            "SyncGroup",
            p.ApiKey.SYNC_GROUP,
            lambda _: p.SyncGroupRequest(group_id=G, generation_id=1, member_id="m"),
            group_coordinator(G),
            [(Op.READ, RT.GROUP, G)],
        ),
        c(
            "Heartbeat",
            p.ApiKey.HEARTBEAT,
            lambda _: p.HeartbeatRequest(group_id=G, generation_id=1, member_id="m"),
            group_coordinator(G),
            [(Op.READ, RT.GROUP, G)],
        ),
        c(
            "LeaveGroup",
            p.ApiKey.LEAVE_GROUP,
            lambda _: p.LeaveGroupRequest(group_id=G, members=[]),
            group_coordinator(G),
            [(Op.READ, RT.GROUP, G)],
        ),
        c(
            "DescribeGroups",
            p.ApiKey.DESCRIBE_GROUPS,
            lambda _: p.DescribeGroupsRequest(groups=[G]),
            group_coordinator(G),
            [(Op.DESCRIBE, RT.GROUP, G)],
        ),
        c(
            "ListGroups",
            p.ApiKey.LIST_GROUPS,
            lambda _: p.ListGroupsRequest(),
            group_coordinator(G),
            [(Op.DESCRIBE, RT.GROUP, G)],
            filtered=lambda r: r.groups == [],
            allowed=lambda r: G in {g.group_id for g in r.groups},
        ),
        c(
            "DeleteGroups",
            p.ApiKey.DELETE_GROUPS,
            lambda _: p.DeleteGroupsRequest(groups_names=[DOOMED_GROUP]),
            group_coordinator(DOOMED_GROUP),
            [(Op.DELETE, RT.GROUP, DOOMED_GROUP)],
        ),
        c(
            "OffsetDelete",
            p.ApiKey.OFFSET_DELETE,
            lambda _: p.OffsetDeleteRequest(
                group_id=TRIMMED_GROUP,
                topics=[
                    p.OffsetDeleteRequestTopic(
                        name=T, partitions=[p.OffsetDeleteRequestPartition(partition_index=0)]
                    )
                ],
            ),
            group_coordinator(TRIMMED_GROUP),
            [(Op.DELETE, RT.GROUP, TRIMMED_GROUP), (Op.READ, RT.TOPIC, T)],
        ),
        c(
            "ConsumerGroupHeartbeat",
            p.ApiKey.CONSUMER_GROUP_HEARTBEAT,
            lambda _: p.ConsumerGroupHeartbeatRequest(
                group_id=KIP848_GROUP,
                member_id=uuid.uuid4().hex,
                member_epoch=0,
                rebalance_timeout_ms=10_000,
                subscribed_topic_names=[T],
                topic_partitions=[],
            ),
            group_coordinator(KIP848_GROUP),
            [(Op.READ, RT.GROUP, KIP848_GROUP), (Op.DESCRIBE, RT.TOPIC, T)],
            allowed=lambda r: r.member_epoch > 0,
        ),
        c(
            "ConsumerGroupDescribe",
            p.ApiKey.CONSUMER_GROUP_DESCRIBE,
            lambda _: p.ConsumerGroupDescribeRequest(group_ids=[G]),
            group_coordinator(G),
            [(Op.DESCRIBE, RT.GROUP, G)],
        ),
        c(
            "CreateTopics",
            p.ApiKey.CREATE_TOPICS,
            lambda _: p.CreateTopicsRequest(
                topics=[p.CreatableTopic(name=NEW, num_partitions=1, replication_factor=2)]
            ),
            any_broker,
            [(Op.CREATE, RT.TOPIC, NEW)],
        ),
        c(
            "DeleteTopics",
            p.ApiKey.DELETE_TOPICS,
            lambda _: p.DeleteTopicsRequest(topic_names=[DOOMED]),
            any_broker,
            [(Op.DELETE, RT.TOPIC, DOOMED)],
        ),
        c(
            "DeleteRecords",
            p.ApiKey.DELETE_RECORDS,
            lambda _: p.DeleteRecordsRequest(
                topics=[
                    p.DeleteRecordsTopic(
                        name=TRIM,
                        partitions=[p.DeleteRecordsPartition(partition_index=0, offset=1)],
                    )
                ]
            ),
            leader(TRIM),
            [(Op.DELETE, RT.TOPIC, TRIM)],
        ),
        c(
            "CreatePartitions",
            p.ApiKey.CREATE_PARTITIONS,
            lambda _: p.CreatePartitionsRequest(
                topics=[p.CreatePartitionsTopic(name=GROW, count=2)]
            ),
            any_broker,
            [(Op.ALTER, RT.TOPIC, GROW)],
        ),
        c(
            "DescribeConfigs (topic)",
            p.ApiKey.DESCRIBE_CONFIGS,
            lambda _: p.DescribeConfigsRequest(
                resources=[
                    p.DescribeConfigsResource(resource_type=p.TOPIC_RESOURCE, resource_name=T)
                ]
            ),
            any_broker,
            [(Op.DESCRIBE_CONFIGS, RT.TOPIC, T)],
        ),
        c(
            "DescribeConfigs (broker)",
            p.ApiKey.DESCRIBE_CONFIGS,
            lambda _: p.DescribeConfigsRequest(
                resources=[
                    p.DescribeConfigsResource(resource_type=p.BROKER_RESOURCE, resource_name="1")
                ]
            ),
            any_broker,
            [(Op.DESCRIBE_CONFIGS, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "AlterConfigs",
            p.ApiKey.ALTER_CONFIGS,
            lambda _: p.AlterConfigsRequest(
                resources=[
                    p.AlterConfigsResource(
                        resource_type=p.TOPIC_RESOURCE,
                        resource_name=T,
                        configs=[p.AlterableConfig(name="retention.ms", value="86400001")],
                    )
                ]
            ),
            any_broker,
            [(Op.ALTER_CONFIGS, RT.TOPIC, T)],
        ),
        c(
            "IncrementalAlterConfigs",
            p.ApiKey.INCREMENTAL_ALTER_CONFIGS,
            lambda _: p.IncrementalAlterConfigsRequest(
                resources=[
                    p.IncrementalAlterConfigsResource(
                        resource_type=p.TOPIC_RESOURCE,
                        resource_name=T,
                        configs=[
                            p.IncrementalAlterableConfig(name="retention.ms", value="86400002")
                        ],
                    )
                ]
            ),
            any_broker,
            [(Op.ALTER_CONFIGS, RT.TOPIC, T)],
        ),
        c(
            "DescribeLogDirs",
            p.ApiKey.DESCRIBE_LOG_DIRS,
            lambda _: p.DescribeLogDirsRequest(topics=None),
            leader(T),
            [(Op.DESCRIBE, RT.CLUSTER, CLUSTER), (Op.READ, RT.TOPIC, T)],
            allowed=lambda r: T in {t.name for d in r.results for t in d.topics},
        ),
        c(
            "DescribeLogObjects",
            p.ApiKey.DESCRIBE_LOG_OBJECTS,
            lambda _: p.DescribeLogObjectsRequest(
                topics=[
                    p.DescribeLogObjectsTopic(
                        name=T, partitions=[p.DescribeLogObjectsPartition(partition_index=0)]
                    )
                ]
            ),
            leader(T),
            [(Op.DESCRIBE, RT.CLUSTER, CLUSTER), (Op.READ, RT.TOPIC, T)],
            allowed=lambda r: [pt.error_code for t in r.topics for pt in t.partitions] == [0],
        ),
        c(
            "ElectLeaders",
            p.ApiKey.ELECT_LEADERS,
            lambda _: p.ElectLeadersRequest(
                election_type=p.PREFERRED_ELECTION, topic_partitions=None
            ),
            any_broker,
            [(Op.ALTER, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "AlterPartitionReassignments",
            p.ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            lambda ctx: p.AlterPartitionReassignmentsRequest(
                topics=[
                    p.ReassignableTopic(
                        name=T,
                        partitions=[
                            p.ReassignablePartition(
                                partition_index=0,
                                replicas=list(ctx.admin.describe_topic(T).partitions[0].replicas),
                            )
                        ],
                    )
                ]
            ),
            any_broker,
            [(Op.ALTER, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "ListPartitionReassignments",
            p.ApiKey.LIST_PARTITION_REASSIGNMENTS,
            lambda _: p.ListPartitionReassignmentsRequest(topics=None),
            any_broker,
            [(Op.DESCRIBE, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "InitProducerId (transactional)",
            p.ApiKey.INIT_PRODUCER_ID,
            lambda _: p.InitProducerIdRequest(transactional_id=TX, transaction_timeout_ms=60_000),
            txn_coordinator,
            [(Op.WRITE, RT.TRANSACTIONAL_ID, TX)],
        ),
        c(
            "InitProducerId (idempotent)",
            p.ApiKey.INIT_PRODUCER_ID,
            lambda _: p.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000),
            any_broker,
            [(Op.IDEMPOTENT_WRITE, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "OffsetForLeaderEpoch",
            p.ApiKey.OFFSET_FOR_LEADER_EPOCH,
            epochs_request(-1),
            leader(T),
            [(Op.DESCRIBE, RT.TOPIC, T)],
        ),
        c(
            "AddPartitionsToTxn",
            p.ApiKey.ADD_PARTITIONS_TO_TXN,
            lambda ctx: p.AddPartitionsToTxnRequest(
                transactional_id=TX,
                producer_id=ctx.producer_id,
                producer_epoch=ctx.producer_epoch,
                topics=[p.AddPartitionsToTxnTopic(name=T, partitions=[0])],
            ),
            txn_coordinator,
            [(Op.WRITE, RT.TRANSACTIONAL_ID, TX), (Op.WRITE, RT.TOPIC, T)],
        ),
        c(
            "AddOffsetsToTxn",
            p.ApiKey.ADD_OFFSETS_TO_TXN,
            lambda ctx: p.AddOffsetsToTxnRequest(
                transactional_id=TX,
                producer_id=ctx.producer_id,
                producer_epoch=ctx.producer_epoch,
                group_id=G,
            ),
            txn_coordinator,
            [(Op.WRITE, RT.TRANSACTIONAL_ID, TX), (Op.READ, RT.GROUP, G)],
        ),
        c(
            "TxnOffsetCommit",
            p.ApiKey.TXN_OFFSET_COMMIT,
            txn_commit_request,
            group_coordinator(G),
            [(Op.WRITE, RT.TRANSACTIONAL_ID, TX), (Op.READ, RT.GROUP, G), (Op.READ, RT.TOPIC, T)],
        ),
        c(
            "EndTxn",
            p.ApiKey.END_TXN,
            lambda ctx: p.EndTxnRequest(
                transactional_id=TX,
                producer_id=ctx.producer_id,
                producer_epoch=ctx.producer_epoch,
                committed=False,
            ),
            txn_coordinator,
            [(Op.WRITE, RT.TRANSACTIONAL_ID, TX)],
        ),
        c(
            "DescribeProducers",
            p.ApiKey.DESCRIBE_PRODUCERS,
            lambda _: p.DescribeProducersRequest(topics=topic_partitions),
            leader(T),
            [(Op.READ, RT.TOPIC, T)],
        ),
        c(
            "DescribeTransactions",
            p.ApiKey.DESCRIBE_TRANSACTIONS,
            lambda _: p.DescribeTransactionsRequest(transactional_ids=[TX]),
            txn_coordinator,
            [(Op.DESCRIBE, RT.TRANSACTIONAL_ID, TX)],
        ),
        c(
            "ListTransactions",
            p.ApiKey.LIST_TRANSACTIONS,
            lambda _: p.ListTransactionsRequest(state_filters=[]),
            txn_coordinator,
            [(Op.DESCRIBE, RT.TRANSACTIONAL_ID, TX)],
            filtered=lambda r: r.transactions == [],
            allowed=lambda r: TX in {t.transactional_id for t in r.transactions},
        ),
        c(
            "CommitSinkBatch",
            p.ApiKey.COMMIT_SINK_BATCH,
            lambda ctx: p.CommitSinkBatchRequest(
                sink_id=SINK,
                batch_id=7,
                transactions=[
                    p.SinkTransaction(
                        transactional_id=TX,
                        producer_id=ctx.producer_id,
                        producer_epoch=ctx.producer_epoch,
                    )
                ],
            ),
            txn_coordinator,
            [
                (Op.WRITE, RT.TRANSACTIONAL_ID, TX),
                (Op.WRITE, RT.TRANSACTIONAL_ID, f"replog-sink/{SINK}"),
            ],
        ),
        c(
            "DescribeSink",
            p.ApiKey.DESCRIBE_SINK,
            lambda _: p.DescribeSinkRequest(sink_id=SINK),
            txn_coordinator,
            [(Op.DESCRIBE, RT.TRANSACTIONAL_ID, f"replog-sink/{SINK}")],
        ),
        c(
            "DescribeAcls",
            p.ApiKey.DESCRIBE_ACLS,
            lambda _: pa.DescribeAclsRequest(),
            any_broker,
            [(Op.DESCRIBE, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "CreateAcls",
            p.ApiKey.CREATE_ACLS,
            lambda _: acl_creation(),
            any_broker,
            [(Op.ALTER, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "DeleteAcls",
            p.ApiKey.DELETE_ACLS,
            lambda _: pa.DeleteAclsRequest(
                filters=[pa.DeleteAclsFilter(principal_filter="User:nobody")]
            ),
            any_broker,
            [(Op.ALTER, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "DescribeUserScramCredentials",
            p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            lambda _: pa.DescribeUserScramCredentialsRequest(users=None),
            any_broker,
            [(Op.DESCRIBE, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "AlterUserScramCredentials",
            p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            lambda _: pa.AlterUserScramCredentialsRequest(
                deletions=[pa.ScramCredentialDeletion(name="victim", mechanism=1)]
            ),
            any_broker,
            [(Op.ALTER, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "DescribeClientQuotas",
            p.ApiKey.DESCRIBE_CLIENT_QUOTAS,
            lambda _: pq.DescribeClientQuotasRequest(),
            any_broker,
            [(Op.DESCRIBE_CONFIGS, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "AlterClientQuotas",
            p.ApiKey.ALTER_CLIENT_QUOTAS,
            lambda _: pq.AlterClientQuotasRequest(
                entries=[
                    pq.AlterClientQuotasEntry(
                        entity=[pq.EntityData(entity_type="user", entity_name="victim")],
                        ops=[pq.OpData(key="producer_byte_rate", value=1e9)],
                    )
                ]
            ),
            any_broker,
            [(Op.ALTER_CONFIGS, RT.CLUSTER, CLUSTER)],
        ),
        c(
            "UnregisterBroker",
            p.ApiKey.UNREGISTER_BROKER,
            lambda _: p.UnregisterBrokerRequest(broker_id=FAKE_BROKER + 1),
            any_broker,
            [(Op.ALTER, RT.CLUSTER, CLUSTER)],
        ),
        # --- between brokers and controllers: refused to alice wherever she sends them
        c(
            "Fetch (follower)",
            p.ApiKey.FETCH,
            fetch_request(1),
            leader(T),
            [(Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)],
            denied_code=TOPIC_DENIED,
        ),
        c(
            "OffsetForLeaderEpoch (follower)",
            p.ApiKey.OFFSET_FOR_LEADER_EPOCH,
            epochs_request(1),
            leader(T),
            [(Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)],
            denied_code=TOPIC_DENIED,
        ),
        c(
            "WriteTxnMarkers",
            p.ApiKey.WRITE_TXN_MARKERS,
            lambda ctx: p.WriteTxnMarkersRequest(
                markers=[
                    p.WritableTxnMarker(
                        producer_id=ctx.producer_id,
                        producer_epoch=ctx.producer_epoch,
                        transaction_result=False,
                        coordinator_epoch=0,
                        topics=[p.WritableTxnMarkerTopic(name=T, partition_indexes=[0])],
                    )
                ]
            ),
            leader(T),
            [(Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)],
            denied_code=CLUSTER_DENIED,
        ),
        *(
            c(
                f"{name} ({where})",
                api,
                build_it,
                to,
                [(Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER)],
                denied_code=CLUSTER_DENIED,
            )
            for where, to in (("to a broker", any_broker), ("to the controller", controller))
            for name, api, build_it in (
                (
                    "BrokerHeartbeat",
                    p.ApiKey.BROKER_HEARTBEAT,
                    lambda _: p.BrokerHeartbeatRequest(broker_id=FAKE_BROKER, broker_epoch=1),
                ),
                (
                    "AlterPartition",
                    p.ApiKey.ALTER_PARTITION,
                    lambda _: p.AlterPartitionRequest(broker_id=0, broker_epoch=1),
                ),
                (
                    "AllocateProducerIds",
                    p.ApiKey.ALLOCATE_PRODUCER_IDS,
                    lambda _: p.AllocateProducerIdsRequest(broker_id=0, broker_epoch=1),
                ),
                ("BrokerRegistration", p.ApiKey.BROKER_REGISTRATION, registration),
            )
        ),
    ]
