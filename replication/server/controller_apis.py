"""Request handlers of the controller's APIs, as Kafka's ControllerApis: broker registration
and heartbeats, AlterPartition, producer id blocks, topic creation and deletion, config
changes (AlterConfigs, IncrementalAlterConfigs), partition reassignments, leader elections,
broker unregistration, the ACL and SCRAM credential changes (CreateAcls, DeleteAcls,
AlterUserScramCredentials: their handlers are :mod:`replication.server.security_apis`') and
the client quotas (AlterClientQuotas, :mod:`replication.server.quota_apis`).

A standby controller answers NOT_CONTROLLER (:func:`not_controller_answer`). On a node that is
also a broker, KafkaApis routes these APIs here (:mod:`replication.server.apis`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from logstore.errors import ReplogError
from replication import protocol as p
from replication.config import BrokerConfig
from replication.controller.controller import Controller
from replication.coordinator.group_metadata_manager import OFFSETS_TOPIC
from replication.coordinator.transaction import TRANSACTION_TOPIC
from replication.errors import (
    InconsistentClusterIdError,
    InvalidRequestError,
    NotControllerError,
)
from replication.metadata.image import MetadataImage
from replication.protocol import acls as pa
from replication.security.acl import AclOperation, ResourceType
from replication.security.checks import NO_AUTH, AuthHelper
from replication.server.quota_apis import alter_client_quotas, not_controller_alter_quotas
from replication.server.responses import Handler, answer_each, error_code, error_message
from replication.server.security_apis import (
    acl_creation_error,
    acl_filter_error,
    alter_user_scram_credentials,
    create_acls,
    delete_acls,
)

log = logging.getLogger(__name__)

#: how the active controller answers a forwarded request
ForwardedAnswer = Callable[[Controller, Any], Awaitable[Any]]


class ControllerHandle(Protocol):
    """The controller of this process, active or standing by (ControllerService)."""

    @property
    def controller(self) -> Controller: ...

    @property
    def active(self) -> bool: ...


#: the admin APIs any broker takes and the active controller answers (KRaft brokers forward
#: them, KIP-590); :meth:`ControllerApis.forwarded_handlers` answers them on the controller
FORWARDED_APIS = (
    p.ApiKey.CREATE_TOPICS,
    p.ApiKey.DELETE_TOPICS,
    p.ApiKey.CREATE_PARTITIONS,
    p.ApiKey.ALTER_CONFIGS,
    p.ApiKey.INCREMENTAL_ALTER_CONFIGS,
    p.ApiKey.ALTER_PARTITION_REASSIGNMENTS,
    p.ApiKey.LIST_PARTITION_REASSIGNMENTS,
    p.ApiKey.ELECT_LEADERS,
    p.ApiKey.UNREGISTER_BROKER,
    p.ApiKey.CREATE_ACLS,
    p.ApiKey.DELETE_ACLS,
    p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
    p.ApiKey.ALTER_CLIENT_QUOTAS,
)


def not_controller_create(body: p.CreateTopicsRequest) -> p.CreateTopicsResponse:
    """CreateTopics answered by a node that cannot reach the active controller."""
    return p.CreateTopicsResponse(
        topics=[
            p.CreatableTopicResult(
                name=t.name,
                error_code=NotControllerError.code,
                error_message="this controller is a standby; send it to the active controller",
            )
            for t in body.topics
        ]
    )


def not_controller_create_partitions(
    body: p.CreatePartitionsRequest,
) -> p.CreatePartitionsResponse:
    """CreatePartitions answered by a node that cannot reach the active controller."""
    return p.CreatePartitionsResponse(
        results=[
            p.CreatePartitionsTopicResult(
                name=t.name,
                error_code=NotControllerError.code,
                error_message="this controller is a standby; send it to the active controller",
            )
            for t in body.topics
        ]
    )


def not_controller_delete(body: p.DeleteTopicsRequest) -> p.DeleteTopicsResponse:
    """DeleteTopics answered by a node that cannot reach the active controller."""
    return p.DeleteTopicsResponse(
        responses=[
            p.DeletableTopicResult(name=n, error_code=NotControllerError.code)
            for n in body.topic_names
        ]
    )


def not_controller_alter_configs(
    body: p.AlterConfigsRequest | p.IncrementalAlterConfigsRequest,
) -> p.AlterConfigsResponse | p.IncrementalAlterConfigsResponse:
    """AlterConfigs / IncrementalAlterConfigs answered by a node that cannot reach the active
    controller."""
    incremental = isinstance(body, p.IncrementalAlterConfigsRequest)
    response = p.IncrementalAlterConfigsResponse if incremental else p.AlterConfigsResponse
    return response(
        responses=[
            p.AlterConfigsResourceResponse(
                error_code=NotControllerError.code,
                error_message="this controller is a standby; send it to the active controller",
                resource_type=r.resource_type,
                resource_name=r.resource_name,
            )
            for r in body.resources
        ]
    )


ConfigOps = list[tuple[int, str, str | None]]

#: Topics brokers create on first use (FindCoordinator), with internal_topic_placement.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_TOPIC})


def internal_topic_placement(
    image: MetadataImage, replication_factor: int, configs: list[tuple[str, str]]
) -> tuple[int, list[tuple[str, str]]]:
    """The replication factor and min ISR of an internal topic, decided here on the controller.

    A broker asks for the configured replication factor (offsets.topic.replication.factor).
    It gets at most the number of *registered* brokers, so that a one- or two-broker cluster
    has its coordinators; create_topic still refuses until that many are live, and the broker
    answers COORDINATOR_NOT_AVAILABLE meanwhile (Kafka refuses likewise until enough brokers
    are up). The count is the controller's: a broker's metadata can lag a registration, and an
    offsets topic it sized from its own view got 2 replicas in a 3-broker cluster, min ISR 2,
    and stopped taking writes at the first broker failure. Min ISR is 2 where it can be."""
    rf = max(1, min(replication_factor, len(image.brokers)))
    configs = [(k, v) for k, v in configs if k != "min.insync.replicas"]
    return rf, [*configs, ("min.insync.replicas", str(min(2, rf)))]


class ControllerApis:
    def __init__(self, config: BrokerConfig, service: ControllerHandle) -> None:
        self.config = config
        self.service = service
        #: authorization (the KafkaApis serving these installs its own; none until then)
        self.auth: AuthHelper = NO_AUTH
        self.handlers: dict[int, Handler] = {
            p.ApiKey.BROKER_REGISTRATION: self.handle_broker_registration,
            p.ApiKey.BROKER_HEARTBEAT: self.handle_broker_heartbeat,
            p.ApiKey.ALTER_PARTITION: self.handle_alter_partition,
            p.ApiKey.ALLOCATE_PRODUCER_IDS: self.handle_allocate_producer_ids,
        }
        #: how the active controller answers each of FORWARDED_APIS (KafkaApis.handle_forwarded
        #: routes them here, or onwards to the active controller)
        answers: dict[p.ApiKey, ForwardedAnswer] = {
            p.ApiKey.CREATE_TOPICS: self.create_topics,
            p.ApiKey.DELETE_TOPICS: self.delete_topics,
            p.ApiKey.CREATE_PARTITIONS: self.create_partitions,
            p.ApiKey.ALTER_CONFIGS: self.alter_configs,
            p.ApiKey.INCREMENTAL_ALTER_CONFIGS: self.alter_configs,
            p.ApiKey.ALTER_PARTITION_REASSIGNMENTS: _alter_partition_reassignments,
            p.ApiKey.LIST_PARTITION_REASSIGNMENTS: _list_partition_reassignments,
            p.ApiKey.ELECT_LEADERS: _elect_leaders,
            p.ApiKey.UNREGISTER_BROKER: _unregister_broker,
            p.ApiKey.CREATE_ACLS: functools.partial(create_acls, config),
            p.ApiKey.DELETE_ACLS: functools.partial(delete_acls, config),
            p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS: alter_user_scram_credentials,
            p.ApiKey.ALTER_CLIENT_QUOTAS: alter_client_quotas,
        }
        self.forwarded_handlers: dict[int, Callable[[Any], Awaitable[Any]]] = {
            api: self._when_active(api, answer) for api, answer in answers.items()
        }

    def _when_active(
        self, api: p.ApiKey, answer: ForwardedAnswer
    ) -> Callable[[Any], Awaitable[Any]]:
        """``answer(controller, body)`` while this controller is the active one; a standby
        answers NOT_CONTROLLER (:func:`not_controller_answer`)."""

        async def forwarded(body: Any) -> Any:
            controller = self.active_controller
            if controller is None:
                return not_controller_answer(api, body)
            return await answer(controller, body)

        return forwarded

    @property
    def active(self) -> bool:
        return self.service.active

    @property
    def active_controller(self) -> Controller | None:
        return self.service.controller if self.service.active else None

    @property
    def image(self) -> MetadataImage:
        """The controller's metadata (a standby's is what it last read)."""
        return self.service.controller.image

    # --- topics ------------------------------------------------------------------------------

    async def create_topics(
        self, controller: Controller, body: p.CreateTopicsRequest
    ) -> p.CreateTopicsResponse:
        results = []
        for topic in body.topics:
            partitions = (
                topic.num_partitions if topic.num_partitions != -1 else self.config.num_partitions
            )
            rf = (
                topic.replication_factor
                if topic.replication_factor != -1
                else self.config.default_replication_factor
            )
            configs = [(c.name, c.value or "") for c in topic.configs]
            if topic.name in INTERNAL_TOPICS:
                rf, configs = internal_topic_placement(self.image, rf, configs)
            try:
                await asyncio.to_thread(
                    controller.create_topic,
                    topic.name,
                    partitions,
                    rf,
                    configs,
                    validate_only=body.validate_only,
                )
                results.append(
                    p.CreatableTopicResult(
                        name=topic.name, num_partitions=partitions, replication_factor=rf
                    )
                )
            except ReplogError as err:
                results.append(
                    p.CreatableTopicResult(
                        name=topic.name,
                        error_code=error_code(err),
                        error_message=error_message(err),
                    )
                )
        return p.CreateTopicsResponse(topics=results)

    async def create_partitions(
        self, controller: Controller, body: p.CreatePartitionsRequest
    ) -> p.CreatePartitionsResponse:

        async def create(topic: p.CreatePartitionsTopic) -> p.CreatePartitionsTopicResult:
            await asyncio.to_thread(
                controller.create_partitions,
                topic.name,
                topic.count,
                None if topic.assignments is None else [a.broker_ids for a in topic.assignments],
                validate_only=body.validate_only,
            )
            return p.CreatePartitionsTopicResult(name=topic.name)

        results = await answer_each(
            body.topics,
            create,
            lambda topic, err: p.CreatePartitionsTopicResult(
                name=topic.name, error_code=error_code(err), error_message=error_message(err)
            ),
        )
        return p.CreatePartitionsResponse(results=results)

    async def delete_topics(
        self, controller: Controller, body: p.DeleteTopicsRequest
    ) -> p.DeleteTopicsResponse:

        async def delete(name: str) -> p.DeletableTopicResult:
            await asyncio.to_thread(controller.delete_topic, name)
            return p.DeletableTopicResult(name=name)

        results = await answer_each(
            body.topic_names,
            delete,
            lambda name, err: p.DeletableTopicResult(
                name=name, error_code=error_code(err), error_message=error_message(err)
            ),
        )
        return p.DeleteTopicsResponse(responses=results)

    # --- configs ------------------------------------------------------------------------------

    async def alter_configs(
        self, controller: Controller, body: p.AlterConfigsRequest | p.IncrementalAlterConfigsRequest
    ) -> p.AlterConfigsResponse | p.IncrementalAlterConfigsResponse:
        """AlterConfigs (each resource's keys become its whole set of dynamic configs) or
        IncrementalAlterConfigs (SET / DELETE per key): per resource, done or why not."""
        incremental = isinstance(body, p.IncrementalAlterConfigsRequest)
        results = []
        for resource in body.resources:
            ops: ConfigOps = [
                (getattr(c, "config_operation", p.CONFIG_OP_SET), c.name, c.value)
                for c in resource.configs
            ]
            try:
                if resource.resource_type == p.TOPIC_RESOURCE:
                    alter = controller.alter_topic_configs
                elif resource.resource_type == p.BROKER_RESOURCE:
                    alter = controller.alter_broker_configs
                else:
                    raise InvalidRequestError(
                        f"resource type {resource.resource_type} cannot be altered: use 2 "
                        "(topic) or 4 (broker)"
                    )
                await asyncio.to_thread(
                    alter,
                    resource.resource_name,
                    ops,
                    replace_all=not incremental,
                    validate_only=body.validate_only,
                )
                results.append(
                    p.AlterConfigsResourceResponse(
                        resource_type=resource.resource_type,
                        resource_name=resource.resource_name,
                    )
                )
            except ReplogError as err:
                results.append(
                    p.AlterConfigsResourceResponse(
                        error_code=error_code(err),
                        error_message=error_message(err),
                        resource_type=resource.resource_type,
                        resource_name=resource.resource_name,
                    )
                )
        response = p.IncrementalAlterConfigsResponse if incremental else p.AlterConfigsResponse
        return response(responses=results)

    # --- producer ids, brokers, ISR ----------------------------------------------------------

    def _cluster_action_denied(self, api: str) -> int:
        """0, or CLUSTER_AUTHORIZATION_FAILED's code: the APIs brokers send their controller
        need ClusterAction on the cluster (a client must not register or fence a broker)."""
        err = self.auth.check(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, api=api)
        return 0 if err is None else err.code or -1

    async def handle_allocate_producer_ids(
        self, header: p.RequestHeader, body: p.AllocateProducerIdsRequest
    ) -> Any:
        if denied := self._cluster_action_denied("AllocateProducerIds"):
            return p.AllocateProducerIdsResponse(error_code=denied)
        controller = self.active_controller
        if controller is None:
            return p.AllocateProducerIdsResponse(error_code=NotControllerError.code)
        try:
            block = await asyncio.to_thread(controller.allocate_producer_ids, 1000)
        except ReplogError as err:
            return p.AllocateProducerIdsResponse(error_code=error_code(err))
        return p.AllocateProducerIdsResponse(
            producer_id_start=block.start, producer_id_len=len(block)
        )

    async def handle_broker_registration(
        self, header: p.RequestHeader, body: p.BrokerRegistrationRequest
    ) -> Any:
        if denied := self._cluster_action_denied("BrokerRegistration"):
            return p.BrokerRegistrationResponse(error_code=denied)
        controller = self.active_controller
        if controller is None:
            return p.BrokerRegistrationResponse(error_code=NotControllerError.code)
        if not body.listeners:
            return p.BrokerRegistrationResponse(error_code=InvalidRequestError.code)
        cluster_id = controller.image.cluster_id
        if body.cluster_id and cluster_id and body.cluster_id != cluster_id:
            # the broker's log.dir was written for another cluster (its meta.properties)
            log.warning(
                "broker %d registers with cluster id %s, but this cluster is %s: refused",
                body.broker_id,
                body.cluster_id,
                cluster_id,
            )
            return p.BrokerRegistrationResponse(error_code=InconsistentClusterIdError.code)
        listener = body.listeners[0]
        endpoints = tuple((e.name, e.host, e.port) for e in body.listeners[1:])
        try:
            info = await asyncio.to_thread(
                controller.register_broker,
                body.broker_id,
                listener.host,
                listener.port,
                body.rack,
                str(body.incarnation_id),
                endpoints,
            )
        except ReplogError as err:
            return p.BrokerRegistrationResponse(error_code=error_code(err))
        return p.BrokerRegistrationResponse(broker_epoch=info.epoch)

    async def handle_broker_heartbeat(
        self, header: p.RequestHeader, body: p.BrokerHeartbeatRequest
    ) -> Any:
        if denied := self._cluster_action_denied("BrokerHeartbeat"):
            return p.BrokerHeartbeatResponse(error_code=denied)
        controller = self.active_controller
        if controller is None:
            return p.BrokerHeartbeatResponse(error_code=NotControllerError.code)
        try:
            # the steady case renews the session on the loop: no thread hop per heartbeat
            info = controller.heartbeat_in_memory(body.broker_id, body.broker_epoch)
            if info is None:
                info = await asyncio.to_thread(
                    controller.heartbeat,
                    body.broker_id,
                    body.broker_epoch,
                    body.current_metadata_offset,
                )
        except ReplogError as err:
            return p.BrokerHeartbeatResponse(
                error_code=error_code(err), controller_epoch=controller.epoch
            )
        return p.BrokerHeartbeatResponse(
            is_caught_up=controller.caught_up(body.broker_id, body.current_metadata_offset),
            is_fenced=info.fenced,
            metadata_version=controller.image.version,
            controller_epoch=controller.epoch,
        )

    async def handle_alter_partition(
        self, header: p.RequestHeader, body: p.AlterPartitionRequest
    ) -> Any:
        if denied := self._cluster_action_denied("AlterPartition"):
            return p.AlterPartitionResponse(error_code=denied)
        controller = self.active_controller
        if controller is None:
            return p.AlterPartitionResponse(error_code=NotControllerError.code)
        topics = []
        for t in body.topics:
            parts = []
            for part in t.partitions:
                try:
                    state = await asyncio.to_thread(
                        controller.alter_partition,
                        body.broker_id,
                        t.topic_name,
                        part.partition_index,
                        part.leader_epoch,
                        part.partition_epoch,
                        part.new_isr,
                    )
                    parts.append(
                        p.AlterPartitionResponsePartition(
                            partition_index=part.partition_index,
                            leader_id=state.leader,
                            leader_epoch=state.leader_epoch,
                            isr=list(state.isr),
                            partition_epoch=state.partition_epoch,
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.AlterPartitionResponsePartition(
                            partition_index=part.partition_index, error_code=error_code(err)
                        )
                    )
            topics.append(p.AlterPartitionResponseTopic(topic_name=t.topic_name, partitions=parts))
        return p.AlterPartitionResponse(topics=topics)


# --- reassignments, leader elections, unregistration ------------------------------------------

_STANDBY = "this controller is a standby; send it to the active controller"


def not_controller_answer(api_key: int, body: Any) -> Any:
    """What a node that cannot reach the active controller answers to a forwarded API (one of
    :attr:`ControllerApis.forwarded_handlers`)."""
    match api_key:
        case p.ApiKey.CREATE_TOPICS:
            return not_controller_create(body)
        case p.ApiKey.DELETE_TOPICS:
            return not_controller_delete(body)
        case p.ApiKey.CREATE_PARTITIONS:
            return not_controller_create_partitions(body)
        case p.ApiKey.ALTER_CONFIGS | p.ApiKey.INCREMENTAL_ALTER_CONFIGS:
            return not_controller_alter_configs(body)
        case p.ApiKey.CREATE_ACLS:
            return not_controller_create_acls(body)
        case p.ApiKey.DELETE_ACLS:
            return not_controller_delete_acls(body)
        case p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS:
            return not_controller_alter_scram(body)
        case p.ApiKey.ALTER_CLIENT_QUOTAS:
            return not_controller_alter_quotas(body)
        case _:
            return not_controller_admin(api_key)


def not_controller_admin(api_key: int) -> Any:
    """The answer of a node that cannot reach the active controller, for the admin APIs of
    reassignments, elections and unregistration (each has a top-level error code)."""
    if api_key == p.ApiKey.ELECT_LEADERS:
        return p.ElectLeadersResponse(error_code=NotControllerError.code)
    response = {
        p.ApiKey.ALTER_PARTITION_REASSIGNMENTS: p.AlterPartitionReassignmentsResponse,
        p.ApiKey.LIST_PARTITION_REASSIGNMENTS: p.ListPartitionReassignmentsResponse,
        p.ApiKey.UNREGISTER_BROKER: p.UnregisterBrokerResponse,
    }[p.ApiKey(api_key)]
    return response(error_code=NotControllerError.code, error_message=_STANDBY)


async def _alter_partition_reassignments(
    controller: Controller, body: p.AlterPartitionReassignmentsRequest
) -> p.AlterPartitionReassignmentsResponse:
    changes = [
        (t.name, part.partition_index, part.replicas) for t in body.topics for part in t.partitions
    ]
    try:
        results = await asyncio.to_thread(
            controller.alter_partition_reassignments, changes, throttled_rate=body.throttled_rate
        )
    except ReplogError as err:
        return p.AlterPartitionReassignmentsResponse(
            error_code=error_code(err), error_message=error_message(err)
        )
    by_topic: dict[str, list[p.ReassignablePartitionResponse]] = {}
    for (topic, index, _), failure in zip(changes, results, strict=True):
        by_topic.setdefault(topic, []).append(
            p.ReassignablePartitionResponse(
                partition_index=index,
                error_code=error_code(failure) if failure else 0,
                error_message=error_message(failure) if failure else None,
            )
        )
    return p.AlterPartitionReassignmentsResponse(
        responses=[p.ReassignableTopicResponse(name=n, partitions=ps) for n, ps in by_topic.items()]
    )


async def _list_partition_reassignments(
    controller: Controller, body: p.ListPartitionReassignmentsRequest
) -> p.ListPartitionReassignmentsResponse:
    wanted = (
        None
        if body.topics is None
        else [(t.name, i) for t in body.topics for i in t.partition_indexes]
    )
    ongoing = controller.list_partition_reassignments(wanted)
    by_topic: dict[str, list[p.OngoingPartitionReassignment]] = {}
    for topic, index, state in ongoing:
        by_topic.setdefault(topic, []).append(
            p.OngoingPartitionReassignment(
                partition_index=index,
                replicas=list(state.replicas),
                adding_replicas=list(state.adding_replicas),
                removing_replicas=list(state.removing_replicas),
            )
        )
    return p.ListPartitionReassignmentsResponse(
        topics=[p.OngoingTopicReassignment(name=n, partitions=ps) for n, ps in by_topic.items()]
    )


async def _elect_leaders(
    controller: Controller, body: p.ElectLeadersRequest
) -> p.ElectLeadersResponse:
    if body.election_type not in (p.PREFERRED_ELECTION, p.UNCLEAN_ELECTION):
        return p.ElectLeadersResponse(error_code=InvalidRequestError.code)
    wanted = (
        None
        if body.topic_partitions is None
        else [(t.topic, i) for t in body.topic_partitions for i in t.partitions]
    )
    try:
        results = await asyncio.to_thread(
            controller.elect_leaders, body.election_type == p.PREFERRED_ELECTION, wanted
        )
    except ReplogError as err:
        return p.ElectLeadersResponse(error_code=error_code(err))
    by_topic: dict[str, list[p.ElectLeadersPartitionResult]] = {}
    for (topic, index), failure in results.items():
        by_topic.setdefault(topic, []).append(
            p.ElectLeadersPartitionResult(
                partition_id=index,
                error_code=error_code(failure) if failure else 0,
                error_message=error_message(failure) if failure else None,
            )
        )
    return p.ElectLeadersResponse(
        replica_election_results=[
            p.ElectLeadersReplicaElectionResult(topic=t, partition_result=r)
            for t, r in by_topic.items()
        ]
    )


async def _unregister_broker(
    controller: Controller, body: p.UnregisterBrokerRequest
) -> p.UnregisterBrokerResponse:
    try:
        await asyncio.to_thread(controller.unregister_broker, body.broker_id)
    except ReplogError as err:
        return p.UnregisterBrokerResponse(
            error_code=error_code(err), error_message=error_message(err)
        )
    return p.UnregisterBrokerResponse()


def not_controller_create_acls(body: pa.CreateAclsRequest) -> pa.CreateAclsResponse:
    return pa.CreateAclsResponse(
        results=[acl_creation_error(NotControllerError(_STANDBY))] * len(body.creations)
    )


def not_controller_delete_acls(body: pa.DeleteAclsRequest) -> pa.DeleteAclsResponse:
    return pa.DeleteAclsResponse(
        filter_results=[acl_filter_error(NotControllerError(_STANDBY))] * len(body.filters)
    )


def not_controller_alter_scram(
    body: pa.AlterUserScramCredentialsRequest,
) -> pa.AlterUserScramCredentialsResponse:
    users = dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions])
    return pa.AlterUserScramCredentialsResponse(
        results=[
            pa.AlterUserScramCredentialsResult(
                user=user, error_code=NotControllerError.code, error_message=_STANDBY
            )
            for user in users
        ]
    )
