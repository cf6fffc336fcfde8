"""The consumer group APIs of a broker: FindCoordinator for groups, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, OffsetDelete, ListGroups, DescribeGroups,
DeleteGroups, and the consumer group protocol's (KIP-848) ConsumerGroupHeartbeat and
ConsumerGroupDescribe.

Each handler turns a request into a call of the :class:`GroupCoordinator` and its outcome into
a response; errors travel as Kafka's codes, with a message where the response has a field for
it. KafkaApis serves these beside its own (as Kafka's KafkaApis hands them to its
GroupCoordinator).

Each handler checks the principal's rights first (security/api_acls.py: Read on the group to
be a member or commit, Describe to look, Delete to delete; Read on a topic to commit or delete
its offsets); :attr:`GroupApis.auth` is KafkaApis's helper once it serves these.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from replication import protocol as p
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.coordinator.consumer_group import ConsumerGroup, TopicAssignment
from replication.coordinator.consumer_group_coordinator import (
    CONSUMER_GROUP_TYPE,
    ConsumerHeartbeat,
)
from replication.coordinator.group import GroupCoordinator, encode_consumer_assignment
from replication.coordinator.group_metadata import (
    GroupMetadata,
    GroupState,
    JoinRequest,
    OffsetAndMetadata,
)
from replication.coordinator.group_metadata_manager import OFFSETS_TOPIC, partition_for
from replication.errors import (
    CoordinatorNotAvailableError,
    GroupIdNotFoundError,
    ReplogError,
    UnknownTopicOrPartitionError,
    UnstableOffsetCommitError,
)
from replication.metadata.image import MetadataImage
from replication.security.acl import AclOperation, ResourceType
from replication.security.checks import NO_AUTH, AuthHelper
from replication.security.principal import SESSION
from replication.server.responses import Handler, error_code, error_message

_OP = AclOperation
#: a described group, of DescribeGroups or ConsumerGroupDescribe
_D = TypeVar("_D")
_ZERO_UUID = uuid.UUID(int=0)
_RT = ResourceType


class GroupApis:
    def __init__(
        self,
        config: BrokerConfig,
        coordinator: GroupCoordinator,
        image: Callable[[], MetadataImage],
        create_internal_topic: Callable[[str, int, int], Awaitable[None]],
    ) -> None:
        self.config = config
        self.coordinator = coordinator
        self.image = image
        self._create_internal_topic = create_internal_topic
        #: authorization (KafkaApis.serve_groups installs its own; none until then)
        self.auth: AuthHelper = NO_AUTH
        self.handlers: dict[int, Handler] = {
            p.ApiKey.JOIN_GROUP: self.handle_join_group,
            p.ApiKey.SYNC_GROUP: self.handle_sync_group,
            p.ApiKey.HEARTBEAT: self.handle_heartbeat,
            p.ApiKey.LEAVE_GROUP: self.handle_leave_group,
            p.ApiKey.OFFSET_COMMIT: self.handle_offset_commit,
            p.ApiKey.OFFSET_FETCH: self.handle_offset_fetch,
            p.ApiKey.LIST_GROUPS: self.handle_list_groups,
            p.ApiKey.DESCRIBE_GROUPS: self.handle_describe_groups,
            p.ApiKey.DELETE_GROUPS: self.handle_delete_groups,
            p.ApiKey.OFFSET_DELETE: self.handle_offset_delete,
            p.ApiKey.TXN_OFFSET_COMMIT: self.handle_txn_offset_commit,
            p.ApiKey.CONSUMER_GROUP_HEARTBEAT: self.handle_consumer_group_heartbeat,
            p.ApiKey.CONSUMER_GROUP_DESCRIBE: self.handle_consumer_group_describe,
        }

    async def offsets_partition(self, group_id: str) -> TopicPartition:
        """The group's __consumer_offsets partition (the topic is created on first use)."""
        info = self.image().topic(OFFSETS_TOPIC)
        if info is None:
            await self.find_coordinator(group_id)
            info = self.image().topic(OFFSETS_TOPIC)
        if info is None:
            raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC} does not exist yet; retry")
        return TopicPartition(OFFSETS_TOPIC, partition_for(group_id, len(info.partitions)))

    async def find_coordinator(self, group_id: str) -> p.FindCoordinatorResponse:
        """The leader of the group's __consumer_offsets partition, creating the topic on first
        use (as Kafka does)."""
        image = self.image()
        info = image.topic(OFFSETS_TOPIC)
        if info is None:
            await self._create_internal_topic(
                OFFSETS_TOPIC,
                self.config.offsets_topic_num_partitions,
                self.config.offsets_topic_replication_factor,
            )
            info = self.image().topic(OFFSETS_TOPIC)
        leader = -1
        if info is not None:
            leader = info.partitions[partition_for(group_id, len(info.partitions))].leader
        broker = self.image().broker(leader) if leader >= 0 else None
        if broker is None:
            return p.FindCoordinatorResponse(
                error_code=CoordinatorNotAvailableError.code,
                error_message=f"the coordinator of group {group_id!r} is not available yet; retry",
            )
        return p.FindCoordinatorResponse(
            node_id=broker.broker_id, host=broker.host, port=broker.port
        )

    def _group_denied(self, operation: AclOperation, group_id: str, api: str) -> int:
        """0, or GROUP_AUTHORIZATION_FAILED's code if the principal may not."""
        err = self.auth.check(operation, _RT.GROUP, group_id, api=api)
        return 0 if err is None else err.code or -1

    async def handle_join_group(self, header: p.RequestHeader, body: p.JoinGroupRequest) -> Any:
        if denied := self._group_denied(_OP.READ, body.group_id, "JoinGroup"):
            return p.JoinGroupResponse(error_code=denied)
        result = await self.coordinator.join_group(
            JoinRequest(
                group_id=body.group_id,
                member_id=body.member_id,
                group_instance_id=body.group_instance_id,
                client_id=header.client_id or "",
                client_host=_client_host(),
                session_timeout_ms=body.session_timeout_ms,
                rebalance_timeout_ms=body.rebalance_timeout_ms,
                protocol_type=body.protocol_type,
                protocols=tuple((proto.name, bytes(proto.metadata)) for proto in body.protocols),
            )
        )
        return p.JoinGroupResponse(
            error_code=(result.error.code or -1) if result.error is not None else 0,
            generation_id=result.generation_id,
            protocol_name=result.protocol_name,
            leader=result.leader,
            member_id=result.member_id,
            members=[
                p.JoinGroupResponseMember(
                    member_id=member_id, group_instance_id=instance_id, metadata=metadata
                )
                for member_id, instance_id, metadata in result.members
            ],
        )

    async def handle_sync_group(self, header: p.RequestHeader, body: p.SyncGroupRequest) -> Any:
        if denied := self._group_denied(_OP.READ, body.group_id, "SyncGroup"):
            return p.SyncGroupResponse(error_code=denied)
        try:
            assignment = await self.coordinator.sync_group(
                body.group_id,
                body.generation_id,
                body.member_id,
                body.group_instance_id,
                {a.member_id: bytes(a.assignment) for a in body.assignments},
            )
        except ReplogError as err:
            return p.SyncGroupResponse(error_code=error_code(err))
        return p.SyncGroupResponse(assignment=assignment)

    async def handle_heartbeat(self, header: p.RequestHeader, body: p.HeartbeatRequest) -> Any:
        if denied := self._group_denied(_OP.READ, body.group_id, "Heartbeat"):
            return p.HeartbeatResponse(error_code=denied)
        try:
            await self.coordinator.heartbeat(
                body.group_id, body.generation_id, body.member_id, body.group_instance_id
            )
        except ReplogError as err:
            return p.HeartbeatResponse(error_code=error_code(err))
        return p.HeartbeatResponse()

    async def handle_leave_group(self, header: p.RequestHeader, body: p.LeaveGroupRequest) -> Any:
        if denied := self._group_denied(_OP.READ, body.group_id, "LeaveGroup"):
            return p.LeaveGroupResponse(error_code=denied)
        members = [(m.member_id, m.group_instance_id) for m in body.members]
        try:
            errors = await self.coordinator.leave_group(body.group_id, members)
        except ReplogError as err:
            return p.LeaveGroupResponse(error_code=error_code(err))
        return p.LeaveGroupResponse(
            members=[
                p.MemberResponse(
                    member_id=member_id,
                    group_instance_id=instance_id,
                    error_code=(error.code or -1) if error is not None else 0,
                )
                for (member_id, instance_id), error in zip(members, errors, strict=True)
            ]
        )

    async def handle_offset_commit(
        self, header: p.RequestHeader, body: p.OffsetCommitRequest
    ) -> Any:
        offsets = _offsets_of(body.topics)
        if denied := self._group_denied(_OP.READ, body.group_id, "OffsetCommit"):
            return p.OffsetCommitResponse(topics=_commit_topics(dict.fromkeys(offsets, denied)))
        offsets, refused = self._readable(offsets, "OffsetCommit")
        codes: dict[TopicPartition, int] = {}
        try:
            if offsets or not refused:  # (a request of only refused topics commits nothing)
                results = await self.coordinator.commit_offsets(
                    body.group_id,
                    body.generation_id,
                    body.member_id,
                    body.group_instance_id,
                    offsets,
                )
                codes = {tp: (e.code or -1) if e is not None else 0 for tp, e in results.items()}
        except ReplogError as err:
            codes = dict.fromkeys(offsets, error_code(err))
        return p.OffsetCommitResponse(topics=_commit_topics({**codes, **refused}))

    def _readable(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], api: str
    ) -> tuple[dict[TopicPartition, OffsetAndMetadata], dict[TopicPartition, int]]:
        """The offsets of topics the principal may Read, and TOPIC_AUTHORIZATION_FAILED for
        the others' partitions (committing a topic's offsets needs Read on it, as Kafka)."""
        if not self.auth.enabled:
            return offsets, {}
        may = self.auth.filter(_OP.READ, _RT.TOPIC, (tp.topic for tp in offsets), api=api)
        refused = {
            tp: self.auth.error(_OP.READ, _RT.TOPIC, tp.topic).code or -1
            for tp in offsets
            if tp.topic not in may
        }
        return {tp: o for tp, o in offsets.items() if tp.topic in may}, refused

    async def handle_txn_offset_commit(
        self, header: p.RequestHeader, body: p.TxnOffsetCommitRequest
    ) -> Any:
        offsets = _offsets_of(body.topics)
        api = "TxnOffsetCommit"
        err = self.auth.check(
            _OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api=api
        ) or self.auth.check(_OP.READ, _RT.GROUP, body.group_id, api=api)
        if err is not None:
            return p.TxnOffsetCommitResponse(
                topics=_commit_topics(dict.fromkeys(offsets, err.code or -1))
            )
        offsets, refused = self._readable(offsets, api)
        if not offsets and refused:
            return p.TxnOffsetCommitResponse(topics=_commit_topics(refused))
        try:
            results = await self.coordinator.commit_txn_offsets(
                body.group_id,
                body.producer_id,
                body.producer_epoch,
                body.generation_id,
                body.member_id,
                body.group_instance_id,
                offsets,
            )
            codes = {tp: (e.code or -1) if e is not None else 0 for tp, e in results.items()}
        except ReplogError as failure:
            codes = dict.fromkeys(offsets, error_code(failure))
        return p.TxnOffsetCommitResponse(topics=_commit_topics({**codes, **refused}))

    async def handle_offset_fetch(self, header: p.RequestHeader, body: p.OffsetFetchRequest) -> Any:
        """The group's committed offsets: Describe on the group (else GROUP_AUTHORIZATION_FAILED
        at the top), and on each topic: named ones answer TOPIC_AUTHORIZATION_FAILED, all
        offsets leave them out."""
        api = "OffsetFetch"
        if denied := self._group_denied(_OP.DESCRIBE, body.group_id, api):
            return _offset_fetch_error(body, denied)
        wanted = (
            None
            if body.topics is None
            else [TopicPartition(t.name, i) for t in body.topics for i in t.partition_indexes]
        )
        refused: dict[TopicPartition, int] = {}
        if self.auth.enabled and wanted is not None:
            may = self.auth.filter(_OP.DESCRIBE, _RT.TOPIC, (tp.topic for tp in wanted), api=api)
            refused = {
                tp: self.auth.error(_OP.DESCRIBE, _RT.TOPIC, tp.topic).code or -1
                for tp in wanted
                if tp.topic not in may
            }
            wanted = [tp for tp in wanted if tp.topic in may]
        try:
            offsets = self.coordinator.fetch_offsets(body.group_id, wanted)
            unstable = self.coordinator.unstable(body.group_id) if body.require_stable else set()
        except ReplogError as err:
            return _offset_fetch_error(body, error_code(err))
        if self.auth.enabled and wanted is None:
            visible = self.auth.filter(
                _OP.DESCRIBE, _RT.TOPIC, (tp.topic for tp in offsets), api=api, log_denied=False
            )
            offsets = {tp: v for tp, v in offsets.items() if tp.topic in visible}
        by_topic: dict[str, list[p.OffsetFetchResponsePartition]] = {}
        for tp, code in sorted(refused.items()):
            by_topic.setdefault(tp.topic, []).append(
                p.OffsetFetchResponsePartition(partition_index=tp.partition, error_code=code)
            )
        for tp, value in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                p.OffsetFetchResponsePartition(
                    partition_index=tp.partition,
                    committed_offset=value.offset if value is not None else -1,
                    committed_leader_epoch=value.leader_epoch if value is not None else -1,
                    metadata=value.metadata if value is not None else None,
                    error_code=UnstableOffsetCommitError.code if tp in unstable else 0,
                )
            )
        return p.OffsetFetchResponse(
            topics=[
                p.OffsetFetchResponseTopic(name=name, partitions=parts)
                for name, parts in by_topic.items()
            ]
        )

    async def handle_list_groups(self, header: p.RequestHeader, body: p.ListGroupsRequest) -> Any:
        """Every group with Describe on the cluster, else those with Describe on the group."""
        groups = sorted(self.coordinator.list_groups(), key=lambda g: g.group_id)
        api = "ListGroups"
        if self.auth.enabled and not self.auth.allowed(
            _OP.DESCRIBE, _RT.CLUSTER, api=api, log_denied=False
        ):
            visible = self.auth.filter(
                _OP.DESCRIBE, _RT.GROUP, (g.group_id for g in groups), api=api, log_denied=False
            )
            groups = [g for g in groups if g.group_id in visible]
        listed = [_listed(g) for g in groups]
        states = {s.lower() for s in body.states_filter}
        types = {t.lower() for t in body.types_filter}
        return p.ListGroupsResponse(
            groups=[
                g
                for g in listed
                if (not states or g.group_state.lower() in states)
                and (not types or g.group_type in types)
            ]
        )

    def _describe_each(
        self,
        group_ids: Iterable[str],
        api: str,
        describe: Callable[[str, GroupMetadata | None], _D],
        failed: Callable[[str, int, str | None], _D],
    ) -> list[_D]:
        """``describe(group id, group or None)`` of each group the principal may Describe;
        ``failed(group id, code, message)`` for the others and where describing raised."""
        out = []
        for group_id in group_ids:
            if denied := self._group_denied(_OP.DESCRIBE, group_id, api):
                out.append(failed(group_id, denied, None))
                continue
            try:
                out.append(describe(group_id, self.coordinator.describe_group(group_id)))
            except ReplogError as err:
                out.append(failed(group_id, error_code(err), error_message(err)))
        return out

    async def handle_describe_groups(
        self, header: p.RequestHeader, body: p.DescribeGroupsRequest
    ) -> Any:
        def failed(group_id: str, code: int, message: str | None) -> p.DescribedGroup:
            return p.DescribedGroup(error_code=code, group_id=group_id)

        groups = self._describe_each(body.groups, "DescribeGroups", self._describe, failed)
        return p.DescribeGroupsResponse(groups=groups)

    def _describe(self, group_id: str, group: GroupMetadata | None) -> p.DescribedGroup:
        if group is None:
            return p.DescribedGroup(group_id=group_id, group_state=GroupState.DEAD.value)
        if group.consumer is not None:
            return self._describe_as_classic(group, group.consumer)
        return p.DescribedGroup(
            group_id=group_id,
            group_state=group.state.value,
            protocol_type=group.protocol_type or "",
            protocol_data=group.protocol_name or "",
            members=[
                p.DescribedGroupMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_metadata=m.metadata_for(group.protocol_name or ""),
                    member_assignment=m.assignment,
                )
                for m in group.members.values()
            ],
        )

    def _describe_as_classic(self, group: GroupMetadata, cg: ConsumerGroup) -> p.DescribedGroup:
        """A consumer group in DescribeGroups' terms (for tools that only know those): its
        members with their partitions as a ConsumerProtocol assignment."""
        image = self.image()
        return p.DescribedGroup(
            group_id=group.group_id,
            group_state=cg.state.value,
            protocol_type=CONSUMER_GROUP_TYPE,
            protocol_data=cg.assignor_name,
            members=[
                p.DescribedGroupMember(
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_assignment=encode_consumer_assignment(
                        cg.assignment_names(m.assigned, image)
                    ),
                )
                for m in cg.members.values()
            ],
        )

    # --- the consumer group protocol (KIP-848) -----------------------------------------------

    async def handle_consumer_group_heartbeat(
        self, header: p.RequestHeader, body: p.ConsumerGroupHeartbeatRequest
    ) -> Any:
        """Read on the group, and Describe on each subscribed topic named (Kafka's checks;
        topics a regex matches are not filtered by ACLs)."""
        api = "ConsumerGroupHeartbeat"
        if denied := self._group_denied(_OP.READ, body.group_id, api):
            return p.ConsumerGroupHeartbeatResponse(error_code=denied)
        names = body.subscribed_topic_names or []
        if self.auth.enabled and names:
            may = self.auth.filter(_OP.DESCRIBE, _RT.TOPIC, names, api=api)
            refused = sorted(set(names) - set(may))
            if refused:
                err = self.auth.error(_OP.DESCRIBE, _RT.TOPIC, refused[0])
                return p.ConsumerGroupHeartbeatResponse(
                    error_code=err.code or -1,
                    error_message=f"not authorized to describe topics {refused}",
                )
        owned = None
        if body.topic_partitions is not None:
            # (Kafka's zero uuid, which kio reads as None, names no topic)
            owned = {
                (t.topic_id or _ZERO_UUID).hex: frozenset(t.partitions)
                for t in body.topic_partitions
            }
        request = ConsumerHeartbeat(
            group_id=body.group_id,
            member_id=body.member_id,
            member_epoch=body.member_epoch,
            instance_id=body.instance_id,
            rack_id=body.rack_id,
            rebalance_timeout_ms=body.rebalance_timeout_ms,
            subscribed_topic_names=(
                tuple(body.subscribed_topic_names)
                if body.subscribed_topic_names is not None
                else None
            ),
            subscribed_topic_regex=body.subscribed_topic_regex,
            server_assignor=body.server_assignor,
            owned=owned,
            client_id=header.client_id or "",
            client_host=_client_host(),
        )
        try:
            result = await self.coordinator.consumer_group_heartbeat(request)
        except ReplogError as err:
            return p.ConsumerGroupHeartbeatResponse(
                error_code=error_code(err), error_message=error_message(err)
            )
        return p.ConsumerGroupHeartbeatResponse(
            member_id=result.member_id,
            member_epoch=result.member_epoch,
            heartbeat_interval_ms=result.heartbeat_interval_ms,
            assignment=None if result.assignment is None else _by_topic_id(result.assignment),
        )

    async def handle_consumer_group_describe(
        self, header: p.RequestHeader, body: p.ConsumerGroupDescribeRequest
    ) -> Any:
        def failed(group_id: str, code: int, message: str | None) -> p.ConsumerGroupDescribedGroup:
            return p.ConsumerGroupDescribedGroup(
                error_code=code, error_message=message, group_id=group_id
            )

        groups = self._describe_each(
            body.group_ids, "ConsumerGroupDescribe", self._describe_consumer_group, failed
        )
        return p.ConsumerGroupDescribeResponse(groups=groups)

    def _describe_consumer_group(
        self, group_id: str, group: GroupMetadata | None
    ) -> p.ConsumerGroupDescribedGroup:
        if group is None or group.consumer is None:
            kind = "does not exist" if group is None else "is not a consumer group"
            raise GroupIdNotFoundError(f"group {group_id} {kind}")
        cg = group.consumer
        names = {t.topic_id: t.name for t in self.image().topics}
        names.update({topic_id: n for n, (topic_id, _) in cg.subscription_metadata.items()})

        def described(assignment: TopicAssignment) -> p.DescribedAssignment:
            return p.DescribedAssignment(
                topic_partitions=[
                    p.DescribedTopicPartitions(
                        topic_id=uuid.UUID(topic_id),
                        topic_name=names.get(topic_id, ""),
                        partitions=sorted(numbers),
                    )
                    for topic_id, numbers in sorted(assignment.items())
                ]
            )

        return p.ConsumerGroupDescribedGroup(
            group_id=group_id,
            group_state=cg.state.value,
            group_epoch=cg.group_epoch,
            assignment_epoch=cg.assignment_epoch,
            assignor_name=cg.assignor_name,
            members=[
                p.ConsumerGroupDescribedMember(
                    member_id=m.member_id,
                    instance_id=m.instance_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=list(m.subscribed_topic_names),
                    subscribed_topic_regex=m.subscribed_topic_regex,
                    assignment=described(m.assigned),
                    target_assignment=described(cg.target.get(m.member_id, {})),
                )
                for m in cg.members.values()
            ],
        )

    async def handle_delete_groups(
        self, header: p.RequestHeader, body: p.DeleteGroupsRequest
    ) -> Any:
        results = []
        for group_id in body.groups_names:
            if denied := self._group_denied(_OP.DELETE, group_id, "DeleteGroups"):
                results.append(p.DeletableGroupResult(group_id=group_id, error_code=denied))
                continue
            try:
                await self.coordinator.delete_group(group_id)
                code = 0
            except ReplogError as err:
                code = error_code(err)
            results.append(p.DeletableGroupResult(group_id=group_id, error_code=code))
        return p.DeleteGroupsResponse(results=results)

    async def handle_offset_delete(
        self, header: p.RequestHeader, body: p.OffsetDeleteRequest
    ) -> Any:
        """Delete the group's offsets of some partitions (Kafka's KafkaApis
        handleOffsetDeleteRequest): Delete on the group (else GROUP_AUTHORIZATION_FAILED at the
        top), Read on each topic (else TOPIC_AUTHORIZATION_FAILED on its partitions), and
        UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist; the group's own
        errors (not found, not empty, not its coordinator) are the top-level error."""
        api = "OffsetDelete"
        if denied := self._group_denied(_OP.DELETE, body.group_id, api):
            return p.OffsetDeleteResponse(error_code=denied)
        may = self.auth.filter(_OP.READ, _RT.TOPIC, (t.name for t in body.topics), api=api)
        image = self.image()
        codes: dict[TopicPartition, int] = {}
        wanted: list[TopicPartition] = []
        for t in body.topics:
            info = image.topic(t.name)
            for part in t.partitions:
                tp = TopicPartition(t.name, part.partition_index)
                if t.name not in may:
                    codes[tp] = self.auth.error(_OP.READ, _RT.TOPIC, t.name).code or -1
                elif info is None or not 0 <= tp.partition < len(info.partitions):
                    codes[tp] = UnknownTopicOrPartitionError.code
                else:
                    wanted.append(tp)
        try:
            results = await self.coordinator.delete_offsets(body.group_id, wanted)
        except ReplogError as err:
            return p.OffsetDeleteResponse(error_code=error_code(err))
        codes.update({tp: (e.code or -1) if e is not None else 0 for tp, e in results.items()})
        by_topic: dict[str, list[p.OffsetDeleteResponsePartition]] = {}
        for tp, code in codes.items():
            by_topic.setdefault(tp.topic, []).append(
                p.OffsetDeleteResponsePartition(partition_index=tp.partition, error_code=code)
            )
        return p.OffsetDeleteResponse(
            topics=[
                p.OffsetDeleteResponseTopic(name=name, partitions=parts)
                for name, parts in by_topic.items()
            ]
        )


