"""The admin client: topics, the cluster, offsets, transactions and Spark sink commits.

Topic changes go to the controller (any broker forwards them; NOT_CONTROLLER makes the client
refresh metadata and retry). Per-topic errors are raised as their named classes
(TopicAlreadyExistsError, InvalidPartitionsError, InvalidReplicationFactorError,
UnknownTopicOrPartitionError, ...) carrying the broker's message; when several topics fail, the
first failure is raised after every topic was tried, and the others are logged.

Configs (:meth:`Admin.describe_configs`, :meth:`Admin.alter_configs`,
:meth:`Admin.incremental_alter_configs`) are described by a broker (a broker's own configs by
that broker) and changed through the controller, which keeps them in the cluster metadata.
Records are deleted (:meth:`Admin.delete_records`) by each partition's leader.

Replica logs (:meth:`Admin.describe_log_dirs`) are asked of the brokers holding them, and a
partition's aborted transactions (:meth:`Admin.aborted_transactions`) of its leader, as a
read_committed Fetch that asks for no records: what a reader of segment objects (the Spark
source's executors) needs to read straight from storage.

Transactions and sinks go to the transaction coordinator (found with FindCoordinator; retried
as Kafka's clients retry, see :mod:`replication.client.coordinator`). A sink commit either
raises CommitFailedError (it did not happen: the caller may clean up, e.g. abort) or
CommitStateUnknownError (it may have happened: the caller must not clean up, and may call
again, which is safe: a batch is committed at most once).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from logstore.reader import AbortedTxnRange, ObjectExtent
from replication.client.cluster import Cluster
from replication.client.config import AdminConfig, load
from replication.client.coordinator import CallState, CoordinatorClient
from replication.client.errors import ClientClosedError
from replication.client.group_admin import GroupAdmin
from replication.client.offsets import OffsetLookup
from replication.client.reassignments import PartitionReassignment
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.transaction_admin import TransactionAdmin
from replication.client.types import (
    BrokerInfo,
    ClusterDescription,
    ConfigEntry,
    ConsumerGroupDescription,
    HangingTransaction,
    NewTopic,
    PartitionInfo,
    ProducerState,
    ReplicaLog,
    SinkCommitResult,
    TopicDescription,
    TopicPartition,
    TransactionHandle,
    TransactionListing,
)
from replication.errors import (
    BrokerNotAvailableError,
    CommitFailedError,
    CommitStateUnknownError,
    LeaderNotAvailableError,
    NetworkError,
    NotControllerError,
    OffsetOutOfRangeError,
    ReplogError,
    UnknownTopicOrPartitionError,
    for_code,
)
from replication.protocol import (
    BROKER_RESOURCE,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    PREFERRED_ELECTION,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TOPIC_RESOURCE,
    UNCLEAN_ELECTION,
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterConfigsResourceResponse,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ApiKey,
    CommitSinkBatchRequest,
    CommitSinkBatchResponse,
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopic,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribableLogDirTopic,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeLogObjectsPartition,
    DescribeLogObjectsRequest,
    DescribeLogObjectsResponse,
    DescribeLogObjectsTopic,
    DescribeSinkRequest,
    DescribeSinkResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ElectLeadersTopicPartitions,
    FetchRequest,
    FetchRequestPartition,
    FetchRequestTopic,
    FetchResponse,
    IncrementalAlterableConfig,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResource,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    ListPartitionReassignmentsTopics,
    ListTransactionsRequest,
    ListTransactionsResponse,
    MetadataResponse,
    ReassignablePartition,
    ReassignableTopic,
    SinkTransaction,
    UnregisterBrokerRequest,
    UnregisterBrokerResponse,
)
from replication.protocol import acls as pa
from replication.security.acl import AclBinding, AclBindingFilter
from replication.security.scram import (
    DEFAULT_ITERATIONS,
    MECHANISMS,
    SALT_BYTES,
    mechanism_name,
    salted_password,
)

__all__ = [
    "Admin",
    "ConfigResourceType",
    "LogObjects",
    "OffsetSpec",
    "UserScramCredentialUpsertion",
]

log = logging.getLogger(__name__)

#: What :meth:`Admin.list_offsets` looks up: the log start, the end, or a timestamp (ms).
OffsetSpec = Literal["earliest", "latest"] | int

T = TypeVar("T")

#: The resources whose configs :meth:`Admin.describe_configs` and the alter calls take
#: (Kafka's ConfigResource.Type TOPIC and BROKER).
ConfigResourceType = Literal["topic", "broker"]
_RESOURCE_TYPES: Final = {"topic": TOPIC_RESOURCE, "broker": BROKER_RESOURCE}
#: Kafka's names of DescribeConfigs' config sources.
_CONFIG_SOURCES: Final = {
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
}

#: Kafka's transaction states, as ListTransactions filters take them.
TRANSACTION_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
)
_COMMITTED_STATES = frozenset({"PrepareCommit", "CompleteCommit"})
_ABORTED_STATES = frozenset({"PrepareAbort", "CompleteAbort"})
_DESCRIBE_LOG_DIRS_VERSION: Final = 0
_DESCRIBE_LOG_OBJECTS_VERSION: Final = 0


@dataclass(frozen=True)
class LogObjects:
    """Where one replica holds an offset range on its storage (DescribeLogObjects)."""

    broker_id: int
    #: the broker's storage root (``log.dir``): the extents' paths are relative to it
    log_dir: str
    high_watermark: int
    #: the end of what is in the replica's storage; the extents stop there
    durable_end_offset: int
    log_start_offset: int
    #: the extents holding the range, in offset order
    extents: tuple[ObjectExtent, ...]


#: A Fetch without a session (KIP-227's FINAL_EPOCH).
_NO_SESSION_EPOCH: Final = -1


#: What to do about a DeleteRecords error (its response carries no message).
_DELETE_RECORDS_HINTS: Final = {
    OffsetOutOfRangeError.code: "the offset must be between the partition's log start offset and "
    "its high watermark (or -1 for the high watermark); see them with `replog topics describe`",
}


def _resource_type(resource_type: str) -> int:
    code = _RESOURCE_TYPES.get(resource_type)
    if code is None:
        raise ValueError(f"config resource type {resource_type!r}: use 'topic' or 'broker'")
    return code


def _resource_text(resource_type: str, name: str) -> str:
    if resource_type == "broker" and not name:
        return "the default broker configs"
    return f"{resource_type} {name!r} configs"


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Set ``user``'s SCRAM credential for ``mechanism`` (Kafka's
    UserScramCredentialUpsertion). The password is salted here and never sent; it never shows
    in a repr."""

    user: str
    password: str = field(repr=False)
    mechanism: str = "SCRAM-SHA-512"
    iterations: int = DEFAULT_ITERATIONS


def _error(code: int, message: str | None, what: str) -> ReplogError:
    cls = for_code(code) or ReplogError
    return cls(f"{what}: {message or str(cls())}")


