"""Authorization in the request handlers (security/api_acls.py): each API, called in
process as ``User:bob`` from 127.0.0.1, is refused with Kafka's error shape and changes nothing
while bob has no ACL, and succeeds with the minimal ACL of its row. Without an authorizer
nothing changes; with one and no session, everything is refused (never run as the node).

The handlers run on a real one-broker node in process: a Controller on memory:// metadata,
ControllerApis, a ReplicaManager on memory:// storage and KafkaApis, as
tests/test_internal_topics.py builds them. The authorizer is a small real implementation of
the Authorizer protocol over a list of allows (the StandardAuthorizer is tested on its own).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import uuid
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from kio.schema.produce.v9 import request as kio_produce
from kio.schema.types import TopicName, TransactionalId
from kio.static.primitive import Records, i16, i32, i32Timedelta

from logstore.batch import Record, build
from logstore.storage import Storage
from replication import protocol as p
from replication.broker.replica_manager import ReplicaManager
from replication.config import broker_config_from
from replication.controller.controller import Controller
from replication.coordinator.group import GroupCoordinator
from replication.coordinator.group_metadata import GroupConfig
from replication.coordinator.group_metadata_manager import OffsetsPartition
from replication.coordinator.transaction import TransactionCoordinator
from replication.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    OperationNotAttemptedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from replication.kafka.apis import KafkaProtocolApis
from replication.kafka.records import replog_to_kafka
from replication.kafka.wire import SERVED_VERSIONS, KafkaRequest
from replication.metadata.store import MetadataStore
from replication.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from replication.security.api_acls import REQUIRED
from replication.security.checks import AuthHelper
from replication.security.principal import (
    SESSION,
    KafkaPrincipal,
    Session,
    internal_scope,
)
from replication.server.apis import KafkaApis
from replication.server.controller_apis import ControllerApis
from replication.server.group_apis import GroupApis

pytestmark = pytest.mark.unit

T = TypeVar("T")
Op = AclOperation
RT = ResourceType
TOPIC = "events"
TOPIC_DENIED = TopicAuthorizationFailedError.code
GROUP_DENIED = GroupAuthorizationFailedError.code
CLUSTER_DENIED = ClusterAuthorizationFailedError.code
TXN_DENIED = TransactionalIdAuthorizationFailedError.code
BOB = Session(KafkaPrincipal("User", "bob"), "127.0.0.1")

#: what each operation implies (Kafka's rule; the StandardAuthorizer has the same)
_IMPLIED = {
    Op.DESCRIBE: {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
    Op.DESCRIBE_CONFIGS: {Op.ALTER_CONFIGS},
}


class ListAuthorizer:
    """Allows exactly the (principal, operation, resource type, name) entries it holds (an
    operation also allowed by the ones implying it, and by ALL)."""

    def __init__(self) -> None:
        self.allows: set[tuple[str, Op, RT, str]] = set()

    def allow(self, op: Op, rtype: RT, name: str = CLUSTER_NAME, who: str = "User:bob") -> None:
        self.allows.add((who, op, rtype, name))

    def authorize(self, session: Session, operation: Op, resource_type: RT, name: str) -> bool:
        who = str(session.principal)
        ops = {operation, Op.ALL, *_IMPLIED.get(operation, ())}
        return any((who, op, resource_type, name) in self.allows for op in ops)

    def authorize_any(self, session: Session, operation: Op, resource_type: RT) -> bool:
        who = str(session.principal)
        return any(
            w == who and op in (operation, Op.ALL) and rt == resource_type
            for w, op, rt, _ in self.allows
        )


class Active:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.active = True


class Node:
    """A one-broker node (broker and active controller) in process."""

    def __init__(self, *, secure: bool = True) -> None:
        root = f"memory://authz-{uuid.uuid4().hex}"
        self.loop = asyncio.new_event_loop()
        self.config = broker_config_from(
            {
                "broker.id": 0,
                "listeners": "127.0.0.1:19092",
                "log.dir": f"{root}/logs",
                "min.insync.replicas": 1,
                "default.replication.factor": 1,
                "offsets.topic.replication.factor": 1,
                "auto.create.topics.enable": True,
                # a marker write waits for the high watermark, which needs a flush here
                "request.timeout.ms": 200,
            }
        )
        self.controller = Controller(
            MetadataStore(Storage.from_url(f"{root}/meta")), 100, "127.0.0.1", 19093
        )
        self.controller.activate()
        epoch = self.controller.register_broker(0, "127.0.0.1", 19092, None, "i0").epoch
        self.controller.heartbeat(0, epoch, self.controller.image.version)
        self.controller.create_topic(TOPIC, 2, 1, [])
        self.controller_apis = ControllerApis(self.config, Active(self.controller))
        self.rm = ReplicaManager(self.config, Storage.from_url(self.config.log_dir))
        self.rm.broker_epoch = epoch  # registered (as BrokerLifecycle sets it)
        self.apis = KafkaApis(self.config, self.rm, self.controller_apis, None)
        self.apis.coordinator = TransactionCoordinator(
            0,
            60_000,
            lambda: self.rm.image,
            self._no_append,
            self.apis.write_own_txn_markers,
            self._no_ids,
        )
        self.appended: list[bytes] = []
        self.groups = GroupCoordinator(
            0,
            GroupConfig(num_partitions=1, initial_rebalance_delay_ms=0),
            lambda: self.rm.image,
            self._append_offsets,
        )
        self.groups.partitions[0] = OffsetsPartition(0, 0, loaded=True)
        self.apis.serve_groups(
            GroupApis(
                self.config, self.groups, lambda: self.rm.image, self.apis.create_internal_topic
            )
        )
        self.authz = ListAuthorizer()
        if secure:
            self.apis.authorizer = lambda: self.authz
        self.sync()

    @staticmethod
    async def _no_append(records: bytes) -> int:
        raise CoordinatorNotAvailableError("the transaction log is not loaded in this node")

    @staticmethod
    async def _no_ids() -> range:
        raise CoordinatorNotAvailableError("no producer ids in this node")

    async def _append_offsets(self, index: int, records: bytes) -> int:
        self.appended.append(records)
        return len(self.appended) - 1

    def sync(self) -> None:
        """The broker applies the controller's newest metadata (as BrokerLifecycle would)."""
        image = self.controller.image

        async def apply() -> None:
            self.rm.apply_image(image)
            await self.rm.wait_for_opens()  # replicas open off the loop

        self.loop.run_until_complete(apply())

    def run(self, awaitable: Awaitable[T]) -> T:
        async def wait() -> T:
            return await awaitable

        return self.loop.run_until_complete(wait())

    def call(self, api: p.ApiKey, body: Any) -> Any:
        header = p.RequestHeader(api_key=api, api_version=0, correlation_id=1, client_id="t")
        response = self.run(self.apis.handle(header, body))
        self.sync()
        return response

    def end_offset(self, index: int = 0) -> int:
        return self.rm.get_partition(TOPIC, index).log.log_end_offset

    def close(self) -> None:
        self.loop.close()


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node()
    token = SESSION.set(BOB)
    try:
        yield n
    finally:
        SESSION.reset(token)
        n.close()


