"""The driver's questions to the cluster: partitions, offsets, replica logs, aborted transactions.

:class:`ClusterView` answers them with replog's client :class:`~replication.client.Admin` (it
retries and refreshes metadata itself):

- :meth:`~replication.client.Admin.describe_log_dirs`, asked of every broker holding a
  replica: each answers its storage root (``log.dir``) and, per replica, log start, LEO,
  durable end and HW. Executors read segment objects from the roots of replicas whose durable
  end covers a range.
- :meth:`~replication.client.Admin.aborted_transactions`: the leader's aborted transactions of
  ``[start, LSO)``. A direct read drops their records as Kafka's consumer does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

from datasource.options import CLIENT_SETTINGS, Assign, SourceOptions, Subscribe
from logstore.reader import AbortedTxnRange
from replication.client import (
    Admin,
    PartitionInfo,
    ReplicaLog,
    RetryPolicy,
    TopicDescription,
    TopicPartition,
    call_with_retries,
)
from replication.client import OffsetSpec as ListOffsetsSpec
from replication.errors import ReplogError, UnknownTopicOrPartitionError

__all__ = ["ClusterView", "ReplicaLog"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_CLIENT_ID: Final = "replog-spark-source"
#: How long the leader is asked for a range's aborted transactions (retries included).
_ABORTED_TIMEOUT_MS: Final = 30_000


class ClusterView:
    """Topics, offsets and replica logs, asked of the brokers by the driver.

    Clients are opened on first use and closed by :meth:`close`; the view is not picklable
    state (readers drop it when Spark pickles them).
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: Admin | None = None
        #: the partitions' leaders and ISRs, from the last :meth:`topic_partitions`
        self.partitions: dict[TopicPartition, PartitionInfo] = {}
        self._missing_warned: set[str] = set()

    def _config(self) -> dict[str, Any]:
        return {
            "client.id": _CLIENT_ID,
            "request.timeout.ms": 30_000,
            "default.api.timeout.ms": 60_000,
            **{k: v for k, v in self.options.consumer_settings if k in CLIENT_SETTINGS},
            **dict(self.options.client_security),
            "bootstrap.servers": self.options.bootstrap_servers,
        }

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self._config())
        return self._admin

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """``call``, retried fetchOffset.numRetries times, fetchOffset.retryIntervalMs apart,
        after retriable errors (the client's own retries come first), as Spark's Kafka source."""
        interval = self.options.fetch_offset_retry_interval_ms
        policy = RetryPolicy(
            timeout_ms=None,
            backoff_ms=interval,
            backoff_max_ms=interval,
            max_retries=self.options.fetch_offset_num_retries,
            jitter=0.0,
        )
        return call_with_retries(what, call, policy)

    # --- topics ---------------------------------------------------------------------------

    def topic_partitions(self) -> list[TopicPartition]:
        """The partitions the subscription covers now (topics that do not exist yet have none)."""
        sub = self.options.subscription
        existing = set(self._retrying("listing topics", self.admin.list_topics))
        if isinstance(sub, Assign | Subscribe):
            topics = [t for t in sub.topics if t in existing]
            for topic in sub.topics:
                if topic not in existing and topic not in self._missing_warned:
                    self._missing_warned.add(topic)
                    log.warning("topic %r does not exist (yet); reading it once it does", topic)
        else:
            topics = sorted(t for t in existing if sub.matches(t))
        if not topics:
            self.partitions = {}
            return []
        described = self._describe(topics)
        infos = {TopicPartition(d.name, p.partition): p for d in described for p in d.partitions}
        if isinstance(sub, Assign):
            infos = {tp: info for tp, info in infos.items() if tp in sub.partitions}
        self.partitions = infos
        return sorted(infos)

    def _describe(self, topics: list[str]) -> list[TopicDescription]:
        """The topics' partitions; a topic just created (or deleted) that the broker asked
        does not know is left out, and joins (or leaves) at a later call."""
        try:
            return self._retrying("describing topics", lambda: self.admin.describe_topics(topics))
        except UnknownTopicOrPartitionError:
            found: list[TopicDescription] = []
            for topic in topics:
                try:
                    found.extend(self.admin.describe_topics([topic]))
                except UnknownTopicOrPartitionError as err:
                    log.info("topic %r is not in the metadata (yet): %s", topic, err)
            return found

    # --- offsets --------------------------------------------------------------------------

    def list_offsets(
        self, specs: Mapping[TopicPartition, ListOffsetsSpec]
    ) -> dict[TopicPartition, int]:
        """ListOffsets: "earliest", "latest" (HW, or LSO with read_committed), or a time in ms
        (-1 where no record is that late)."""
        if not specs:
            return {}
        isolation = self.options.isolation_level
        asked: dict[TopicPartition | tuple[str, int], ListOffsetsSpec] = {}
        asked.update(specs.items())
        return self._retrying(
            "listing offsets", lambda: self.admin.list_offsets(asked, isolation_level=isolation)
        )

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.list_offsets(dict.fromkeys(tps, "earliest"))

    def latest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.list_offsets(dict.fromkeys(tps, "latest"))

    # --- replica logs ---------------------------------------------------------------------

    def replica_logs(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, list[ReplicaLog]]:
        """Each partition's replicas as their brokers describe them; brokers that do not
        answer (down, unreachable) are left out."""
        wanted = sorted(set(tps))
        if not wanted:
            return {}
        infos = dict(self.partitions)
        missing = sorted({tp.topic for tp in wanted if tp not in infos})
        if missing:  # who holds the replicas of partitions not seen yet
            try:
                described = self._describe(missing)
            except ReplogError as err:
                log.info("describing %s for their replicas failed: %s", missing, err)
                return {}
            for d in described:
                infos.update({TopicPartition(d.name, p.partition): p for p in d.partitions})
        brokers = sorted({r for tp in wanted if tp in infos for r in infos[tp].replicas})
        out: dict[TopicPartition, list[ReplicaLog]] = {tp: [] for tp in wanted}
        if not brokers:
            return out
        try:
            answers = self.admin.describe_log_dirs(wanted, brokers=brokers)
        except ReplogError as err:
            log.info("DescribeLogDirs failed: %s", err)
            return {}
        for broker_id, answer in sorted(answers.items()):
            if isinstance(answer, ReplogError):
                log.info("broker %d did not describe its log dirs: %s", broker_id, answer)
                continue
            for tp, replica in answer.items():
                if tp in out:
                    out[tp].append(replica)
        return out

    # --- aborted transactions -------------------------------------------------------------

    def commit_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` to the consumer group ``group_id`` (it has no members: commits
        from outside the group, as Kafka's admin tools make)."""
        self.admin.alter_consumer_group_offsets(group_id, offsets)

    def aborted_transactions(self, tp: TopicPartition, start: int) -> tuple[AbortedTxnRange, ...]:
        """The aborted transactions with records at or after ``start`` (below the LSO), as a
        read_committed Fetch at ``start`` reports them: (producer id, first offset)."""
        return self._retrying(
            f"asking the leader of {tp} for aborted transactions",
            lambda: self.admin.aborted_transactions(tp, start, timeout_ms=_ABORTED_TIMEOUT_MS),
        )
