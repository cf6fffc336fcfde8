"""The driver's questions to the cluster: partitions, offsets, replica logs, aborted transactions.

:class:`ClusterView` answers them with replog's client: the :class:`~replication.client.Admin`
for topics and offsets (it retries and refreshes metadata itself), and a
:class:`~replication.client.cluster.Cluster` for the two requests the client has no call for:

- DescribeLogDirs, sent to every broker holding a replica: each answers its storage root
  (``log.dir``) and, per replica, log start, LEO, durable end and HW. Executors read segment
  objects from the roots of replicas whose durable end covers a range.
- Fetch at read_committed with ``max_bytes=0``: the leader answers the aborted transactions of
  ``[fetch offset, LSO)`` and no records. A direct read drops their records as Kafka's
  consumer does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from datasource.options import Assign, SourceOptions, Subscribe
from logstore.reader import AbortedTransaction
from replication.client import Admin, PartitionInfo, TopicDescription, TopicPartition
from replication.client import OffsetSpec as ListOffsetsSpec
from replication.client.cluster import Cluster
from replication.client.config import AdminConfig, load
from replication.client.retry import RetryPolicy, call_with_retries
from replication.errors import (
    LeaderNotAvailableError,
    ReplogError,
    UnknownTopicOrPartitionError,
    for_code,
)
from replication.protocol import (
    READ_COMMITTED,
    ApiKey,
    DescribableLogDirTopic,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    FetchRequest,
    FetchRequestPartition,
    FetchRequestTopic,
    FetchResponse,
)

__all__ = ["ClusterView", "ReplicaLog"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_CLIENT_ID: Final = "replog-spark-source"
_FINAL_EPOCH: Final = -1  # a fetch without a session (KIP-227)


@dataclass(frozen=True)
class ReplicaLog:
    """One replica's log as its broker describes it (DescribeLogDirs)."""

    broker_id: int
    log_dir: str
    log_start_offset: int
    log_end_offset: int
    durable_end_offset: int
    high_watermark: int
    is_leader: bool


