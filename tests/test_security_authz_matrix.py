"""The authorization matrix over real broker processes: for every API a broker serves
(the list comes from the broker's own ApiVersions answer, so an API added later without a case
here fails), a valid request from ``User:alice`` with no ACLs is refused with Kafka's
authorization error (or, for a listing, an answer with everything filtered out) and changes
nothing; with the minimal ACL of its row in security/api_acls.py the same request gets past
authorization. The count of unauthorized operations that succeed must be 0.

The same cases go through the Kafka listener too (raw Kafka frames written with kio), for the
APIs its ApiVersions answer lists. The broker-to-controller APIs are sent by alice both to a
broker and to the controller itself.

A broker that logs in as a user without ClusterAction (``intruder``) never registers and its
follower fetches are refused, until ``replog acls add --cluster --operation ClusterAction``;
then it joins the ISR, and falls out again once the ACL is removed. A process that does not
log in at all gets no answer to BrokerRegistration.

The cluster: a controller and two brokers, both listeners SASL_SSL, the StandardAuthorizer,
``super.users=User:broker;User:admin``; ``admin`` sets up the resources and grants ACLs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from scramp import ScramClient

from logstore.batch import Record, build
from replication import protocol as p
from replication.client import Admin, Producer
from replication.client.config import ClientConfig, load
from replication.client.connection import BrokerConnection
from replication.common import TopicPartition
from replication.errors import (
    BrokerIdNotRegisteredError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    OperationNotAttemptedError,
    ReplogError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from replication.kafka.records import replog_to_kafka
from replication.kafka.translate import to_kafka, to_replog
from replication.kafka.wire import response_class
from replication.protocol import acls as pa
from replication.protocol import quotas as pq
from replication.protocol.framing import _APIS
from replication.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from replication.security.api_acls import REQUIRED
from replication.security.connector import client_login_factory, client_ssl_context
from replication.server.controller_apis import FORWARDED_APIS
from tests.cluster import START_TIMEOUT_S, BrokerProcess, Cluster, wait_until
from tests.security_env import SecurityEnv

pytestmark = [pytest.mark.cluster]

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


# --- the cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SecurityEnv:
    env = SecurityEnv.create(tmp_path_factory.mktemp("matrix-secrets"))
    env.users["admin"] = "admin-secret-5e0b"
    env.users["intruder"] = "intruder-secret-77a1"
    env.users["victim"] = "victim-secret-1d93"
    return env


def overrides(env: SecurityEnv, login: str = "broker") -> dict[str, str]:
    return env.broker_overrides(
        "SASL_SSL",
        **{
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.jaas.config": env.jaas(login),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:broker;User:admin",
        },
    )


def client_config(env: SecurityEnv, user: str) -> dict[str, Any]:
    settings: dict[str, Any] = {"sasl.username": user, "sasl.password": env.users[user]}
    return env.client_config("SASL_SSL", **settings)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, env: SecurityEnv) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("matrix-cluster"),
        brokers=2,
        kafka=True,
        overrides=overrides(env),
        client=client_config(env, "admin"),
    )
    env.bootstrap(c.metadata_root)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[Admin]:
    with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as a:
        yield a


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


# --- state -------------------------------------------------------------------------------------


def state(ctx: Ctx) -> dict[str, Any]:
    """What an unauthorized request must not change, as the admin (a super user) sees it."""
    admin = ctx.admin
    topics = admin.list_topics(include_internal=True)
    described = {
        t.name: [(q.partition, q.replicas) for q in t.partitions]
        for t in admin.describe_topics(topics)
    }
    partitions = [TopicPartition(t, 0) for t in (T, TRIM)]
    groups = sorted(g for g, _ in admin.list_consumer_groups())
    return {
        "topics": described,
        "brokers": [b.node_id for b in admin.describe_cluster().brokers],
        "end offsets": admin.list_offsets(dict.fromkeys(partitions, "latest")),
        "start offsets": admin.list_offsets(dict.fromkeys(partitions, "earliest")),
        "groups": groups,
        "group offsets": {g: admin.list_consumer_group_offsets(g) for g in groups if "matrix" in g},
        "acls": admin.describe_acls(),
        "users": admin.describe_user_scram_credentials(),
        "configs": {k: v.value for k, v in admin.describe_configs("topic", T).items()},
        "sink": admin.last_committed_batch(SINK),
        "transactions": sorted((t.transactional_id, t.state) for t in admin.list_transactions()),
    }


def alice_acls_everywhere(ctx: Ctx, expected: list[AclBinding]) -> bool:
    """Whether every node (controller included) has applied exactly ``expected`` for alice."""
    request = pa.DescribeAclsRequest(principal_filter=ALICE)
    want = sorted(expected)
    for node in [ctx.cluster.controller, *ctx.cluster.brokers.values()]:
        with closing(connect(ctx.env, node.bootstrap, "admin")) as conn:
            response = send(conn, p.ApiKey.DESCRIBE_ACLS, request)
        seen = sorted(
            AclBinding.from_wire(
                r.resource_type,
                r.resource_name,
                r.pattern_type,
                a.principal,
                a.host,
                a.operation,
                a.permission_type,
            )
            for r in response.resources
            for a in r.acls
        )
        if seen != want:
            return False
    return True


def forget_fake_broker(ctx: Ctx) -> None:
    """Unregister the broker the BrokerRegistration case registered (fenced, as every new
    registration: no heartbeat of it reports the metadata), and wait until no node lists it:
    a later case's state check must not see it leave (nor list groups from it)."""
    with contextlib.suppress(BrokerIdNotRegisteredError):
        ctx.admin.unregister_broker(FAKE_BROKER)

    def gone_everywhere() -> bool:
        for node in ctx.cluster.brokers.values():
            with closing(connect(ctx.env, node.bootstrap, "admin")) as conn:
                response = send(conn, p.ApiKey.METADATA, p.MetadataRequest(topics=[]))
            if FAKE_BROKER in {b.node_id for b in response.brokers}:
                return False
        return True

    wait_until(gone_everywhere, timeout=30)


