"""A group of the consumer group protocol (KIP-848) as its coordinator holds it, as Kafka's
ConsumerGroup and ConsumerGroupMember: the group epoch, the target assignment and its epoch,
each member's epoch, subscription and current assignment, and which member epoch owns each
partition.

Epochs, as KIP-848 names them: the *group epoch* moves whenever what the assignment depends on
changes (a member joins, leaves or changes its subscription, a subscribed topic gains
partitions or is deleted); the coordinator then computes a *target assignment* for that epoch
(:mod:`replication.coordinator.server_assignors`). Each member moves towards its target at its
own pace, one heartbeat at a time (:mod:`replication.coordinator.current_assignment`): its
*member epoch* reaches the target's epoch once it has revoked what it must give up.

A group lives beside the classic group of the same id on ``__consumer_offsets``
(:class:`~replication.coordinator.group_metadata.GroupMetadata` holds it in ``consumer``), so
committed offsets, their expiry and DeleteGroups are shared by both protocols.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from replication.common import TopicPartition
from replication.metadata.image import MetadataImage

__all__ = [
    "LEAVE_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_STATIC_MEMBER_EPOCH",
    "ConsumerGroup",
    "ConsumerGroupMember",
    "ConsumerGroupState",
    "MemberState",
    "TopicAssignment",
    "subscribed_topics",
]

#: member epochs with a meaning (Kafka's ConsumerGroupHeartbeatRequest constants)
JOIN_GROUP_MEMBER_EPOCH = 0
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2

#: a member's partitions: topic id -> partition numbers
TopicAssignment = Mapping[str, frozenset[int]]


class ConsumerGroupState(enum.Enum):
    """Kafka's ConsumerGroup.ConsumerGroupState, as ListGroups and describe name them."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(enum.Enum):
    """Where a member is in its reconciliation (Kafka's MemberState)."""

    #: its epoch is the target's and it has all it may have
    STABLE = "stable"
    #: it must revoke partitions before it may move to the next epoch
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    #: at the target's epoch, waiting for partitions other members have not released yet
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class ConsumerGroupMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    rebalance_timeout_ms: int = 300_000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    #: the partitions it may use now
    assigned: TopicAssignment = field(default_factory=dict)
    #: the partitions it must revoke before it moves on
    pending_revocation: TopicAssignment = field(default_factory=dict)
    #: when it started revoking (its rebalance timeout runs from here)
    revoking_since_ms: int = 0

    def owns(self) -> Iterable[tuple[str, int]]:
        """Every partition it holds, assigned or still to revoke."""
        for held in (self.assigned, self.pending_revocation):
            for topic, numbers in held.items():
                for number in numbers:
                    yield topic, number


@dataclass(slots=True)
class ConsumerGroup:
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerGroupMember] = field(default_factory=dict)
    #: instance id -> member id of the static members
    static_members: dict[str, str] = field(default_factory=dict)
    #: member id -> its target assignment at ``assignment_epoch``
    target: dict[str, TopicAssignment] = field(default_factory=dict)
    #: (topic id, partition) -> epoch of the member holding it
    partition_epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    #: subscribed topic name -> (topic id, partition count), as of the last image looked at
    subscription_metadata: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: the assignor of the last target assignment
    assignor_name: str = ""
    #: member id -> last heartbeat time (ms)
    last_heartbeat_ms: dict[str, int] = field(default_factory=dict)
    #: the image ``subscription_metadata`` was computed from
    image_seen: MetadataImage | None = None

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for member in self.members.values():
            if member.member_epoch != self.assignment_epoch or member.state is not (
                MemberState.STABLE
            ):
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def partition_epoch(self, topic: str, partition: int) -> int:
        """The epoch of the member holding the partition; -1 if none holds it."""
        return self.partition_epochs.get((topic, partition), -1)

    def update_member(self, member: ConsumerGroupMember) -> None:
        """Put ``member`` in place of the member of its id, moving partition ownership."""
        old = self.members.get(member.member_id)
        if old is not None:
            self._release(old)
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        for tp in member.owns():
            self.partition_epochs[tp] = member.member_epoch

    def remove_member(self, member_id: str) -> ConsumerGroupMember | None:
        member = self.members.pop(member_id, None)
        self.target.pop(member_id, None)
        self.last_heartbeat_ms.pop(member_id, None)
        if member is None:
            return None
        self._release(member)
        if member.instance_id is not None and self.static_members.get(member.instance_id) == (
            member_id
        ):
            del self.static_members[member.instance_id]
        return member

    def _release(self, member: ConsumerGroupMember) -> None:
        for tp in member.owns():
            if self.partition_epochs.get(tp) == member.member_epoch:
                del self.partition_epochs[tp]

    def assignment_names(
        self, assignment: TopicAssignment, image: MetadataImage
    ) -> set[TopicPartition]:
        """An assignment by topic name (topics no longer in the image are left out)."""
        names = {topic_id: name for name, (topic_id, _) in self.subscription_metadata.items()}
        for t in image.topics:
            names.setdefault(t.topic_id, t.name)
        return {
            TopicPartition(names[topic], p)
            for topic, numbers in assignment.items()
            if topic in names
            for p in numbers
        }


def subscribed_topics(
    members: Iterable[ConsumerGroupMember], image: MetadataImage
) -> dict[str, tuple[str, int]]:
    """The topics the members subscribe to that exist: name -> (topic id, partition count)."""
    names: set[str] = set()
    patterns: set[str] = set()
    for member in members:
        names.update(member.subscribed_topic_names)
        if member.subscribed_topic_regex:
            patterns.add(member.subscribed_topic_regex)
    out: dict[str, tuple[str, int]] = {}
    for topic in image.topics:
        if topic.name in names or any(matches(p, topic.name) for p in patterns):
            out[topic.name] = (topic.topic_id, len(topic.partitions))
    return out


def matches(pattern: str, topic: str) -> bool:
    """Whether a SubscribedTopicRegex takes ``topic``: the whole name must match, as RE2/J's
    ``matches()``; internal topics (``__`` names) never do. The pattern is Python's ``re``
    (RE2/J's syntax is a subset of it for what clients send: classes, alternation,
    quantifiers); one that does not compile matches nothing."""
    if topic.startswith("__"):
        return False
    try:
        return re.fullmatch(pattern, topic) is not None
    except re.error:
        return False


def member_subscription(
    member: ConsumerGroupMember, metadata: Mapping[str, tuple[str, int]]
) -> frozenset[str]:
    """The topic ids a member subscribes to, of those in ``metadata``."""
    ids = {metadata[n][0] for n in member.subscribed_topic_names if n in metadata}
    if member.subscribed_topic_regex:
        pattern = member.subscribed_topic_regex
        ids.update(topic_id for name, (topic_id, _) in metadata.items() if matches(pattern, name))
    return frozenset(ids)
