"""The consumer group APIs of a broker: FindCoordinator for groups, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups.

Each handler turns a request into a call of the :class:`GroupCoordinator` and its outcome into
a response; errors travel as Kafka's codes, with a message where the response has a field for
it. KafkaApis serves these beside its own (as Kafka's KafkaApis hands them to its
GroupCoordinator).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from replication import protocol as p
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.coordinator.group import (
    OFFSETS_TOPIC,
    GroupCoordinator,
    GroupState,
    JoinRequest,
    OffsetAndMetadata,
    partition_for,
)
from replication.errors import (
    CoordinatorNotAvailableError,
    ReplogError,
    UnstableOffsetCommitError,
)
from replication.metadata.image import MetadataImage
from replication.server.responses import Handler, error_code


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
            p.ApiKey.TXN_OFFSET_COMMIT: self.handle_txn_offset_commit,
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

    async def handle_join_group(self, header: p.RequestHeader, body: p.JoinGroupRequest) -> Any:
        result = await self.coordinator.join_group(
            JoinRequest(
                group_id=body.group_id,
                member_id=body.member_id,
                group_instance_id=body.group_instance_id,
                client_id=header.client_id or "",
                client_host="",
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
        try:
            await self.coordinator.heartbeat(
                body.group_id, body.generation_id, body.member_id, body.group_instance_id
            )
        except ReplogError as err:
            return p.HeartbeatResponse(error_code=error_code(err))
        return p.HeartbeatResponse()

    async def handle_leave_group(self, header: p.RequestHeader, body: p.LeaveGroupRequest) -> Any:
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
        try:
            results = await self.coordinator.commit_offsets(
                body.group_id, body.generation_id, body.member_id, body.group_instance_id, offsets
            )
            codes = {tp: (e.code or -1) if e is not None else 0 for tp, e in results.items()}
        except ReplogError as err:
            codes = dict.fromkeys(offsets, error_code(err))
        return p.OffsetCommitResponse(topics=_commit_topics(codes))

    async def handle_txn_offset_commit(
        self, header: p.RequestHeader, body: p.TxnOffsetCommitRequest
    ) -> Any:
        offsets = _offsets_of(body.topics)
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
        except ReplogError as err:
            codes = dict.fromkeys(offsets, error_code(err))
        return p.TxnOffsetCommitResponse(topics=_commit_topics(codes))

    async def handle_offset_fetch(self, header: p.RequestHeader, body: p.OffsetFetchRequest) -> Any:
        wanted = (
            None
            if body.topics is None
            else [TopicPartition(t.name, i) for t in body.topics for i in t.partition_indexes]
        )
        try:
            offsets = self.coordinator.fetch_offsets(body.group_id, wanted)
            unstable = self.coordinator.unstable(body.group_id) if body.require_stable else set()
        except ReplogError as err:
            return p.OffsetFetchResponse(error_code=error_code(err))
        by_topic: dict[str, list[p.OffsetFetchResponsePartition]] = {}
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
        return p.ListGroupsResponse(
            groups=[
                p.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type or "")
                for g in sorted(self.coordinator.list_groups(), key=lambda g: g.group_id)
            ]
        )

    async def handle_describe_groups(
        self, header: p.RequestHeader, body: p.DescribeGroupsRequest
    ) -> Any:
        out = []
        for group_id in body.groups:
            try:
                group = self.coordinator.describe_group(group_id)
            except ReplogError as err:
                out.append(p.DescribedGroup(error_code=error_code(err), group_id=group_id))
                continue
            if group is None:
                out.append(p.DescribedGroup(group_id=group_id, group_state=GroupState.DEAD.value))
                continue
            out.append(
                p.DescribedGroup(
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
            )
        return p.DescribeGroupsResponse(groups=out)

    async def handle_delete_groups(
        self, header: p.RequestHeader, body: p.DeleteGroupsRequest
    ) -> Any:
        results = []
        for group_id in body.groups_names:
            try:
                await self.coordinator.delete_group(group_id)
                code = 0
            except ReplogError as err:
                code = error_code(err)
            results.append(p.DeletableGroupResult(group_id=group_id, error_code=code))
        return p.DeleteGroupsResponse(results=results)


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
