"""The admin client, :class:`Admin`: one object with every admin call, composed of the
families Kafka's AdminClient has, one module each over the shared request plumbing of
:mod:`replication.client.admin_base`:

- topics (:mod:`~replication.client.admin_topics`): create, delete, list, describe;
- configs (:mod:`~replication.client.admin_configs`): describe, alter, incremental alter;
- partitions and replicas (:mod:`~replication.client.admin_partitions`): reassignments,
  leader elections, ListOffsets, DeleteRecords, replica logs and aborted transactions;
- the cluster (:mod:`~replication.client.admin_cluster`): describe it, unregister a broker;
- security (:mod:`~replication.client.admin_security`): ACLs and SCRAM credentials;
- transactions and Spark sink commits (:mod:`~replication.client.admin_transactions`);
- consumer groups, here, each asked at its coordinator by
  :class:`~replication.client.group_admin.GroupAdmin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from replication.client.admin_cluster import ClusterCalls
from replication.client.admin_configs import ConfigCalls, ConfigResourceType
from replication.client.admin_partitions import LogObjects, OffsetSpec, PartitionCalls
from replication.client.admin_security import SecurityCalls, UserScramCredentialUpsertion
from replication.client.admin_topics import TopicCalls
from replication.client.admin_transactions import TRANSACTION_STATES, TransactionCalls
from replication.client.types import ConsumerGroupDescription, TopicPartition
from replication.errors import ReplogError

__all__ = [
    "TRANSACTION_STATES",
    "Admin",
    "ConfigResourceType",
    "LogObjects",
    "OffsetSpec",
    "UserScramCredentialUpsertion",
]


class Admin(
    TopicCalls,
    ConfigCalls,
    PartitionCalls,
    ClusterCalls,
    SecurityCalls,
    TransactionCalls,
):
    """Manage topics and inspect the cluster.

    Parameters
    ----------
    config
        Kafka-named settings (see :class:`~replication.client.config.AdminConfig`); keyword
        arguments with underscores for dots are merged over it.

    Examples
    --------
    >>> with Admin(bootstrap_servers="127.0.0.1:9092") as admin:  # doctest: +SKIP
    ...     admin.create_topic("events", num_partitions=3, replication_factor=1)
    ...     admin.list_topics()
    ['events']
    """

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Admin({self.config.bootstrap_servers!r})"

    # --- consumer groups --------------------------------------------------------------------

    def list_consumer_groups(self) -> list[tuple[str, str]]:
        """(group id, protocol type) of every group the brokers coordinate, sorted."""
        self._check_open()
        return self._groups.list()

    def describe_consumer_group(
        self, group_id: str, *, timeout_ms: int | None = None
    ) -> ConsumerGroupDescription:
        """A group's state, assignor, coordinator and members with their partitions."""
        self._check_open()
        return self._groups.describe(group_id, timeout_ms)

    def list_consumer_group_offsets(
        self, group_id: str, *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offset (the next record to read) of each partition."""
        self._check_open()
        return self._groups.offsets(group_id, timeout_ms)

    def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int], *, timeout_ms: int | None = None
    ) -> None:
        """Set the group's committed offsets (GroupNotEmptyError while it has members)."""
        self._check_open()
        self._groups.alter_offsets(group_id, offsets, timeout_ms)

    def delete_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition | tuple[str, int]],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, ReplogError | None]:
        """Delete the group's committed offsets of some partitions, as Kafka's
        deleteConsumerGroupOffsets: per partition None (deleted) or its error, e.g.
        GroupSubscribedToTopicError while members subscribe to the topic. The group must be
        empty or not subscribed to the topics; GroupIdNotFoundError, GroupNotEmptyError (a
        group of another protocol with members) and authorization errors of the group raise.

        Examples
        --------
        >>> admin.delete_consumer_group_offsets("billing", [("events", 0)])  # doctest: +SKIP
        {TopicPartition(topic='events', partition=0): None}
        """
        self._check_open()
        return self._groups.delete_offsets(
            group_id, [TopicPartition(*tp) for tp in partitions], timeout_ms
        )

    def delete_consumer_groups(
        self, group_ids: Iterable[str], *, timeout_ms: int | None = None
    ) -> None:
        """Delete empty groups and their offsets (GroupNotEmptyError, GroupIdNotFoundError)."""
        self._check_open()
        self._groups.delete(group_ids, timeout_ms)