def set_alice_acls(ctx: Ctx, grants: list[tuple[AclOperation, ResourceType, str]]) -> None:
    ctx.admin.delete_acls([AclBindingFilter(principal=ALICE)])
    bindings = [
        AclBinding(rt, name, PatternType.LITERAL, ALICE, "*", op, AclPermissionType.ALLOW)
        for op, rt, name in grants
    ]
    ctx.admin.create_acls(bindings)
    wait_until(lambda: alice_acls_everywhere(ctx, bindings), timeout=30)


# --- the setup -----------------------------------------------------------------------------------


def retrying(action: Callable[..., object]) -> None:
    """``action()`` until it stops failing with a retriable error (a coordinator that is
    still loading, a leader not yet elected)."""

    def attempt() -> bool:
        try:
            action()
        except ReplogError as err:
            if not err.retriable:
                raise
            return False
        return True

    wait_until(attempt, timeout=30)


def set_up(ctx: Ctx) -> None:
    admin = ctx.admin
    for topic in (T, TRIM, GROW, DOOMED):
        admin.create_topic(topic, 1, 2)
    config = {**ctx.cluster.client, "bootstrap_servers": ctx.cluster.bootstrap, "acks": "all"}
    with Producer(config) as producer:
        for topic in (T, TRIM):
            for i in range(3):
                producer.send(topic, b"v%d" % i, partition=0).result()
    for group in (G, DOOMED_GROUP, TRIMMED_GROUP):
        retrying(lambda g=group: admin.alter_consumer_group_offsets(g, {TopicPartition(T, 0): 1}))
    # a transactional id that exists (so that listings have something to hide), with a
    # producer id and epoch the transactional cases use
    with Producer({**config, "transactional_id": TX}) as producer:
        producer.init_transactions()
    with closing(connect(ctx.env, txn_coordinator(ctx), "admin")) as conn:
        (state_,) = send(
            conn,
            p.ApiKey.DESCRIBE_TRANSACTIONS,
            p.DescribeTransactionsRequest(transactional_ids=[TX]),
        ).transaction_states
    ctx.producer_id, ctx.producer_epoch = state_.producer_id, state_.producer_epoch


# --- the matrix ----------------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    api: p.ApiKey
    target: str
    denied_as: str
    allowed_after: str
    unauthorized_success: bool
    vacuous: bool