def _client_host() -> str:
    """The address of the connection being served, as Kafka shows a member's (``/1.2.3.4``)."""
    session = SESSION.get()
    return f"/{session.host}" if session is not None and session.host else ""


def _listed(group: GroupMetadata) -> p.ListedGroup:
    """A group as ListGroups names it: its protocol type, state and type (classic or
    consumer)."""
    if group.consumer is not None:
        return p.ListedGroup(
            group_id=group.group_id,
            protocol_type=CONSUMER_GROUP_TYPE,
            group_state=group.consumer.state.value,
            group_type=CONSUMER_GROUP_TYPE,
        )
    return p.ListedGroup(
        group_id=group.group_id,
        protocol_type=group.protocol_type or "",
        group_state=group.state.value,
        group_type="classic",
    )


def _by_topic_id(assignment: Mapping[str, frozenset[int]]) -> list[p.ConsumerGroupTopicPartitions]:
    return [
        p.ConsumerGroupTopicPartitions(topic_id=uuid.UUID(topic_id), partitions=sorted(numbers))
        for topic_id, numbers in sorted(assignment.items())
        if numbers
    ]


def _offsets_of(
    topics: list[p.OffsetCommitRequestTopic],
) -> dict[TopicPartition, OffsetAndMetadata]:
    return {
        TopicPartition(t.name, part.partition_index): OffsetAndMetadata(
            part.committed_offset, part.committed_leader_epoch, part.committed_metadata
        )
        for t in topics
        for part in t.partitions
    }


def _commit_topics(codes: dict[TopicPartition, int]) -> list[p.OffsetCommitResponseTopic]:
    by_topic: dict[str, list[p.OffsetCommitResponsePartition]] = {}
    for tp, code in codes.items():
        by_topic.setdefault(tp.topic, []).append(
            p.OffsetCommitResponsePartition(partition_index=tp.partition, error_code=code)
        )
    return [
        p.OffsetCommitResponseTopic(name=name, partitions=parts) for name, parts in by_topic.items()
    ]


__all__ = ["GroupApis"]


def _offset_fetch_error(body: p.OffsetFetchRequest, code: int) -> p.OffsetFetchResponse:
    """An OffsetFetch refused as a whole: the error at the top and on every partition named
    (Kafka's ``OffsetFetchRequest.getErrorResponse``): OffsetFetch v0 and v1 on the Kafka
    listener have no top-level error code, and would otherwise read as "no offsets"."""
    return p.OffsetFetchResponse(
        error_code=code,
        topics=[
            p.OffsetFetchResponseTopic(
                name=t.name,
                partitions=[
                    p.OffsetFetchResponsePartition(partition_index=i, error_code=code)
                    for i in t.partition_indexes
                ],
            )
            for t in body.topics or []
        ],
    )
