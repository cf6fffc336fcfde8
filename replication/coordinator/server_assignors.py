"""Server-side partition assignors of the consumer group protocol (KIP-848), as Kafka's
``group.consumer.assignors``: ``uniform`` (the default) and ``range``. A member names one with
its ``serverAssignor`` (the client's ``group.remote.assignor``); the group uses the one most
of its members name, else the default.

Unlike the classic protocol's assignors (:mod:`replication.client.assignors`, run by the
group's leader), these run in the coordinator, whenever the group epoch moves past the epoch
of the target assignment. An assignor sees each member's subscribed topics (by topic id), the
partition count of each topic, and the current target assignment; it returns each member's new
target. Topics are named by id, as in the ConsumerGroupHeartbeat messages, so a topic deleted
and created again under its name is another topic.

``uniform`` (Kafka's UniformAssignor) balances the number of partitions per member (they
differ by at most one where the members have the same subscriptions) and is sticky: a
partition stays with its member unless it must move for balance, so a rebalance moves as few
partitions as it can. ``range`` (Kafka's RangeAssignor) gives each member, topic by topic, a
consecutive range of partitions, the first ``partitions % members`` members (by member id) one
more, so members subscribed to co-partitioned topics get the same partition numbers of each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Final, Protocol

__all__ = [
    "DEFAULT_ASSIGNOR",
    "SERVER_ASSIGNORS",
    "MemberAssignment",
    "MemberSpec",
    "RangeAssignor",
    "ServerAssignor",
    "UniformAssignor",
]

#: one member's partitions: topic id -> partition numbers (Kafka's Map<Uuid, Set<Integer>>)
MemberAssignment = dict[str, set[int]]


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor knows of a member: the topic ids it subscribes to (those that exist)
    and its current target assignment."""

    subscribed: frozenset[str]
    target: Mapping[str, frozenset[int]]


class ServerAssignor(Protocol):
    name: ClassVar[str]

    def assign(
        self, members: Mapping[str, MemberSpec], partitions: Mapping[str, int]
    ) -> dict[str, MemberAssignment]:
        """Each member's new target assignment; ``partitions`` is topic id -> count."""
        ...


class RangeAssignor:
    """Per topic, consecutive ranges of partitions to its subscribers, ordered by member id."""

    name: ClassVar[str] = "range"

    def assign(
        self, members: Mapping[str, MemberSpec], partitions: Mapping[str, int]
    ) -> dict[str, MemberAssignment]:
        out: dict[str, MemberAssignment] = {m: {} for m in members}
        for topic, count in sorted(partitions.items()):
            subscribers = sorted(m for m, spec in members.items() if topic in spec.subscribed)
            if not subscribers:
                continue
            per, extra = divmod(count, len(subscribers))
            start = 0
            for i, member in enumerate(subscribers):
                n = per + (1 if i < extra else 0)
                if n:
                    out[member][topic] = set(range(start, start + n))
                start += n
        return out


class UniformAssignor:
    """Balanced and sticky: keep what each member still may have, give the rest to the
    eligible member with the fewest partitions, then move partitions from the fullest members
    to eligible ones with at least two fewer until none can move."""

    name: ClassVar[str] = "uniform"

    def assign(
        self, members: Mapping[str, MemberSpec], partitions: Mapping[str, int]
    ) -> dict[str, MemberAssignment]:
        owner: dict[tuple[str, int], str] = {}
        held: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
        for member in sorted(members):
            spec = members[member]
            for topic, numbers in spec.target.items():
                if topic not in spec.subscribed:
                    continue
                for number in numbers:
                    tp = (topic, number)
                    if number < partitions.get(topic, 0) and tp not in owner:
                        owner[tp] = member
                        held[member].add(tp)
        # A member subscribed to more topics than its share may not keep everything: drop its
        # surplus first (Kafka's quota), so a new member gets its share even from sticky owners.
        quota = _quotas(members, partitions)
        for member in sorted(members):
            while len(held[member]) > quota[member]:
                tp = max(held[member])
                held[member].discard(tp)
                del owner[tp]
        for topic, count in sorted(partitions.items()):
            eligible = sorted(m for m, spec in members.items() if topic in spec.subscribed)
            if not eligible:
                continue
            for number in range(count):
                tp = (topic, number)
                if tp not in owner:
                    member = min(eligible, key=lambda m: (len(held[m]), m))
                    owner[tp] = member
                    held[member].add(tp)
        _balance(members, held)
        out: dict[str, MemberAssignment] = {m: {} for m in members}
        for member, tps in held.items():
            for topic, number in tps:
                out[member].setdefault(topic, set()).add(number)
        return out


def _quotas(members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, int]:
    """The most each member should hold: its equal share of what its subscribers share with
    it, rounded up (exact when subscriptions are the same, an upper bound otherwise)."""
    quota: dict[str, int] = {}
    for member, spec in members.items():
        total = sum(partitions.get(t, 0) for t in spec.subscribed)
        peers = {m for m, other in members.items() if other.subscribed & spec.subscribed} or {
            member
        }
        quota[member] = -(-total // len(peers)) if total else 0
    return quota


def _balance(members: Mapping[str, MemberSpec], held: dict[str, set[tuple[str, int]]]) -> None:
    """Move partitions from the fullest member to an eligible member with at least two fewer,
    while such a move exists (each move lowers the spread, so this ends)."""
    while True:
        moved = False
        for donor in sorted(held, key=lambda m: (-len(held[m]), m)):
            for tp in sorted(held[donor]):
                takers = [
                    m
                    for m in members
                    if m != donor
                    and tp[0] in members[m].subscribed
                    and len(held[m]) + 2 <= len(held[donor])
                ]
                if takers:
                    taker = min(takers, key=lambda m: (len(held[m]), m))
                    held[donor].discard(tp)
                    held[taker].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


#: the server assignors by name; ``uniform`` unless the members name another
SERVER_ASSIGNORS: Final[dict[str, ServerAssignor]] = {
    UniformAssignor.name: UniformAssignor(),
    RangeAssignor.name: RangeAssignor(),
}
DEFAULT_ASSIGNOR: Final = UniformAssignor.name
