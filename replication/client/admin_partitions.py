"""The admin client's partition and replica calls: reassignments and leader elections
(KIP-455, KIP-460) through the controller, offsets (ListOffsets) and DeleteRecords at each
partition's leader, and each replica's log (DescribeLogDirs, DescribeLogObjects) and a
partition's aborted transactions asked of the brokers holding them: what a reader of segment
objects (the Spark source's executors) needs to read straight from storage."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Literal

from logstore.reader import AbortedTxnRange, ObjectExtent
from replication.client.admin_base import _error
from replication.client.admin_cluster import ClusterCalls
from replication.client.reassignments import PartitionReassignment
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.types import ReplicaLog, TopicPartition
from replication.errors import (
    LeaderNotAvailableError,
    NetworkError,
    OffsetOutOfRangeError,
    ReplogError,
    UnknownTopicOrPartitionError,
    for_code,
)
from replication.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    PREFERRED_ELECTION,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    UNCLEAN_ELECTION,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ApiKey,
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopic,
    DescribableLogDirTopic,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeLogObjectsPartition,
    DescribeLogObjectsRequest,
    DescribeLogObjectsResponse,
    DescribeLogObjectsTopic,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ElectLeadersTopicPartitions,
    FetchRequest,
    FetchRequestPartition,
    FetchRequestTopic,
    FetchResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    ListPartitionReassignmentsTopics,
    ReassignablePartition,
    ReassignableTopic,
)

log = logging.getLogger(__name__)

#: What :meth:`Admin.list_offsets` looks up: the log start, the end, or a timestamp (ms).
OffsetSpec = Literal["earliest", "latest"] | int
_DESCRIBE_LOG_DIRS_VERSION: Final = 0
_DESCRIBE_LOG_OBJECTS_VERSION: Final = 0


@dataclass(frozen=True)
class LogObjects:
    """Where one replica holds an offset range on its storage (DescribeLogObjects)."""

    broker_id: int
    #: the broker's storage root (``log.dir``): the extents' paths are relative to it
    log_dir: str
    high_watermark: int
    #: the end of what is in the replica's storage; the extents stop there
    durable_end_offset: int
    log_start_offset: int
    #: the extents holding the range, in offset order
    extents: tuple[ObjectExtent, ...]


#: A Fetch without a session (KIP-227's FINAL_EPOCH).
_NO_SESSION_EPOCH: Final = -1


#: What to do about a DeleteRecords error (its response carries no message).
_DELETE_RECORDS_HINTS: Final = {
    OffsetOutOfRangeError.code: "the offset must be between the partition's log start offset and "
    "its high watermark (or -1 for the high watermark); see them with `replog topics describe`",
}


class PartitionCalls(ClusterCalls):
    """Move, elect, look up, trim and describe partitions and their replicas."""

    # --- reassignments, leader elections, brokers (KIP-455, KIP-460) ----------------------

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition | tuple[str, int], Sequence[int] | None],
        *,
        throttle: int = 0,
    ) -> None:
        """Move partitions to new replicas (a list of broker ids, the first the preferred
        leader) or cancel their move in progress (None), as Kafka's
        alterPartitionReassignments. ``throttle`` (bytes/s, 0: none) limits how fast the new
        replicas catch up. Returns once the controller started the moves; they complete in the
        background (see :meth:`list_partition_reassignments`). Raises the first partition's
        error (by class) after trying them all."""
        by_topic: dict[str, list[ReassignablePartition]] = {}
        for key, replicas in reassignments.items():
            tp = TopicPartition(*key)
            by_topic.setdefault(tp.topic, []).append(
                ReassignablePartition(
                    partition_index=tp.partition,
                    replicas=None if replicas is None else [int(r) for r in replicas],
                )
            )
        request = AlterPartitionReassignmentsRequest(
            timeout_ms=self.config.request_timeout_ms,
            topics=[ReassignableTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
            throttled_rate=throttle,
        )

        response: AlterPartitionReassignmentsResponse = self._controller_call(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            request,
            "reassigning partitions",
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot reassign")
        self._raise_first(
            [
                _error(
                    r.error_code, r.error_message, f"cannot reassign {t.name}-{r.partition_index}"
                )
                for t in response.responses
                for r in t.partitions
                if r.error_code
            ]
        )
        self._cluster.request_update()

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments in progress (of ``partitions`` only, if given)."""
        topics: list[ListPartitionReassignmentsTopics] | None = None
        if partitions is not None:
            wanted: dict[str, list[int]] = {}
            for key in partitions:
                tp = TopicPartition(*key)
                wanted.setdefault(tp.topic, []).append(tp.partition)
            topics = [
                ListPartitionReassignmentsTopics(name=t, partition_indexes=ps)
                for t, ps in wanted.items()
            ]
        request = ListPartitionReassignmentsRequest(
            timeout_ms=self.config.request_timeout_ms, topics=topics
        )

        response: ListPartitionReassignmentsResponse = self._controller_call(
            ApiKey.LIST_PARTITION_REASSIGNMENTS,
            request,
            "listing partition reassignments",
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot list reassignments")
        return {
            TopicPartition(t.name, p.partition_index): PartitionReassignment(
                tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas)
            )
            for t in response.topics
            for p in t.partitions
        }

    def elect_leaders(
        self,
        election_type: Literal["preferred", "unclean"] = "preferred",
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
    ) -> dict[TopicPartition, ReplogError | None]:
        """Kafka's electLeaders: ``preferred`` moves each partition's leadership to its first
        replica (if live and in the ISR); ``unclean`` elects a leader for partitions without one,
        from outside the ISR if it must (may lose records). ``partitions`` None: every
        partition, and only those elected or failing are in the answer. The answer maps each
        partition to None (elected) or its error (ElectionNotNeededError,
        PreferredLeaderNotAvailableError, ...)."""
        if election_type not in ("preferred", "unclean"):
            raise ValueError(f"election type {election_type!r}: use 'preferred' or 'unclean'")
        tps: list[ElectLeadersTopicPartitions] | None = None
        if partitions is not None:
            wanted: dict[str, list[int]] = {}
            for key in partitions:
                tp = TopicPartition(*key)
                wanted.setdefault(tp.topic, []).append(tp.partition)
            tps = [ElectLeadersTopicPartitions(topic=t, partitions=ps) for t, ps in wanted.items()]
        request = ElectLeadersRequest(
            election_type=PREFERRED_ELECTION if election_type == "preferred" else UNCLEAN_ELECTION,
            topic_partitions=tps,
            timeout_ms=self.config.request_timeout_ms,
        )

        response: ElectLeadersResponse = self._controller_call(
            ApiKey.ELECT_LEADERS,
            request,
            "electing leaders",
        )
        if response.error_code:
            raise _error(response.error_code, None, "cannot elect leaders")
        self._cluster.request_update()
        return {
            TopicPartition(t.topic, r.partition_id): (
                _error(r.error_code, r.error_message, f"{t.topic}-{r.partition_id}")
                if r.error_code
                else None
            )
            for t in response.replica_election_results
            for r in t.partition_result
        }

    # --- offsets ----------------------------------------------------------------------------

    def list_offsets(
        self,
        specs: Mapping[TopicPartition | tuple[str, int], OffsetSpec],
        *,
        isolation_level: str = "read_uncommitted",
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Offsets per partition: ``"earliest"`` (log start), ``"latest"`` (high watermark, or
        LSO with read_committed) or a timestamp in ms (first offset with a timestamp at least
        that; -1 if there is none)."""
        timestamps: dict[TopicPartition, int] = {}
        for tp, spec in specs.items():
            key = TopicPartition(*tp)
            if spec == "earliest":
                timestamps[key] = EARLIEST_TIMESTAMP
            elif spec == "latest":
                timestamps[key] = LATEST_TIMESTAMP
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamps[key] = spec
            else:
                raise ValueError(
                    f"offset spec for {key} must be 'earliest', 'latest' or a timestamp in ms "
                    f">= 0, got {spec!r}"
                )
        self._check_open()
        isolation = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}.get(
            isolation_level
        )
        if isolation is None:
            raise ValueError(
                f"isolation_level={isolation_level!r}: expected read_uncommitted or read_committed"
            )
        found = self._offsets.list(
            timestamps,
            isolation,
            self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms,
        )
        return {tp: offset for tp, (offset, _) in found.items()}

    # --- records ------------------------------------------------------------------------------

    def delete_records(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Delete each partition's records before an offset (-1: its high watermark), as
        Kafka's deleteRecords: the log start offset moves there and the records become
        unreadable. Returns each partition's new log start offset (its low watermark).

        Asked of each partition's leader; leadership changes are retried until
        ``timeout_ms`` (default.api.timeout.ms). An offset outside [log start, high watermark]
        raises OffsetOutOfRangeError.

        Examples
        --------
        >>> admin.delete_records({("events", 0): 100})  # doctest: +SKIP
        {TopicPartition(topic='events', partition=0): 100}
        """
        wanted = {TopicPartition(*tp): int(offset) for tp, offset in offsets.items()}
        if not wanted:
            return {}
        self._check_open()
        cluster = self._cluster
        cluster.add_interest({tp.topic for tp in wanted})
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        done: dict[TopicPartition, int] = {}
        failed: dict[TopicPartition, ReplogError] = {}

        def attempt() -> None:
            unknown: set[str] = set()
            if not cluster.bootstrapped or any(
                cluster.snapshot.leader(*tp) is None for tp in wanted
            ):
                metadata = cluster.refresh(sorted({tp.topic for tp in wanted}))
                unknown = {
                    t.name
                    for t in metadata.topics
                    if t.error_code == UnknownTopicOrPartitionError.code
                }
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in wanted:
                if tp in done or tp in failed:
                    continue
                leader = cluster.snapshot.leader(*tp)
                if leader is None:
                    if tp.topic in unknown:
                        failed[tp] = UnknownTopicOrPartitionError(
                            f"cannot delete records of {tp}: topic {tp.topic!r} does not exist"
                        )
                        continue
                    raise LeaderNotAvailableError(f"{tp} has no leader right now")
                by_leader.setdefault(leader, []).append(tp)
            retry: ReplogError | None = None
            for leader, tps in sorted(by_leader.items()):
                topics: dict[str, list[DeleteRecordsPartition]] = {}
                for tp in tps:
                    topics.setdefault(tp.topic, []).append(
                        DeleteRecordsPartition(partition_index=tp.partition, offset=wanted[tp])
                    )
                request = DeleteRecordsRequest(
                    topics=[DeleteRecordsTopic(name=t, partitions=ps) for t, ps in topics.items()],
                    timeout_ms=timeout,
                )
                conn = cluster.connection(leader)
                response: DeleteRecordsResponse = conn.send(
                    ApiKey.DELETE_RECORDS,
                    conn.max_version(ApiKey.DELETE_RECORDS, 0),
                    request,
                    timeout_ms=timeout,
                )
                for topic in response.topics:
                    for part in topic.partitions:
                        tp = TopicPartition(topic.name, part.partition_index)
                        if not part.error_code:
                            done[tp] = part.low_watermark
                            continue
                        err = _error(
                            part.error_code,
                            _DELETE_RECORDS_HINTS.get(part.error_code),
                            f"cannot delete records of {tp} before offset {wanted[tp]}",
                        )
                        if err.retriable:
                            retry = err
                        else:
                            failed[tp] = err
            if retry is not None:
                raise retry

        call_with_retries(
            "deleting records",
            attempt,
            RetryPolicy.of(
                self.config,
                self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms,
                "default.api.timeout.ms",
            ),
            retriable=cluster.retriable,
            on_retry=lambda err, attempt: cluster.request_update(),
        )
        self._raise_first(list(failed.values()))
        return done

    # --- replica logs and aborted transactions ------------------------------------------------

    def describe_log_dirs(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        brokers: Iterable[int] | None = None,
        timeout_ms: int | None = None,
    ) -> dict[int, dict[TopicPartition, ReplicaLog] | ReplogError]:
        """Ask brokers (default: every broker in the metadata) for the logs of their replicas
        (Kafka's describeLogDirs): per broker id, its replicas' :class:`ReplicaLog` (storage
        root, log start, LEO, durable end, HW) or the error that kept it from answering.

        Only a replica's own broker knows its log's offsets, so each broker is asked (in
        parallel). ``partitions`` limits the answer to those partitions (None: every replica a
        broker holds). A broker that is down does not fail the call: its entry is its error
        (BrokerUnreachableError; BrokerNotAvailableError if it is not in the metadata).

        Examples
        --------
        >>> logs = admin.describe_log_dirs([("events", 0)])  # doctest: +SKIP
        >>> logs[1][TopicPartition("events", 0)].durable_end_offset  # doctest: +SKIP
        42
        """
        self._check_open()
        cluster = self._cluster
        if brokers is None:
            ids = sorted(b.node_id for b in self.describe_cluster().brokers)
        else:
            ids = sorted(set(brokers))
            if not cluster.bootstrapped or not set(ids) <= set(cluster.snapshot.brokers):
                self.describe_cluster()  # a broker may have (re)joined since the last refresh
        by_topic: dict[str, set[int]] = {}
        for topic, index in partitions or ():
            by_topic.setdefault(topic, set()).add(int(index))
        request = DescribeLogDirsRequest(
            topics=None
            if partitions is None
            else [
                DescribableLogDirTopic(topic=t, partitions=sorted(ps))
                for t, ps in sorted(by_topic.items())
            ]
        )
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms

        def ask(broker: int) -> dict[TopicPartition, ReplicaLog] | ReplogError:
            try:
                conn = cluster.connection(broker)
                version = conn.max_version(ApiKey.DESCRIBE_LOG_DIRS, _DESCRIBE_LOG_DIRS_VERSION)
                response: DescribeLogDirsResponse = conn.send(
                    ApiKey.DESCRIBE_LOG_DIRS, version, request, timeout_ms=timeout
                )
            except ReplogError as err:
                log.debug("DescribeLogDirs to broker %d failed: %s", broker, err)
                return err
            return _replica_logs(broker, response)

        if not ids:
            return {}
        with ThreadPoolExecutor(
            max_workers=len(ids), thread_name_prefix="describe-log-dirs"
        ) as pool:
            return dict(zip(ids, pool.map(ask, ids), strict=True))

    def describe_log_objects(
        self,
        broker: int,
        ranges: Mapping[TopicPartition | tuple[str, int], tuple[int, int]],
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, LogObjects | ReplogError]:
        """Ask broker ``broker`` where its replicas hold offset ranges on its storage
        (replog's DescribeLogObjects): per partition, the :class:`LogObjects` (storage root,
        HW, durable end, log start and the extents covering ``[start, end)`` up to the
        durable end; ``end`` -1: to the durable end), or the error of that partition.

        The broker answers from memory (no storage request), which is why Spark's planner asks
        it instead of listing storage. UnsupportedVersionError if the broker does not know the
        API (an older replog): list the partition's segment objects instead.

        Examples
        --------
        >>> found = admin.describe_log_objects(1, {("events", 0): (0, 100)})  # doctest: +SKIP
        >>> [e.path for e in found[TopicPartition("events", 0)].extents]  # doctest: +SKIP
        ['events/0/00000000000000000000.seg', '_replog/wal/L0/...']
        """
        self._check_open()
        by_topic: dict[str, list[DescribeLogObjectsPartition]] = {}
        for tp, (start, end) in ranges.items():
            topic, index = tp
            if start < 0 or (end >= 0 and end < start):
                raise ValueError(
                    f"the range [{start}, {end}) of {topic}-{index} is not a range of offsets: "
                    "give 0 <= start <= end, or end -1 for the durable end"
                )
            by_topic.setdefault(topic, []).append(
                DescribeLogObjectsPartition(
                    partition_index=int(index), start_offset=int(start), end_offset=int(end)
                )
            )
        if not by_topic:
            return {}
        request = DescribeLogObjectsRequest(
            topics=[
                DescribeLogObjectsTopic(name=t, partitions=ps) for t, ps in sorted(by_topic.items())
            ]
        )
        cluster = self._cluster
        if not cluster.bootstrapped or broker not in cluster.snapshot.brokers:
            self.describe_cluster()  # the broker may have (re)joined since the last refresh
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        conn = cluster.connection(broker)
        version = conn.max_version(ApiKey.DESCRIBE_LOG_OBJECTS, _DESCRIBE_LOG_OBJECTS_VERSION)
        response: DescribeLogObjectsResponse = conn.send(
            ApiKey.DESCRIBE_LOG_OBJECTS, version, request, timeout_ms=timeout
        )
        if response.error_code:
            cls = for_code(response.error_code) or ReplogError
            raise cls(f"broker {broker} refused DescribeLogObjects: {cls()}")
        out: dict[TopicPartition, LogObjects | ReplogError] = {}
        for answered in response.topics:
            for part in answered.partitions:
                tp = TopicPartition(answered.name, int(part.partition_index))
                if part.error_code:
                    cls = for_code(part.error_code) or ReplogError
                    out[tp] = cls(part.error_message or f"broker {broker}: {cls()}")
                    continue
                out[tp] = LogObjects(
                    broker_id=broker,
                    log_dir=response.log_dir,
                    high_watermark=int(part.high_watermark),
                    durable_end_offset=int(part.durable_end_offset),
                    log_start_offset=int(part.log_start_offset),
                    extents=tuple(
                        ObjectExtent(
                            e.path,
                            int(e.position),
                            int(e.size),
                            int(e.base_offset),
                            int(e.next_offset),
                        )
                        for e in part.extents
                    ),
                )
        return out

    def aborted_transactions(
        self,
        partition: TopicPartition | tuple[str, int],
        start_offset: int,
        *,
        timeout_ms: int | None = None,
    ) -> tuple[AbortedTxnRange, ...]:
        """The aborted transactions of ``partition`` with records at or after ``start_offset``
        (and below its LSO), as its leader lists them in the answer to a read_committed Fetch
        at ``start_offset`` (Kafka's FetchResponse ``aborted_transactions``): (producer id,
        first offset) pairs, by first offset.

        A reader of the partition's segment objects drops the records of these transactions,
        as Kafka's read_committed consumer does. Asks for no records (max_bytes 0). Retries
        retriable errors (no leader, leadership moved) until ``timeout_ms`` (default
        default.api.timeout.ms); UnknownTopicOrPartitionError if the partition does not exist.
        """
        self._check_open()
        tp = TopicPartition(*partition)
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        request = FetchRequest(
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=0,  # no records: only the partition's state and aborted transactions
            isolation_level=READ_COMMITTED,
            session_id=0,
            session_epoch=_NO_SESSION_EPOCH,
            topics=[
                FetchRequestTopic(
                    topic=tp.topic,
                    partitions=[
                        FetchRequestPartition(
                            partition=tp.partition,
                            fetch_offset=start_offset,
                            partition_max_bytes=0,
                        )
                    ],
                )
            ],
        )
        cluster = self._cluster

        def attempt() -> tuple[AbortedTxnRange, ...]:
            self._offsets.ensure_metadata([tp])
            leader = cluster.snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                raise self._offsets.no_leader_error(tp)
            response: FetchResponse = cluster.connection(leader).send(ApiKey.FETCH, 0, request)
            return _aborted_in(tp, response)

        def on_retry(err: ReplogError, attempt: int) -> None:
            cluster.request_update()
            self._offsets.check_unknown([tp])

        ms = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
        return call_with_retries(
            f"asking the leader of {tp} for aborted transactions",
            attempt,
            RetryPolicy.of(
                self.config,
                ms,
                "timeout_ms" if timeout_ms is not None else "default.api.timeout.ms",
            ),
            retriable=cluster.retriable,
            on_retry=on_retry,
        )


def _replica_logs(
    broker: int, response: DescribeLogDirsResponse
) -> dict[TopicPartition, ReplicaLog] | ReplogError:
    codes = [response.error_code, *(r.error_code for r in response.results)]
    code = next((c for c in codes if c), 0)
    if code:
        cls = for_code(code) or ReplogError
        return cls(f"broker {broker} could not describe its log dirs: {cls()}")
    out: dict[TopicPartition, ReplicaLog] = {}
    for result in response.results:
        for topic in result.topics:
            for p in topic.partitions:
                out[TopicPartition(topic.name, int(p.partition_index))] = ReplicaLog(
                    broker_id=broker,
                    log_dir=result.log_dir,
                    log_start_offset=int(p.log_start_offset),
                    log_end_offset=int(p.log_end_offset),
                    durable_end_offset=int(p.durable_end_offset),
                    high_watermark=int(p.high_watermark),
                    leader_epoch=int(p.leader_epoch),
                    is_leader=bool(p.is_leader),
                    size_bytes=int(p.partition_size),
                )
    return out


def _aborted_in(tp: TopicPartition, response: FetchResponse) -> tuple[AbortedTxnRange, ...]:
    """The aborted transactions of ``tp`` in a Fetch response; its error (by class) if any."""
    if response.error_code:
        cls = for_code(response.error_code) or ReplogError
        raise cls(f"fetch of {tp} failed: {cls()}")
    for t in response.responses:
        for p in t.partitions:
            if t.topic != tp.topic or p.partition_index != tp.partition:
                continue
            if p.error_code:
                cls = for_code(p.error_code) or ReplogError
                raise cls(f"fetch of {tp} failed: {cls()}")
            return tuple(
                AbortedTxnRange(int(a.producer_id), int(a.first_offset))
                for a in (p.aborted_transactions or ())
            )
    raise NetworkError(f"the leader of {tp} did not answer for it")
