"""Partition reassignments as the admin client reports them, and the plans the CLI proposes:
Kafka's ``kafka-reassign-partitions --generate`` (spread topics over a broker list) and a
broker decommission (every replica of one broker moved onto the other live brokers).

    >>> from replication.client.types import PartitionInfo, TopicDescription
    >>> t = TopicDescription("t", (PartitionInfo(0, 0, 0, (0, 1), (0, 1)),
    ...                            PartitionInfo(1, 1, 0, (1, 2), (1, 2))))
    >>> plan_decommission(1, [t], [0, 1, 2])
    {TopicPartition(topic='t', partition=0): [0, 2], TopicPartition(topic='t', partition=1): [0, 2]}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from replication.client.types import TopicDescription, TopicPartition
from replication.errors import InvalidReplicaAssignmentError

__all__ = ["PartitionReassignment", "generate_assignment", "plan_decommission"]


@dataclass(frozen=True)
class PartitionReassignment:
    """A reassignment in progress: every replica during the move, the ones joining (catching
    up as followers) and the ones leaving once every target replica is in the ISR."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing_replicas)


def plan_decommission(
    broker_id: int, topics: Sequence[TopicDescription], live: Sequence[int]
) -> dict[TopicPartition, list[int]]:
    """New replicas for every partition with a replica on ``broker_id``: that replica replaced
    (in its place, so a preferred leader's replacement is preferred) by the live broker not
    already a replica that holds the fewest replicas so far (ties: the lowest id). The
    replication factor stays."""
    others = sorted(b for b in set(live) if b != broker_id)
    load: Counter[int] = Counter(dict.fromkeys(others, 0))
    for topic in topics:
        for part in topic.partitions:
            load.update(r for r in part.replicas if r in load)
    plan: dict[TopicPartition, list[int]] = {}
    for topic in sorted(topics, key=lambda t: t.name):
        for part in topic.partitions:
            if broker_id not in part.replicas:
                continue
            candidates = [b for b in others if b not in part.replicas]
            if not candidates:
                raise InvalidReplicaAssignmentError(
                    f"cannot move {topic.name}-{part.partition} off broker {broker_id}: its "
                    f"replicas {list(part.replicas)} already use every other live broker "
                    f"({others}); add a broker or lower the topic's replication factor"
                )
            chosen = min(candidates, key=lambda b: (load[b], b))
            load[chosen] += 1
            plan[TopicPartition(topic.name, part.partition)] = [
                chosen if r == broker_id else r for r in part.replicas
            ]
    return plan


def generate_assignment(
    topics: Sequence[TopicDescription], brokers: Sequence[int]
) -> dict[TopicPartition, list[int]]:
    """Kafka's ``--generate``: every partition of ``topics`` spread over ``brokers``, keeping
    each partition's replication factor: leaders round-robin, followers after them."""
    ids = sorted(set(brokers))
    if not ids:
        raise InvalidReplicaAssignmentError("--broker-list names no broker")
    plan: dict[TopicPartition, list[int]] = {}
    for n, topic in enumerate(sorted(topics, key=lambda t: t.name)):
        for part in topic.partitions:
            rf = len(part.replicas)
            if rf > len(ids):
                raise InvalidReplicaAssignmentError(
                    f"{topic.name}-{part.partition} has {rf} replicas but --broker-list names "
                    f"only {len(ids)} broker(s) ({ids})"
                )
            first = (n + part.partition) % len(ids)
            plan[TopicPartition(topic.name, part.partition)] = [
                ids[(first + j) % len(ids)] for j in range(rf)
            ]
    return plan