def produce(topic: str = TOPIC, transactional_id: str | None = None) -> p.ProduceRequest:
    return p.ProduceRequest(
        transactional_id=transactional_id,
        acks=1,
        topic_data=[
            p.ProduceRequestTopic(
                name=topic,
                partition_data=[
                    p.ProduceRequestPartition(index=0, records=build([Record(None, b"v", 1)]))
                ],
            )
        ],
    )


def fetch(replica_id: int = -1) -> p.FetchRequest:
    return p.FetchRequest(
        replica_id=replica_id,
        max_wait_ms=0,
        topics=[
            p.FetchRequestTopic(
                topic=TOPIC,
                partitions=[
                    p.FetchRequestPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=1 << 20
                    )
                ],
            )
        ],
    )


def codes(response: Any, topics: str, parts: str) -> set[int]:
    return {part.error_code for t in getattr(response, topics) for part in getattr(t, parts)}


# --- the table -------------------------------------------------------------------------------


def test_every_served_api_has_a_row_in_the_table() -> None:
    """A new API served without an authorization row fails here."""
    n = Node()
    try:
        served = (
            set(n.apis.handlers)
            | set(n.controller_apis.handlers)
            | set(n.controller_apis.forwarded_handlers)
            | set(SERVED_VERSIONS)
        )
        assert n.apis.group_apis is not None
        served |= set(n.apis.group_apis.handlers)
    finally:
        n.close()
    missing = sorted(p.ApiKey(k).name for k in served if k not in REQUIRED)
    assert not missing, f"APIs without an authorization row in security/api_acls.py: {missing}"
    # the pre-authentication APIs need nothing
    for free in (p.ApiKey.API_VERSIONS, p.ApiKey.SASL_HANDSHAKE, p.ApiKey.SASL_AUTHENTICATE):
        assert REQUIRED[free] == ()


# --- the helper ------------------------------------------------------------------------------


def test_without_an_authorizer_everything_is_allowed_and_no_session_is_read() -> None:
    helper = AuthHelper(lambda: None)
    assert SESSION.get() is None
    assert helper.allowed(Op.WRITE, RT.TOPIC, TOPIC, api="Produce")
    assert helper.filter(Op.READ, RT.TOPIC, ["a", "b"], api="Fetch") == {"a", "b"}


def test_an_authorizer_and_no_session_denies_and_logs_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    authz = ListAuthorizer()
    authz.allow(Op.WRITE, RT.TOPIC, TOPIC, who="Internal:replog")
    helper = AuthHelper(lambda: authz)
    assert SESSION.get() is None
    with caplog.at_level(logging.INFO, logger="replication.security.authorizer"):
        assert not helper.allowed(Op.WRITE, RT.TOPIC, TOPIC, api="Produce")
    assert "bug: unauthenticated call" in caplog.text
    with internal_scope():  # the node's own work
        assert helper.allowed(Op.WRITE, RT.TOPIC, TOPIC, api="Produce")


