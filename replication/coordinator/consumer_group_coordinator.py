"""Membership of the consumer group protocol (KIP-848), as Kafka's
``GroupMetadataManager.consumerGroupHeartbeat``: a member joins (member epoch 0), heartbeats
with what it owns, is given its partitions through the reconciliation state machine
(:mod:`replication.coordinator.current_assignment`), and leaves (epoch -1; -2 for a static
member that will come back). The assignment is the coordinator's
(:mod:`replication.coordinator.server_assignors`); there is no group leader, no JoinGroup or
SyncGroup round.

A member that sends no heartbeat within ``group.consumer.session.timeout.ms``, or that does not
revoke partitions within its rebalance timeout, is removed; either bumps the group epoch, as a
join, a leave, a new subscription or a change of a subscribed topic (partitions added, topic
deleted) does, and a new target assignment is computed at once.

Durability, and where replog differs from Kafka: Kafka writes each member, its assignment and
the target assignment to ``__consumer_offsets``. replog keeps them in memory only: after a
coordinator failover the new coordinator knows none of the members, answers their heartbeats
UNKNOWN_MEMBER_ID, and they join again with epoch 0 (KIP-848 clients do so by themselves) and
are assigned afresh. Committed offsets are written as for classic groups and survive.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace

from replication.common import TopicPartition
from replication.coordinator.consumer_group import (
    JOIN_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerGroupMember,
    MemberState,
    TopicAssignment,
    member_subscription,
    subscribed_topics,
)
from replication.coordinator.current_assignment import next_member_state
from replication.coordinator.group_metadata import GroupConfig, GroupMetadata, GroupState
from replication.coordinator.group_metadata_manager import GroupMetadataManager
from replication.coordinator.server_assignors import (
    DEFAULT_ASSIGNOR,
    SERVER_ASSIGNORS,
    MemberSpec,
)
from replication.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    InvalidRequestError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
    UnsupportedAssignorError,
)
from replication.metadata.image import MetadataImage

log = logging.getLogger(__name__)

__all__ = ["ConsumerGroupCoordinator", "ConsumerHeartbeat", "HeartbeatResult"]

CONSUMER_GROUP_TYPE = "consumer"


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """A ConsumerGroupHeartbeat's fields (None: unchanged since the member's last one)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    #: topic id -> the partitions the member owns
    owned: Mapping[str, frozenset[int]] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    #: the member's partitions, when they changed or the request was a full one
    assignment: TopicAssignment | None = None