def describe_codes(codes: list[int]) -> str:
    names = {
        TOPIC_DENIED: "TOPIC_AUTHORIZATION_FAILED",
        GROUP_DENIED: "GROUP_AUTHORIZATION_FAILED",
        CLUSTER_DENIED: "CLUSTER_AUTHORIZATION_FAILED",
        TXN_DENIED: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        NOT_ATTEMPTED: "OPERATION_NOT_ATTEMPTED",
        0: "NONE",
    }
    return ",".join(sorted({names.get(c, str(c)) for c in codes})) or "no error codes"


def run_case(
    ctx: Ctx, case: Case, send_as_alice: Callable[[p.ApiKey, Any], Any] | None = None
) -> Row:
    """Send the case's request as alice without ACLs, then with its grants."""
    set_alice_acls(ctx, [])
    target = case.target(ctx)
    if send_as_alice is None:
        conn = ctx.as_alice(target)

        def send_as_alice(api: p.ApiKey, body: Any) -> Any:
            return send(conn, api, body)

    before = state(ctx)
    response = send_as_alice(case.api, case.request(ctx))
    changed = [k for k, v in state(ctx).items() if before[k] != v]
    codes = error_codes(response)
    auth = set(codes) & AUTH_CODES
    if case.filtered is not None:
        denied = case.filtered(response) and not auth and set(codes) <= {0}
        denied_as = "filtered" if denied else f"NOT filtered ({describe_codes(codes)})"
    else:
        denied = bool(auth) and set(codes) <= AUTH_CODES | {0, NOT_ATTEMPTED}
        if case.denied_code is not None:
            denied = denied and auth == {case.denied_code}
        denied_as = (
            describe_codes([c for c in codes if c])
            if denied
            else (f"NOT denied ({describe_codes(codes)})")
        )
    if changed:
        denied_as += f"; CHANGED {', '.join(changed)}"
    set_alice_acls(ctx, case.grants)
    response = send_as_alice(case.api, case.request(ctx))
    codes = error_codes(response)
    allowed = not set(codes) & AUTH_CODES and case.allowed(response)
    allowed_after = ("ok " if allowed else "STILL REFUSED ") + describe_codes(codes)
    return Row(
        case.name,
        case.api,
        target,
        denied_as,
        allowed_after,
        unauthorized_success=not denied or bool(changed),
        vacuous=not allowed,
    )


def print_matrix(rows: list[Row]) -> None:
    width = max(len(r.case) for r in rows)
    print(f"\n{'API':<{width}}  {'denied as':<45}  allowed after the ACL")
    for r in rows:
        print(f"{r.case:<{width}}  {r.denied_as:<45}  {r.allowed_after}")


@pytest.fixture(scope="module")
def ctx(env: SecurityEnv, cluster: Cluster, admin: Admin) -> Ctx:
    """The cluster with the resources the cases work on."""
    ctx = Ctx(env, cluster, admin)
    set_up(ctx)
    return ctx


def test_every_api_is_refused_without_its_acl_and_allowed_with_it(
    env: SecurityEnv, cluster: Cluster, admin: Admin, ctx: Ctx
) -> None:
    all_cases = cases()
    covered = {case.api for case in all_cases}
    # the APIs come from the nodes' own ApiVersions answers: one served without a case fails
    for node in [*cluster.brokers.values(), cluster.controller]:
        with closing(connect(env, node.bootstrap, "alice")) as conn:
            missing = served(conn) - EXEMPT - covered
        assert not missing, f"{node.role} {node.broker_id} serves APIs without a case: {missing}"
    rows: list[Row] = []
    try:
        for case in all_cases:
            rows.append(run_case(ctx, case))
    finally:
        for conn in ctx.alice.values():
            conn.close()
        if rows:
            print_matrix(rows)
        set_alice_acls(ctx, [])
        forget_fake_broker(ctx)
    unauthorized = [r.case for r in rows if r.unauthorized_success]
    vacuous = [r.case for r in rows if r.vacuous]
    print(
        f"{len(rows)} cases over {len(covered)} APIs; unauthorized successes: {len(unauthorized)}"
    )
    assert unauthorized == []
    assert vacuous == []


# --- the Kafka listener --------------------------------------------------------------------------

#: the version each API is sent at on the Kafka listener: the lowest it serves (closest to
#: replog's own messages), except where that version cannot say what the case says
#: versions that carry the refusal: DescribeLogDirs before v3 has no top-level error code,
#: so an unauthorized caller gets an empty answer there, as from Kafka
KAFKA_VERSIONS = {
    p.ApiKey.FIND_COORDINATOR: 3,
    p.ApiKey.METADATA: 4,
    p.ApiKey.ELECT_LEADERS: 1,
    p.ApiKey.DESCRIBE_LOG_DIRS: 3,
}