def test_a_denial_logs_one_line_and_names_who_what_and_which(
    caplog: pytest.LogCaptureFixture,
) -> None:
    helper = AuthHelper(lambda: ListAuthorizer())
    token = SESSION.set(BOB)
    try:
        with caplog.at_level(logging.INFO, logger="replication.security.authorizer"):
            assert not helper.allowed(Op.WRITE, RT.TOPIC, TOPIC, api="Produce")
        err = helper.error(Op.WRITE, RT.TOPIC, TOPIC)
    finally:
        SESSION.reset(token)
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "authorization_denied principal=User:bob host=127.0.0.1 operation=Write "
        "resource=Topic:events api=Produce result=DENIED"
    )
    assert isinstance(err, TopicAuthorizationFailedError)
    assert str(err) == "User:bob is not authorized to Write Topic:events"


def test_security_off_changes_nothing() -> None:
    """No authorizer and no session (as every in-process test calls handlers): served."""
    n = Node(secure=False)
    try:
        assert SESSION.get() is None
        response = n.call(p.ApiKey.PRODUCE, produce())
        assert codes(response, "responses", "partition_responses") == {0}
        assert n.end_offset() == 1
        metadata = n.call(p.ApiKey.METADATA, p.MetadataRequest(topics=None))
        assert [t.name for t in metadata.topics] == [TOPIC]
    finally:
        n.close()


def test_an_authorizer_and_no_session_is_refused_never_run_as_the_node() -> None:
    n = Node()
    try:
        n.authz.allow(Op.ALL, RT.TOPIC, TOPIC, who="Internal:replog")
        assert SESSION.get() is None
        response = n.call(p.ApiKey.PRODUCE, produce())
        assert codes(response, "responses", "partition_responses") == {TOPIC_DENIED}
        assert n.end_offset() == 0
    finally:
        n.close()


# --- records -----------------------------------------------------------------------------------


def test_produce_needs_write_on_the_topic(node: Node) -> None:
    response = node.call(p.ApiKey.PRODUCE, produce())
    (part,) = response.responses[0].partition_responses
    assert part.error_code == TOPIC_DENIED
    assert part.error_message == "User:bob is not authorized to Write Topic:events"
    assert node.end_offset() == 0
    node.authz.allow(Op.WRITE, RT.TOPIC, TOPIC)
    response = node.call(p.ApiKey.PRODUCE, produce())
    assert codes(response, "responses", "partition_responses") == {0}
    assert node.end_offset() == 1


def test_transactional_produce_needs_write_on_the_transactional_id(node: Node) -> None:
    node.authz.allow(Op.WRITE, RT.TOPIC, TOPIC)
    response = node.call(p.ApiKey.PRODUCE, produce(transactional_id="tx"))
    assert codes(response, "responses", "partition_responses") == {TXN_DENIED}
    # transactional batches without a transactional id: refused too (as Kafka)
    batch = build([Record(None, b"v", 1)], producer_id=7, producer_epoch=0, is_transactional=True)
    request = dataclasses.replace(
        produce(),
        topic_data=[
            p.ProduceRequestTopic(
                name=TOPIC, partition_data=[p.ProduceRequestPartition(index=0, records=batch)]
            )
        ],
    )
    response = node.call(p.ApiKey.PRODUCE, request)
    assert codes(response, "responses", "partition_responses") == {TXN_DENIED}
    assert node.end_offset() == 0


def test_fetch_needs_read_and_a_follower_cluster_action(node: Node) -> None:
    node.authz.allow(Op.WRITE, RT.TOPIC, TOPIC)
    node.call(p.ApiKey.PRODUCE, produce())
    response = node.call(p.ApiKey.FETCH, fetch())
    (part,) = response.responses[0].partitions
    assert part.error_code == TOPIC_DENIED
    assert not part.records
    node.authz.allow(Op.READ, RT.TOPIC, TOPIC)
    response = node.call(p.ApiKey.FETCH, fetch())
    (part,) = response.responses[0].partitions
    assert part.error_code == 0
    # a follower: Read on the topic is not enough
    response = node.call(p.ApiKey.FETCH, fetch(replica_id=1))
    assert codes(response, "responses", "partitions") == {TOPIC_DENIED}
    node.authz.allow(Op.CLUSTER_ACTION, RT.CLUSTER)
    response = node.call(p.ApiKey.FETCH, fetch(replica_id=1))
    assert TOPIC_DENIED not in codes(response, "responses", "partitions")


def test_list_offsets_and_offset_for_leader_epoch_need_describe(node: Node) -> None:
    request = p.ListOffsetsRequest(
        topics=[
            p.ListOffsetsRequestTopic(
                name=TOPIC,
                partitions=[p.ListOffsetsRequestPartition(partition_index=0, timestamp=-1)],
            )
        ]
    )
    epochs = p.OffsetsForLeaderEpochRequest(
        topics=[
            p.OffsetForLeaderTopic(
                topic=TOPIC, partitions=[p.OffsetForLeaderPartition(partition=0, leader_epoch=0)]
            )
        ]
    )
    assert codes(node.call(p.ApiKey.LIST_OFFSETS, request), "topics", "partitions") == {
        TOPIC_DENIED
    }
    assert codes(node.call(p.ApiKey.OFFSET_FOR_LEADER_EPOCH, epochs), "topics", "partitions") == {
        TOPIC_DENIED
    }
    node.authz.allow(Op.DESCRIBE, RT.TOPIC, TOPIC)
    assert codes(node.call(p.ApiKey.LIST_OFFSETS, request), "topics", "partitions") == {0}
    assert codes(node.call(p.ApiKey.OFFSET_FOR_LEADER_EPOCH, epochs), "topics", "partitions") == {0}