class Admin:
    """Manage topics and inspect the cluster.

    Parameters
    ----------
    config
        Kafka-named settings (see :class:`~replication.client.config.AdminConfig`); keyword
        arguments with underscores for dots are merged over it.

    Examples
    --------
    >>> with Admin(bootstrap_servers="127.0.0.1:9092") as admin:  # doctest: +SKIP
    ...     admin.create_topic("events", num_partitions=3, replication_factor=1)
    ...     admin.list_topics()
    ['events']
    """

    def __init__(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self.config = load(AdminConfig, config, kwargs)
        self._cluster = Cluster(self.config)
        self._offsets = OffsetLookup(
            self._cluster, default_api_timeout_ms=self.config.default_api_timeout_ms
        )
        self._coordinator = CoordinatorClient(self._cluster, self.config.client_id)
        self._sink_coordinators: dict[str, CoordinatorClient] = {}
        self._groups = GroupAdmin(self._cluster, self.config.default_api_timeout_ms)
        self._transactions = TransactionAdmin(self._cluster, self._coordinator)
        self._closed = False

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Admin({self.config.bootstrap_servers!r})"

    def close(self) -> None:
        self._closed = True
        self._cluster.close()

    # --- topics ---------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        """Create one topic (-1: the broker's num.partitions / default.replication.factor)."""
        self.create_topics(
            [NewTopic(name, num_partitions, replication_factor, dict(configs or {}))],
            validate_only=validate_only,
        )

    def create_topics(
        self,
        new_topics: Iterable[NewTopic],
        *,
        timeout_ms: int | None = None,
        validate_only: bool = False,
    ) -> None:
        """Create topics; raises the first topic's error (by class) after trying them all."""
        topics = list(new_topics)
        if not topics:
            return
        request = CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=t.name,
                    num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    configs=[
                        CreatableTopicConfig(name=k, value=None if v is None else str(v))
                        for k, v in t.configs.items()
                    ],
                )
                for t in topics
            ],
            timeout_ms=self.config.request_timeout_ms if timeout_ms is None else timeout_ms,
            validate_only=validate_only,
        )

        response: CreateTopicsResponse = self._controller_call(
            ApiKey.CREATE_TOPICS,
            request,
            f"creating topics {', '.join(t.name for t in topics)}",
            codes=lambda r: [x.error_code for x in r.topics],
            version=1,
        )
        errors = [
            _error(r.error_code, r.error_message, f"cannot create topic {r.name!r}")
            for r in response.topics
            if r.error_code
        ]
        self._raise_first(errors)
        if not validate_only:
            self._cluster.add_interest(t.name for t in topics)
            self._cluster.request_update()

    def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        """Delete topics; raises the first topic's error (by class) after trying them all."""
        topic_names = list(names)
        if not topic_names:
            return
        request = DeleteTopicsRequest(
            topic_names=topic_names,
            timeout_ms=self.config.request_timeout_ms if timeout_ms is None else timeout_ms,
        )

        response: DeleteTopicsResponse = self._controller_call(
            ApiKey.DELETE_TOPICS,
            request,
            f"deleting topics {', '.join(topic_names)}",
            codes=lambda r: [x.error_code for x in r.responses],
        )
        errors = [
            _error(r.error_code, r.error_message, f"cannot delete topic {r.name!r}")
            for r in response.responses
            if r.error_code
        ]
        self._raise_first(errors)
        self._cluster.request_update()

    def delete_topic(self, name: str) -> None:
        self.delete_topics([name])

    def list_topics(self, *, include_internal: bool = False) -> list[str]:
        """Names of the topics in the cluster, sorted."""
        response = self._metadata(None)
        return sorted(t.name for t in response.topics if include_internal or not t.is_internal)

    def describe_topics(self, names: Iterable[str]) -> list[TopicDescription]:
        """Partitions (leader, leader epoch, replicas, ISR) of each topic, in the order asked.

        UnknownTopicOrPartitionError (or the topic's own error) if a topic does not exist.
        """
        wanted = list(names)
        response = self._metadata(wanted)
        by_name = {t.name: t for t in response.topics}
        out: list[TopicDescription] = []
        errors: list[ReplogError] = []
        for name in wanted:
            topic = by_name.get(name)
            if topic is None:
                errors.append(UnknownTopicOrPartitionError(f"topic {name!r} does not exist"))
                continue
            if topic.error_code and not topic.partitions:
                errors.append(
                    _error(topic.error_code, None, f"cannot describe topic {name!r}")
                    if topic.error_code != UnknownTopicOrPartitionError.code
                    else UnknownTopicOrPartitionError(
                        f"topic {name!r} does not exist; list topics with `replog topics list`"
                    )
                )
                continue
            out.append(
                TopicDescription(
                    name=name,
                    partitions=tuple(
                        PartitionInfo(
                            partition=p.partition_index,
                            leader=p.leader_id,
                            leader_epoch=p.leader_epoch,
                            replicas=tuple(p.replica_nodes),
                            isr=tuple(p.isr_nodes),
                            offline_replicas=tuple(p.offline_replicas),
                        )
                        for p in sorted(topic.partitions, key=lambda p: p.partition_index)
                    ),
                    is_internal=topic.is_internal,
                )
            )
        self._raise_first(errors)
        return out

    def describe_topic(self, name: str) -> TopicDescription:
        return self.describe_topics([name])[0]

    def describe_cluster(self) -> ClusterDescription:
        """Cluster id, controller and live brokers."""
        response = self._metadata([])
        return ClusterDescription(
            cluster_id=response.cluster_id,
            controller_id=response.controller_id,
            brokers=tuple(
                BrokerInfo(b.node_id, b.host, b.port, b.rack)
                for b in sorted(response.brokers, key=lambda b: b.node_id)
            ),
        )

    # --- reassignments, leader elections, brokers (KIP-455, KIP-460) ----------------------

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition | tuple[str, int], Sequence[int] | None],
        *,
        throttle: int = 0,
    ) -> None:
        """Move partitions to new replicas (a list of broker ids, the first the preferred
        leader) or cancel their move in progress (None), as Kafka's
        alterPartitionReassignments. ``throttle`` (bytes/s, 0: none) limits how fast the new
        replicas catch up. Returns once the controller started the moves; they complete in the
        background (see :meth:`list_partition_reassignments`). Raises the first partition's
        error (by class) after trying them all."""
        by_topic: dict[str, list[ReassignablePartition]] = {}
        for key, replicas in reassignments.items():
            tp = TopicPartition(*key)
            by_topic.setdefault(tp.topic, []).append(
                ReassignablePartition(
                    partition_index=tp.partition,
                    replicas=None if replicas is None else [int(r) for r in replicas],
                )
            )
        request = AlterPartitionReassignmentsRequest(
            timeout_ms=self.config.request_timeout_ms,
            topics=[ReassignableTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
            throttled_rate=throttle,
        )

        response: AlterPartitionReassignmentsResponse = self._controller_call(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            request,
            "reassigning partitions",
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot reassign")
        self._raise_first(
            [
                _error(
                    r.error_code, r.error_message, f"cannot reassign {t.name}-{r.partition_index}"
                )
                for t in response.responses
                for r in t.partitions
                if r.error_code
            ]
        )
        self._cluster.request_update()

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments in progress (of ``partitions`` only, if given)."""
        topics: list[ListPartitionReassignmentsTopics] | None = None
        if partitions is not None:
            wanted: dict[str, list[int]] = {}
            for key in partitions:
                tp = TopicPartition(*key)
                wanted.setdefault(tp.topic, []).append(tp.partition)
            topics = [
                ListPartitionReassignmentsTopics(name=t, partition_indexes=ps)
                for t, ps in wanted.items()
            ]
        request = ListPartitionReassignmentsRequest(
            timeout_ms=self.config.request_timeout_ms, topics=topics
        )

        response: ListPartitionReassignmentsResponse = self._controller_call(
            ApiKey.LIST_PARTITION_REASSIGNMENTS,
            request,
            "listing partition reassignments",
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot list reassignments")
        return {
            TopicPartition(t.name, p.partition_index): PartitionReassignment(
                tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas)
            )
            for t in response.topics
            for p in t.partitions
        }

    def elect_leaders(
        self,
        election_type: Literal["preferred", "unclean"] = "preferred",
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
    ) -> dict[TopicPartition, ReplogError | None]:
        """Kafka's electLeaders: ``preferred`` moves each partition's leadership to its first
        replica (if live and in the ISR); ``unclean`` elects a leader for partitions without one,
        from outside the ISR if it must (may lose records). ``partitions`` None: every
        partition, and only those elected or failing are in the answer. The answer maps each
        partition to None (elected) or its error (ElectionNotNeededError,
        PreferredLeaderNotAvailableError, ...)."""
        if election_type not in ("preferred", "unclean"):
            raise ValueError(f"election type {election_type!r}: use 'preferred' or 'unclean'")
        tps: list[ElectLeadersTopicPartitions] | None = None
        if partitions is not None:
            wanted: dict[str, list[int]] = {}
            for key in partitions:
                tp = TopicPartition(*key)
                wanted.setdefault(tp.topic, []).append(tp.partition)
            tps = [ElectLeadersTopicPartitions(topic=t, partitions=ps) for t, ps in wanted.items()]
        request = ElectLeadersRequest(
            election_type=PREFERRED_ELECTION if election_type == "preferred" else UNCLEAN_ELECTION,
            topic_partitions=tps,
            timeout_ms=self.config.request_timeout_ms,
        )

        response: ElectLeadersResponse = self._controller_call(
            ApiKey.ELECT_LEADERS,
            request,
            "electing leaders",
        )
        if response.error_code:
            raise _error(response.error_code, None, "cannot elect leaders")
        self._cluster.request_update()
        return {
            TopicPartition(t.topic, r.partition_id): (
                _error(r.error_code, r.error_message, f"{t.topic}-{r.partition_id}")
                if r.error_code
                else None
            )
            for t in response.replica_election_results
            for r in t.partition_result
        }

    def unregister_broker(self, broker_id: int) -> None:
        """Remove a broker's registration (Kafka's unregisterBroker). Refused while the broker
        holds replicas: move them off first (:func:`~replication.client.reassignments.
        plan_decommission`). A broker process still running registers again, empty."""
        request = UnregisterBrokerRequest(broker_id=broker_id)

        response: UnregisterBrokerResponse = self._controller_call(
            ApiKey.UNREGISTER_BROKER,
            request,
            f"unregistering broker {broker_id}",
        )
        if response.error_code:
            raise _error(
                response.error_code, response.error_message, f"cannot unregister broker {broker_id}"
            )
        self._cluster.request_update()

    # --- ACLs and SCRAM credentials ---------------------------------------------------------

    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Add ACL bindings (through the controller); raises the first binding's error (by
        class: SecurityDisabledError without an authorizer, InvalidRequestError for a bad
        binding) after trying them all."""
        wanted = list(bindings)
        if not wanted:
            return
        request = pa.CreateAclsRequest(
            creations=[
                pa.AclCreation(
                    resource_type=b.resource_type,
                    resource_name=b.resource_name,
                    resource_pattern_type=b.pattern_type,
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in wanted
            ]
        )

        response: pa.CreateAclsResponse = self._controller_call(
            ApiKey.CREATE_ACLS,
            request,
            f"creating {len(wanted)} ACL(s)",
            codes=lambda r: [x.error_code for x in r.results],
        )
        self._raise_first(
            [
                _error(r.error_code, r.error_message, f"cannot create ACL {_acl_text(b)}")
                for b, r in zip(wanted, response.results, strict=False)
                if r.error_code
            ]
        )

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """The ACL bindings ``acl_filter`` matches (default: all), sorted."""
        f = acl_filter or AclBindingFilter()
        request = pa.DescribeAclsRequest(
            resource_type_filter=f.resource_type,
            resource_name_filter=f.resource_name,
            pattern_type_filter=f.pattern_type,
            principal_filter=f.principal,
            host_filter=f.host,
            operation=f.operation,
            permission_type=f.permission,
        )
        response: pa.DescribeAclsResponse = self._retrying(
            "describing ACLs",
            lambda: self._any_broker(ApiKey.DESCRIBE_ACLS, request),
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot describe ACLs")
        return sorted(
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

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        """Remove the bindings each filter matches (through the controller); per filter, the
        bindings it removed. Raises the first filter's error after trying them all."""
        wanted = list(filters)
        if not wanted:
            return []
        request = pa.DeleteAclsRequest(
            filters=[
                pa.DeleteAclsFilter(
                    resource_type_filter=f.resource_type,
                    resource_name_filter=f.resource_name,
                    pattern_type_filter=f.pattern_type,
                    principal_filter=f.principal,
                    host_filter=f.host,
                    operation=f.operation,
                    permission_type=f.permission,
                )
                for f in wanted
            ]
        )

        response: pa.DeleteAclsResponse = self._controller_call(
            ApiKey.DELETE_ACLS,
            request,
            "deleting ACLs",
            codes=lambda r: [x.error_code for x in r.filter_results],
        )
        self._raise_first(
            [
                _error(r.error_code, r.error_message, "cannot delete ACLs")
                for r in response.filter_results
                if r.error_code
            ]
        )
        return [
            [
                AclBinding.from_wire(
                    a.resource_type,
                    a.resource_name,
                    a.pattern_type,
                    a.principal,
                    a.host,
                    a.operation,
                    a.permission_type,
                )
                for a in r.matching_acls
            ]
            for r in response.filter_results
        ]

    def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, dict[str, int]]:
        """Each user's SCRAM mechanisms and their iteration counts (never a salt or key):
        ``{"alice": {"SCRAM-SHA-512": 8192}}``. No users named: every user. A user named who
        has no credential raises ResourceNotFoundError."""
        names = None if users is None else list(users)
        request = pa.DescribeUserScramCredentialsRequest(
            users=None if names is None else [pa.UserName(name=n) for n in names]
        )
        response: pa.DescribeUserScramCredentialsResponse = self._retrying(
            "describing SCRAM users",
            lambda: self._any_broker(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, request),
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot describe users")
        self._raise_first(
            [
                _error(r.error_code, r.error_message, f"cannot describe user {r.user!r}")
                for r in response.results
                if r.error_code
            ]
        )
        return {
            r.user: {mechanism_name(i.mechanism): i.iterations for i in r.credential_infos}
            for r in response.results
        }

    def alter_user_scram_credentials(
        self,
        upsertions: Iterable[UserScramCredentialUpsertion] = (),
        deletions: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Set users' SCRAM credentials and delete (user, mechanism) ones, through the
        controller. Each password is salted here with a new random salt (Kafka's wire form:
        the salted password); raises the first user's error after trying them all."""
        ups = list(upsertions)
        dels = list(deletions)
        if not ups and not dels:
            return
        wire_ups = []
        for u in ups:
            if u.mechanism not in MECHANISMS:
                raise ValueError(
                    f"SCRAM mechanism {u.mechanism!r} is not supported: use one of "
                    f"{', '.join(MECHANISMS)}"
                )
            salt = os.urandom(SALT_BYTES)
            wire_ups.append(
                pa.ScramCredentialUpsertion(
                    name=u.user,
                    mechanism=MECHANISMS[u.mechanism],
                    iterations=u.iterations,
                    salt=salt,
                    salted_password=salted_password(u.mechanism, u.password, salt, u.iterations),
                )
            )
        wire_dels = []
        for user, mechanism in dels:
            if mechanism not in MECHANISMS:
                raise ValueError(
                    f"SCRAM mechanism {mechanism!r} is not supported: use one of "
                    f"{', '.join(MECHANISMS)}"
                )
            wire_dels.append(pa.ScramCredentialDeletion(name=user, mechanism=MECHANISMS[mechanism]))
        request = pa.AlterUserScramCredentialsRequest(deletions=wire_dels, upsertions=wire_ups)

        response: pa.AlterUserScramCredentialsResponse = self._controller_call(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            request,
            "altering SCRAM credentials",
            codes=lambda r: [x.error_code for x in r.results],
        )
        self._raise_first(
            [
                _error(r.error_code, r.error_message, f"cannot alter the credentials of {r.user!r}")
                for r in response.results
                if r.error_code
            ]
        )

    def _any_broker(self, api_key: int, request: Any) -> Any:
        self._check_open()
        return self._cluster.any_connection_send(api_key, lambda version: request, 0)

    # --- offsets ----------------------------------------------------------------------------

    def list_offsets(
        self,
        specs: Mapping[TopicPartition | tuple[str, int], OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Offsets per partition: ``"earliest"`` (log start), ``"latest"`` (high watermark, or
        LSO with read_committed) or a timestamp in ms (first offset with a timestamp at least
        that; -1 if there is none)."""
        timestamps: dict[TopicPartition, int] = {}
        for tp, spec in specs.items():
            key = TopicPartition(*tp)
            if spec == "earliest":
                timestamps[key] = EARLIEST_TIMESTAMP
            elif spec == "latest":
                timestamps[key] = LATEST_TIMESTAMP
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamps[key] = spec
            else:
                raise ValueError(
                    f"offset spec for {key} must be 'earliest', 'latest' or a timestamp in ms "
                    f">= 0, got {spec!r}"
                )
        self._check_open()
        isolation = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}.get(
            isolation_level
        )
        if isolation is None:
            raise ValueError(
                f"isolation_level={isolation_level!r}: expected read_uncommitted or read_committed"
            )
        found = self._offsets.list(
            timestamps,
            isolation,
            self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms,
        )
        return {tp: offset for tp, (offset, _) in found.items()}

    # --- configs ------------------------------------------------------------------------------

    def describe_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        keys: Iterable[str] | None = None,
    ) -> dict[str, ConfigEntry]:
        """The configs of a topic, of a broker (``name`` its id; asked of that broker), or the
        cluster-wide dynamic broker defaults (``"broker"``, ``""``): key -> :class:`ConfigEntry`
        (value, Kafka's config source, whether it can be altered). ``keys`` limits the answer.

        Examples
        --------
        >>> admin.describe_configs("topic", "events")["retention.ms"].source  # doctest: +SKIP
        'DYNAMIC_TOPIC_CONFIG'
        """
        rtype = _resource_type(resource_type)
        what = _resource_text(resource_type, name)
        request = DescribeConfigsRequest(
            resources=[
                DescribeConfigsResource(
                    resource_type=rtype,
                    resource_name=name,
                    configuration_keys=None if keys is None else list(keys),
                )
            ]
        )
        self._check_open()
        cluster = self._cluster

        if rtype == BROKER_RESOURCE and name:  # a broker's own configs: ask that broker
            live = [b.node_id for b in self.describe_cluster().brokers]
            if not name.isdigit() or int(name) not in live:
                raise BrokerNotAvailableError(
                    f"cannot describe configs of broker {name!r}: no such live broker "
                    f"(live: {live})"
                )

        def send() -> DescribeConfigsResult:
            if not cluster.bootstrapped:
                cluster.refresh()
            if rtype == BROKER_RESOURCE and name:
                conn = cluster.connection(int(name))
                response: DescribeConfigsResponse = conn.send(
                    ApiKey.DESCRIBE_CONFIGS, conn.max_version(ApiKey.DESCRIBE_CONFIGS, 0), request
                )
            else:
                response = cluster.any_connection_send(
                    ApiKey.DESCRIBE_CONFIGS, lambda version: request, 0
                )
            return response.results[0]

        result = self._retrying(f"describing configs of {what}", send)
        if result.error_code:
            raise _error(result.error_code, result.error_message, f"cannot describe {what}")
        return {
            c.name: ConfigEntry(
                name=c.name,
                value=c.value,
                source=_CONFIG_SOURCES.get(c.config_source, "UNKNOWN"),
                read_only=c.read_only,
                is_sensitive=c.is_sensitive,
            )
            for c in result.configs
        }

    def alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        configs: Mapping[str, str],
        *,
        validate_only: bool = False,
    ) -> None:
        """Replace the dynamic configs of a topic or broker (``""``: the cluster-wide default)
        with ``configs`` (Kafka's legacy AlterConfigs: keys not given go back to their
        defaults). Prefer :meth:`incremental_alter_configs`. ConfigError names a bad key."""
        request = AlterConfigsRequest(
            resources=[
                AlterConfigsResource(
                    resource_type=_resource_type(resource_type),
                    resource_name=name,
                    configs=[AlterableConfig(name=k, value=str(v)) for k, v in configs.items()],
                )
            ],
            validate_only=validate_only,
        )
        self._alter(ApiKey.ALTER_CONFIGS, request, _resource_text(resource_type, name))

    def incremental_alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        *,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Iterable[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Set and delete dynamic configs of a topic or broker (``""``: the cluster-wide
        default), leaving the others as they are (Kafka's IncrementalAlterConfigs). Applied
        without a restart; a deleted key falls back to the next source (broker dynamic, static,
        default). ConfigError names a bad key or value, or a key that needs a restart.

        Examples
        --------
        >>> admin.incremental_alter_configs(  # doctest: +SKIP
        ...     "topic", "events", set_configs={"retention.ms": "3600000"}
        ... )
        """
        ops = [
            IncrementalAlterableConfig(name=k, config_operation=CONFIG_OP_SET, value=str(v))
            for k, v in (set_configs or {}).items()
        ] + [
            IncrementalAlterableConfig(name=k, config_operation=CONFIG_OP_DELETE)
            for k in delete_configs
        ]
        request = IncrementalAlterConfigsRequest(
            resources=[
                IncrementalAlterConfigsResource(
                    resource_type=_resource_type(resource_type), resource_name=name, configs=ops
                )
            ],
            validate_only=validate_only,
        )
        self._alter(ApiKey.INCREMENTAL_ALTER_CONFIGS, request, _resource_text(resource_type, name))

    def _alter(self, api_key: int, request: Any, what: str) -> None:
        response = self._controller_call(
            api_key,
            request,
            f"altering configs of {what}",
            codes=lambda r: [x.error_code for x in r.responses],
        )
        result: AlterConfigsResourceResponse
        (result,) = response.responses
        if result.error_code:
            raise _error(result.error_code, result.error_message, f"cannot alter {what}")

    # --- records ------------------------------------------------------------------------------

    def delete_records(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Delete each partition's records before an offset (-1: its high watermark), as
        Kafka's deleteRecords: the log start offset moves there and the records become
        unreadable. Returns each partition's new log start offset (its low watermark).

        Asked of each partition's leader; leadership changes are retried until
        ``timeout_ms`` (default.api.timeout.ms). An offset outside [log start, high watermark]
        raises OffsetOutOfRangeError.

        Examples
        --------
        >>> admin.delete_records({("events", 0): 100})  # doctest: +SKIP
        {TopicPartition(topic='events', partition=0): 100}
        """
        wanted = {TopicPartition(*tp): int(offset) for tp, offset in offsets.items()}
        if not wanted:
            return {}
        self._check_open()
        cluster = self._cluster
        cluster.add_interest({tp.topic for tp in wanted})
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        done: dict[TopicPartition, int] = {}
        failed: dict[TopicPartition, ReplogError] = {}

        def attempt() -> None:
            unknown: set[str] = set()
            if not cluster.bootstrapped or any(
                cluster.snapshot.leader(*tp) is None for tp in wanted
            ):
                metadata = cluster.refresh(sorted({tp.topic for tp in wanted}))
                unknown = {
                    t.name
                    for t in metadata.topics
                    if t.error_code == UnknownTopicOrPartitionError.code
                }
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in wanted:
                if tp in done or tp in failed:
                    continue
                leader = cluster.snapshot.leader(*tp)
                if leader is None:
                    if tp.topic in unknown:
                        failed[tp] = UnknownTopicOrPartitionError(
                            f"cannot delete records of {tp}: topic {tp.topic!r} does not exist"
                        )
                        continue
                    raise LeaderNotAvailableError(f"{tp} has no leader right now")
                by_leader.setdefault(leader, []).append(tp)
            retry: ReplogError | None = None
            for leader, tps in sorted(by_leader.items()):
                topics: dict[str, list[DeleteRecordsPartition]] = {}
                for tp in tps:
                    topics.setdefault(tp.topic, []).append(
                        DeleteRecordsPartition(partition_index=tp.partition, offset=wanted[tp])
                    )
                request = DeleteRecordsRequest(
                    topics=[DeleteRecordsTopic(name=t, partitions=ps) for t, ps in topics.items()],
                    timeout_ms=timeout,
                )
                conn = cluster.connection(leader)
                response: DeleteRecordsResponse = conn.send(
                    ApiKey.DELETE_RECORDS,
                    conn.max_version(ApiKey.DELETE_RECORDS, 0),
                    request,
                    timeout_ms=timeout,
                )
                for topic in response.topics:
                    for part in topic.partitions:
                        tp = TopicPartition(topic.name, part.partition_index)
                        if not part.error_code:
                            done[tp] = part.low_watermark
                            continue
                        err = _error(
                            part.error_code,
                            _DELETE_RECORDS_HINTS.get(part.error_code),
                            f"cannot delete records of {tp} before offset {wanted[tp]}",
                        )
                        if err.retriable:
                            retry = err
                        else:
                            failed[tp] = err
            if retry is not None:
                raise retry

        call_with_retries(
            "deleting records",
            attempt,
            RetryPolicy.of(
                self.config,
                self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms,
                "default.api.timeout.ms",
            ),
            retriable=cluster.retriable,
            on_retry=lambda err, attempt: cluster.request_update(),
        )
        self._raise_first(list(failed.values()))
        return done

    # --- replica logs and aborted transactions ------------------------------------------------

    def describe_log_dirs(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        brokers: Iterable[int] | None = None,
        timeout_ms: int | None = None,
    ) -> dict[int, dict[TopicPartition, ReplicaLog] | ReplogError]:
        """Ask brokers (default: every broker in the metadata) for the logs of their replicas
        (Kafka's describeLogDirs): per broker id, its replicas' :class:`ReplicaLog` (storage
        root, log start, LEO, durable end, HW) or the error that kept it from answering.

        Only a replica's own broker knows its log's offsets, so each broker is asked (in
        parallel). ``partitions`` limits the answer to those partitions (None: every replica a
        broker holds). A broker that is down does not fail the call: its entry is its error
        (BrokerUnreachableError; BrokerNotAvailableError if it is not in the metadata).

        Examples
        --------
        >>> logs = admin.describe_log_dirs([("events", 0)])  # doctest: +SKIP
        >>> logs[1][TopicPartition("events", 0)].durable_end_offset  # doctest: +SKIP
        42
        """
        self._check_open()
        cluster = self._cluster
        if brokers is None:
            ids = sorted(b.node_id for b in self.describe_cluster().brokers)
        else:
            ids = sorted(set(brokers))
            if not cluster.bootstrapped or not set(ids) <= set(cluster.snapshot.brokers):
                self.describe_cluster()  # a broker may have (re)joined since the last refresh
        by_topic: dict[str, set[int]] = {}
        for topic, index in partitions or ():
            by_topic.setdefault(topic, set()).add(int(index))
        request = DescribeLogDirsRequest(
            topics=None
            if partitions is None
            else [
                DescribableLogDirTopic(topic=t, partitions=sorted(ps))
                for t, ps in sorted(by_topic.items())
            ]
        )
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms

        def ask(broker: int) -> dict[TopicPartition, ReplicaLog] | ReplogError:
            try:
                conn = cluster.connection(broker)
                version = conn.max_version(ApiKey.DESCRIBE_LOG_DIRS, _DESCRIBE_LOG_DIRS_VERSION)
                response: DescribeLogDirsResponse = conn.send(
                    ApiKey.DESCRIBE_LOG_DIRS, version, request, timeout_ms=timeout
                )
            except ReplogError as err:
                log.debug("DescribeLogDirs to broker %d failed: %s", broker, err)
                return err
            return _replica_logs(broker, response)

        if not ids:
            return {}
        with ThreadPoolExecutor(
            max_workers=len(ids), thread_name_prefix="describe-log-dirs"
        ) as pool:
            return dict(zip(ids, pool.map(ask, ids), strict=True))

    def describe_log_objects(
        self,
        broker: int,
        ranges: Mapping[TopicPartition | tuple[str, int], tuple[int, int]],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, LogObjects | ReplogError]:
        """Ask broker ``broker`` where its replicas hold offset ranges on its storage
        (replog's DescribeLogObjects): per partition, the :class:`LogObjects` (storage root,
        HW, durable end, log start and the extents covering ``[start, end)`` up to the
        durable end; ``end`` -1: to the durable end), or the error of that partition.

        The broker answers from memory (no storage request), which is why Spark's planner asks
        it instead of listing storage. UnsupportedVersionError if the broker does not know the
        API (an older replog): list the partition's segment objects instead.

        Examples
        --------
        >>> found = admin.describe_log_objects(1, {("events", 0): (0, 100)})  # doctest: +SKIP
        >>> [e.path for e in found[TopicPartition("events", 0)].extents]  # doctest: +SKIP
        ['events/0/00000000000000000000.seg', '_replog/wal/L0/...']
        """
        self._check_open()
        by_topic: dict[str, list[DescribeLogObjectsPartition]] = {}
        for tp, (start, end) in ranges.items():
            topic, index = tp
            if start < 0 or (end >= 0 and end < start):
                raise ValueError(
                    f"the range [{start}, {end}) of {topic}-{index} is not a range of offsets: "
                    "give 0 <= start <= end, or end -1 for the durable end"
                )
            by_topic.setdefault(topic, []).append(
                DescribeLogObjectsPartition(
                    partition_index=int(index), start_offset=int(start), end_offset=int(end)
                )
            )
        if not by_topic:
            return {}
        request = DescribeLogObjectsRequest(
            topics=[
                DescribeLogObjectsTopic(name=t, partitions=ps) for t, ps in sorted(by_topic.items())
            ]
        )
        cluster = self._cluster
        if not cluster.bootstrapped or broker not in cluster.snapshot.brokers:
            self.describe_cluster()  # the broker may have (re)joined since the last refresh
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        conn = cluster.connection(broker)
        version = conn.max_version(ApiKey.DESCRIBE_LOG_OBJECTS, _DESCRIBE_LOG_OBJECTS_VERSION)
        response: DescribeLogObjectsResponse = conn.send(
            ApiKey.DESCRIBE_LOG_OBJECTS, version, request, timeout_ms=timeout
        )
        if response.error_code:
            cls = for_code(response.error_code) or ReplogError
            raise cls(f"broker {broker} refused DescribeLogObjects: {cls()}")
        out: dict[TopicPartition, LogObjects | ReplogError] = {}
        for answered in response.topics:
            for part in answered.partitions:
                tp = TopicPartition(answered.name, int(part.partition_index))
                if part.error_code:
                    cls = for_code(part.error_code) or ReplogError
                    out[tp] = cls(part.error_message or f"broker {broker}: {cls()}")
                    continue
                out[tp] = LogObjects(
                    broker_id=broker,
                    log_dir=response.log_dir,
                    high_watermark=int(part.high_watermark),
                    durable_end_offset=int(part.durable_end_offset),
                    log_start_offset=int(part.log_start_offset),
                    extents=tuple(
                        ObjectExtent(
                            e.path,
                            int(e.position),
                            int(e.size),
                            int(e.base_offset),
                            int(e.next_offset),
                        )
                        for e in part.extents
                    ),
                )
        return out

    def aborted_transactions(
        self,
        partition: TopicPartition | tuple[str, int],
        start_offset: int,
        *,
        timeout_ms: int | None = None,
    ) -> tuple[AbortedTxnRange, ...]:
        """The aborted transactions of ``partition`` with records at or after ``start_offset``
        (and below its LSO), as its leader lists them in the answer to a read_committed Fetch
        at ``start_offset`` (Kafka's FetchResponse ``aborted_transactions``): (producer id,
        first offset) pairs, by first offset.

        A reader of the partition's segment objects drops the records of these transactions,
        as Kafka's read_committed consumer does. Asks for no records (max_bytes 0). Retries
        retriable errors (no leader, leadership moved) until ``timeout_ms`` (default
        default.api.timeout.ms); UnknownTopicOrPartitionError if the partition does not exist.
        """
        self._check_open()
        tp = TopicPartition(*partition)
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        request = FetchRequest(
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=0,  # no records: only the partition's state and aborted transactions
            isolation_level=READ_COMMITTED,
            session_id=0,
            session_epoch=_NO_SESSION_EPOCH,
            topics=[
                FetchRequestTopic(
                    topic=tp.topic,
                    partitions=[
                        FetchRequestPartition(
                            partition=tp.partition,
                            fetch_offset=start_offset,
                            partition_max_bytes=0,
                        )
                    ],
                )
            ],
        )
        cluster = self._cluster

        def attempt() -> tuple[AbortedTxnRange, ...]:
            self._offsets.ensure_metadata([tp])
            leader = cluster.snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                raise self._offsets.no_leader_error(tp)
            response: FetchResponse = cluster.connection(leader).send(ApiKey.FETCH, 0, request)
            return _aborted_in(tp, response)

        def on_retry(err: ReplogError, attempt: int) -> None:
            cluster.request_update()
            self._offsets.check_unknown([tp])

        ms = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
        return call_with_retries(
            f"asking the leader of {tp} for aborted transactions",
            attempt,
            RetryPolicy.of(
                self.config,
                ms,
                "timeout_ms" if timeout_ms is not None else "default.api.timeout.ms",
            ),
            retriable=cluster.retriable,
            on_retry=on_retry,
        )

    # --- transactions and Spark sinks ------------------------------------------------------

    # --- consumer groups --------------------------------------------------------------------

    def list_consumer_groups(self) -> list[tuple[str, str]]:
        """(group id, protocol type) of every group the brokers coordinate, sorted."""
        self._check_open()
        return self._groups.list()

    def describe_consumer_group(
        self, group_id: str, *, timeout_ms: int | None = None
    ) -> ConsumerGroupDescription:
        """A group's state, assignor, coordinator and members with their partitions."""
        self._check_open()
        return self._groups.describe(group_id, timeout_ms)

    def list_consumer_group_offsets(
        self, group_id: str, *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offset (the next record to read) of each partition."""
        self._check_open()
        return self._groups.offsets(group_id, timeout_ms)

    def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int], *, timeout_ms: int | None = None
    ) -> None:
        """Set the group's committed offsets (GroupNotEmptyError while it has members)."""
        self._check_open()
        self._groups.alter_offsets(group_id, offsets, timeout_ms)

    def delete_consumer_groups(
        self, group_ids: Iterable[str], *, timeout_ms: int | None = None
    ) -> None:
        """Delete empty groups and their offsets (GroupNotEmptyError, GroupIdNotFoundError)."""
        self._check_open()
        self._groups.delete(group_ids, timeout_ms)

    def list_transactions(self, states: Iterable[str] = ()) -> list[TransactionListing]:
        """The transactions the coordinator knows, optionally only those in ``states``
        (Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
        CompleteAbort), sorted by transactional id."""
        wanted = list(states)
        bad = [s for s in wanted if s not in TRANSACTION_STATES]
        if bad:
            raise ValueError(
                f"unknown transaction state(s) {bad}; expected some of "
                f"{', '.join(TRANSACTION_STATES)}"
            )
        self._check_open()
        response: ListTransactionsResponse = self._coordinator.call(
            ApiKey.LIST_TRANSACTIONS,
            ListTransactionsRequest(state_filters=wanted),
            what="listing transactions",
            deadline=self._deadline(None),
        )
        return sorted(
            (
                TransactionListing(
                    transactional_id=t.transactional_id,
                    producer_id=t.producer_id,
                    producer_epoch=t.producer_epoch,
                    state=t.transaction_state,
                    timeout_ms=t.transaction_timeout_ms,
                    start_time_ms=t.transaction_start_time_ms,
                    partitions=tuple(TopicPartition(q.topic, q.partition) for q in t.partitions),
                )
                for t in response.transactions
            ),
            key=lambda t: t.transactional_id,
        )

    def describe_transactions(
        self, transactional_ids: Iterable[str], *, timeout_ms: int | None = None
    ) -> dict[str, TransactionListing]:
        """The coordinator's state of each transactional id (Kafka's describeTransactions):
        producer id and epoch, state, timeout, start time and partitions of the open
        transaction. TransactionalIdNotFoundError for an id it does not know."""
        self._check_open()
        return self._transactions.describe(transactional_ids, self._deadline(timeout_ms))

    def describe_producers(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers each partition's leader knows, with the first offset of their open
        transaction on it (Kafka's describeProducers)."""
        self._check_open()
        tps = [TopicPartition(*tp) for tp in partitions]
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            by_leader.setdefault(self._leader_of(tp), []).append(tp)
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        out: dict[TopicPartition, list[ProducerState]] = {}
        for leader, led in by_leader.items():
            out.update(self._transactions.describe_producers(leader, led, timeout))
        return out

    def find_hanging_transactions(
        self,
        broker_id: int,
        max_transaction_timeout_ms: int = 900_000,
        *,
        timeout_ms: int | None = None,
    ) -> list[HangingTransaction]:
        """The hanging transactions on the partitions broker ``broker_id`` leads (Kafka's
        FindHangingTransactions): open on a partition for at least
        ``max_transaction_timeout_ms`` (the brokers' transaction.max.timeout.ms, after which
        the coordinator would have aborted any transaction it knows) while the coordinator
        does not know them as ongoing on that partition. Abort each with
        :meth:`abort_transaction`."""
        self._check_open()
        metadata = self._metadata(None)
        led = [
            TopicPartition(t.name, q.partition_index)
            for t in metadata.topics
            if not t.error_code
            for q in t.partitions
            if q.leader_id == broker_id
        ]
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        return self._transactions.find_hanging(
            broker_id, led, max_transaction_timeout_ms, timeout, self._deadline(timeout_ms)
        )

    def abort_transaction(
        self,
        partition: TopicPartition | tuple[str, int],
        *,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
        coordinator_epoch: int | None = None,
        start_offset: int | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """Abort an open (hanging) transaction on one partition, as Kafka's abortTransaction:
        an ABORT marker written by the partition's leader (WriteTxnMarkers), so its LSO moves
        past it. Name the transaction by ``producer_id``, ``producer_epoch`` and
        ``coordinator_epoch``, or by its ``start_offset`` (then they are looked up with
        DescribeProducers)."""
        self._check_open()
        tp = TopicPartition(*partition)
        leader = self._leader_of(tp)
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        if start_offset is not None:
            found = self._transactions.producer_at(leader, tp, start_offset, timeout)
            producer_id, producer_epoch = found.producer_id, found.producer_epoch
            coordinator_epoch = found.coordinator_epoch
        if producer_id is None or producer_epoch is None or coordinator_epoch is None:
            raise ValueError(
                "name the transaction to abort by its start_offset, or by producer_id, "
                "producer_epoch and coordinator_epoch"
            )
        self._transactions.abort(
            leader, tp, producer_id, producer_epoch, coordinator_epoch, timeout
        )

    def _leader_of(self, tp: TopicPartition) -> int:
        self._offsets.ensure_metadata([tp])
        leader = self._cluster.snapshot.leader(tp.topic, tp.partition)
        if leader is None:
            self._cluster.refresh([tp.topic])
            leader = self._cluster.snapshot.leader(tp.topic, tp.partition)
        if leader is None:
            raise self._offsets.no_leader_error(tp)
        return leader

    def transaction_coordinator(self) -> int:
        """The broker id of the transaction coordinator (FindCoordinator)."""
        self._check_open()
        self.list_transactions(["Empty"])  # finds it, retrying as the other calls do
        return self._coordinator.node_id

    def _sink_coordinator(self, sink_id: str) -> CoordinatorClient:
        """The transaction coordinator, found as the coordinator of the sink's own
        transactional id ``replog-sink/<sink_id>``: with an authorizer, FindCoordinator needs
        Describe on the id it names, and the sink's principal holds Write (so Describe) on
        ``replog-sink/`` ids, not on this admin's client.id. One per sink, kept: a commit
        goes where the sink's last lookup found the coordinator, without asking again."""
        client = self._sink_coordinators.get(sink_id)
        if client is None:
            client = CoordinatorClient(self._cluster, f"replog-sink/{sink_id}")
            self._sink_coordinators[sink_id] = client
        return client

    def last_committed_batch(self, sink_id: str, *, timeout_ms: int | None = None) -> int:
        """The last batch id committed for ``sink_id`` (-1 if none)."""
        self._check_open()
        response: DescribeSinkResponse = self._sink_coordinator(sink_id).call(
            ApiKey.DESCRIBE_SINK,
            DescribeSinkRequest(sink_id=sink_id),
            what=f"describing sink {sink_id!r}",
            deadline=self._deadline(timeout_ms),
        )
        return int(response.last_committed_batch)

    def commit_sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        handles: Iterable[TransactionHandle],
        *,
        timeout_ms: int | None = None,
    ) -> SinkCommitResult:
        """Commit the transactions of ``handles`` as batch ``batch_id`` of ``sink_id``, in one
        atomic step, unless that batch is already committed: then abort them (a replay).

        Returns :class:`SinkCommitResult`; ``committed`` False means the batch had been
        committed before and these transactions were aborted, so its data is visible exactly
        once either way. Raises CommitFailedError when nothing happened (e.g. a transaction was
        fenced or timed out: abort and retry the batch) and CommitStateUnknownError when it may
        have happened (do not abort; call again, or look at :meth:`last_committed_batch`).

        Examples
        --------
        >>> handles = [p.transaction_handle() for p in task_producers]  # doctest: +SKIP
        >>> admin.commit_sink_batch("query-1", 7, handles)  # doctest: +SKIP
        SinkCommitResult(committed=True, last_committed_batch=7)
        """
        return self._sink_batch(sink_id, batch_id, list(handles), False, timeout_ms)

    def abort_sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        handles: Iterable[TransactionHandle],
        *,
        timeout_ms: int | None = None,
    ) -> SinkCommitResult:
        """Abort the transactions of ``handles`` (a batch that will not be committed): nothing
        of them is ever visible to read_committed consumers. Errors as commit_sink_batch."""
        return self._sink_batch(sink_id, batch_id, list(handles), True, timeout_ms)

    def _sink_batch(
        self,
        sink_id: str,
        batch_id: int,
        handles: list[TransactionHandle],
        abort: bool,
        timeout_ms: int | None,
    ) -> SinkCommitResult:
        self._check_open()
        for handle in handles:
            if not isinstance(handle, TransactionHandle):
                raise TypeError(
                    f"expected TransactionHandle objects (from Producer.transaction_handle()), "
                    f"got {type(handle).__name__}"
                )
        request = CommitSinkBatchRequest(
            sink_id=sink_id,
            batch_id=batch_id,
            transactions=[
                SinkTransaction(
                    transactional_id=h.transactional_id,
                    producer_id=h.producer_id,
                    producer_epoch=h.producer_epoch,
                )
                for h in handles
            ],
            abort=abort,
        )
        what = f"{'abort' if abort else 'commit'} of batch {batch_id} of sink {sink_id!r}"
        state = CallState()
        deadline = self._deadline(timeout_ms)
        try:
            response: CommitSinkBatchResponse = self._sink_coordinator(sink_id).call(
                ApiKey.COMMIT_SINK_BATCH, request, what=what, deadline=deadline, state=state
            )
        except ReplogError as err:
            if state.maybe_done:
                raise CommitStateUnknownError(
                    f"the {what} may or may not have happened ({err}); do not abort its "
                    "transactions: call again (a batch is committed at most once) or check "
                    "last_committed_batch()"
                ) from err
            raise CommitFailedError(f"the {what} did not happen: {err}") from err
        committed = bool(response.committed)
        if state.maybe_done and not committed and not abort:
            # An earlier attempt may have committed these very transactions and its answer
            # was lost: then this retry finds the batch committed and reports a replay.
            committed = self._committed_by_us(sink_id, handles, what, deadline)
        return SinkCommitResult(committed, int(response.last_committed_batch))

    def _committed_by_us(
        self, sink_id: str, handles: list[TransactionHandle], what: str, deadline: float
    ) -> bool:
        """Whether the transactions of ``handles`` ended committed (after an unknown attempt)."""
        ids = {h.transactional_id: h for h in handles}
        try:
            coordinator = self._sink_coordinator(sink_id)
            listed = coordinator.call(
                ApiKey.LIST_TRANSACTIONS,
                ListTransactionsRequest(),
                what="listing transactions",
                deadline=max(deadline, time.monotonic() + 1),
            ).transactions
        except ReplogError as err:
            raise CommitStateUnknownError(
                f"the {what} was retried after an answer was lost and found the batch already "
                f"committed, but whether by these transactions is unknown ({err})"
            ) from err
        states = {
            t.transaction_state
            for t in listed
            if (h := ids.get(t.transactional_id)) is not None
            and (t.producer_id, t.producer_epoch) == (h.producer_id, h.producer_epoch)
        }
        if states & _COMMITTED_STATES and states & _ABORTED_STATES:
            raise CommitStateUnknownError(
                f"the {what} was retried after an answer was lost; its transactions ended "
                f"differently ({sorted(states)})"
            )
        return bool(states & _COMMITTED_STATES)

    # --- plumbing ---------------------------------------------------------------------------

    def _deadline(self, timeout_ms: int | None) -> float:
        ms = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
        return time.monotonic() + ms / 1000

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the admin client is closed")

    def _metadata(self, topics: list[str] | None) -> MetadataResponse:
        self._check_open()
        cluster = self._cluster
        if topics is None:
            return self._retrying("listing topics", lambda: cluster.refresh(all_topics=True))
        what = f"describing topics {', '.join(topics)}" if topics else "describing the cluster"
        return self._retrying(what, lambda: cluster.refresh(topics))

    def _send_to_controller(self, api_key: int, build: Callable[[int], Any], version: int) -> Any:
        self._check_open()
        cluster = self._cluster
        if not cluster.bootstrapped:
            cluster.refresh()
        controller = cluster.snapshot.controller_id
        if controller >= 0 and controller in cluster.snapshot.brokers:
            conn = cluster.connection(controller)
            use = conn.max_version(api_key, version)
            return conn.send(api_key, use, build(use))
        return cluster.any_connection_send(api_key, build, version)

    def _controller_call(
        self,
        api_key: int,
        request: Any,
        what: str,
        *,
        codes: Callable[[Any], Iterable[int]] = lambda response: (response.error_code,),
        version: int = 0,
    ) -> Any:
        """``request`` to the active controller (or any broker, which forwards it), resent
        while the answer says NOT_CONTROLLER (``codes``: the answer's error codes, per entry
        for the APIs that answer per topic, ACL or user) or a retriable error comes, until
        default.api.timeout.ms."""

        def send() -> Any:
            response = self._send_to_controller(api_key, lambda version: request, version)
            if NotControllerError.code in codes(response):
                raise NotControllerError()
            return response

        return self._retrying(what, send)

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """Run ``call``, retrying retriable errors (refreshing metadata) until
        default.api.timeout.ms. A broker that cannot be reached before any other ever was is
        reported at once."""

        def on_retry(err: ReplogError, attempt: int) -> None:
            if err.refresh_metadata or isinstance(err, NotControllerError):
                try:
                    self._cluster.refresh()
                except ReplogError as refresh_error:
                    log.debug("metadata refresh failed: %s", refresh_error)

        return call_with_retries(
            what,
            call,
            RetryPolicy.of(
                self.config, self.config.default_api_timeout_ms, "default.api.timeout.ms"
            ),
            retriable=self._cluster.retriable,
            on_retry=on_retry,
        )

    @staticmethod
    def _raise_first(errors: list[ReplogError]) -> None:
        if not errors:
            return
        for extra in errors[1:]:
            log.error("%s", extra)
        raise errors[0]


def _acl_text(b: AclBinding) -> str:
    return (
        f"{b.permission.name} {b.principal} {b.operation.name} on "
        f"{b.resource_type.name}:{b.pattern_type.name}:{b.resource_name} from {b.host}"
    )


def _replica_logs(
    broker: int, response: DescribeLogDirsResponse
) -> dict[TopicPartition, ReplicaLog] | ReplogError:
    codes = [response.error_code, *(r.error_code for r in response.results)]
    code = next((c for c in codes if c), 0)
    if code:
        cls = for_code(code) or ReplogError
        return cls(f"broker {broker} could not describe its log dirs: {cls()}")
    out: dict[TopicPartition, ReplicaLog] = {}
    for result in response.results:
        for topic in result.topics:
            for p in topic.partitions:
                out[TopicPartition(topic.name, int(p.partition_index))] = ReplicaLog(
                    broker_id=broker,
                    log_dir=result.log_dir,
                    log_start_offset=int(p.log_start_offset),
                    log_end_offset=int(p.log_end_offset),
                    durable_end_offset=int(p.durable_end_offset),
                    high_watermark=int(p.high_watermark),
                    leader_epoch=int(p.leader_epoch),
                    is_leader=bool(p.is_leader),
                    size_bytes=int(p.partition_size),
                )
    return out


def _aborted_in(tp: TopicPartition, response: FetchResponse) -> tuple[AbortedTxnRange, ...]:
    """The aborted transactions of ``tp`` in a Fetch response; its error (by class) if any."""
    if response.error_code:
        cls = for_code(response.error_code) or ReplogError
        raise cls(f"fetch of {tp} failed: {cls()}")
    for t in response.responses:
        for p in t.partitions:
            if t.topic != tp.topic or p.partition_index != tp.partition:
                continue
            if p.error_code:
                cls = for_code(p.error_code) or ReplogError
                raise cls(f"fetch of {tp} failed: {cls()}")
            return tuple(
                AbortedTxnRange(int(a.producer_id), int(a.first_offset))
                for a in (p.aborted_transactions or ())
            )
    raise NetworkError(f"the leader of {tp} did not answer for it")