class ClusterView:
    """Topics, offsets and replica logs, asked of the brokers by the driver.

    Clients are opened on first use and closed by :meth:`close`; the view is not picklable
    state (readers drop it when Spark pickles them).
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: Admin | None = None
        self._cluster: Cluster | None = None
        #: the partitions' leaders and ISRs, from the last :meth:`topic_partitions`
        self.partitions: dict[TopicPartition, PartitionInfo] = {}
        self._missing_warned: set[str] = set()

    def _config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.options.bootstrap_servers,
            "client.id": _CLIENT_ID,
            "request.timeout.ms": 30_000,
            "default.api.timeout.ms": 60_000,
        }

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self._config())
        return self._admin

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(load(AdminConfig, self._config(), {}))
        return self._cluster

    def close(self) -> None:
        admin, self._admin = self._admin, None
        cluster, self._cluster = self._cluster, None
        if admin is not None:
            admin.close()
        if cluster is not None:
            cluster.close()

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
        cluster = self.cluster
        try:
            cluster.refresh({tp.topic for tp in wanted})
        except ReplogError as err:
            log.info("metadata refresh for DescribeLogDirs failed: %s", err)
            return {}
        by_topic: dict[str, list[int]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = DescribeLogDirsRequest(
            topics=[DescribableLogDirTopic(topic=t, partitions=ps) for t, ps in by_topic.items()]
        )
        replicas = {r for tp in wanted for r in self._replicas_of(tp)}
        brokers = sorted(replicas & set(cluster.snapshot.brokers))

        def ask(broker_id: int) -> DescribeLogDirsResponse | None:
            try:
                response: DescribeLogDirsResponse = cluster.connection(broker_id).send(
                    ApiKey.DESCRIBE_LOG_DIRS, 0, request
                )
            except ReplogError as err:
                log.info("broker %d did not describe its log dirs: %s", broker_id, err)
                return None
            return response

        out: dict[TopicPartition, list[ReplicaLog]] = {tp: [] for tp in wanted}
        if not brokers:
            return out
        with ThreadPoolExecutor(max_workers=len(brokers)) as pool:
            answers = list(zip(brokers, pool.map(ask, brokers), strict=True))
        for broker_id, response in answers:
            if response is None or response.error_code:
                continue
            for result in response.results:
                if result.error_code:
                    continue
                for topic in result.topics:
                    for p in topic.partitions:
                        tp = TopicPartition(topic.name, p.partition_index)
                        if tp not in out:
                            continue
                        out[tp].append(
                            ReplicaLog(
                                broker_id=broker_id,
                                log_dir=result.log_dir,
                                log_start_offset=int(p.log_start_offset),
                                log_end_offset=int(p.log_end_offset),
                                durable_end_offset=int(p.durable_end_offset),
                                high_watermark=int(p.high_watermark),
                                is_leader=bool(p.is_leader),
                            )
                        )
        return out

    def _replicas_of(self, tp: TopicPartition) -> tuple[int, ...]:
        info = self.partitions.get(tp)
        if info is not None:
            return info.replicas
        meta = self.cluster.snapshot.topics.get(tp.topic)
        part = meta.partitions.get(tp.partition) if meta is not None else None
        return part.replicas if part is not None else ()

    # --- aborted transactions -------------------------------------------------------------

    def aborted_transactions(
        self, tp: TopicPartition, start: int
    ) -> tuple[AbortedTransaction, ...]:
        """The aborted transactions with records at or after ``start`` (below the LSO), as a
        read_committed Fetch at ``start`` reports them: (producer id, first offset)."""
        request = FetchRequest(
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=0,  # no records: only the partition's state and aborted transactions
            isolation_level=READ_COMMITTED,
            session_id=0,
            session_epoch=_FINAL_EPOCH,
            topics=[
                FetchRequestTopic(
                    topic=tp.topic,
                    partitions=[
                        FetchRequestPartition(
                            partition=tp.partition, fetch_offset=start, partition_max_bytes=0
                        )
                    ],
                )
            ],
        )
        return self._retrying(
            f"asking the leader of {tp} for aborted transactions",
            lambda: self._fetch_aborted(tp, request),
        )

    def _fetch_aborted(
        self, tp: TopicPartition, request: FetchRequest
    ) -> tuple[AbortedTransaction, ...]:
        cluster = self.cluster
        deadline = time.monotonic() + 30
        attempt = 0
        while True:
            leader = cluster.snapshot.leader(tp.topic, tp.partition)
            error: ReplogError
            if leader is None:
                error = LeaderNotAvailableError(f"{tp} has no known leader")
            else:
                try:
                    response: FetchResponse = cluster.connection(leader).send(
                        ApiKey.FETCH, 0, request
                    )
                    result = self._aborted_from(tp, response)
                    if isinstance(result, tuple):
                        return result
                    error = result
                except ReplogError as err:
                    if not err.retriable:
                        raise
                    error = err
            if not error.retriable or time.monotonic() >= deadline:
                raise error
            attempt += 1
            log.info("aborted transactions of %s: %s (retrying)", tp, error)
            try:
                cluster.refresh({tp.topic})
            except ReplogError as err:
                log.debug("metadata refresh failed: %s", err)
            time.sleep(min(0.05 * attempt, 1.0))

    @staticmethod
    def _aborted_from(
        tp: TopicPartition, response: FetchResponse
    ) -> tuple[AbortedTransaction, ...] | ReplogError:
        if response.error_code:
            cls = for_code(response.error_code) or ReplogError
            return cls(f"fetch of {tp} failed: {cls()}")
        for t in response.responses:
            for p in t.partitions:
                if t.topic != tp.topic or p.partition_index != tp.partition:
                    continue
                if p.error_code:
                    cls = for_code(p.error_code) or ReplogError
                    return cls(f"fetch of {tp} failed: {cls()}")
                return tuple(
                    (int(a.producer_id), int(a.first_offset))
                    for a in (p.aborted_transactions or ())
                )
        return LeaderNotAvailableError(f"the leader did not answer for {tp}")