def test_delete_records_needs_delete(node: Node) -> None:
    node.authz.allow(Op.WRITE, RT.TOPIC, TOPIC)
    node.call(p.ApiKey.PRODUCE, produce())
    request = p.DeleteRecordsRequest(
        topics=[
            p.DeleteRecordsTopic(
                name=TOPIC, partitions=[p.DeleteRecordsPartition(partition_index=0, offset=-1)]
            )
        ]
    )
    assert codes(node.call(p.ApiKey.DELETE_RECORDS, request), "topics", "partitions") == {
        TOPIC_DENIED
    }
    assert node.rm.get_partition(TOPIC, 0).log.log_start_offset == 0
    node.authz.allow(Op.DELETE, RT.TOPIC, TOPIC)
    assert codes(node.call(p.ApiKey.DELETE_RECORDS, request), "topics", "partitions") == {0}


# --- metadata and topics ---------------------------------------------------------------------


def test_metadata_names_denied_topics_and_filters_all_topics(node: Node) -> None:
    named = node.call(
        p.ApiKey.METADATA, p.MetadataRequest(topics=[p.MetadataRequestTopic(name=TOPIC)])
    )
    assert [(t.name, t.error_code, t.partitions) for t in named.topics] == [
        (TOPIC, TOPIC_DENIED, [])
    ]
    assert node.call(p.ApiKey.METADATA, p.MetadataRequest(topics=None)).topics == []
    node.authz.allow(Op.DESCRIBE, RT.TOPIC, TOPIC)
    everything = node.call(p.ApiKey.METADATA, p.MetadataRequest(topics=None))
    assert [(t.name, t.error_code) for t in everything.topics] == [(TOPIC, 0)]


def test_metadata_auto_create_needs_create(node: Node) -> None:
    request = p.MetadataRequest(
        topics=[p.MetadataRequestTopic(name="new")], allow_auto_topic_creation=True
    )
    node.authz.allow(Op.DESCRIBE, RT.TOPIC, "new")
    (topic,) = node.call(p.ApiKey.METADATA, request).topics
    assert topic.error_code == TOPIC_DENIED
    assert node.controller.image.topic("new") is None
    node.authz.allow(Op.CREATE, RT.TOPIC, "new")
    node.call(p.ApiKey.METADATA, request)
    assert node.controller.image.topic("new") is not None


def test_create_delete_and_grow_topics_need_create_delete_alter(node: Node) -> None:
    create = p.CreateTopicsRequest(
        topics=[
            p.CreatableTopic(name="a", num_partitions=1, replication_factor=1),
            p.CreatableTopic(name="b", num_partitions=1, replication_factor=1),
        ]
    )
    node.authz.allow(Op.CREATE, RT.TOPIC, "a")
    results = {t.name: t.error_code for t in node.call(p.ApiKey.CREATE_TOPICS, create).topics}
    assert results == {"a": 0, "b": TOPIC_DENIED}
    assert node.controller.image.topic("b") is None
    grow = p.CreatePartitionsRequest(topics=[p.CreatePartitionsTopic(name="a", count=2)])
    (result,) = node.call(p.ApiKey.CREATE_PARTITIONS, grow).results
    assert result.error_code == TOPIC_DENIED
    node.authz.allow(Op.ALTER, RT.TOPIC, "a")
    (result,) = node.call(p.ApiKey.CREATE_PARTITIONS, grow).results
    assert result.error_code == 0
    delete = p.DeleteTopicsRequest(topic_names=["a"])
    (result,) = node.call(p.ApiKey.DELETE_TOPICS, delete).responses
    assert result.error_code == TOPIC_DENIED
    assert node.controller.image.topic("a") is not None
    node.authz.allow(Op.DELETE, RT.TOPIC, "a")
    (result,) = node.call(p.ApiKey.DELETE_TOPICS, delete).responses
    assert result.error_code == 0
    # Create on the cluster covers every topic
    node.authz.allow(Op.CREATE, RT.CLUSTER)
    results = {t.name: t.error_code for t in node.call(p.ApiKey.CREATE_TOPICS, create).topics}
    assert results == {"a": 0, "b": 0}