def kio_request(api: int, version: int) -> Any:
    """kio's request class of an API version (typed loosely: its fields differ per class)."""
    return load_request_schema(api, version)


class KafkaConnection:
    """A raw Kafka-protocol connection over TLS, logged in with SCRAM-SHA-512 (SaslHandshake
    v1 and SaslAuthenticate v2, scramp doing the SCRAM), that sends kio messages."""

    def __init__(self, env: SecurityEnv, address: str, user: str) -> None:
        host, port = address.rsplit(":", 1)
        context = ssl.create_default_context(cafile=str(env.ca))
        raw = socket.create_connection((host, int(port)), timeout=30)
        self.sock = context.wrap_socket(raw, server_hostname=host)
        self._ids = itertools.count(1)
        handshake = self.request(kio_request(p.ApiKey.SASL_HANDSHAKE, 1)(
            mechanism="SCRAM-SHA-512"
        ))  # fmt: skip
        assert handshake.error_code == 0, handshake
        scram = ScramClient(["SCRAM-SHA-512"], user, env.users[user])
        authenticate = kio_request(p.ApiKey.SASL_AUTHENTICATE, 2)
        first = self.request(authenticate(auth_bytes=scram.get_client_first().encode()))
        assert first.error_code == 0, first
        scram.set_server_first(first.auth_bytes.decode())
        final = self.request(authenticate(auth_bytes=scram.get_client_final().encode()))
        assert final.error_code == 0, final
        scram.set_server_final(final.auth_bytes.decode())
        versions = self.request(
            kio_request(p.ApiKey.API_VERSIONS, 3)(
                client_software_name="matrix", client_software_version="1"
            )
        )
        self.api_versions = {
            int(k.api_key): (k.min_version, k.max_version) for k in versions.api_keys
        }

    def close(self) -> None:
        self.sock.close()

    def request(self, body: Any) -> Any:
        cls = type(body)
        header_cls: Any = cls.__header_schema__
        out = io.BytesIO()
        correlation_id = next(self._ids)
        entity_writer(header_cls)(
            out,
            header_cls(
                request_api_key=cls.__api_key__,
                request_api_version=cls.__version__,
                correlation_id=correlation_id,
                client_id="matrix",
            ),
        )
        entity_writer(cls)(out, body)
        data = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        (size,) = struct.unpack(">i", self._recv(4))
        frame = self._recv(size)
        response_cls: Any = response_class(cls.__api_key__, cls.__version__)
        header, offset = entity_reader(response_cls.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation_id
        response, _ = entity_reader(response_cls)(frame, offset)
        return response

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)

    def send(self, api: p.ApiKey, body: Any) -> Any:
        """Send replog's message ``body`` as Kafka's; the answer as replog's message."""
        low, high = self.api_versions[api]
        version = min(max(KAFKA_VERSIONS.get(api, low), low), high)
        if api == p.ApiKey.PRODUCE:  # a Kafka client sends Kafka's record batches
            body = dataclasses.replace(
                body,
                topic_data=[
                    dataclasses.replace(
                        t,
                        partition_data=[
                            dataclasses.replace(q, records=replog_to_kafka(q.records))
                            for q in t.partition_data
                        ],
                    )
                    for t in body.topic_data
                ],
            )
        response = self.request(to_kafka(body, load_request_schema(api, version)))
        if api == p.ApiKey.CONSUMER_GROUP_HEARTBEAT:  # Kafka's assignment is a struct
            response = dataclasses.replace(response, assignment=None)
        if api == p.ApiKey.LIST_TRANSACTIONS:  # Kafka names the listings transaction_states
            return p.ListTransactionsResponse(
                error_code=response.error_code,
                transactions=[
                    p.TransactionListing(
                        transactional_id=t.transactional_id,
                        producer_id=t.producer_id,
                        transaction_state=t.transaction_state,
                    )
                    for t in response.transaction_states
                ],
            )
        return to_replog(response, RESPONSES[api])


