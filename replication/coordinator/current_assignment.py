"""A member's next step towards its target assignment, as Kafka's CurrentAssignmentBuilder:
the reconciliation state machine of the consumer group protocol (KIP-848)::

    STABLE --new target--> UNREVOKED_PARTITIONS --revoked (owned no more)--> next epoch
       ^                          |                                             |
       |                          +----- nothing to revoke --------------------+
       |                                                                        v
       +------------- all assigned --------------- UNRELEASED_PARTITIONS <-- some still held
                                                                              by others

A partition moving from member A to member B is first revoked by A: A stays at its epoch in
UNREVOKED_PARTITIONS with the partition pending revocation, until a heartbeat of A no longer
reports it as owned. Only then does A move to the target's epoch; and B is given the partition
only once no member holds it (its partition epoch is gone): until then B waits in
UNRELEASED_PARTITIONS at the target epoch. So no partition is ever owned by two members.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from replication.coordinator.consumer_group import (
    ConsumerGroupMember,
    MemberState,
    TopicAssignment,
)
from replication.errors import FencedMemberEpochError

__all__ = ["next_member_state"]

#: topic id -> partitions the member reports it owns (None: not sent in this heartbeat)
Owned = Mapping[str, frozenset[int]] | None


def next_member_state(
    member: ConsumerGroupMember,
    target_epoch: int,
    target: TopicAssignment,
    partition_epoch: Callable[[str, int], int],
    owned: Owned,
    now_ms: int,
) -> ConsumerGroupMember:
    """The member after one heartbeat that reported ``owned`` (Kafka's ``build()``)."""
    if member.state is MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next(
            member, member.member_epoch, target_epoch, target, partition_epoch, owned, now_ms
        )
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return member
        return _next(
            member, member.member_epoch + 1, target_epoch, target, partition_epoch, owned, now_ms
        )
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        return _next(
            member, member.member_epoch, target_epoch, target, partition_epoch, owned, now_ms
        )
    raise FencedMemberEpochError(f"member {member.member_id} is in an unknown state; rejoin")


def _owns_any(owned: Owned, partitions: TopicAssignment) -> bool:
    """Does the member still own any of ``partitions``? (If it did not say, assume it does.)"""
    if owned is None:
        return True
    return any(owned.get(topic, frozenset()) & numbers for topic, numbers in partitions.items())


def _next(
    member: ConsumerGroupMember,
    member_epoch: int,
    target_epoch: int,
    target: TopicAssignment,
    partition_epoch: Callable[[str, int], int],
    owned: Owned,
    now_ms: int,
) -> ConsumerGroupMember:
    """Kafka's ``computeNextAssignment``."""
    unreleased = False
    assigned: dict[str, frozenset[int]] = {}
    revoking: dict[str, frozenset[int]] = {}
    adding: dict[str, frozenset[int]] = {}
    for topic in set(target) | set(member.assigned):
        wanted = target.get(topic, frozenset())
        current = member.assigned.get(topic, frozenset())
        kept = current & wanted
        gone = current - kept
        free = {p for p in wanted - kept if partition_epoch(topic, p) == -1}
        unreleased = unreleased or len(free) < len(wanted - kept)
        if kept:
            assigned[topic] = kept
        if gone:
            revoking[topic] = frozenset(gone)
        if free:
            adding[topic] = frozenset(free)
    if revoking and _owns_any(owned, revoking):
        # it keeps its epoch and revokes first; its rebalance timeout runs from now
        since = (
            now_ms
            if member.state is not MemberState.UNREVOKED_PARTITIONS
            else (member.revoking_since_ms)
        )
        return _with(
            member, MemberState.UNREVOKED_PARTITIONS, member_epoch, assigned, revoking, since
        )
    for topic, numbers in adding.items():
        assigned[topic] = assigned.get(topic, frozenset()) | numbers
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return _with(member, state, target_epoch, assigned, {}, 0)


def _with(
    member: ConsumerGroupMember,
    state: MemberState,
    epoch: int,
    assigned: TopicAssignment,
    revoking: TopicAssignment,
    revoking_since_ms: int,
) -> ConsumerGroupMember:
    previous = member.member_epoch if epoch != member.member_epoch else member.previous_member_epoch
    return dataclasses.replace(
        member,
        state=state,
        member_epoch=epoch,
        previous_member_epoch=previous,
        assigned=assigned,
        pending_revocation=revoking,
        revoking_since_ms=revoking_since_ms,
    )