def test_configs_need_describe_and_alter_configs(node: Node) -> None:
    describe = p.DescribeConfigsRequest(
        resources=[
            p.DescribeConfigsResource(resource_type=p.TOPIC_RESOURCE, resource_name=TOPIC),
            p.DescribeConfigsResource(resource_type=p.BROKER_RESOURCE, resource_name="0"),
        ]
    )
    results = node.call(p.ApiKey.DESCRIBE_CONFIGS, describe).results
    assert [r.error_code for r in results] == [TOPIC_DENIED, CLUSTER_DENIED]
    node.authz.allow(Op.DESCRIBE_CONFIGS, RT.TOPIC, TOPIC)
    node.authz.allow(Op.DESCRIBE_CONFIGS, RT.CLUSTER)
    results = node.call(p.ApiKey.DESCRIBE_CONFIGS, describe).results
    assert [r.error_code for r in results] == [0, 0]
    alter = p.IncrementalAlterConfigsRequest(
        resources=[
            p.IncrementalAlterConfigsResource(
                resource_type=p.TOPIC_RESOURCE,
                resource_name=TOPIC,
                configs=[p.IncrementalAlterableConfig(name="retention.ms", value="1000")],
            )
        ]
    )
    (result,) = node.call(p.ApiKey.INCREMENTAL_ALTER_CONFIGS, alter).responses
    assert result.error_code == TOPIC_DENIED
    assert "retention.ms" not in dict(node.controller.image.topic(TOPIC).configs)  # type: ignore[union-attr]
    node.authz.allow(Op.ALTER_CONFIGS, RT.TOPIC, TOPIC)
    (result,) = node.call(p.ApiKey.INCREMENTAL_ALTER_CONFIGS, alter).responses
    assert result.error_code == 0


def test_describe_log_dirs_needs_describe_cluster_and_shows_only_readable_topics(
    node: Node,
) -> None:
    request = p.DescribeLogDirsRequest(topics=None)
    assert node.call(p.ApiKey.DESCRIBE_LOG_DIRS, request).error_code == CLUSTER_DENIED
    node.authz.allow(Op.DESCRIBE, RT.CLUSTER)
    response = node.call(p.ApiKey.DESCRIBE_LOG_DIRS, request)
    assert response.error_code == 0
    assert response.results[0].topics == []
    node.authz.allow(Op.READ, RT.TOPIC, TOPIC)
    response = node.call(p.ApiKey.DESCRIBE_LOG_DIRS, request)
    assert [t.name for t in response.results[0].topics] == [TOPIC]


def test_cluster_admin_apis_need_alter_or_describe_on_the_cluster(node: Node) -> None:
    version = node.controller.image.version
    elect = p.ElectLeadersRequest(election_type=p.PREFERRED_ELECTION, topic_partitions=None)
    assert node.call(p.ApiKey.ELECT_LEADERS, elect).error_code == CLUSTER_DENIED
    unregister = p.UnregisterBrokerRequest(broker_id=5)
    response = node.call(p.ApiKey.UNREGISTER_BROKER, unregister)
    assert response.error_code == CLUSTER_DENIED
    assert response.error_message == "User:bob is not authorized to Alter Cluster:kafka-cluster"
    listing = p.ListPartitionReassignmentsRequest(topics=None)
    assert node.call(p.ApiKey.LIST_PARTITION_REASSIGNMENTS, listing).error_code == CLUSTER_DENIED
    assert node.controller.image.version == version
    node.authz.allow(Op.DESCRIBE, RT.CLUSTER)
    assert node.call(p.ApiKey.LIST_PARTITION_REASSIGNMENTS, listing).error_code == 0
    node.authz.allow(Op.ALTER, RT.CLUSTER)
    assert node.call(p.ApiKey.ELECT_LEADERS, elect).error_code == 0


def test_a_forwarding_broker_with_cluster_action_is_trusted(node: Node) -> None:
    """The controller sees forwarded requests under the broker's principal; the broker
    authorized the client already."""
    node.authz.allow(Op.CLUSTER_ACTION, RT.CLUSTER)
    create = p.CreateTopicsRequest(
        topics=[p.CreatableTopic(name="fwd", num_partitions=1, replication_factor=1)]
    )
    (result,) = node.call(p.ApiKey.CREATE_TOPICS, create).topics
    assert result.error_code == 0


def test_internal_topics_are_created_as_the_node(node: Node) -> None:
    """FindCoordinator creates __consumer_offsets for a client that may not create topics."""
    node.authz.allow(Op.DESCRIBE, RT.GROUP, "g")
    find = p.FindCoordinatorRequest(key="g", key_type=p.GROUP_KEY_TYPE)
    # (this node's broker side learns of the topic from the next metadata it applies: the
    # coordinator is not available to the first request)
    assert node.call(p.ApiKey.FIND_COORDINATOR, find).error_code != GROUP_DENIED
    assert node.controller.image.topic("__consumer_offsets") is not None


# --- the controller's own APIs ---------------------------------------------------------------


def test_broker_to_controller_apis_need_cluster_action(node: Node) -> None:
    api = node.controller_apis
    header = p.RequestHeader(api_key=0, api_version=0, correlation_id=1)
    version = node.controller.image.version
    registration = p.BrokerRegistrationRequest(
        broker_id=7,
        cluster_id=node.controller.image.cluster_id,
        incarnation_id=uuid.uuid4(),
        listeners=[p.BrokerRegistrationListener(name="REPLOG", host="127.0.0.1", port=1)],
    )
    broker_epoch = node.controller.image.broker(0).epoch  # type: ignore[union-attr]
    heartbeat = p.BrokerHeartbeatRequest(broker_id=0, broker_epoch=broker_epoch)
    alter = p.AlterPartitionRequest(broker_id=0, broker_epoch=broker_epoch)
    ids = p.AllocateProducerIdsRequest(broker_id=0, broker_epoch=broker_epoch)
    requests: dict[p.ApiKey, Any] = {
        p.ApiKey.BROKER_REGISTRATION: registration,
        p.ApiKey.BROKER_HEARTBEAT: heartbeat,
        p.ApiKey.ALTER_PARTITION: alter,
        p.ApiKey.ALLOCATE_PRODUCER_IDS: ids,
    }
    assert set(requests) == set(api.handlers)
    for key, body in requests.items():
        assert node.run(api.handlers[key](header, body)).error_code == CLUSTER_DENIED, key.name
    assert node.controller.image.version == version
    assert node.controller.image.broker(7) is None
    node.authz.allow(Op.CLUSTER_ACTION, RT.CLUSTER)
    assert node.run(api.handle_broker_heartbeat(header, heartbeat)).error_code == 0
    assert node.run(api.handle_allocate_producer_ids(header, ids)).error_code == 0


