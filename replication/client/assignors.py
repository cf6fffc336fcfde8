"""Partition assignors: how a group's leader spreads partitions over the members, as Kafka's
``partition.assignment.strategy``: ``range``, ``roundrobin`` and ``cooperative-sticky``.

An assignor sees each member's subscription (its topics, and for cooperative rebalancing what
it owns now and in which generation) and the partition count of each topic, and returns each
member's partitions. Members are ordered by member id, so every leader computes the same
result from the same input.

``range`` and ``roundrobin`` are *eager*: every member gives up all its partitions before a
rebalance. ``cooperative-sticky`` (KIP-429) keeps what it can where it is: a member gives up
only partitions that move, and a partition moving from one member to another is assigned to
no one in the generation that takes it away; its new owner gets it in the next rebalance, which
the old owner triggers once it has revoked it. So no partition is ever owned by two members.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from replication.common import TopicPartition

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "CooperativeStickyAssignor",
    "RangeAssignor",
    "RoundRobinAssignor",
    "Subscription",
]


@dataclass(frozen=True)
class Subscription:
    """What a member asks for: its topics; for cooperative rebalancing, what it owns."""

    topics: tuple[str, ...]
    owned: frozenset[TopicPartition] = field(default_factory=frozenset)
    generation_id: int = -1


Assignment = dict[str, set[TopicPartition]]


class Assignor(Protocol):
    name: ClassVar[str]
    #: True for cooperative rebalancing (members keep what does not move)
    cooperative: ClassVar[bool]

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment: ...


def _members_of(topic: str, subscriptions: Mapping[str, Subscription]) -> list[str]:
    return sorted(m for m, s in subscriptions.items() if topic in s.topics)


class RangeAssignor:
    """Per topic, consecutive ranges of partitions to the members subscribed to it; the first
    ``partitions % members`` members get one more (Kafka's RangeAssignor)."""

    name: ClassVar[str] = "range"
    cooperative: ClassVar[bool] = False

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        out: Assignment = {m: set() for m in subscriptions}
        for topic, count in sorted(partitions_per_topic.items()):
            members = _members_of(topic, subscriptions)
            if not members:
                continue
            per, extra = divmod(count, len(members))
            start = 0
            for i, member in enumerate(members):
                n = per + (1 if i < extra else 0)
                out[member].update(TopicPartition(topic, p) for p in range(start, start + n))
                start += n
        return out


class RoundRobinAssignor:
    """Every partition of every topic, in order, to the members in turn, skipping those not
    subscribed to its topic (Kafka's RoundRobinAssignor)."""

    name: ClassVar[str] = "roundrobin"
    cooperative: ClassVar[bool] = False

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        out: Assignment = {m: set() for m in subscriptions}
        members = sorted(subscriptions)
        if not members:
            return out
        turn = 0
        for topic, count in sorted(partitions_per_topic.items()):
            if not _members_of(topic, subscriptions):
                continue
            for partition in range(count):
                while topic not in subscriptions[members[turn % len(members)]].topics:
                    turn += 1
                out[members[turn % len(members)]].add(TopicPartition(topic, partition))
                turn += 1
        return out


class CooperativeStickyAssignor:
    """Balanced, and sticky: a member keeps the partitions it owns while the assignment stays
    balanced (counts differ by at most one where subscriptions allow); partitions that must move
    are withheld for one generation (cooperative rebalancing, KIP-429)."""

    name: ClassVar[str] = "cooperative-sticky"
    cooperative: ClassVar[bool] = True

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        out: Assignment = {m: set() for m in subscriptions}
        if not subscriptions:
            return out
        every = {
            TopicPartition(t, p)
            for t, count in partitions_per_topic.items()
            if _members_of(t, subscriptions)
            for p in range(count)
        }
        previous = self._previous_owners(subscriptions, every)
        # 1. each member keeps what it owns; 2. the rest go to the subscriber with the fewest;
        # 3. even out, moving as little of what members owned as possible
        for tp, owner in previous.items():
            out[owner].add(tp)
        for tp in sorted(every - previous.keys()):
            candidates = [m for m in sorted(subscriptions) if tp.topic in subscriptions[m].topics]
            least = min(candidates, key=lambda m: (len(out[m]), m))
            out[least].add(tp)
        self._balance(out, subscriptions, previous)
        # cooperative: a partition that changes hands is held back one generation
        for member, parts in out.items():
            moved = {tp for tp in parts if previous.get(tp, member) != member}
            parts -= moved
        return out

    @staticmethod
    def _previous_owners(
        subscriptions: Mapping[str, Subscription], every: set[TopicPartition]
    ) -> dict[TopicPartition, str]:
        """Who owns each partition now; a claim from an older generation loses to a newer."""
        owners: dict[TopicPartition, tuple[int, str]] = {}
        for member in sorted(subscriptions):
            sub = subscriptions[member]
            for tp in sub.owned:
                if tp not in every or tp.topic not in sub.topics:
                    continue
                current = owners.get(tp)
                if current is None or sub.generation_id > current[0]:
                    owners[tp] = (sub.generation_id, member)
        return {tp: member for tp, (_, member) in owners.items()}

    @staticmethod
    def _balance(
        out: Assignment,
        subscriptions: Mapping[str, Subscription],
        previous: Mapping[TopicPartition, str],
    ) -> None:
        """Move partitions from the fullest member to one with two fewer, while possible;
        partitions the giver did not own before go first (stickiness)."""
        while True:
            moved = False
            for giver in sorted(out, key=lambda m: (-len(out[m]), m)):
                for taker in sorted(out, key=lambda m: (len(out[m]), m)):
                    if len(out[giver]) - len(out[taker]) < 2:
                        continue
                    movable = sorted(
                        (tp for tp in out[giver] if tp.topic in subscriptions[taker].topics),
                        key=lambda tp: (previous.get(tp) != giver, tp),
                    )
                    if movable:
                        tp = movable[-1]
                        out[giver].discard(tp)
                        out[taker].add(tp)
                        moved = True
                        break
                if moved:
                    break
            if not moved:
                return


#: the assignors by their ``partition.assignment.strategy`` name
ASSIGNORS: dict[str, type[Assignor]] = {
    a.name: a for a in (RangeAssignor, RoundRobinAssignor, CooperativeStickyAssignor)
}