class ConsumerGroupCoordinator:
    """The consumer-protocol side of a broker's group coordinator (it shares the classic
    side's offsets partitions, groups and locks)."""

    def __init__(
        self,
        config: GroupConfig,
        manager: GroupMetadataManager,
        image: Callable[[], MetadataImage],
        locked: Callable[..., AbstractAsyncContextManager[None]],
        time_ms: Callable[[], int],
    ) -> None:
        self.config = config
        self.manager = manager
        self.image = image
        self._locked = locked
        self._time_ms = time_ms

    # --- ConsumerGroupHeartbeat ---------------------------------------------------------------

    async def heartbeat(self, r: ConsumerHeartbeat) -> HeartbeatResult:
        """Answer a heartbeat (raises the error of the answer)."""
        _validate(r)
        async with self._locked(r.group_id):
            if r.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                return self._leave(r)
            return self._heartbeat(r)

    def _group(self, group_id: str, *, create: bool) -> tuple[GroupMetadata, ConsumerGroup]:
        group = self.manager.group(group_id, create=create)
        if group is None or group.is_(GroupState.DEAD):
            raise UnknownMemberIdError(f"group {group_id!r} has no members; join again")
        if group.consumer is None:
            if group.members:
                raise GroupIdNotFoundError(
                    f"group {group_id!r} is a classic group (protocol type "
                    f"{group.protocol_type!r}); it cannot be joined with group.protocol=consumer "
                    "while it has members"
                )
            if not create:
                raise UnknownMemberIdError(f"group {group_id!r} has no members; join again")
            # an empty classic group (its offsets only) becomes a consumer group, as in Kafka
            group.consumer = ConsumerGroup()
            group.protocol_type = CONSUMER_GROUP_TYPE
            group.protocol_name = group.leader_id = None
        return group, group.consumer

    def _heartbeat(self, r: ConsumerHeartbeat) -> HeartbeatResult:
        now = self._time_ms()
        joining = r.member_epoch == JOIN_GROUP_MEMBER_EPOCH
        group, cg = self._group(r.group_id, create=joining)
        member = self._member(group, cg, r, joining)
        updated = replace(
            member,
            instance_id=r.instance_id if r.instance_id is not None else member.instance_id,
            rack_id=r.rack_id if r.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(
                r.rebalance_timeout_ms
                if r.rebalance_timeout_ms >= 0
                else member.rebalance_timeout_ms
            ),
            server_assignor=(
                r.server_assignor if r.server_assignor is not None else member.server_assignor
            ),
            subscribed_topic_names=(
                tuple(r.subscribed_topic_names)
                if r.subscribed_topic_names is not None
                else member.subscribed_topic_names
            ),
            subscribed_topic_regex=(
                (r.subscribed_topic_regex or None)
                if r.subscribed_topic_regex is not None
                else member.subscribed_topic_regex
            ),
            client_id=r.client_id,
            client_host=r.client_host,
        )
        new_member = member.member_id not in cg.members
        bump = (
            new_member
            or updated.subscribed_topic_names != member.subscribed_topic_names
            or updated.subscribed_topic_regex != member.subscribed_topic_regex
            or updated.server_assignor != member.server_assignor
        )
        cg.update_member(updated)
        cg.last_heartbeat_ms[updated.member_id] = now
        if not group.is_(GroupState.STABLE):
            group.transition(GroupState.STABLE, now)  # (the classic side's "has members")
        self._maybe_refresh(group, cg, bump=bump)
        target = cg.target.get(updated.member_id, {})
        reconciled = next_member_state(
            updated, cg.assignment_epoch, target, cg.partition_epoch, r.owned, now
        )
        cg.update_member(reconciled)
        full = joining or (
            r.rebalance_timeout_ms != -1
            and r.subscribed_topic_names is not None
            and r.owned is not None
        )
        changed = dict(reconciled.assigned) != dict(member.assigned) or new_member
        return HeartbeatResult(
            member_id=reconciled.member_id,
            member_epoch=reconciled.member_epoch,
            heartbeat_interval_ms=self.config.consumer_heartbeat_interval_ms,
            assignment=reconciled.assigned if full or changed else None,
        )

    def _member(
        self, group: GroupMetadata, cg: ConsumerGroup, r: ConsumerHeartbeat, joining: bool
    ) -> ConsumerGroupMember:
        member_id = r.member_id or str(uuid.uuid4())
        if r.instance_id is not None:
            known_id = cg.static_members.get(r.instance_id)
            known = cg.members.get(known_id) if known_id is not None else None
            if joining:
                if known is None:
                    return self._new_member(cg, member_id, r)
                if known.member_id != member_id and known.member_epoch != (
                    LEAVE_GROUP_STATIC_MEMBER_EPOCH
                ):
                    raise UnreleasedInstanceIdError(
                        f"group.instance.id {r.instance_id!r} is still held by member "
                        f"{known.member_id}"
                    )
                # the static member comes back (under a new member id): its partitions with it
                target = cg.target.pop(known.member_id, {})
                cg.remove_member(known.member_id)
                back = replace(known, member_id=member_id, member_epoch=0, previous_member_epoch=0)
                cg.update_member(back)
                cg.target[member_id] = target
                log.info(
                    "group %s: static member %s is back as %s",
                    group.group_id,
                    r.instance_id,
                    member_id,
                )
                return back
            if known is None:
                raise UnknownMemberIdError(f"no static member {r.instance_id!r}; join again")
            if known.member_id != member_id:
                raise FencedInstanceIdError(
                    f"group.instance.id {r.instance_id!r} now belongs to member {known.member_id}"
                )
            _check_epoch(known, r)
            return known
        member = cg.members.get(member_id)
        if joining:
            if member is None:
                return self._new_member(cg, member_id, r)
            # it joins again (it was fenced): it owns nothing now
            fresh = replace(
                member,
                member_epoch=0,
                previous_member_epoch=0,
                state=MemberState.STABLE,
                assigned={},
                pending_revocation={},
            )
            cg.update_member(fresh)
            return fresh
        if member is None:
            raise UnknownMemberIdError(
                f"group {group.group_id!r} has no member {member_id!r}; join again"
            )
        _check_epoch(member, r)
        return member

    def _new_member(
        self, cg: ConsumerGroup, member_id: str, r: ConsumerHeartbeat
    ) -> ConsumerGroupMember:
        if len(cg.members) >= self.config.max_size:
            raise GroupMaxSizeReachedError(
                f"group {r.group_id!r} has group.max.size={self.config.max_size} members"
            )
        log.info("group %s: member %s joins (consumer protocol)", r.group_id, member_id)
        return ConsumerGroupMember(member_id=member_id, instance_id=r.instance_id)

    def _leave(self, r: ConsumerHeartbeat) -> HeartbeatResult:
        group, cg = self._group(r.group_id, create=False)
        member_id = r.member_id
        if r.instance_id is not None:
            known = cg.static_members.get(r.instance_id)
            if known is None:
                raise UnknownMemberIdError(f"no static member {r.instance_id!r}")
            if known != member_id:
                raise FencedInstanceIdError(
                    f"group.instance.id {r.instance_id!r} now belongs to member {known}"
                )
        member = cg.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"group {r.group_id!r} has no member {member_id!r}")
        interval = self.config.consumer_heartbeat_interval_ms
        if r.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and r.instance_id is not None:
            # it will come back: its partitions wait for it until its session runs out
            cg.update_member(
                replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH, pending_revocation={})
            )
            log.info("group %s: static member %s left for now", r.group_id, r.instance_id)
            return HeartbeatResult(member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH, interval)
        self.fence(group, member_id, "left the group")
        return HeartbeatResult(member_id, LEAVE_GROUP_MEMBER_EPOCH, interval)

    # --- the group epoch and the target assignment --------------------------------------------

    def fence(self, group: GroupMetadata, member_id: str, why: str) -> None:
        """Remove a member; the group epoch moves on and its partitions are assigned anew."""
        cg = group.consumer
        if cg is None or cg.remove_member(member_id) is None:
            return
        log.info("group %s: member %s leaves (%s)", group.group_id, member_id, why)
        if not cg.members:
            group.transition(GroupState.EMPTY, self._time_ms())
        self._maybe_refresh(group, cg, bump=True)

    def _maybe_refresh(self, group: GroupMetadata, cg: ConsumerGroup, *, bump: bool) -> None:
        """Bump the group epoch if asked or if the subscribed topics changed, and compute the
        target assignment of a new epoch."""
        image = self.image()
        if bump or image is not cg.image_seen:
            metadata = subscribed_topics(cg.members.values(), image)
            cg.image_seen = image
            if metadata != cg.subscription_metadata:
                cg.subscription_metadata = metadata
                bump = True
        if not bump:
            return
        cg.group_epoch += 1
        self._assign(group, cg)

    def _assign(self, group: GroupMetadata, cg: ConsumerGroup) -> None:
        name = _assignor_name(cg)
        metadata = cg.subscription_metadata
        specs = {
            m.member_id: MemberSpec(
                member_subscription(m, metadata),
                {t: frozenset(ps) for t, ps in cg.target.get(m.member_id, {}).items()},
            )
            for m in cg.members.values()
        }
        partitions = dict(metadata.values())
        computed = SERVER_ASSIGNORS[name].assign(specs, partitions)
        cg.target = {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in computed.items()}
        cg.assignment_epoch = cg.group_epoch
        cg.assignor_name = name
        log.info(
            "group %s: epoch %d, %d members, assignor %s",
            group.group_id,
            cg.group_epoch,
            len(cg.members),
            name,
        )

    # --- timers --------------------------------------------------------------------------------

    def expire(self, group: GroupMetadata, now: int) -> None:
        """Remove members whose session ran out, or that did not revoke in time."""
        cg = group.consumer
        if cg is None:
            return
        self._maybe_refresh(group, cg, bump=False)
        for member in list(cg.members.values()):
            last = cg.last_heartbeat_ms.get(member.member_id, now)
            if now - last > self.config.consumer_session_timeout_ms:
                self.fence(group, member.member_id, "session timed out")
            elif (
                member.state is MemberState.UNREVOKED_PARTITIONS
                and now - member.revoking_since_ms > member.rebalance_timeout_ms
            ):
                self.fence(group, member.member_id, "did not revoke within its rebalance timeout")

    def deadline_ms(self, group: GroupMetadata) -> int | None:
        """The earliest time ``expire`` has something to do for the group."""
        cg = group.consumer
        if cg is None or not cg.members:
            return None
        times = [
            at + self.config.consumer_session_timeout_ms + 1 for at in cg.last_heartbeat_ms.values()
        ]
        times += [
            m.revoking_since_ms + m.rebalance_timeout_ms + 1
            for m in cg.members.values()
            if m.state is MemberState.UNREVOKED_PARTITIONS
        ]
        return min(times, default=None)

    # --- offset commits ------------------------------------------------------------------------

    @staticmethod
    def check_commit(group: GroupMetadata, member_id: str, member_epoch: int) -> None:
        """KIP-848's rules for an OffsetCommit to a consumer group: from outside the group
        (epoch < 0) only while it is empty; else from a known member, at its current epoch."""
        cg = group.consumer
        assert cg is not None
        if member_epoch < 0 and not cg.members:
            return
        member = cg.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"group {group.group_id!r} has no member {member_id!r}")
        if member_epoch != member.member_epoch:
            raise StaleMemberEpochError(
                f"member epoch {member_epoch} is not member {member_id}'s {member.member_epoch}"
            )

    def owned(self, group: GroupMetadata, member_id: str) -> set[TopicPartition] | None:
        """The partitions a member holds, by name (None: not a member)."""
        cg = group.consumer
        member = cg.members.get(member_id) if cg is not None else None
        if cg is None or member is None:
            return None
        held: dict[str, frozenset[int]] = dict(member.assigned)
        for topic, numbers in member.pending_revocation.items():
            held[topic] = held.get(topic, frozenset()) | numbers
        return cg.assignment_names(held, self.image())