def test_write_txn_markers_needs_cluster_action(node: Node) -> None:
    request = p.WriteTxnMarkersRequest(
        markers=[
            p.WritableTxnMarker(
                producer_id=1,
                producer_epoch=0,
                transaction_result=True,
                coordinator_epoch=0,
                topics=[p.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=[0])],
            )
        ]
    )
    response = node.call(p.ApiKey.WRITE_TXN_MARKERS, request)
    assert {
        part.error_code for m in response.markers for t in m.topics for part in t.partitions
    } == {CLUSTER_DENIED}
    assert node.end_offset() == 0
    # the node's own coordinator writes them as the node
    own = node.run(node.apis.write_own_txn_markers(request))
    assert {part.error_code for m in own.markers for t in m.topics for part in t.partitions} != {
        CLUSTER_DENIED
    }


# --- transactions ------------------------------------------------------------------------------


def test_transactional_apis_need_write_on_the_transactional_id(node: Node) -> None:
    init = p.InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=10_000)
    assert node.call(p.ApiKey.INIT_PRODUCER_ID, init).error_code == TXN_DENIED
    end = p.EndTxnRequest(transactional_id="tx", producer_id=1, producer_epoch=0, committed=True)
    assert node.call(p.ApiKey.END_TXN, end).error_code == TXN_DENIED
    offsets = p.AddOffsetsToTxnRequest(
        transactional_id="tx", producer_id=1, producer_epoch=0, group_id="g"
    )
    assert node.call(p.ApiKey.ADD_OFFSETS_TO_TXN, offsets).error_code == TXN_DENIED
    node.authz.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "tx")
    assert node.call(p.ApiKey.ADD_OFFSETS_TO_TXN, offsets).error_code == GROUP_DENIED
    for api, body in ((p.ApiKey.INIT_PRODUCER_ID, init), (p.ApiKey.END_TXN, end)):
        code = node.call(api, body).error_code
        assert code not in (TXN_DENIED, CLUSTER_DENIED), api.name  # past the check


def test_idempotence_needs_idempotent_write_or_write_on_a_topic(node: Node) -> None:
    init = p.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=10_000)
    assert node.call(p.ApiKey.INIT_PRODUCER_ID, init).error_code == CLUSTER_DENIED
    node.authz.allow(Op.WRITE, RT.TOPIC, "any")
    assert node.call(p.ApiKey.INIT_PRODUCER_ID, init).error_code != CLUSTER_DENIED


def test_add_partitions_to_txn_refuses_denied_topics_and_attempts_none(node: Node) -> None:
    request = p.AddPartitionsToTxnRequest(
        transactional_id="tx",
        producer_id=1,
        producer_epoch=0,
        topics=[
            p.AddPartitionsToTxnTopic(name=TOPIC, partitions=[0]),
            p.AddPartitionsToTxnTopic(name="other", partitions=[0]),
        ],
    )

    def by_topic() -> dict[str, set[int]]:
        response = node.call(p.ApiKey.ADD_PARTITIONS_TO_TXN, request)
        return {t.name: {r.error_code for r in t.results} for t in response.results}

    assert by_topic() == {TOPIC: {TXN_DENIED}, "other": {TXN_DENIED}}
    node.authz.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "tx")
    node.authz.allow(Op.WRITE, RT.TOPIC, TOPIC)
    assert by_topic() == {TOPIC: {OperationNotAttemptedError.code}, "other": {TOPIC_DENIED}}


def test_sink_commits_need_write_on_the_sinks_own_id(node: Node) -> None:
    commit = p.CommitSinkBatchRequest(
        sink_id="s1",
        batch_id=3,
        transactions=[p.SinkTransaction(transactional_id="mine", producer_id=1, producer_epoch=0)],
    )
    node.authz.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "mine")
    response = node.call(p.ApiKey.COMMIT_SINK_BATCH, commit)
    assert response.error_code == TXN_DENIED
    assert response.error_message == (
        "User:bob is not authorized to Write TransactionalId:replog-sink/s1"
    )
    describe = p.DescribeSinkRequest(sink_id="s1")
    assert node.call(p.ApiKey.DESCRIBE_SINK, describe).error_code == TXN_DENIED
    node.authz.allow(Op.WRITE, RT.TRANSACTIONAL_ID, "replog-sink/s1")
    assert node.call(p.ApiKey.DESCRIBE_SINK, describe).error_code != TXN_DENIED
    assert node.call(p.ApiKey.COMMIT_SINK_BATCH, commit).error_code != TXN_DENIED


