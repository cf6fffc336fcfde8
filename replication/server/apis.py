"""Request handlers of a broker's APIs, as Kafka's KafkaApis: one method per API, protocol
objects in and out. On a node that is also a controller, the controller's APIs are routed to
:class:`~replication.server.controller_apis.ControllerApis`.

Handlers turn :class:`ReplogError` into per-partition or per-topic error codes with the
error's message; nothing here touches sockets (socket_server.py) or storage (the replica
manager and the controller do).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

from logstore.batch import iter_batches, parse_header
from logstore.errors import OffsetOutOfRangeError, ReplogError
from logstore.reader import ObjectExtent
from replication import protocol as p
from replication.broker.fetch_metadata import PartitionFetchState
from replication.broker.fetch_session import FetchSessionCache
from replication.broker.lifecycle import BrokerLifecycle
from replication.broker.partition import Partition
from replication.broker.replica_manager import FetchSpec, ProduceResult, ReplicaManager
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.coordinator.group_metadata_manager import OFFSETS_TOPIC
from replication.coordinator.transaction import TRANSACTION_TOPIC, TransactionCoordinator
from replication.errors import (
    AuthorizationError,
    CoordinatorNotAvailableError,
    InvalidRequestError,
    LeaderNotAvailableError,
    NotControllerError,
    OperationNotAttemptedError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from replication.metadata.image import MetadataImage
from replication.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from replication.security.authorizer import Authorizer
from replication.security.checks import AuthHelper
from replication.security.principal import internal_scope
from replication.server.configs import describe_configs
from replication.server.controller_apis import (
    FORWARDED_APIS,
    ControllerApis,
    not_controller_answer,
    security_handlers,
)
from replication.server.group_apis import GroupApis
from replication.server.responses import Handler, error_code, error_message

log = logging.getLogger(__name__)

_OP = AclOperation
_RT = ResourceType

#: APIs answered by any node whose one check is an operation on the cluster (the ACL and SCRAM
#: listings: api_acls); their handlers are wrapped by the check when this node serves them
CLUSTER_CHECKED: dict[p.ApiKey, AclOperation] = {
    p.ApiKey.DESCRIBE_ACLS: AclOperation.DESCRIBE,
    p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: AclOperation.DESCRIBE,
}

#: the transactional id a sink's batches are committed under (the sink's own id is checked
#: as one, see api_acls)
SINK_TRANSACTIONAL_PREFIX = "replog-sink/"
#: how long a broker answering a controller change (CreateTopics...) waits for the replicas it
#: gave this broker to open (see KafkaApis._after_controller_change)
CONTROLLER_CHANGE_OPEN_WAIT_MS = 5000


class KafkaApis:
    def __init__(
        self,
        config: BrokerConfig,
        replica_manager: ReplicaManager | None,
        controller_apis: ControllerApis | None,
        lifecycle: BrokerLifecycle | None,
    ) -> None:
        self.config = config
        self._replica_manager = replica_manager
        self.controller_apis = controller_apis
        self.lifecycle = lifecycle
        #: The authorizer of this node, asked at each check (None: no authorization, the
        #: default). The node replaces it once its configuration and metadata are there.
        self.authorizer: Callable[[], Authorizer | None] = lambda: None
        #: what every handler (also the group and controller handlers) checks through
        self.auth = AuthHelper(lambda: self.authorizer())
        if controller_apis is not None:
            controller_apis.auth = self.auth
        #: set by the node once its broker side is up
        self.coordinator: TransactionCoordinator | None = None
        self.group_apis: GroupApis | None = None
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)
        self.handlers: dict[int, Handler] = {
            p.ApiKey.API_VERSIONS: self.handle_api_versions,
            p.ApiKey.METADATA: self.handle_metadata,
        }
        if replica_manager is not None:
            self.handlers.update(
                {
                    p.ApiKey.PRODUCE: self.handle_produce,
                    p.ApiKey.FETCH: self.handle_fetch,
                    p.ApiKey.LIST_OFFSETS: self.handle_list_offsets,
                    p.ApiKey.OFFSET_FOR_LEADER_EPOCH: self.handle_offsets_for_leader_epoch,
                    p.ApiKey.DESCRIBE_LOG_DIRS: self.handle_describe_log_dirs,
                    p.ApiKey.DESCRIBE_LOG_OBJECTS: self.handle_describe_log_objects,
                    p.ApiKey.DELETE_RECORDS: self.handle_delete_records,
                    p.ApiKey.DESCRIBE_CONFIGS: self.handle_describe_configs,
                    p.ApiKey.FIND_COORDINATOR: self.handle_find_coordinator,
                    p.ApiKey.INIT_PRODUCER_ID: self.handle_init_producer_id,
                    p.ApiKey.ADD_PARTITIONS_TO_TXN: self.handle_add_partitions_to_txn,
                    p.ApiKey.ADD_OFFSETS_TO_TXN: self.handle_add_offsets_to_txn,
                    p.ApiKey.END_TXN: self.handle_end_txn,
                    p.ApiKey.WRITE_TXN_MARKERS: self.handle_write_txn_markers,
                    p.ApiKey.LIST_TRANSACTIONS: self.handle_list_transactions,
                    p.ApiKey.DESCRIBE_TRANSACTIONS: self.handle_describe_transactions,
                    p.ApiKey.DESCRIBE_PRODUCERS: self.handle_describe_producers,
                    p.ApiKey.COMMIT_SINK_BATCH: self.handle_commit_sink_batch,
                    p.ApiKey.DESCRIBE_SINK: self.handle_describe_sink,
                }
            )
        for api_key in FORWARDED_APIS:
            self.handlers[api_key] = self.handle_forwarded
        self.handlers.update(security_handlers(config, lambda: self.image))
        if controller_apis is not None:
            self.handlers.update(controller_apis.handlers)
        for checked, operation in CLUSTER_CHECKED.items():
            if checked in self.handlers:
                self.handlers[checked] = self._cluster_checked(
                    checked, operation, self.handlers[checked]
                )

    def _cluster_checked(self, api: p.ApiKey, operation: AclOperation, handler: Handler) -> Handler:
        """``handler`` behind a check of ``operation`` on the cluster: refused as a whole
        (CLUSTER_AUTHORIZATION_FAILED at the top level of its answer)."""

        async def checked(header: p.RequestHeader, body: Any) -> Any:
            err = self.auth.check(operation, _RT.CLUSTER, api=api.kafka_name)
            if err is not None:
                return _cluster_refusal(p.response_class(header.api_key, header.api_version), err)
            return await handler(header, body)

        return checked

    @property
    def replica_manager(self) -> ReplicaManager:
        assert self._replica_manager is not None
        return self._replica_manager

    @property
    def image(self) -> MetadataImage:
        if self._replica_manager is not None:
            return self._replica_manager.image
        assert self.controller_apis is not None
        return self.controller_apis.image

    async def handle(self, header: p.RequestHeader, body: Any) -> Any:
        """The response body, or None when no response is sent (Produce with acks=0)."""
        handler = self.handlers.get(header.api_key)
        if handler is None:
            raise UnsupportedVersionError(
                f"API {p.ApiKey(header.api_key).name} is not served by this broker"
            )
        return await handler(header, body)

    # --- ApiVersions, Metadata ---------------------------------------------------------------

    async def handle_api_versions(self, header: p.RequestHeader, body: Any) -> Any:
        return p.ApiVersionsResponse(
            api_keys=[
                p.ApiVersionsResponseKey(api_key=int(k), min_version=lo, max_version=hi)
                for k, (lo, hi) in p.SUPPORTED_VERSIONS.items()
                if k in self.handlers
            ]
        )

    async def _after_controller_change(self) -> None:
        """Make this process's own view of metadata include what the controller just did,
        and the replicas it gave this broker open (they open in the background, off the event
        loop): a client's next request usually uses them. At most
        CONTROLLER_CHANGE_OPEN_WAIT_MS, so a change of thousands of partitions on a slow
        store still answers in time (its replicas answer NOT_LEADER_OR_FOLLOWER, retriable,
        until they are open)."""
        if self.lifecycle is not None:
            await self.lifecycle.refresh_metadata()
            await self.replica_manager.wait_for_opens(CONTROLLER_CHANGE_OPEN_WAIT_MS / 1000)

    async def handle_metadata(self, header: p.RequestHeader, body: p.MetadataRequest) -> Any:
        """Brokers and topics. Named topics the principal may not Describe answer
        TOPIC_AUTHORIZATION_FAILED (whether they exist or not); all topics: only those it may
        Describe. Auto-creating a missing topic needs Create on the cluster or the topic."""
        auth = self.auth
        image = self.image
        denied: set[str] = set()
        if body.topics is None:
            names = [t.name for t in image.topics]
            if auth.enabled:
                visible = auth.filter(
                    _OP.DESCRIBE, _RT.TOPIC, names, api="Metadata", log_denied=False
                )
                names = [n for n in names if n in visible]
        else:
            names = [t.name for t in body.topics]
            denied = set(names) - auth.filter(_OP.DESCRIBE, _RT.TOPIC, names, api="Metadata")
            missing = [n for n in names if n not in denied and image.topic(n) is None]
            auto_create = body.allow_auto_topic_creation and self.config.auto_create_topics_enable
            if missing and auto_create and not self._may_create_all(missing, "Metadata"):
                may = auth.filter(_OP.CREATE, _RT.TOPIC, missing, api="Metadata")
                denied.update(n for n in missing if n not in may)
                missing = [n for n in missing if n in may]
            if missing and auto_create:
                await self.handle_create_topics(
                    header,
                    p.CreateTopicsRequest(
                        topics=[
                            p.CreatableTopic(name=name, num_partitions=-1, replication_factor=-1)
                            for name in missing
                        ]
                    ),
                )
                image = self.image
        topics = []
        for name in names:
            if name in denied:
                topics.append(
                    p.MetadataResponseTopic(
                        error_code=auth.error(_OP.DESCRIBE, _RT.TOPIC, name).code or -1,
                        name=name,
                    )
                )
                continue
            info = image.topic(name)
            if info is None:
                topics.append(
                    p.MetadataResponseTopic(error_code=UnknownTopicOrPartitionError.code, name=name)
                )
                continue
            partitions = []
            for index, state in enumerate(info.partitions):
                leader_ok = state.leader >= 0
                partitions.append(
                    p.MetadataResponsePartition(
                        error_code=0 if leader_ok else LeaderNotAvailableError.code,
                        partition_index=index,
                        leader_id=state.leader,
                        leader_epoch=state.leader_epoch,
                        replica_nodes=list(state.replicas),
                        isr_nodes=list(state.isr),
                        offline_replicas=[
                            r for r in state.replicas if (b := image.broker(r)) is None or b.fenced
                        ],
                    )
                )
            topics.append(
                p.MetadataResponseTopic(
                    name=name, partitions=partitions, is_internal=name.startswith("__")
                )
            )
        return p.MetadataResponse(
            brokers=[
                p.MetadataResponseBroker(node_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
                for b in image.brokers
                if not b.fenced
            ],
            cluster_id=image.cluster_id or None,
            controller_id=image.controller_id,
            topics=topics,
        )

    # --- topics ------------------------------------------------------------------------------

    async def handle_forwarded(self, header: p.RequestHeader, body: Any) -> Any:
        """Topic, config, reassignment, election and unregistration requests: answered by this
        process's controller if it is the active one, else forwarded to the active controller
        (as KRaft brokers forward them, KIP-590). Whatever the controller changed is in this
        process's metadata before the answer goes back."""
        api = p.ApiKey(header.api_key)
        # Authorized here, as the client, before forwarding: the controller sees the request
        # on this broker's own connection, under the broker's principal (no KIP-590 envelope).
        allowed_body, refused = self._authorize_forwarded(api, body)
        if allowed_body is None:
            return _merge_forwarded(api, body, None, refused)
        controller = self.controller_apis
        if controller is not None and (controller.active or self.lifecycle is None):
            response = await controller.forwarded_handlers[api](allowed_body)
        elif self.lifecycle is not None:
            response = await self.lifecycle.controller_request(api, allowed_body)
        else:  # a broker still starting: no way to the controller yet
            response = not_controller_answer(api, allowed_body)
        if api != p.ApiKey.LIST_PARTITION_REASSIGNMENTS:
            await self._after_controller_change()
        return _merge_forwarded(api, body, response, refused)

    def _may_create_all(self, names: Iterable[str], api: str) -> bool:
        """Create on the cluster (Kafka checks it first, without logging a denial: Create on
        each topic may still allow it)."""
        return self.auth.allowed(_OP.CREATE, _RT.CLUSTER, api=api, log_denied=False)

    def _authorize_forwarded(self, api: p.ApiKey, body: Any) -> tuple[Any | None, list[Any]]:
        """The part of a forwarded request the principal may do (None: nothing, or all of it
        refused as one), and the answer entries of the refused parts (see api_acls).

        A principal with ClusterAction on the cluster is a broker forwarding what it has
        authorized already (as Kafka's controller trusts an envelope from a broker)."""
        auth = self.auth
        if not auth.enabled:
            return body, []
        name = api.kafka_name
        if auth.allowed(_OP.CLUSTER_ACTION, _RT.CLUSTER, api=name, log_denied=False):
            return body, []
        match api:
            case p.ApiKey.CREATE_TOPICS:
                if self._may_create_all((t.name for t in body.topics), name):
                    return body, []
                may = auth.filter(_OP.CREATE, _RT.TOPIC, (t.name for t in body.topics), api=name)
                refused: list[Any] = [
                    p.CreatableTopicResult(
                        name=t.name,
                        error_code=(err := auth.error(_OP.CREATE, _RT.TOPIC, t.name)).code or -1,
                        error_message=str(err),
                    )
                    for t in body.topics
                    if t.name not in may
                ]
                kept = [t for t in body.topics if t.name in may]
                return (dataclasses.replace(body, topics=kept) if kept else None), refused
            case p.ApiKey.DELETE_TOPICS:
                may = auth.filter(_OP.DELETE, _RT.TOPIC, body.topic_names, api=name)
                refused = [
                    p.DeletableTopicResult(
                        name=n,
                        error_code=(err := auth.error(_OP.DELETE, _RT.TOPIC, n)).code or -1,
                        error_message=str(err),
                    )
                    for n in body.topic_names
                    if n not in may
                ]
                names = [n for n in body.topic_names if n in may]
                return (dataclasses.replace(body, topic_names=names) if names else None), refused
            case p.ApiKey.CREATE_PARTITIONS:
                may = auth.filter(_OP.ALTER, _RT.TOPIC, (t.name for t in body.topics), api=name)
                refused = [
                    p.CreatePartitionsTopicResult(
                        name=t.name,
                        error_code=(err := auth.error(_OP.ALTER, _RT.TOPIC, t.name)).code or -1,
                        error_message=str(err),
                    )
                    for t in body.topics
                    if t.name not in may
                ]
                kept = [t for t in body.topics if t.name in may]
                return (dataclasses.replace(body, topics=kept) if kept else None), refused
            case p.ApiKey.ALTER_CONFIGS | p.ApiKey.INCREMENTAL_ALTER_CONFIGS:
                kept, refused = [], []
                for r in body.resources:
                    denied = self._config_check(
                        _OP.ALTER_CONFIGS, r.resource_type, r.resource_name, name
                    )
                    if denied is None:
                        kept.append(r)
                    else:
                        refused.append(
                            p.AlterConfigsResourceResponse(
                                error_code=denied.code or -1,
                                error_message=str(denied),
                                resource_type=r.resource_type,
                                resource_name=r.resource_name,
                            )
                        )
                return (dataclasses.replace(body, resources=kept) if kept else None), refused
            case p.ApiKey.LIST_PARTITION_REASSIGNMENTS:
                whole = auth.check(_OP.DESCRIBE, _RT.CLUSTER, api=name)
            case _:  # reassignments, elections, unregistration: Alter on the cluster
                whole = auth.check(_OP.ALTER, _RT.CLUSTER, api=name)
        return (body, []) if whole is None else (None, [whole])

    def _config_check(
        self, operation: AclOperation, resource_type: int, resource_name: str, api: str
    ) -> AuthorizationError | None:
        """A config resource's check: a topic's configs are the topic's, a broker's the
        cluster's; other types are left to the handler (it refuses them)."""
        if resource_type == p.TOPIC_RESOURCE:
            return self.auth.check(operation, _RT.TOPIC, resource_name, api=api)
        if resource_type == p.BROKER_RESOURCE:
            return self.auth.check(operation, _RT.CLUSTER, CLUSTER_NAME, api=api)
        return None

    async def handle_create_topics(
        self, header: p.RequestHeader, body: p.CreateTopicsRequest
    ) -> p.CreateTopicsResponse:
        # Metadata's auto-creation comes here with its own header: forward a CreateTopics
        if header.api_key != p.ApiKey.CREATE_TOPICS:
            header = dataclasses.replace(header, api_key=p.ApiKey.CREATE_TOPICS)
        return cast(p.CreateTopicsResponse, await self.handle_forwarded(header, body))

    async def handle_delete_records(
        self, header: p.RequestHeader, body: p.DeleteRecordsRequest
    ) -> Any:
        """Advance each partition's log start offset on its leader (offset -1: the high
        watermark). Followers follow through the log start offset in their fetches.

        Kafka answers once every replica has deleted (the low watermark of the replicas); here
        the leader's new log start offset is the answer, since no replica serves records below
        it to a consumer once the leader has moved it (followers are not read by consumers)."""
        rm = self.replica_manager
        topics = []
        may = self.auth.filter(
            _OP.DELETE, _RT.TOPIC, (t.name for t in body.topics), api="DeleteRecords"
        )
        for t in body.topics:
            parts = []
            for part in t.partitions:
                try:
                    if t.name not in may:
                        raise self.auth.error(_OP.DELETE, _RT.TOPIC, t.name)
                    partition = rm.get_partition(t.name, part.partition_index)
                    partition.check_leader_epoch(-1, require_leader=True)
                    plog = partition.log
                    offset = plog.high_watermark if part.offset == -1 else part.offset
                    if not plog.log_start_offset <= offset <= plog.high_watermark:
                        raise OffsetOutOfRangeError(
                            f"{t.name}-{part.partition_index}: cannot delete records before "
                            f"offset {part.offset}: it must be between the log start offset "
                            f"{plog.log_start_offset} and the high watermark "
                            f"{plog.high_watermark} (or -1 for the high watermark)"
                        )
                    low = await asyncio.to_thread(plog.delete_records_before, offset)
                    parts.append(
                        p.DeleteRecordsPartitionResult(
                            partition_index=part.partition_index, low_watermark=low
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.DeleteRecordsPartitionResult(
                            partition_index=part.partition_index, error_code=error_code(err)
                        )
                    )
            topics.append(p.DeleteRecordsTopicResult(name=t.name, partitions=parts))
        return p.DeleteRecordsResponse(topics=topics)

    async def handle_describe_configs(
        self, header: p.RequestHeader, body: p.DescribeConfigsRequest
    ) -> Any:
        """Each resource's configs: a topic's need DescribeConfigs on the topic, a broker's on
        the cluster (else TOPIC_ / CLUSTER_AUTHORIZATION_FAILED for that resource)."""
        results = []
        for r in body.resources:
            err = self._config_check(
                _OP.DESCRIBE_CONFIGS, r.resource_type, r.resource_name, "DescribeConfigs"
            )
            if err is not None:
                results.append(
                    p.DescribeConfigsResult(
                        error_code=err.code or -1,
                        error_message=str(err),
                        resource_type=r.resource_type,
                        resource_name=r.resource_name,
                    )
                )
            else:
                results.append(describe_configs(self.config, self.image, r))
        return p.DescribeConfigsResponse(results=results)

    # --- transactions --------------------------------------------------------------------------

    @property
    def txn_coordinator(self) -> TransactionCoordinator:
        assert self.coordinator is not None
        return self.coordinator

    async def _transaction_partition_leader(self) -> int:
        """The leader of __transaction_state-0, creating the topic on first use (as Kafka)."""
        info = self.image.topic(TRANSACTION_TOPIC)
        if info is None:
            await self.create_internal_topic(TRANSACTION_TOPIC, 1, 3)
            info = self.image.topic(TRANSACTION_TOPIC)
        return info.partitions[0].leader if info is not None else -1

    def serve_groups(self, group_apis: GroupApis) -> None:
        """Serve the consumer group APIs (the node calls this once its broker side is up)."""
        self.group_apis = group_apis
        group_apis.auth = self.auth
        self.handlers.update(group_apis.handlers)

    async def create_internal_topic(self, name: str, partitions: int, replication: int) -> None:
        """Create an internal topic: ``replication`` replicas, or as many as the controller
        has registered brokers if fewer, min ISR 2 where it can be (the controller decides:
        ``controller_apis.internal_topic_placement``); kept whole (no retention).

        The controller refuses until that many brokers are live: created while one of three
        is restarting, it would get 2 replicas with min ISR 2 and stop taking writes at the
        next failure. Until then nothing is created, and the caller answers
        COORDINATOR_NOT_AVAILABLE, which clients retry (Kafka refuses likewise until
        offsets.topic.replication.factor brokers are up).

        The node creates it on its own behalf (internal_scope): the client whose
        FindCoordinator needed it may not create topics."""
        with internal_scope():
            response = await self._create_internal_topic(name, partitions, replication)
        for result in response.topics:
            if result.error_code and result.error_code != TopicAlreadyExistsError.code:
                log.info("not creating %s yet: %s", name, result.error_message)

    async def _create_internal_topic(
        self, name: str, partitions: int, replication: int
    ) -> p.CreateTopicsResponse:
        return await self.handle_create_topics(
            p.RequestHeader(api_key=p.ApiKey.CREATE_TOPICS, api_version=0, correlation_id=0),
            p.CreateTopicsRequest(
                topics=[
                    p.CreatableTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=replication,
                        configs=[
                            # Kafka compacts its internal topics; replog has no compaction, so
                            # it keeps them whole (a sink's last committed batch, a group's
                            # offsets must outlive any retention).
                            p.CreatableTopicConfig(name="retention.ms", value="-1"),
                            p.CreatableTopicConfig(name="retention.bytes", value="-1"),
                        ],
                    )
                ]
            ),
        )

    async def handle_find_coordinator(
        self, header: p.RequestHeader, body: p.FindCoordinatorRequest
    ) -> Any:
        if body.key_type in (p.GROUP_KEY_TYPE, p.TRANSACTION_KEY_TYPE):
            rtype = _RT.GROUP if body.key_type == p.GROUP_KEY_TYPE else _RT.TRANSACTIONAL_ID
            err = self.auth.check(_OP.DESCRIBE, rtype, body.key, api="FindCoordinator")
            if err is not None:
                return p.FindCoordinatorResponse(error_code=err.code or -1, error_message=str(err))
        if body.key_type == p.GROUP_KEY_TYPE:
            if self.group_apis is None:
                return p.FindCoordinatorResponse(
                    error_code=CoordinatorNotAvailableError.code,
                    error_message="this broker is starting; retry",
                )
            return await self.group_apis.find_coordinator(body.key)
        if body.key_type != p.TRANSACTION_KEY_TYPE:
            return p.FindCoordinatorResponse(
                error_code=InvalidRequestError.code,
                error_message=f"key_type {body.key_type} is neither 0 (group) nor 1 (transaction)",
            )
        leader = await self._transaction_partition_leader()
        broker = self.image.broker(leader) if leader >= 0 else None
        if broker is None:
            return p.FindCoordinatorResponse(
                error_code=CoordinatorNotAvailableError.code,
                error_message="the transaction coordinator is not available yet; retry",
            )
        return p.FindCoordinatorResponse(
            node_id=broker.broker_id, host=broker.host, port=broker.port
        )

    async def handle_init_producer_id(
        self, header: p.RequestHeader, body: p.InitProducerIdRequest
    ) -> Any:
        api = "InitProducerId"
        if body.transactional_id is not None:
            err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api=api)
        elif self.auth.allowed(
            _OP.IDEMPOTENT_WRITE, _RT.CLUSTER, api=api, log_denied=False
        ) or self.auth.allowed_any(_OP.WRITE, _RT.TOPIC, api=api):
            err = None
        else:  # KIP-679: IdempotentWrite on the cluster, or Write on some topic
            err = self.auth.error(_OP.IDEMPOTENT_WRITE, _RT.CLUSTER)
        if err is not None:
            return p.InitProducerIdResponse(error_code=err.code or -1)
        try:
            pid, epoch = await self.txn_coordinator.init_producer_id(
                body.transactional_id, body.transaction_timeout_ms
            )
        except ReplogError as err:
            return p.InitProducerIdResponse(error_code=error_code(err))
        return p.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    async def handle_add_partitions_to_txn(
        self, header: p.RequestHeader, body: p.AddPartitionsToTxnRequest
    ) -> Any:
        """Add partitions to the transaction. Without Write on the transactional id, every
        partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED; without Write on a topic, its
        partitions answer TOPIC_AUTHORIZATION_FAILED and the others OPERATION_NOT_ATTEMPTED
        (nothing is added: Kafka's answer)."""
        api = "AddPartitionsToTxn"
        codes: dict[str, int] = {}
        err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api=api)
        if err is not None:
            codes = dict.fromkeys((t.name for t in body.topics), err.code or -1)
        else:
            may = self.auth.filter(_OP.WRITE, _RT.TOPIC, (t.name for t in body.topics), api=api)
            if len(may) < len({t.name for t in body.topics}):
                denied = TopicAuthorizationFailedError.code
                codes = {
                    t.name: OperationNotAttemptedError.code if t.name in may else denied
                    for t in body.topics
                }
        if not codes:
            code = 0
            try:
                await self.txn_coordinator.add_partitions(
                    body.transactional_id,
                    body.producer_id,
                    body.producer_epoch,
                    [TopicPartition(t.name, i) for t in body.topics for i in t.partitions],
                )
            except ReplogError as failure:
                code = error_code(failure)
            codes = dict.fromkeys((t.name for t in body.topics), code)
        return p.AddPartitionsToTxnResponse(
            results=[
                p.AddPartitionsToTxnTopicResult(
                    name=t.name,
                    results=[
                        p.AddPartitionsToTxnPartitionResult(
                            partition_index=i, error_code=codes[t.name]
                        )
                        for i in t.partitions
                    ],
                )
                for t in body.topics
            ]
        )

    async def handle_add_offsets_to_txn(
        self, header: p.RequestHeader, body: p.AddOffsetsToTxnRequest
    ) -> Any:
        """Add the group's __consumer_offsets partition to the transaction, so its markers
        reach the offsets the transaction commits (Kafka's AddOffsetsToTxn)."""
        api = "AddOffsetsToTxn"
        err = self.auth.check(
            _OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api=api
        ) or self.auth.check(_OP.READ, _RT.GROUP, body.group_id, api=api)
        if err is not None:
            return p.AddOffsetsToTxnResponse(error_code=err.code or -1)
        if self.group_apis is None:
            return p.AddOffsetsToTxnResponse(error_code=CoordinatorNotAvailableError.code)
        try:
            tp = await self.group_apis.offsets_partition(body.group_id)
            await self.txn_coordinator.add_partitions(
                body.transactional_id, body.producer_id, body.producer_epoch, [tp]
            )
        except ReplogError as err:
            return p.AddOffsetsToTxnResponse(error_code=error_code(err))
        return p.AddOffsetsToTxnResponse()

    async def handle_end_txn(self, header: p.RequestHeader, body: p.EndTxnRequest) -> Any:
        err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api="EndTxn")
        if err is not None:
            return p.EndTxnResponse(error_code=err.code or -1)
        try:
            await self.txn_coordinator.end_txn(
                body.transactional_id, body.producer_id, body.producer_epoch, body.committed
            )
        except ReplogError as err:
            return p.EndTxnResponse(error_code=error_code(err))
        return p.EndTxnResponse()

    async def handle_write_txn_markers(
        self, header: p.RequestHeader | None, body: p.WriteTxnMarkersRequest
    ) -> p.WriteTxnMarkersResponse:
        """Write transaction markers (from a transaction coordinator: ClusterAction on the
        cluster, else CLUSTER_AUTHORIZATION_FAILED on every partition). The node's own
        coordinator calls this in internal_scope."""
        err = self.auth.check(_OP.CLUSTER_ACTION, _RT.CLUSTER, api="WriteTxnMarkers")
        if err is not None:
            return p.WriteTxnMarkersResponse(
                markers=[
                    p.WritableTxnMarkerResult(
                        producer_id=m.producer_id,
                        topics=[
                            p.WritableTxnMarkerTopicResult(
                                name=t.name,
                                partitions=[
                                    p.WritableTxnMarkerPartitionResult(
                                        partition_index=i, error_code=err.code or -1
                                    )
                                    for i in t.partition_indexes
                                ],
                            )
                            for t in m.topics
                        ],
                    )
                    for m in body.markers
                ]
            )
        markers = [
            (m.producer_id, m.producer_epoch, m.transaction_result, m.coordinator_epoch, t.name, i)
            for m in body.markers
            for t in m.topics
            for i in t.partition_indexes
        ]
        results = await self.replica_manager.write_txn_markers(
            markers, self.config.request_timeout_ms
        )
        if self.group_apis is not None:
            # markers on __consumer_offsets settle the offsets of the transaction
            for producer_id, _, result, _, topic, index in markers:
                if topic == OFFSETS_TOPIC and results[(producer_id, topic, index)] is None:
                    self.group_apis.coordinator.complete_txn(index, producer_id, bool(result))
        return p.WriteTxnMarkersResponse(
            markers=[
                p.WritableTxnMarkerResult(
                    producer_id=m.producer_id,
                    topics=[
                        p.WritableTxnMarkerTopicResult(
                            name=t.name,
                            partitions=[
                                p.WritableTxnMarkerPartitionResult(
                                    partition_index=i,
                                    error_code=error_code(results[(m.producer_id, t.name, i)]),
                                )
                                for i in t.partition_indexes
                            ],
                        )
                        for t in m.topics
                    ],
                )
                for m in body.markers
            ]
        )

    async def write_own_txn_markers(
        self, request: p.WriteTxnMarkersRequest
    ) -> p.WriteTxnMarkersResponse:
        """The markers this node's transaction coordinator writes to its own partitions: the
        node's own work (internal_scope), not a request of the client it is serving."""
        with internal_scope():
            return await self.handle_write_txn_markers(None, request)

    async def handle_list_transactions(
        self, header: p.RequestHeader, body: p.ListTransactionsRequest
    ) -> Any:
        try:
            listings = self.txn_coordinator.listings(body.state_filters)
        except ReplogError as err:
            return p.ListTransactionsResponse(error_code=error_code(err))
        if self.auth.enabled:
            visible = self.auth.filter(
                _OP.DESCRIBE,
                _RT.TRANSACTIONAL_ID,
                (m.transactional_id for m in listings),
                api="ListTransactions",
                log_denied=False,
            )
            listings = [m for m in listings if m.transactional_id in visible]
        return p.ListTransactionsResponse(
            transactions=[
                p.TransactionListing(
                    transactional_id=m.transactional_id,
                    producer_id=m.producer_id,
                    producer_epoch=m.producer_epoch,
                    transaction_state=m.state.value,
                    transaction_timeout_ms=m.timeout_ms,
                    transaction_start_time_ms=m.start_ms,
                    partitions=[
                        p.TransactionPartition(topic=t, partition=i)
                        for t, i in sorted(m.partitions)
                    ],
                )
                for m in listings
            ]
        )

    async def handle_describe_transactions(
        self, header: p.RequestHeader, body: p.DescribeTransactionsRequest
    ) -> Any:
        """The coordinator's state of each transactional id (Kafka's DescribeTransactions)."""
        states = []
        api = "DescribeTransactions"
        for transactional_id in body.transactional_ids:
            denied = self.auth.check(_OP.DESCRIBE, _RT.TRANSACTIONAL_ID, transactional_id, api=api)
            if denied is not None:
                states.append(
                    p.TransactionState(
                        error_code=denied.code or -1, transactional_id=transactional_id
                    )
                )
                continue
            try:
                m = self.txn_coordinator.describe(transactional_id)
            except ReplogError as err:
                states.append(
                    p.TransactionState(
                        error_code=error_code(err), transactional_id=transactional_id
                    )
                )
                continue
            topics: dict[str, list[int]] = {}
            for t, i in sorted(m.partitions):
                topics.setdefault(t, []).append(i)
            if self.auth.enabled:  # the partitions of topics it may not Describe are left out
                visible = self.auth.filter(
                    _OP.DESCRIBE, _RT.TOPIC, topics, api=api, log_denied=False
                )
                topics = {t: ps for t, ps in topics.items() if t in visible}
            states.append(
                p.TransactionState(
                    transactional_id=transactional_id,
                    transaction_state=m.state.value,
                    transaction_timeout_ms=m.timeout_ms,
                    transaction_start_time_ms=m.start_ms,
                    producer_id=m.producer_id,
                    producer_epoch=m.producer_epoch,
                    topics=[p.TopicData(topic=t, partitions=ps) for t, ps in topics.items()],
                )
            )
        return p.DescribeTransactionsResponse(transaction_states=states)

    async def handle_describe_producers(
        self, header: p.RequestHeader, body: p.DescribeProducersRequest
    ) -> Any:
        """The producers each partition's leader knows, with their open transaction's first
        offset (Kafka's DescribeProducers; what kafka-transactions.sh find-hanging reads)."""
        rm = self.replica_manager
        topics = []
        may = self.auth.filter(
            _OP.READ, _RT.TOPIC, (t.name for t in body.topics), api="DescribeProducers"
        )
        for t in body.topics:
            parts = []
            for index in t.partition_indexes:
                try:
                    if t.name not in may:
                        raise self.auth.error(_OP.READ, _RT.TOPIC, t.name)
                    partition = rm.get_partition(t.name, index)
                    partition.check_leader_epoch(-1, require_leader=True)
                    producers = await asyncio.to_thread(_active_producers, partition)
                    parts.append(
                        p.DescribeProducersPartitionResponse(
                            partition_index=index, active_producers=producers
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.DescribeProducersPartitionResponse(
                            partition_index=index,
                            error_code=error_code(err),
                            error_message=str(err),
                        )
                    )
            topics.append(p.DescribeProducersTopicResponse(name=t.name, partitions=parts))
        return p.DescribeProducersResponse(topics=topics)

    async def handle_commit_sink_batch(
        self, header: p.RequestHeader, body: p.CommitSinkBatchRequest
    ) -> Any:
        """Commit a sink's batch: Write on every transaction's id and on the sink's own
        (``replog-sink/<sink_id>``), or a producer could mark another sink's batch committed
        with its own transactions and make that sink's replay abort."""
        api = "CommitSinkBatch"
        for name in [
            *(t.transactional_id for t in body.transactions),
            SINK_TRANSACTIONAL_PREFIX + body.sink_id,
        ]:
            err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, name, api=api)
            if err is not None:
                return p.CommitSinkBatchResponse(
                    error_code=err.code or -1, error_message=error_message(err)
                )
        try:
            result = await self.txn_coordinator.commit_sink_batch(
                body.sink_id,
                body.batch_id,
                [(t.transactional_id, t.producer_id, t.producer_epoch) for t in body.transactions],
                abort=body.abort,
            )
        except ReplogError as err:
            return p.CommitSinkBatchResponse(
                error_code=error_code(err), error_message=error_message(err)
            )
        return p.CommitSinkBatchResponse(
            committed=result.committed, last_committed_batch=result.last_committed_batch
        )

    async def handle_describe_sink(
        self, header: p.RequestHeader, body: p.DescribeSinkRequest
    ) -> Any:
        name = SINK_TRANSACTIONAL_PREFIX + body.sink_id
        err = self.auth.check(_OP.DESCRIBE, _RT.TRANSACTIONAL_ID, name, api="DescribeSink")
        if err is not None:
            return p.DescribeSinkResponse(error_code=err.code or -1)
        try:
            last = self.txn_coordinator.last_committed_batch(body.sink_id)
        except ReplogError as err:
            return p.DescribeSinkResponse(error_code=error_code(err))
        return p.DescribeSinkResponse(last_committed_batch=last)

    # --- produce and fetch -------------------------------------------------------------------

    def authorize_produce(
        self, transactional_id: str | None, transactional: bool, topics: Iterable[str]
    ) -> dict[str, AuthorizationError]:
        """The topics a Produce may not write to, with the error to answer on each of their
        partitions: all of them (TRANSACTIONAL_ID_AUTHORIZATION_FAILED) without Write on the
        transactional id, else those without Write on the topic (TOPIC_AUTHORIZATION_FAILED).
        ``transactional``: the request carries transactional batches (Kafka refuses them
        without a transactional id). Both listeners' Produce handlers call this."""
        names = set(topics)
        if not self.auth.enabled:
            return {}
        api = "Produce"
        if transactional_id is not None or transactional:
            err = (
                self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, transactional_id, api=api)
                if transactional_id is not None
                else self.auth.error(_OP.WRITE, _RT.TRANSACTIONAL_ID, "null")
            )
            if err is not None:
                return dict.fromkeys(names, err)
        may = self.auth.filter(_OP.WRITE, _RT.TOPIC, names, api=api)
        return {n: self.auth.error(_OP.WRITE, _RT.TOPIC, n) for n in names - may}

    async def handle_produce(self, header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        refused = self.authorize_produce(
            body.transactional_id,
            self.auth.enabled
            and any(
                _transactional(part.records) for t in body.topic_data for part in t.partition_data
            ),
            (t.name for t in body.topic_data),
        )
        entries = [
            (topic.name, part.index, part.records)
            for topic in body.topic_data
            for part in topic.partition_data
            if topic.name not in refused
        ]
        results = await self.replica_manager.append_records(body.acks, body.timeout_ms, entries)
        if body.acks == 0:
            return None
        for name, err in refused.items():
            for topic in body.topic_data:
                if topic.name == name:
                    for part in topic.partition_data:
                        results[TopicPartition(name, part.index)] = ProduceResult(error=err)
        return p.ProduceResponse(
            responses=[
                p.ProduceResponseTopic(
                    name=topic.name,
                    partition_responses=[
                        p.ProduceResponsePartition(
                            index=part.index,
                            error_code=error_code(r.error),
                            base_offset=r.base_offset,
                            log_start_offset=r.log_start_offset,
                            error_message=error_message(r.error),
                        )
                        for part in topic.partition_data
                        for r in [results[TopicPartition(topic.name, part.index)]]
                    ],
                )
                for topic in body.topic_data
            ]
        )

    async def handle_fetch(self, header: p.RequestHeader, body: p.FetchRequest) -> Any:
        requested = [
            (
                TopicPartition(t.topic, part.partition),
                PartitionFetchState(
                    fetch_offset=part.fetch_offset,
                    max_bytes=part.partition_max_bytes,
                    current_leader_epoch=part.current_leader_epoch,
                    last_fetched_epoch=part.last_fetched_epoch,
                    log_start_offset=part.log_start_offset,
                ),
            )
            for t in body.topics
            for part in t.partitions
        ]
        forgotten = [
            TopicPartition(f.topic, i) for f in body.forgotten_topics_data for i in f.partitions
        ]
        context = self.fetch_sessions.new_context(
            body.session_id,
            body.session_epoch,
            requested,
            forgotten,
            is_from_follower=body.replica_id >= 0,
        )
        if context.error is not None:
            return p.FetchResponse(error_code=context.error_code, session_id=context.session_id)
        # A follower needs ClusterAction on the cluster, a consumer Read on each topic; a
        # partition refused answers TOPIC_AUTHORIZATION_FAILED (Kafka's answer in both cases)
        # and is neither read nor counted as the follower's fetch.
        refused: dict[str, AuthorizationError] = {}
        if self.auth.enabled:
            wanted = {topic for topic, _, _ in context.partitions()}
            if body.replica_id >= 0:
                err = self.auth.check(_OP.CLUSTER_ACTION, _RT.CLUSTER, api="Fetch")
                if err is not None:
                    refused = dict.fromkeys(wanted, TopicAuthorizationFailedError(str(err)))
            else:
                may = self.auth.filter(_OP.READ, _RT.TOPIC, wanted, api="Fetch")
                refused = {t: self.auth.error(_OP.READ, _RT.TOPIC, t) for t in wanted - may}
        specs = [
            FetchSpec(
                topic=topic,
                partition=index,
                fetch_offset=state.fetch_offset,
                partition_max_bytes=state.max_bytes,
                current_leader_epoch=state.current_leader_epoch,
                last_fetched_epoch=state.last_fetched_epoch,
            )
            for topic, index, state in context.partitions()
            if topic not in refused
        ]
        data = await self.replica_manager.fetch(
            body.replica_id,
            specs,
            max_wait_ms=body.max_wait_ms,
            min_bytes=body.min_bytes,
            max_bytes=body.max_bytes,
            isolation_level=body.isolation_level,
        )
        results = {
            key: p.FetchResponsePartition(
                partition_index=key[1],
                error_code=error_code(d.error),
                high_watermark=d.high_watermark,
                last_stable_offset=d.last_stable_offset,
                log_start_offset=d.log_start_offset,
                diverging_epoch=p.EpochEndOffset(
                    epoch=d.diverging_epoch[0], end_offset=d.diverging_epoch[1]
                )
                if d.diverging_epoch
                else p.EpochEndOffset(),
                records=d.records,
                aborted_transactions=None
                if d.aborted is None
                else [
                    p.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in d.aborted
                ],
            )
            for key, d in data.items()
        }
        for topic, index, _ in context.partitions():
            if topic in refused:
                results[TopicPartition(topic, index)] = p.FetchResponsePartition(
                    partition_index=index, error_code=refused[topic].code or -1
                )
        by_topic: dict[str, list[p.FetchResponsePartition]] = {}
        for (topic, _), part in context.filter_response(results):
            by_topic.setdefault(topic, []).append(part)
        return p.FetchResponse(
            error_code=context.error_code,
            session_id=context.session_id,
            responses=[p.FetchResponseTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )

    async def handle_list_offsets(self, header: p.RequestHeader, body: p.ListOffsetsRequest) -> Any:
        rm = self.replica_manager
        topics = []
        may = self.auth.filter(
            _OP.DESCRIBE, _RT.TOPIC, (t.name for t in body.topics), api="ListOffsets"
        )
        for t in body.topics:
            parts = []
            for part in t.partitions:
                try:
                    if t.name not in may:
                        raise self.auth.error(_OP.DESCRIBE, _RT.TOPIC, t.name)
                    partition = rm.get_partition(t.name, part.partition_index)
                    partition.check_leader_epoch(part.current_leader_epoch, require_leader=True)
                    if part.timestamp != p.EARLIEST_TIMESTAMP:
                        partition.check_high_watermark_known()
                    upper = (
                        partition.last_stable_offset
                        if body.isolation_level == 1
                        else partition.high_watermark
                    )
                    plog = partition.log
                    timestamp, offset = -1, -1
                    if part.timestamp == p.EARLIEST_TIMESTAMP:
                        offset = plog.log_start_offset
                    elif part.timestamp == p.LATEST_TIMESTAMP:
                        offset = upper
                    else:
                        found = await asyncio.to_thread(plog.offset_for_timestamp, part.timestamp)
                        if found is not None and found[0] < upper:
                            offset, timestamp = found
                    parts.append(
                        p.ListOffsetsResponsePartition(
                            partition_index=part.partition_index,
                            timestamp=timestamp,
                            offset=offset,
                            leader_epoch=partition.leader_epoch,
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.ListOffsetsResponsePartition(
                            partition_index=part.partition_index, error_code=error_code(err)
                        )
                    )
            topics.append(p.ListOffsetsResponseTopic(name=t.name, partitions=parts))
        return p.ListOffsetsResponse(topics=topics)

    async def handle_describe_log_dirs(
        self, header: p.RequestHeader, body: p.DescribeLogDirsRequest
    ) -> Any:
        """The replicas this broker holds. Kafka needs Describe on the cluster
        (CLUSTER_AUTHORIZATION_FAILED); replog also leaves out topics the principal may not
        Read: a log dir is where direct segment reads (Spark) start."""
        api = "DescribeLogDirs"
        err = self.auth.check(_OP.DESCRIBE, _RT.CLUSTER, api=api)
        if err is not None:
            return p.DescribeLogDirsResponse(error_code=err.code or -1)
        rm = self.replica_manager
        wanted = (
            None
            if body.topics is None
            else {(t.topic, i) for t in body.topics for i in t.partitions}
        )
        readable: set[str] | None = None
        if self.auth.enabled:
            readable = self.auth.filter(
                _OP.READ, _RT.TOPIC, (t for t, _ in rm.partitions), api=api, log_denied=False
            )
        by_topic: dict[str, list[p.DescribeLogDirsPartition]] = {}
        for (topic, index), partition in sorted(rm.partitions.items()):
            if wanted is not None and (topic, index) not in wanted:
                continue
            if readable is not None and topic not in readable:
                continue
            plog = partition.log
            by_topic.setdefault(topic, []).append(
                p.DescribeLogDirsPartition(
                    partition_index=index,
                    partition_size=plog.size_in_bytes,
                    log_start_offset=plog.log_start_offset,
                    log_end_offset=plog.log_end_offset,
                    durable_end_offset=plog.durable_end_offset,
                    high_watermark=plog.high_watermark,
                    leader_epoch=partition.leader_epoch,
                    is_leader=partition.is_leader,
                )
            )
        return p.DescribeLogDirsResponse(
            results=[
                p.DescribeLogDirsResult(
                    log_dir=self.config.log_dir,
                    topics=[
                        p.DescribeLogDirsTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                    ],
                )
            ]
        )

    async def handle_describe_log_objects(
        self, header: p.RequestHeader, body: p.DescribeLogObjectsRequest
    ) -> Any:
        """Where this broker's replicas hold offsets ``[start, end)`` on its storage, from the
        logs' extent lists in memory (no storage request): Spark's planner asks this instead of
        listing ``<topic>/<p>/`` per partition per micro-batch, and learns the WAL chunks a
        listing cannot find. Any replica answers (leader or follower): direct reads go to
        whichever in-sync replica the planner chose.

        Authorized as DescribeLogDirs, which it refines: Describe on the cluster (else
        CLUSTER_AUTHORIZATION_FAILED for the whole request), and Read on each topic (else
        TOPIC_AUTHORIZATION_FAILED on its partitions: the answer leads to the topic's bytes).
        Extents end at the replica's durable end: nothing beyond it is in storage yet."""
        api = "DescribeLogObjects"
        err = self.auth.check(_OP.DESCRIBE, _RT.CLUSTER, api=api)
        if err is not None:
            return p.DescribeLogObjectsResponse(
                error_code=err.code or -1, log_dir=self.config.log_dir
            )
        rm = self.replica_manager
        names = {t.name for t in body.topics}
        readable = self.auth.filter(_OP.READ, _RT.TOPIC, names, api=api) if names else set()
        topics = []
        for t in body.topics:
            parts = []
            for want in t.partitions:
                try:
                    if t.name not in readable:
                        raise self.auth.error(_OP.READ, _RT.TOPIC, t.name)
                    if want.start_offset < 0 or (
                        want.end_offset >= 0 and want.end_offset < want.start_offset
                    ):
                        raise InvalidRequestError(
                            f"DescribeLogObjects of {t.name}-{want.partition_index}: the range "
                            f"[{want.start_offset}, {want.end_offset}) is not a range of offsets; "
                            "ask for 0 <= start <= end (end -1: to the log end)"
                        )
                    partition = rm.get_partition(t.name, want.partition_index)
                    parts.append(_log_objects(t.name, want, partition))
                except ReplogError as failure:
                    parts.append(
                        p.DescribeLogObjectsPartitionResponse(
                            partition_index=want.partition_index,
                            error_code=error_code(failure),
                            error_message=error_message(failure),
                        )
                    )
            topics.append(p.DescribeLogObjectsTopicResponse(name=t.name, partitions=parts))
        return p.DescribeLogObjectsResponse(log_dir=self.config.log_dir, topics=topics)

    async def handle_offsets_for_leader_epoch(
        self, header: p.RequestHeader, body: p.OffsetsForLeaderEpochRequest
    ) -> Any:
        rm = self.replica_manager
        topics = []
        # Kafka: ClusterAction on the cluster (a follower), else Describe on each topic (a
        # consumer checking for truncation, KIP-320); TOPIC_AUTHORIZATION_FAILED per partition
        api = "OffsetForLeaderEpoch"
        names = [t.topic for t in body.topics]
        may = (
            set(names)
            if self.auth.allowed(_OP.CLUSTER_ACTION, _RT.CLUSTER, api=api, log_denied=False)
            else self.auth.filter(_OP.DESCRIBE, _RT.TOPIC, names, api=api)
        )
        for t in body.topics:
            parts = []
            for part in t.partitions:
                try:
                    if t.topic not in may:
                        raise self.auth.error(_OP.DESCRIBE, _RT.TOPIC, t.topic)
                    partition = rm.get_partition(t.topic, part.partition)
                    partition.check_leader_epoch(part.current_leader_epoch, require_leader=True)
                    epoch, end = partition.log.end_offset_for_epoch(part.leader_epoch)
                    parts.append(
                        p.OffsetForLeaderPartitionResult(
                            partition=part.partition, leader_epoch=epoch, end_offset=end
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.OffsetForLeaderPartitionResult(
                            partition=part.partition, error_code=error_code(err)
                        )
                    )
            topics.append(p.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
        return p.OffsetsForLeaderEpochResponse(topics=topics)


def _transactional(records: Any) -> bool:
    """Is the (first) batch of a partition's records transactional? (A malformed one is not:
    the log refuses it with its own error.)"""
    if not records:
        return False
    try:
        return parse_header(records).is_transactional
    except (ReplogError, ValueError):
        return False


def _merge_forwarded(api: p.ApiKey, body: Any, response: Any, refused: list[Any]) -> Any:
    """The answer to a forwarded request: the controller's ``response`` (None: nothing was
    forwarded) with the entries refused here, or the whole refusal (one error in
    ``refused``, for the APIs checked as a whole)."""
    if not refused:
        return response
    match api:
        case p.ApiKey.CREATE_TOPICS:
            done = response.topics if response is not None else []
            return p.CreateTopicsResponse(topics=[*done, *refused])
        case p.ApiKey.DELETE_TOPICS:
            done = response.responses if response is not None else []
            return p.DeleteTopicsResponse(responses=[*done, *refused])
        case p.ApiKey.CREATE_PARTITIONS:
            done = response.results if response is not None else []
            return p.CreatePartitionsResponse(results=[*done, *refused])
        case p.ApiKey.ALTER_CONFIGS | p.ApiKey.INCREMENTAL_ALTER_CONFIGS:
            done = response.responses if response is not None else []
            incremental = api == p.ApiKey.INCREMENTAL_ALTER_CONFIGS
            kind = p.IncrementalAlterConfigsResponse if incremental else p.AlterConfigsResponse
            return kind(responses=[*done, *refused])
        case _:
            # Refused as a whole: the answer a node without a controller gives, every
            # NOT_CONTROLLER in it (top level, or per entry) made this refusal.
            return _as_refused(not_controller_answer(api, body), refused[0])


def _as_refused(message: Any, err: AuthorizationError) -> Any:
    """``message`` with each NOT_CONTROLLER error code (and its message) replaced by ``err``."""
    if isinstance(message, list):
        return [_as_refused(m, err) for m in message]
    if not dataclasses.is_dataclass(message) or isinstance(message, type):
        return message
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        if f.name == "error_code" and value == NotControllerError.code:
            changes["error_code"] = err.code or -1
            if any(g.name == "error_message" for g in dataclasses.fields(message)):
                changes["error_message"] = str(err)
        elif isinstance(value, list) or dataclasses.is_dataclass(value):
            changes[f.name] = _as_refused(value, err)
    return dataclasses.replace(message, **changes)


def _cluster_refusal(response_class: type, err: AuthorizationError) -> Any:
    """A response refused as a whole at its top-level error code (and message, if it has
    one)."""
    names = {f.name for f in dataclasses.fields(response_class)}
    fields: dict[str, Any] = {"error_code": err.code or -1}
    if "error_message" in names:
        fields["error_message"] = str(err)
    return response_class(**fields)


def _active_producers(partition: Partition) -> list[p.ProducerState]:
    """The producers of ``partition``'s producer state; an open transaction's start time is
    the timestamp of its first batch, read from the log."""
    out = []
    for entry in list(partition.producer_state.producers.values()):
        started = -1
        first = entry.current_txn_first_offset
        if first >= 0:
            try:
                data = partition.log.read(first, 1)
                batches = list(iter_batches(data))
                if batches:
                    started = batches[0].first_timestamp
            except ReplogError as err:
                log.warning("%r: reading the transaction at %d failed: %s", partition, first, err)
        out.append(
            p.ProducerState(
                producer_id=entry.producer_id,
                producer_epoch=entry.producer_epoch,
                last_sequence=entry.last_seq,
                last_timestamp=started,
                coordinator_epoch=entry.coordinator_epoch,
                current_txn_start_offset=first,
            )
        )
    return sorted(out, key=lambda s: s.producer_id)


def _log_objects(
    topic: str, want: p.DescribeLogObjectsPartition, partition: Partition
) -> p.DescribeLogObjectsPartitionResponse:
    """One partition's answer to DescribeLogObjects: the extents of its log that hold offsets
    ``[start, end)`` below its durable end, as paths relative to the broker's storage root
    (segment objects under ``<topic>/<partition>/``, chunks where the WAL put them)."""
    plog = partition.log
    # One snapshot of the extents, and the durable end read before it: every extent listed
    # was written before that end was reached, so none runs past what storage holds.
    durable = plog.durable_end_offset
    extents = plog.extents()
    end = durable if want.end_offset < 0 else min(want.end_offset, durable)
    found = []
    directory = f"{topic}/{want.partition_index}"
    for extent in extents:
        if extent.next_offset <= want.start_offset or extent.base_offset >= end:
            continue
        e = ObjectExtent.of(extent, directory)
        found.append(
            p.LogObjectExtent(
                path=e.path,
                position=e.position,
                size=e.size,
                base_offset=e.base_offset,
                next_offset=e.next_offset,
            )
        )
    return p.DescribeLogObjectsPartitionResponse(
        partition_index=want.partition_index,
        high_watermark=plog.high_watermark,
        durable_end_offset=durable,
        log_start_offset=plog.log_start_offset,
        extents=found,
    )