def kafka_address(ctx: Ctx, address: str) -> str | None:
    """The Kafka listener of the broker at ``address`` (None: the controller has none)."""
    for broker in ctx.cluster.brokers.values():
        if broker.bootstrap == address:
            return broker.kafka_bootstrap
    return None


def test_the_kafka_listener_refuses_every_api_without_its_acl_too(
    env: SecurityEnv, cluster: Cluster, admin: Admin, ctx: Ctx
) -> None:
    """The same matrix through the Kafka listener, whose Produce, Fetch, Metadata,
    FindCoordinator and LeaveGroup are its own handlers (the rest are translated to replog's
    messages and answered by the same handlers)."""
    conn = KafkaConnection(env, cluster.brokers[0].kafka_bootstrap, "alice")
    served_kafka = {p.ApiKey(k) for k in conn.api_versions}
    conn.close()
    kafka_cases = [c for c in cases() if c.api in served_kafka and "follower" not in c.name]
    missing = served_kafka - EXEMPT - {c.api for c in kafka_cases}
    assert not missing, f"the Kafka listener serves APIs without a case: {missing}"
    connections: dict[str, KafkaConnection] = {}
    rows: list[Row] = []
    try:
        for case in kafka_cases:
            address = kafka_address(ctx, case.target(ctx))
            if address is None:
                continue
            if address not in connections:
                connections[address] = KafkaConnection(env, address, "alice")
            kafka = connections[address]
            rows.append(run_case(ctx, case, kafka.send))
    finally:
        for k in connections.values():
            k.close()
        if rows:
            print_matrix(rows)
        set_alice_acls(ctx, [])
        forget_fake_broker(ctx)
    unauthorized = [r.case for r in rows if r.unauthorized_success]
    print(f"Kafka listener: {len(rows)} cases; unauthorized successes: {len(unauthorized)}")
    assert unauthorized == []
    assert [r.case for r in rows if r.vacuous] == []


# --- no login at all -------------------------------------------------------------------------


def test_an_unauthenticated_process_cannot_register_as_a_broker(
    env: SecurityEnv, cluster: Cluster, admin: Admin
) -> None:
    """A process that speaks TLS but does not log in: its BrokerRegistration (to a broker,
    which would forward it, or to the controller) closes the connection unanswered, and no
    broker appears. (The controller's claim is written to the metadata store, not sent over
    any listener: there is no request that claims it.)"""
    cluster_id = admin.describe_cluster().cluster_id or ""
    request = p.BrokerRegistrationRequest(
        broker_id=FAKE_BROKER + 2,
        cluster_id=cluster_id,
        incarnation_id=uuid.uuid4(),
        listeners=[p.BrokerRegistrationListener(name="REPLOG", host="127.0.0.1", port=1)],
    )
    context = ssl.create_default_context(cafile=str(env.ca))
    for node in (cluster.brokers[0], cluster.controller):
        raw = socket.create_connection(("127.0.0.1", node.port), timeout=30)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            header = p.RequestHeader(
                api_key=p.ApiKey.BROKER_REGISTRATION, api_version=0, correlation_id=1
            )
            sock.sendall(p.encode_request(header, request))
            try:
                answer = sock.recv(4)
            except (ConnectionResetError, ssl.SSLError):
                answer = b""
            assert answer == b"", f"{node.role} answered a request before authentication"
    with pytest.raises(BrokerIdNotRegisteredError):  # not even fenced: never registered
        admin.unregister_broker(FAKE_BROKER + 2)


# --- a broker without ClusterAction --------------------------------------------------------------


def replog_cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}{result.stdout}"
    return result.stdout


def isr(admin: Admin, topic: str) -> set[int] | None:
    """The ISR of partition 0, or None while the broker asked has not heard of the topic."""
    try:
        return set(admin.describe_topic(topic).partitions[0].isr)
    except ReplogError:
        return None


def knows(env: SecurityEnv, broker: BrokerProcess, topic: str) -> bool:
    """Whether ``broker`` has applied the metadata that created ``topic``."""
    request = p.MetadataRequest(topics=[p.MetadataRequestTopic(name=topic)])
    with closing(connect(env, broker.bootstrap, "admin")) as conn:
        return all(t.error_code == 0 for t in send(conn, p.ApiKey.METADATA, request).topics)