def test_describe_transactions_and_find_coordinator_need_describe(node: Node) -> None:
    describe = p.DescribeTransactionsRequest(transactional_ids=["tx"])
    (state,) = node.call(p.ApiKey.DESCRIBE_TRANSACTIONS, describe).transaction_states
    assert state.error_code == TXN_DENIED
    find = p.FindCoordinatorRequest(key="tx", key_type=p.TRANSACTION_KEY_TYPE)
    assert node.call(p.ApiKey.FIND_COORDINATOR, find).error_code == TXN_DENIED
    find_group = p.FindCoordinatorRequest(key="g", key_type=p.GROUP_KEY_TYPE)
    assert node.call(p.ApiKey.FIND_COORDINATOR, find_group).error_code == GROUP_DENIED
    node.authz.allow(Op.DESCRIBE, RT.TRANSACTIONAL_ID, "tx")
    (state,) = node.call(p.ApiKey.DESCRIBE_TRANSACTIONS, describe).transaction_states
    assert state.error_code != TXN_DENIED
    assert node.call(p.ApiKey.FIND_COORDINATOR, find).error_code != TXN_DENIED


# --- groups ------------------------------------------------------------------------------------


def join(group: str = "g") -> p.JoinGroupRequest:
    return p.JoinGroupRequest(
        group_id=group,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[p.JoinGroupRequestProtocol(name="range", metadata=b"m")],
    )


def test_group_membership_needs_read_on_the_group(node: Node) -> None:
    assert node.call(p.ApiKey.JOIN_GROUP, join()).error_code == GROUP_DENIED
    assert node.groups.list_groups() == []
    for api, body in (
        (p.ApiKey.SYNC_GROUP, p.SyncGroupRequest(group_id="g", generation_id=1, member_id="m")),
        (p.ApiKey.HEARTBEAT, p.HeartbeatRequest(group_id="g", generation_id=1, member_id="m")),
        (p.ApiKey.LEAVE_GROUP, p.LeaveGroupRequest(group_id="g", members=[])),
    ):
        assert node.call(api, body).error_code == GROUP_DENIED, api.name
    node.authz.allow(Op.READ, RT.GROUP, "g")
    assert node.call(p.ApiKey.JOIN_GROUP, join()).error_code != GROUP_DENIED
    assert [g.group_id for g in node.groups.list_groups()] == ["g"]


def test_offsets_need_read_on_the_group_and_the_topic(node: Node) -> None:
    commit = p.OffsetCommitRequest(
        group_id="g",
        generation_id=-1,
        member_id="",
        topics=[
            p.OffsetCommitRequestTopic(
                name=TOPIC,
                partitions=[p.OffsetCommitRequestPartition(partition_index=0, committed_offset=5)],
            )
        ],
    )
    assert codes(node.call(p.ApiKey.OFFSET_COMMIT, commit), "topics", "partitions") == {
        GROUP_DENIED
    }
    node.authz.allow(Op.READ, RT.GROUP, "g")
    assert codes(node.call(p.ApiKey.OFFSET_COMMIT, commit), "topics", "partitions") == {
        TOPIC_DENIED
    }
    assert node.appended == []
    node.authz.allow(Op.READ, RT.TOPIC, TOPIC)
    assert codes(node.call(p.ApiKey.OFFSET_COMMIT, commit), "topics", "partitions") == {0}
    # OffsetFetch: named topics without Describe are refused, all offsets leave them out
    fetch_all = p.OffsetFetchRequest(group_id="g", topics=None)
    node.authz.allows.discard(("User:bob", Op.READ, RT.TOPIC, TOPIC))
    assert node.call(p.ApiKey.OFFSET_FETCH, fetch_all).topics == []
    named = p.OffsetFetchRequest(
        group_id="g", topics=[p.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0])]
    )
    assert codes(node.call(p.ApiKey.OFFSET_FETCH, named), "topics", "partitions") == {TOPIC_DENIED}
    node.authz.allow(Op.DESCRIBE, RT.TOPIC, TOPIC)
    (topic,) = node.call(p.ApiKey.OFFSET_FETCH, fetch_all).topics
    assert topic.partitions[0].committed_offset == 5
    assert node.call(p.ApiKey.OFFSET_FETCH, p.OffsetFetchRequest(group_id="h")).error_code == (
        GROUP_DENIED
    )


def test_listing_describing_and_deleting_groups(node: Node) -> None:
    node.authz.allow(Op.READ, RT.GROUP, "g")
    node.authz.allow(Op.READ, RT.GROUP, "h")
    node.call(p.ApiKey.JOIN_GROUP, join("g"))
    node.call(p.ApiKey.JOIN_GROUP, join("h"))
    node.authz.allows.clear()
    assert node.call(p.ApiKey.LIST_GROUPS, p.ListGroupsRequest()).groups == []
    node.authz.allow(Op.DESCRIBE, RT.GROUP, "h")
    listed = node.call(p.ApiKey.LIST_GROUPS, p.ListGroupsRequest()).groups
    assert [g.group_id for g in listed] == ["h"]
    node.authz.allow(Op.DESCRIBE, RT.CLUSTER)
    listed = node.call(p.ApiKey.LIST_GROUPS, p.ListGroupsRequest()).groups
    assert [g.group_id for g in listed] == ["g", "h"]
    described = node.call(p.ApiKey.DESCRIBE_GROUPS, p.DescribeGroupsRequest(groups=["g", "h"]))
    assert [g.error_code for g in described.groups] == [GROUP_DENIED, 0]
    (result,) = node.call(p.ApiKey.DELETE_GROUPS, p.DeleteGroupsRequest(groups_names=["h"])).results
    assert result.error_code == GROUP_DENIED
    assert "h" in {g.group_id for g in node.groups.list_groups()}


