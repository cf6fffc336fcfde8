"""The handlers of a broker's metadata and admin APIs, a family of
:class:`~replication.server.apis.KafkaApis`: Metadata (with auto-creation), DescribeConfigs,
and the admin requests the active controller answers (topics, configs, reassignments,
elections, unregistration, ACLs and SCRAM credentials: FORWARDED_APIS), which a broker
authorizes and forwards to it (as KRaft brokers forward them, KIP-590).

What the principal may not do is refused here, per entry where the response has entries;
the rest goes to the controller, and the two answers are merged into one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any, cast

from replication import protocol as p
from replication.errors import (
    AuthorizationError,
    LeaderNotAvailableError,
    NotControllerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from replication.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from replication.security.principal import internal_scope
from replication.server.apis_base import KafkaApisBase
from replication.server.configs import describe_configs
from replication.server.controller_apis import not_controller_answer

__all__ = ["CONTROLLER_CHANGE_OPEN_WAIT_MS", "AdminApis"]

log = logging.getLogger(__name__)

_OP = AclOperation
_RT = ResourceType

#: how long a broker answering a controller change (CreateTopics...) waits for the replicas it
#: gave this broker to open (see AdminApis._after_controller_change)
CONTROLLER_CHANGE_OPEN_WAIT_MS = 5000


class AdminApis(KafkaApisBase):
    """Metadata, DescribeConfigs and the forwarded admin APIs (see the module's docstring)."""

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
            case p.ApiKey.ALTER_CLIENT_QUOTAS:
                whole = auth.check(_OP.ALTER_CONFIGS, _RT.CLUSTER, api=name)
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
