"""The admin client's topic calls (Kafka's createTopics, deleteTopics, listTopics,
describeTopics, createPartitions): changes go to the controller; per-topic errors are raised
as their named classes carrying the broker's message, the first after every topic was
tried."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from replication.client.admin_base import AdminBase, _error
from replication.client.types import NewTopic, PartitionInfo, TopicDescription
from replication.errors import ReplogError, UnknownTopicOrPartitionError
from replication.protocol import (
    ApiKey,
    CreatableTopic,
    CreatableTopicConfig,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreatePartitionsTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)


class TopicCalls(AdminBase):
    """Create, delete, list and describe topics."""

    # --- topics ---------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        """Create one topic (-1: the broker's num.partitions / default.replication.factor)."""
        self.create_topics(
            [NewTopic(name, num_partitions, replication_factor, dict(configs or {}))],
            validate_only=validate_only,
        )

    def create_topics(
        self,
        new_topics: Iterable[NewTopic],
        *,
        timeout_ms: int | None = None,
        validate_only: bool = False,
    ) -> None:
        """Create topics; raises the first topic's error (by class) after trying them all."""
        topics = list(new_topics)
        if not topics:
            return
        request = CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=t.name,
                    num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    configs=[
                        CreatableTopicConfig(name=k, value=None if v is None else str(v))
                        for k, v in t.configs.items()
                    ],
                )
                for t in topics
            ],
            timeout_ms=self.config.request_timeout_ms if timeout_ms is None else timeout_ms,
            validate_only=validate_only,
        )

        response: CreateTopicsResponse = self._controller_call(
            ApiKey.CREATE_TOPICS,
            request,
            f"creating topics {', '.join(t.name for t in topics)}",
            codes=lambda r: [x.error_code for x in r.topics],
            version=1,
        )
        errors = [
            _error(r.error_code, r.error_message, f"cannot create topic {r.name!r}")
            for r in response.topics
            if r.error_code
        ]
        self._raise_first(errors)
        if not validate_only:
            self._cluster.add_interest(t.name for t in topics)
            self._cluster.request_update()

    def create_partitions(
        self,
        new_counts: Mapping[str, int],
        *,
        timeout_ms: int | None = None,
        validate_only: bool = False,
    ) -> None:
        """Grow each topic to its new partition count (Kafka's createPartitions; a count can
        only grow, and the controller places the new partitions' replicas). Raises the first
        topic's error (by class) after trying them all."""
        if not new_counts:
            return
        request = CreatePartitionsRequest(
            topics=[CreatePartitionsTopic(name=n, count=c) for n, c in new_counts.items()],
            timeout_ms=self.config.request_timeout_ms if timeout_ms is None else timeout_ms,
            validate_only=validate_only,
        )
        response: CreatePartitionsResponse = self._controller_call(
            ApiKey.CREATE_PARTITIONS,
            request,
            f"adding partitions to {', '.join(new_counts)}",
            codes=lambda r: [x.error_code for x in r.results],
        )
        self._raise_first(
            [
                _error(r.error_code, r.error_message, f"cannot add partitions to {r.name!r}")
                for r in response.results
                if r.error_code
            ]
        )
        if not validate_only:
            self._cluster.request_update()

    def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        """Delete topics; raises the first topic's error (by class) after trying them all."""
        topic_names = list(names)
        if not topic_names:
            return
        request = DeleteTopicsRequest(
            topic_names=topic_names,
            timeout_ms=self.config.request_timeout_ms if timeout_ms is None else timeout_ms,
        )

        response: DeleteTopicsResponse = self._controller_call(
            ApiKey.DELETE_TOPICS,
            request,
            f"deleting topics {', '.join(topic_names)}",
            codes=lambda r: [x.error_code for x in r.responses],
        )
        errors = [
            _error(r.error_code, r.error_message, f"cannot delete topic {r.name!r}")
            for r in response.responses
            if r.error_code
        ]
        self._raise_first(errors)
        self._cluster.request_update()

    def delete_topic(self, name: str) -> None:
        self.delete_topics([name])

    def list_topics(self, *, include_internal: bool = False) -> list[str]:
        """Names of the topics in the cluster, sorted."""
        response = self._metadata(None)
        return sorted(t.name for t in response.topics if include_internal or not t.is_internal)

    def describe_topics(self, names: Iterable[str]) -> list[TopicDescription]:
        """Partitions (leader, leader epoch, replicas, ISR) of each topic, in the order asked.

        UnknownTopicOrPartitionError (or the topic's own error) if a topic does not exist.
        """
        wanted = list(names)
        response = self._metadata(wanted)
        by_name = {t.name: t for t in response.topics}
        out: list[TopicDescription] = []
        errors: list[ReplogError] = []
        for name in wanted:
            topic = by_name.get(name)
            if topic is None:
                errors.append(UnknownTopicOrPartitionError(f"topic {name!r} does not exist"))
                continue
            if topic.error_code and not topic.partitions:
                errors.append(
                    _error(topic.error_code, None, f"cannot describe topic {name!r}")
                    if topic.error_code != UnknownTopicOrPartitionError.code
                    else UnknownTopicOrPartitionError(
                        f"topic {name!r} does not exist; list topics with `replog topics list`"
                    )
                )
                continue
            out.append(
                TopicDescription(
                    name=name,
                    partitions=tuple(
                        PartitionInfo(
                            partition=p.partition_index,
                            leader=p.leader_id,
                            leader_epoch=p.leader_epoch,
                            replicas=tuple(p.replica_nodes),
                            isr=tuple(p.isr_nodes),
                            offline_replicas=tuple(p.offline_replicas),
                        )
                        for p in sorted(topic.partitions, key=lambda p: p.partition_index)
                    ),
                    is_internal=topic.is_internal,
                )
            )
        self._raise_first(errors)
        return out

    def describe_topic(self, name: str) -> TopicDescription:
        return self.describe_topics([name])[0]