# --- the Kafka listener ------------------------------------------------------------------------


def kafka_produce(transactional_id: str | None = None) -> KafkaRequest:
    """A Kafka client's Produce v9 (kio's message, a Kafka RecordBatch)."""
    body = kio_produce.ProduceRequest(
        transactional_id=None if transactional_id is None else TransactionalId(transactional_id),
        acks=i16(1),
        timeout=i32Timedelta.parse(timedelta(seconds=5)),
        topic_data=(
            kio_produce.TopicProduceData(
                name=TopicName(TOPIC),
                partition_data=(
                    kio_produce.PartitionProduceData(
                        index=i32(0),
                        records=Records(replog_to_kafka(build([Record(None, b"v", 1)]))),
                    ),
                ),
            ),
        ),
    )
    return KafkaRequest(api_key=0, api_version=9, correlation_id=1, client_id="t", body=body)


def test_the_kafka_listeners_produce_is_checked_too(node: Node) -> None:
    """The Kafka listener appends a Kafka client's records itself (it transcodes them), so it
    makes the Produce checks itself."""
    kafka = KafkaProtocolApis(node.apis)
    header = p.RequestHeader(api_key=p.ApiKey.PRODUCE, api_version=0, correlation_id=1)

    def answer(request: KafkaRequest) -> list[tuple[int, str | None]]:
        response = node.run(kafka._produce(request, header))
        return [
            (part["error_code"], part["error_message"])
            for t in response["responses"]
            for part in t["partition_responses"]
        ]

    denied = "User:bob is not authorized to Write Topic:events"
    assert answer(kafka_produce()) == [(TOPIC_DENIED, denied)]
    assert node.end_offset() == 0
    node.authz.allow(Op.WRITE, RT.TOPIC, TOPIC)
    assert [code for code, _ in answer(kafka_produce("tx"))] == [TXN_DENIED]
    assert node.end_offset() == 0
    assert answer(kafka_produce()) == [(0, None)]
    assert node.end_offset() == 1


# --- ACLs and SCRAM credentials ---------------------------------------------------------------


def test_acl_and_credential_apis_need_describe_or_alter_on_the_cluster(node: Node) -> None:
    """DescribeAcls and DescribeUserScramCredentials (answered by any node) need Describe on
    the cluster; CreateAcls, DeleteAcls and AlterUserScramCredentials (forwarded) Alter, and
    are refused before they reach the controller."""
    assert p.ApiKey.DESCRIBE_ACLS in node.apis.handlers
    acls: Any = importlib.import_module("replication.protocol.acls")
    version = node.controller.image.version
    describe = acls.DescribeAclsRequest()
    response = node.call(p.ApiKey.DESCRIBE_ACLS, describe)
    assert response.error_code == CLUSTER_DENIED
    assert response.error_message == (
        "User:bob is not authorized to Describe Cluster:kafka-cluster"
    )
    users = acls.DescribeUserScramCredentialsRequest(users=None)
    assert node.call(p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, users).error_code == (CLUSTER_DENIED)
    create = acls.CreateAclsRequest(
        creations=[
            acls.AclCreation(
                resource_type=int(RT.TOPIC),
                resource_name=TOPIC,
                principal="User:bob",
                host="*",
                operation=int(Op.ALL),
                permission_type=3,
            )
        ]
    )
    results = node.call(p.ApiKey.CREATE_ACLS, create).results
    assert [r.error_code for r in results] == [CLUSTER_DENIED]
    delete = acls.DeleteAclsRequest(filters=[acls.DeleteAclsFilter()])
    results = node.call(p.ApiKey.DELETE_ACLS, delete).filter_results
    assert [r.error_code for r in results] == [CLUSTER_DENIED]
    alter = acls.AlterUserScramCredentialsRequest(
        deletions=[acls.ScramCredentialDeletion(name="alice", mechanism=1)]
    )
    results = node.call(p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS, alter).results
    assert [(r.user, r.error_code) for r in results] == [("alice", CLUSTER_DENIED)]
    assert node.controller.image.version == version
    node.authz.allow(Op.DESCRIBE, RT.CLUSTER)
    assert node.call(p.ApiKey.DESCRIBE_ACLS, describe).error_code != CLUSTER_DENIED
    assert node.call(p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, users).error_code == 0
    node.authz.allow(Op.ALTER, RT.CLUSTER)
    results = node.call(p.ApiKey.CREATE_ACLS, create).results
    assert CLUSTER_DENIED not in [r.error_code for r in results]
