"""Each replica's log, asked of the broker that holds it (DescribeLogDirs), beside the metadata.

Metadata tells who leads a partition, its replicas and ISR; only the broker holding a replica
knows that replica's log start, log end offset (LEO), durable end and high watermark. So
:func:`describe_topic_status` asks every broker at once (:meth:`Admin.describe_log_dirs`: one
DescribeLogDirs each, in parallel) and joins the answers to the metadata::

    with Admin(bootstrap_servers="127.0.0.1:9092") as admin:
        status = describe_topic_status(admin, "events")
        for p in status.partitions:
            print(p.partition, p.high_watermark, [(r.broker, r.lag) for r in p.replica_states])

A broker that cannot be reached (or is not in the metadata: down or fenced) does not fail the
call: its replicas carry an ``error`` and no offsets, and the others still show. The lag of a
replica is its leader's LEO minus its own, as each broker reported it a moment apart (a
follower that is fetching can show a small lag that is already gone).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from replication.client.admin import Admin
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.types import ReplicaLog, TopicDescription, TopicPartition
from replication.errors import ReplogError, UnknownTopicOrPartitionError

__all__ = [
    "PartitionStatus",
    "ReplicaStatus",
    "TopicStatus",
    "describe_topic_status",
    "describe_topic_waiting",
]

#: How long a just-created topic may stay unknown to the broker asked: brokers learn new
#: metadata with their next heartbeat (broker.heartbeat.interval.ms, 500 by default).
TOPIC_PROPAGATION_MS = 1_000


@dataclass(frozen=True)
class ReplicaStatus:
    """A replica of a partition: its log (None if its broker did not answer) and its lag."""

    broker: int
    is_leader: bool
    in_isr: bool
    log: ReplicaLog | None
    #: The leader's LEO minus this replica's LEO; None when either is unknown.
    lag: int | None
    #: Why ``log`` is None (broker unreachable, not in the metadata, no such replica).
    error: str | None = None


@dataclass(frozen=True)
class PartitionStatus:
    """A partition: leader, epoch, replicas and ISR (metadata), HW and LEOs (its brokers)."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]
    #: The leader's high watermark (-1 if the leader did not answer).
    high_watermark: int
    #: The leader's log start and end offsets (-1 if the leader did not answer).
    log_start_offset: int
    log_end_offset: int
    replica_states: tuple[ReplicaStatus, ...]

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)


@dataclass(frozen=True)
class TopicStatus:
    name: str
    is_internal: bool
    partitions: tuple[PartitionStatus, ...]

    @property
    def replication_factor(self) -> int:
        return max((len(p.replicas) for p in self.partitions), default=0)

    def to_json(self) -> dict[str, Any]:
        """The machine-readable form (`replog topics describe --json`): plain JSON types."""
        return {
            "topic": self.name,
            "is_internal": self.is_internal,
            "partition_count": len(self.partitions),
            "replication_factor": self.replication_factor,
            "partitions": [
                {
                    "partition": p.partition,
                    "leader": p.leader,
                    "leader_epoch": p.leader_epoch,
                    "replicas": list(p.replicas),
                    "isr": list(p.isr),
                    "offline_replicas": list(p.offline_replicas),
                    "under_replicated": p.under_replicated,
                    "high_watermark": p.high_watermark,
                    "log_start_offset": p.log_start_offset,
                    "log_end_offset": p.log_end_offset,
                    "replica_states": [_replica_json(r) for r in p.replica_states],
                }
                for p in self.partitions
            ],
        }


def _replica_json(r: ReplicaStatus) -> dict[str, Any]:
    log_ = r.log
    return {
        "broker": r.broker,
        "is_leader": r.is_leader,
        "in_isr": r.in_isr,
        "log_start_offset": None if log_ is None else log_.log_start_offset,
        "log_end_offset": None if log_ is None else log_.log_end_offset,
        "durable_end_offset": None if log_ is None else log_.durable_end_offset,
        "high_watermark": None if log_ is None else log_.high_watermark,
        "leader_epoch": None if log_ is None else log_.leader_epoch,
        "size_bytes": None if log_ is None else log_.size_bytes,
        "lag": r.lag,
        "error": r.error,
    }


def describe_topic_waiting(
    admin: Admin, name: str, wait_ms: int = TOPIC_PROPAGATION_MS
) -> TopicDescription:
    """:meth:`Admin.describe_topic`, asking again for ``wait_ms`` while the topic is unknown.

    A topic created a moment ago (by this process or another) is unknown to a broker until
    the metadata reaches it; a Kafka client waits for it the same way (max.block.ms). After
    ``wait_ms`` the UnknownTopicOrPartitionError is raised.
    """
    return call_with_retries(
        f"describing topic {name!r}",
        lambda: admin.describe_topic(name),
        RetryPolicy(timeout_ms=wait_ms, backoff_ms=100, backoff_max_ms=100, jitter=0.0),
        retriable=lambda err: isinstance(err, UnknownTopicOrPartitionError),
        log_level=logging.DEBUG,
    )


def describe_topic_status(admin: Admin, name: str, *, timeout_ms: int | None = None) -> TopicStatus:
    """Metadata of ``name`` joined with every replica's log (see the module docstring).

    Raises UnknownTopicOrPartitionError if the topic does not exist, BrokerUnreachableError if
    no broker answers the Metadata request; unreachable replicas only carry an error.
    """
    topic = describe_topic_waiting(admin, name)
    cluster = admin.describe_cluster()
    live = {b.node_id for b in cluster.brokers}
    holders = sorted({b for p in topic.partitions for b in p.replicas})
    answers = admin.describe_log_dirs(
        [TopicPartition(name, p.partition) for p in topic.partitions],
        brokers=[b for b in holders if b in live],
        timeout_ms=timeout_ms,
    )
    partitions: list[PartitionStatus] = []
    for p in topic.partitions:
        tp = TopicPartition(name, p.partition)
        logs: dict[int, ReplicaLog] = {}
        errors: dict[int, str] = {}
        for b in p.replicas:
            answer = answers.get(b)
            if answer is None:
                errors[b] = f"broker {b} is not in the cluster metadata (down or fenced)"
            elif isinstance(answer, ReplogError):
                errors[b] = str(answer)
            elif tp in answer:
                logs[b] = answer[tp]
            else:
                errors[b] = f"broker {b} holds no replica of {tp} (yet)"
        leader_log = logs.get(p.leader)
        leader_leo = -1 if leader_log is None else leader_log.log_end_offset
        states = tuple(
            ReplicaStatus(
                broker=b,
                is_leader=b == p.leader,
                in_isr=b in p.isr,
                log=logs.get(b),
                lag=None
                if leader_log is None or b not in logs
                else leader_leo - logs[b].log_end_offset,
                error=errors.get(b),
            )
            for b in p.replicas
        )
        partitions.append(
            PartitionStatus(
                partition=p.partition,
                leader=p.leader,
                leader_epoch=p.leader_epoch,
                replicas=p.replicas,
                isr=p.isr,
                offline_replicas=p.offline_replicas,
                high_watermark=-1 if leader_log is None else leader_log.high_watermark,
                log_start_offset=-1 if leader_log is None else leader_log.log_start_offset,
                log_end_offset=leader_leo,
                replica_states=states,
            )
        )
    return TopicStatus(name=name, is_internal=topic.is_internal, partitions=tuple(partitions))