def _assignor_name(cg: ConsumerGroup) -> str:
    """The assignor most members name (ties by name), else the default (Kafka's choice)."""
    votes: dict[str, int] = {}
    for m in cg.members.values():
        if m.server_assignor:
            votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
    if not votes:
        return DEFAULT_ASSIGNOR
    return max(sorted(votes), key=lambda n: votes[n])


def _check_epoch(member: ConsumerGroupMember, r: ConsumerHeartbeat) -> None:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid: an epoch ahead is fenced; one behind
    only if it is not the previous epoch with a subset of the assignment (the answer that
    bumped it may have been lost)."""
    if r.member_epoch > member.member_epoch:
        raise FencedMemberEpochError(
            f"member epoch {r.member_epoch} is ahead of {member.member_epoch}; rejoin"
        )
    if r.member_epoch < member.member_epoch:
        subset = r.owned is not None and all(
            numbers <= member.assigned.get(topic, frozenset()) for topic, numbers in r.owned.items()
        )
        if r.member_epoch != member.previous_member_epoch or not subset:
            raise FencedMemberEpochError(
                f"member epoch {r.member_epoch} is behind {member.member_epoch}; rejoin"
            )


def _validate(r: ConsumerHeartbeat) -> None:
    """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
    if not r.group_id:
        raise InvalidRequestError("GroupId can't be empty.")
    if r.instance_id == "":
        raise InvalidRequestError("InstanceId can't be empty.")
    if r.rack_id == "":
        raise InvalidRequestError("RackId can't be empty.")
    if r.member_epoch > 0 or r.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
        if not r.member_id:
            raise InvalidRequestError("MemberId can't be empty.")
    elif r.member_epoch == JOIN_GROUP_MEMBER_EPOCH:
        if r.rebalance_timeout_ms == -1:
            raise InvalidRequestError("RebalanceTimeoutMs must be provided in first request.")
        if r.owned is None or any(r.owned.values()):
            raise InvalidRequestError("TopicPartitions must be empty when (re-)joining.")
        if not r.subscribed_topic_names and not r.subscribed_topic_regex:
            raise InvalidRequestError(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif r.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if not r.member_id:
            raise InvalidRequestError("MemberId can't be empty.")
        if r.instance_id is None:
            raise InvalidRequestError("InstanceId can't be null.")
    else:
        raise InvalidRequestError("MemberEpoch is invalid.")
    if r.server_assignor is not None and r.server_assignor not in SERVER_ASSIGNORS:
        raise UnsupportedAssignorError(
            f"ServerAssignor {r.server_assignor} is not supported. Supported assignors: "
            f"{', '.join(sorted(SERVER_ASSIGNORS))}."
        )
