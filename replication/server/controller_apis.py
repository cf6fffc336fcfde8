"""Request handlers of the controller's APIs, as Kafka's ControllerApis: broker registration
and heartbeats, AlterPartition, producer id blocks, topic creation and deletion, config
changes (AlterConfigs, IncrementalAlterConfigs), partition reassignments, leader elections,
broker unregistration, ACLs (CreateAcls, DeleteAcls) and SCRAM credentials
(AlterUserScramCredentials). DescribeAcls and DescribeUserScramCredentials are answered by any
node from its metadata image (:func:`security_handlers`).

A standby controller answers NOT_CONTROLLER. On a node that is also a broker, KafkaApis
routes these APIs here (:mod:`replication.server.apis`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from logstore.errors import ReplogError
from replication import protocol as p
from replication.config import BrokerConfig
from replication.controller.controller import Controller
from replication.coordinator.group_metadata_manager import OFFSETS_TOPIC
from replication.coordinator.transaction import TRANSACTION_TOPIC
from replication.errors import (
    DuplicateResourceError,
    InvalidRequestError,
    NotControllerError,
    ResourceNotFoundError,
    SecurityDisabledError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from replication.metadata.image import MetadataImage
from replication.protocol import acls as pa
from replication.security.acl import AclBinding, AclBindingFilter, AclOperation, ResourceType
from replication.security.checks import NO_AUTH, AuthHelper
from replication.security.scram import (
    MECHANISMS,
    ScramCredential,
    credential_from_salted,
    mechanism_name,
)
from replication.server.responses import Handler, error_code, error_message


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
        self.forwarded_handlers: dict[int, Callable[[Any], Awaitable[Any]]] = {
            p.ApiKey.CREATE_TOPICS: self.create_topics,
            p.ApiKey.DELETE_TOPICS: self.delete_topics,
            p.ApiKey.CREATE_PARTITIONS: self.create_partitions,
            p.ApiKey.ALTER_CONFIGS: self.alter_configs,
            p.ApiKey.INCREMENTAL_ALTER_CONFIGS: self.alter_configs,
            p.ApiKey.ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            p.ApiKey.LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
            p.ApiKey.ELECT_LEADERS: self.elect_leaders,
            p.ApiKey.UNREGISTER_BROKER: self.unregister_broker,
            p.ApiKey.CREATE_ACLS: self.create_acls,
            p.ApiKey.DELETE_ACLS: self.delete_acls,
            p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
        }

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

    async def create_topics(self, body: p.CreateTopicsRequest) -> p.CreateTopicsResponse:
        controller = self.active_controller
        if controller is None:
            return not_controller_create(body)
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
        self, body: p.CreatePartitionsRequest
    ) -> p.CreatePartitionsResponse:
        controller = self.active_controller
        if controller is None:
            return not_controller_create_partitions(body)
        results = []
        for topic in body.topics:
            try:
                await asyncio.to_thread(
                    controller.create_partitions,
                    topic.name,
                    topic.count,
                    None
                    if topic.assignments is None
                    else [a.broker_ids for a in topic.assignments],
                    validate_only=body.validate_only,
                )
                results.append(p.CreatePartitionsTopicResult(name=topic.name))
            except ReplogError as err:
                results.append(
                    p.CreatePartitionsTopicResult(
                        name=topic.name,
                        error_code=error_code(err),
                        error_message=error_message(err),
                    )
                )
        return p.CreatePartitionsResponse(results=results)

    async def delete_topics(self, body: p.DeleteTopicsRequest) -> p.DeleteTopicsResponse:
        controller = self.active_controller
        if controller is None:
            return not_controller_delete(body)
        results = []
        for name in body.topic_names:
            try:
                await asyncio.to_thread(controller.delete_topic, name)
                results.append(p.DeletableTopicResult(name=name))
            except ReplogError as err:
                results.append(
                    p.DeletableTopicResult(
                        name=name, error_code=error_code(err), error_message=error_message(err)
                    )
                )
        return p.DeleteTopicsResponse(responses=results)

    # --- configs ------------------------------------------------------------------------------

    async def alter_configs(
        self, body: p.AlterConfigsRequest | p.IncrementalAlterConfigsRequest
    ) -> p.AlterConfigsResponse | p.IncrementalAlterConfigsResponse:
        """AlterConfigs (each resource's keys become its whole set of dynamic configs) or
        IncrementalAlterConfigs (SET / DELETE per key): per resource, done or why not."""
        controller = self.active_controller
        if controller is None:
            return not_controller_alter_configs(body)
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

    # --- reassignments, leader elections, unregistration --------------------------------------

    async def alter_partition_reassignments(self, body: Any) -> Any:
        controller = self.active_controller
        if controller is None:
            return not_controller_admin(p.ApiKey.ALTER_PARTITION_REASSIGNMENTS)
        return await _alter_partition_reassignments(controller, body)

    async def list_partition_reassignments(self, body: Any) -> Any:
        controller = self.active_controller
        if controller is None:
            return not_controller_admin(p.ApiKey.LIST_PARTITION_REASSIGNMENTS)
        return await _list_partition_reassignments(controller, body)

    async def elect_leaders(self, body: Any) -> Any:
        controller = self.active_controller
        if controller is None:
            return not_controller_admin(p.ApiKey.ELECT_LEADERS)
        return await _elect_leaders(controller, body)

    async def unregister_broker(self, body: Any) -> Any:
        controller = self.active_controller
        if controller is None:
            return not_controller_admin(p.ApiKey.UNREGISTER_BROKER)
        return await _unregister_broker(controller, body)

    # --- ACLs and SCRAM credentials ---------------------------------------------------------

    async def create_acls(self, body: pa.CreateAclsRequest) -> pa.CreateAclsResponse:
        """Add ACLs, one result per creation (SECURITY_DISABLED on every one without an
        authorizer, as Kafka: ACLs nothing enforces would only mislead)."""
        controller = self.active_controller
        if controller is None:
            return not_controller_create_acls(body)
        if not self.config.security.authorizer_class_name:
            return pa.CreateAclsResponse(
                results=[_acl_creation_error(SecurityDisabledError(_NO_AUTHORIZER))]
                * len(body.creations)
            )
        results: list[pa.AclCreationResult | None] = []
        bindings: list[AclBinding] = []
        for c in body.creations:
            try:
                bindings.append(
                    AclBinding.from_wire(
                        c.resource_type,
                        c.resource_name,
                        c.resource_pattern_type,
                        c.principal,
                        c.host,
                        c.operation,
                        c.permission_type,
                    )
                )
                results.append(None)
            except ReplogError as err:
                results.append(_acl_creation_error(err))
        try:
            outcomes = iter(await asyncio.to_thread(controller.create_acls, bindings))
        except ReplogError as err:
            return pa.CreateAclsResponse(results=[_acl_creation_error(err)] * len(results))
        answers = []
        for result in results:
            if result is None:
                failure = next(outcomes)
                result = pa.AclCreationResult() if failure is None else _acl_creation_error(failure)
            answers.append(result)
        return pa.CreateAclsResponse(results=answers)

    async def delete_acls(self, body: pa.DeleteAclsRequest) -> pa.DeleteAclsResponse:
        """Remove the ACLs each filter matches; per filter, the ACLs it removed."""
        controller = self.active_controller
        if controller is None:
            return not_controller_delete_acls(body)
        if not self.config.security.authorizer_class_name:
            return pa.DeleteAclsResponse(
                filter_results=[_acl_filter_error(SecurityDisabledError(_NO_AUTHORIZER))]
                * len(body.filters)
            )
        filters: list[AclBindingFilter | ReplogError] = []
        for f in body.filters:
            try:
                filters.append(
                    AclBindingFilter.from_wire(
                        f.resource_type_filter,
                        f.resource_name_filter,
                        f.pattern_type_filter,
                        f.principal_filter,
                        f.host_filter,
                        f.operation,
                        f.permission_type,
                    )
                )
            except ReplogError as err:
                filters.append(err)
        valid = [parsed for parsed in filters if isinstance(parsed, AclBindingFilter)]
        try:
            matched = iter(await asyncio.to_thread(controller.delete_acls, valid))
        except ReplogError as err:
            return pa.DeleteAclsResponse(filter_results=[_acl_filter_error(err)] * len(filters))
        results = []
        for parsed in filters:
            if isinstance(parsed, ReplogError):
                results.append(_acl_filter_error(parsed))
                continue
            results.append(
                pa.DeleteAclsFilterResult(
                    matching_acls=[
                        pa.DeleteAclsMatchingAcl(
                            resource_type=b.resource_type,
                            resource_name=b.resource_name,
                            pattern_type=b.pattern_type,
                            principal=b.principal,
                            host=b.host,
                            operation=b.operation,
                            permission_type=b.permission,
                        )
                        for b in next(matched)
                    ]
                )
            )
        return pa.DeleteAclsResponse(filter_results=results)

    async def alter_user_scram_credentials(
        self, body: pa.AlterUserScramCredentialsRequest
    ) -> pa.AlterUserScramCredentialsResponse:
        """Set or delete users' SCRAM credentials, one result per user. The request carries
        salted passwords; only the keys derived from them are kept."""
        controller = self.active_controller
        if controller is None:
            return not_controller_alter_scram(body)
        failed: dict[str, ReplogError] = {}
        upserts: list[ScramCredential] = []
        deletions: list[tuple[str, str]] = []
        for d in body.deletions:
            try:
                deletions.append((_scram_user(d.name), _scram_mechanism(d.mechanism)))
            except ReplogError as err:
                failed.setdefault(d.name, err)
        for u in body.upsertions:
            try:
                mechanism = _scram_mechanism(u.mechanism)
                try:
                    upserts.append(
                        credential_from_salted(
                            _scram_user(u.name), mechanism, u.iterations, u.salt, u.salted_password
                        )
                    )
                except ValueError as err:
                    raise UnacceptableCredentialError(str(err)) from None
            except ReplogError as err:
                failed.setdefault(u.name, err)
        users = list(
            dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions])
        )
        try:
            outcomes = await asyncio.to_thread(
                controller.alter_scram_credentials,
                [c for c in upserts if c.user not in failed],
                [(u, m) for u, m in deletions if u not in failed],
            )
        except ReplogError as err:
            outcomes = dict.fromkeys(users, err)
        results = []
        for user in users:
            error = failed.get(user) or outcomes.get(user)
            results.append(
                pa.AlterUserScramCredentialsResult(
                    user=user,
                    error_code=error_code(error) if error else 0,
                    error_message=error_message(error) if error else None,
                )
            )
        return pa.AlterUserScramCredentialsResponse(results=results)

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
                    controller.heartbeat, body.broker_id, body.broker_epoch
                )
        except ReplogError as err:
            return p.BrokerHeartbeatResponse(
                error_code=error_code(err), controller_epoch=controller.epoch
            )
        return p.BrokerHeartbeatResponse(
            is_caught_up=body.current_metadata_offset >= controller.image.version,
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


# --- ACLs and SCRAM credentials -----------------------------------------------------------------

_NO_AUTHORIZER = (
    "no authorizer is configured: set authorizer.class.name="
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer on the brokers and controllers"
)


def _acl_creation_error(err: ReplogError) -> pa.AclCreationResult:
    return pa.AclCreationResult(error_code=error_code(err), error_message=error_message(err))


def _acl_filter_error(err: ReplogError) -> pa.DeleteAclsFilterResult:
    return pa.DeleteAclsFilterResult(error_code=error_code(err), error_message=error_message(err))


def not_controller_create_acls(body: pa.CreateAclsRequest) -> pa.CreateAclsResponse:
    return pa.CreateAclsResponse(
        results=[_acl_creation_error(NotControllerError(_STANDBY))] * len(body.creations)
    )


def not_controller_delete_acls(body: pa.DeleteAclsRequest) -> pa.DeleteAclsResponse:
    return pa.DeleteAclsResponse(
        filter_results=[_acl_filter_error(NotControllerError(_STANDBY))] * len(body.filters)
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


def _scram_user(name: str) -> str:
    if not name:
        raise UnacceptableCredentialError("a SCRAM user name must not be empty")
    return name


def _scram_mechanism(code: int) -> str:
    try:
        return mechanism_name(code)
    except ValueError as err:
        raise UnsupportedSaslMechanismError(str(err)) from None


def describe_acls(
    config: BrokerConfig, image: MetadataImage, body: pa.DescribeAclsRequest
) -> pa.DescribeAclsResponse:
    """DescribeAcls from a metadata image: the bindings the filter matches, grouped by
    resource pattern (SECURITY_DISABLED without an authorizer, as Kafka)."""
    if not config.security.authorizer_class_name:
        err: ReplogError = SecurityDisabledError(_NO_AUTHORIZER)
        return pa.DescribeAclsResponse(error_code=error_code(err), error_message=error_message(err))
    try:
        f = AclBindingFilter.from_wire(
            body.resource_type_filter,
            body.resource_name_filter,
            body.pattern_type_filter,
            body.principal_filter,
            body.host_filter,
            body.operation,
            body.permission_type,
        )
    except ReplogError as err:
        return pa.DescribeAclsResponse(error_code=error_code(err), error_message=error_message(err))
    by_pattern: dict[tuple[int, str, int], list[pa.AclDescription]] = {}
    for b in image.acls:
        if f.matches(b):
            by_pattern.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
                pa.AclDescription(
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
            )
    return pa.DescribeAclsResponse(
        resources=[
            pa.DescribeAclsResource(
                resource_type=rtype, resource_name=name, pattern_type=pattern, acls=acls
            )
            for (rtype, name, pattern), acls in by_pattern.items()
        ]
    )


def describe_user_scram_credentials(
    image: MetadataImage, body: pa.DescribeUserScramCredentialsRequest
) -> pa.DescribeUserScramCredentialsResponse:
    """DescribeUserScramCredentials from a metadata image: each user's mechanisms and
    iteration counts (never a salt or key). No users named: every user with a credential."""
    infos: dict[str, list[pa.CredentialInfo]] = {}
    for c in image.scram_credentials:
        infos.setdefault(c.user, []).append(
            pa.CredentialInfo(mechanism=MECHANISMS[c.mechanism], iterations=c.iterations)
        )
    if not body.users:
        return pa.DescribeUserScramCredentialsResponse(
            results=[
                pa.DescribeUserScramCredentialsResult(user=user, credential_infos=found)
                for user, found in infos.items()
            ]
        )
    names = [u.name for u in body.users]
    results = []
    for user in dict.fromkeys(names):
        error: ReplogError | None = None
        if names.count(user) > 1:
            error = DuplicateResourceError(f"user {user!r} is named more than once")
        elif user not in infos:
            error = ResourceNotFoundError(f"user {user!r} has no SCRAM credential")
        results.append(
            pa.DescribeUserScramCredentialsResult(
                user=user,
                error_code=error_code(error) if error else 0,
                error_message=error_message(error) if error else None,
                credential_infos=[] if error else infos[user],
            )
        )
    return pa.DescribeUserScramCredentialsResponse(results=results)


def security_handlers(
    config: BrokerConfig, image: Callable[[], MetadataImage]
) -> dict[int, Handler]:
    """The handlers of DescribeAcls and DescribeUserScramCredentials, which any node answers
    from its metadata image (``image()``, read at each request); KafkaApis registers them.
    CreateAcls, DeleteAcls and AlterUserScramCredentials are forwarded (FORWARDED_APIS)."""

    async def handle_describe_acls(header: p.RequestHeader, body: pa.DescribeAclsRequest) -> Any:
        return describe_acls(config, image(), body)

    async def handle_describe_user_scram_credentials(
        header: p.RequestHeader, body: pa.DescribeUserScramCredentialsRequest
    ) -> Any:
        return describe_user_scram_credentials(image(), body)

    return {
        p.ApiKey.DESCRIBE_ACLS: handle_describe_acls,
        p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: handle_describe_user_scram_credentials,
    }
