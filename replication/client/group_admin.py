"""The Admin client's consumer-group calls (as Kafka's Admin: listConsumerGroups,
describeConsumerGroups, listConsumerGroupOffsets, alterConsumerGroupOffsets,
deleteConsumerGroupOffsets, deleteConsumerGroups). Each group is asked at its coordinator;
listing asks every broker, as each coordinator knows only its own groups."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping

from replication.client.cluster import Cluster
from replication.client.coordinator import COORDINATOR_SLOT, CoordinatorClient
from replication.client.types import ConsumerGroupDescription, MemberDescription, TopicPartition
from replication.errors import (
    GroupNotEmptyError,
    ReplogError,
    UnknownMemberIdError,
    for_code,
)
from replication.protocol import (
    GROUP_KEY_TYPE,
    ApiKey,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
    OffsetFetchRequest,
)
from replication.protocol.consumer import (
    ASSIGNMENT_VERSION,
    ConsumerProtocolAssignment,
    decode_embedded,
)

__all__ = ["GroupAdmin"]

_ADMIN_GROUP_SLOT = COORDINATOR_SLOT + 3


def _raise(code: int, what: str) -> None:
    error = for_code(code)
    if error is not None:
        raise error(f"{what}: {error()}")


def _assignment(data: bytes) -> frozenset[TopicPartition]:
    if not data:
        return frozenset()
    try:
        _, assignment = decode_embedded(ConsumerProtocolAssignment, ASSIGNMENT_VERSION, data)
    except ReplogError:
        return frozenset()  # not a consumer's assignment (another protocol type)
    return frozenset(
        TopicPartition(t.topic, p) for t in assignment.assigned_partitions for p in t.partitions
    )


class GroupAdmin:
    def __init__(self, cluster: Cluster, default_api_timeout_ms: int) -> None:
        self.cluster = cluster
        self.default_api_timeout_ms = default_api_timeout_ms

    def _coordinator(self, group_id: str) -> CoordinatorClient:
        return CoordinatorClient(
            self.cluster, group_id, key_type=GROUP_KEY_TYPE, slot=_ADMIN_GROUP_SLOT
        )

    def _deadline(self, timeout_ms: int | None) -> float:
        timeout = self.default_api_timeout_ms if timeout_ms is None else timeout_ms
        return time.monotonic() + timeout / 1000

    def list(self) -> list[tuple[str, str]]:
        """(group id, protocol type) of every group, from every broker."""
        self.cluster.refresh()
        found: dict[str, str] = {}
        for node in sorted(self.cluster.snapshot.brokers):
            response = self.cluster.connection(node).send(
                ApiKey.LIST_GROUPS, 0, ListGroupsRequest()
            )
            _raise(response.error_code, f"listing the groups of broker {node}")
            found.update((g.group_id, g.protocol_type) for g in response.groups)
        return sorted(found.items())

    def describe(self, group_id: str, timeout_ms: int | None = None) -> ConsumerGroupDescription:
        coordinator = self._coordinator(group_id)
        response = coordinator.request(
            ApiKey.DESCRIBE_GROUPS,
            DescribeGroupsRequest(groups=[group_id]),
            what=f"describing group {group_id!r}",
            deadline=self._deadline(timeout_ms),
        )
        group = response.groups[0]
        _raise(group.error_code, f"describing group {group_id!r}")
        return ConsumerGroupDescription(
            group_id=group_id,
            state=group.group_state,
            protocol_type=group.protocol_type,
            assignor=group.protocol_data,
            coordinator=coordinator.node_id,
            members=tuple(
                MemberDescription(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    host=m.client_host,
                    assignment=_assignment(bytes(m.member_assignment)),
                )
                for m in group.members
            ),
        )

    def offsets(self, group_id: str, timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        response = self._coordinator(group_id).request(
            ApiKey.OFFSET_FETCH,
            OffsetFetchRequest(group_id=group_id, topics=None),
            what=f"fetching the offsets of group {group_id!r}",
            deadline=self._deadline(timeout_ms),
        )
        _raise(response.error_code, f"fetching the offsets of group {group_id!r}")
        return {
            TopicPartition(t.name, p.partition_index): p.committed_offset
            for t in response.topics
            for p in t.partitions
            if p.committed_offset >= 0
        }

    def alter_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int], timeout_ms: int | None = None
    ) -> None:
        """Set the group's committed offsets; the group must have no members."""
        by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
        for tp, offset in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                OffsetCommitRequestPartition(partition_index=tp.partition, committed_offset=offset)
            )
        response = self._coordinator(group_id).request(
            ApiKey.OFFSET_COMMIT,
            OffsetCommitRequest(
                group_id=group_id,
                topics=[
                    OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                ],
            ),
            what=f"setting the offsets of group {group_id!r}",
            deadline=self._deadline(timeout_ms),
        )
        for topic in response.topics:
            for part in topic.partitions:
                error = for_code(part.error_code)
                if error is UnknownMemberIdError:
                    raise GroupNotEmptyError(
                        f"group {group_id!r} has active members: stop its consumers before "
                        "setting its offsets"
                    )
                _raise(
                    part.error_code, f"setting {topic.name}-{part.partition_index} of {group_id!r}"
                )

    def delete_offsets(
        self,
        group_id: str,
        partitions: Collection[TopicPartition],
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, ReplogError | None]:
        """Delete the group's committed offsets of ``partitions`` (OffsetDelete): per
        partition None (deleted, or there was none) or its error; an error of the whole
        group (GroupIdNotFoundError, GroupNotEmptyError, GroupAuthorizationFailedError)
        raises."""
        topics = sorted({tp.topic for tp in partitions})
        request = OffsetDeleteRequest(
            group_id=group_id,
            topics=[
                OffsetDeleteRequestTopic(
                    name=name,
                    partitions=[
                        OffsetDeleteRequestPartition(partition_index=index)
                        for index in sorted({tp.partition for tp in partitions if tp.topic == name})
                    ],
                )
                for name in topics
            ],
        )
        what = f"deleting offsets of group {group_id!r}"
        response = self._coordinator(group_id).request(
            ApiKey.OFFSET_DELETE, request, what=what, deadline=self._deadline(timeout_ms)
        )
        _raise(response.error_code, what)
        results: dict[TopicPartition, ReplogError | None] = {}
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                error = for_code(part.error_code)
                results[tp] = None if error is None else error(f"{what} of {tp}: {error()}")
        return results

    def delete(self, group_ids: Iterable[str], timeout_ms: int | None = None) -> None:
        for group_id in group_ids:
            response = self._coordinator(group_id).request(
                ApiKey.DELETE_GROUPS,
                DeleteGroupsRequest(groups_names=[group_id]),
                what=f"deleting group {group_id!r}",
                deadline=self._deadline(timeout_ms),
            )
            _raise(response.results[0].error_code, f"deleting group {group_id!r}")