def test_a_broker_without_cluster_action_cannot_register_or_replicate_until_granted(
    env: SecurityEnv, cluster: Cluster, admin: Admin, tmp_path: Path
) -> None:
    """``intruder`` is a real user with a good password, but not a super user: a broker that
    logs in as intruder is refused BrokerRegistration (so it never gets a replica) and its
    follower fetches are refused; ``replog acls add --cluster --operation ClusterAction``
    lets it in, and it then catches up and joins the ISR."""
    node = BrokerProcess(
        cluster.data_dir / "broker-intruder",
        broker_id=3,
        overrides={**cluster.brokers[0].overrides, "sasl.jaas.config": env.jaas("intruder")},
        client=cluster.client,
    )
    # a broker prints its ready line once registered: start it in the background
    start_errors: list[BaseException] = []

    def start() -> None:
        try:
            node.start()
        except BaseException as err:
            start_errors.append(err)

    starting = threading.Thread(target=start, daemon=True)
    followed = "matrix-followed"
    retrying(lambda: admin.create_topic(followed, 1, 2))
    try:
        starting.start()
        # the controller refuses it, logging who and what
        wait_until(
            lambda: "broker registration refused" in node.stderr_tail(1000),
            message="the intruder's registration was not refused",
        )
        log = cluster.controller.stderr_tail(100_000)
        assert re.search(r"User:intruder.*ClusterAction.*BrokerRegistration", log), log[-3000:]
        assert 3 not in {b.node_id for b in admin.describe_cluster().brokers}
        # it cannot follow either: its follower fetch is refused as Kafka refuses it
        ctx = Ctx(env, cluster, admin)
        with closing(connect(env, ctx.leader(followed), "intruder")) as conn:
            response = send(conn, p.ApiKey.FETCH, fetch_request(3, followed)(ctx))
        assert set(error_codes(response)) - {0} == {TOPIC_DENIED}
        assert 3 not in {b.node_id for b in admin.describe_cluster().brokers}

        # the operator grants ClusterAction
        properties = tmp_path / "admin.properties"
        properties.write_text(
            "security.protocol=SASL_SSL\n"
            f"ssl.truststore.location={env.ca}\n"
            "sasl.mechanism=SCRAM-SHA-512\n"
            f"sasl.jaas.config={env.jaas('admin')}\n"
        )
        properties.chmod(0o600)
        replog_cli(
            "acls", "add", "--allow-principal", "User:intruder", "--cluster",
            "--operation", "ClusterAction",
            "--bootstrap-server", cluster.bootstrap, "--command-config", str(properties),
        )  # fmt: skip
        wait_until(
            lambda: 3 in {b.node_id for b in admin.describe_cluster().brokers},
            message="the intruder did not register after ClusterAction was granted",
        )
        starting.join(START_TIMEOUT_S)
        assert not starting.is_alive()
        assert not start_errors, start_errors
        topic = "matrix-replicated"
        retrying(lambda: admin.create_topic(topic, 1, 3))
        # (each broker answers from the metadata it has applied: poll until they all know it)
        nodes = [*cluster.brokers.values(), node]
        wait_until(lambda: all(knows(env, b, topic) for b in nodes))
        assert 3 in admin.describe_topic(topic).partitions[0].replicas
        config = {**cluster.client, "bootstrap_servers": cluster.bootstrap, "acks": "all"}
        with Producer(config) as producer:
            producer.send(topic, b"replicated", partition=0).result()
        wait_until(lambda: isr(admin, topic) == {0, 1, 3}, message="broker 3 did not join the ISR")

        # and once ClusterAction is taken away again, it falls out of the ISR while the
        # others go on committing without it
        replog_cli(
            "acls", "remove", "--allow-principal", "User:intruder", "--cluster",
            "--operation", "ClusterAction", "--force",
            "--bootstrap-server", cluster.bootstrap, "--command-config", str(properties),
        )  # fmt: skip
        # (not idempotent: broker 3 cannot get producer ids any more, and a producer that asks
        # it for one is told to retry)
        with Producer({**config, "enable_idempotence": False}) as producer:
            producer.send(topic, b"without-the-intruder", partition=0).result()
        wait_until(lambda: isr(admin, topic) == {0, 1}, message="broker 3 stayed in the ISR")
    finally:
        starting.join(START_TIMEOUT_S)
        if node.alive:
            node.kill()
        admin.delete_acls([AclBindingFilter(principal="User:intruder")])
