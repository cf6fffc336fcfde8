"""The handlers of a broker's log APIs, a family of :class:`~replication.server.apis.KafkaApis`:
Produce and Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords, DescribeLogDirs and
DescribeLogObjects (where a replica's offsets are on storage, for Spark's direct reads).

Each answers per partition through the replica manager; a partition its leader cannot serve,
or of a topic the principal may not act on, answers its error code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from functools import partial
from typing import Any

from logstore.batch import parse_header
from logstore.errors import OffsetOutOfRangeError, ReplogError
from logstore.reader import ObjectExtent
from replication import protocol as p
from replication.broker.fetch_metadata import PartitionFetchState
from replication.broker.partition import Partition
from replication.broker.quota_manager import FETCH_QUOTA_BYTES
from replication.broker.replica_fetch import FetchSpec
from replication.broker.replica_produce import ProduceResult
from replication.common import TopicPartition
from replication.errors import (
    AuthorizationError,
    InvalidRequestError,
    TopicAuthorizationFailedError,
)
from replication.security.acl import AclOperation, ResourceType
from replication.server.apis_base import KafkaApisBase
from replication.server.responses import error_code, error_message

__all__ = ["LogApis"]

_OP = AclOperation
_RT = ResourceType


class LogApis(KafkaApisBase):
    """Produce, Fetch and the APIs of a replica's log (see the module's docstring)."""

    def authorize_produce(
        self, transactional_id: str | None, transactional: bool, topics: Iterable[str]
    ) -> dict[str, AuthorizationError]:
        """The topics a Produce may not write to, with the error to answer on each of their
        partitions: all of them (TRANSACTIONAL_ID_AUTHORIZATION_FAILED) without Write on the
        transactional id, else those without Write on the topic (TOPIC_AUTHORIZATION_FAILED).
        ``transactional``: the request carries transactional batches (Kafka refuses them
        without a transactional id). Both listeners' Produce handlers call this."""
        names = set(topics)
        if not self.auth.enabled:
            return {}
        api = "Produce"
        if transactional_id is not None or transactional:
            err = (
                self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, transactional_id, api=api)
                if transactional_id is not None
                else self.auth.error(_OP.WRITE, _RT.TRANSACTIONAL_ID, "null")
            )
            if err is not None:
                return dict.fromkeys(names, err)
        may = self.auth.filter(_OP.WRITE, _RT.TOPIC, names, api=api)
        return {n: self.auth.error(_OP.WRITE, _RT.TOPIC, n) for n in names - may}

    async def handle_produce(self, header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        refused = self.authorize_produce(
            body.transactional_id,
            self.auth.enabled
            and any(
                _transactional(part.records) for t in body.topic_data for part in t.partition_data
            ),
            (t.name for t in body.topic_data),
        )
        entries = [
            (topic.name, part.index, part.records)
            for topic in body.topic_data
            for part in topic.partition_data
            if topic.name not in refused
        ]
        results = await self.replica_manager.append_records(body.acks, body.timeout_ms, entries)
        if body.acks == 0:
            return None
        for name, err in refused.items():
            for topic in body.topic_data:
                if topic.name == name:
                    for part in topic.partition_data:
                        results[TopicPartition(name, part.index)] = ProduceResult(error=err)
        return p.ProduceResponse(
            responses=[
                p.ProduceResponseTopic(
                    name=topic.name,
                    partition_responses=[
                        p.ProduceResponsePartition(
                            index=part.index,
                            error_code=error_code(r.error),
                            base_offset=r.base_offset,
                            log_start_offset=r.log_start_offset,
                            error_message=error_message(r.error),
                        )
                        for part in topic.partition_data
                        for r in [results[TopicPartition(topic.name, part.index)]]
                    ],
                )
                for topic in body.topic_data
            ]
        )

    async def handle_fetch(self, header: p.RequestHeader, body: p.FetchRequest) -> Any:
        requested = [
            (
                TopicPartition(t.topic, part.partition),
                PartitionFetchState(
                    fetch_offset=part.fetch_offset,
                    max_bytes=part.partition_max_bytes,
                    current_leader_epoch=part.current_leader_epoch,
                    last_fetched_epoch=part.last_fetched_epoch,
                    log_start_offset=part.log_start_offset,
                ),
            )
            for t in body.topics
            for part in t.partitions
        ]
        forgotten = [
            TopicPartition(f.topic, i) for f in body.forgotten_topics_data for i in f.partitions
        ]
        context = self.fetch_sessions.new_context(
            body.session_id,
            body.session_epoch,
            requested,
            forgotten,
            is_from_follower=body.replica_id >= 0,
        )
        if context.error is not None:
            return p.FetchResponse(error_code=context.error_code, session_id=context.session_id)
        # A follower needs ClusterAction on the cluster, a consumer Read on each topic; a
        # partition refused answers TOPIC_AUTHORIZATION_FAILED (Kafka's answer in both cases)
        # and is neither read nor counted as the follower's fetch.
        refused: dict[str, AuthorizationError] = {}
        if self.auth.enabled:
            wanted = {topic for topic, _, _ in context.partitions()}
            if body.replica_id >= 0:
                err = self.auth.check(_OP.CLUSTER_ACTION, _RT.CLUSTER, api="Fetch")
                if err is not None:
                    refused = dict.fromkeys(wanted, TopicAuthorizationFailedError(str(err)))
            else:
                may = self.auth.filter(_OP.READ, _RT.TOPIC, wanted, api="Fetch")
                refused = {t: self.auth.error(_OP.READ, _RT.TOPIC, t) for t in wanted - may}
        specs = [
            FetchSpec(
                topic=topic,
                partition=index,
                fetch_offset=state.fetch_offset,
                partition_max_bytes=state.max_bytes,
                current_leader_epoch=state.current_leader_epoch,
                last_fetched_epoch=state.last_fetched_epoch,
            )
            for topic, index, state in context.partitions()
            if topic not in refused
        ]
        data = await self.replica_manager.fetch(
            body.replica_id,
            specs,
            max_wait_ms=body.max_wait_ms,
            min_bytes=body.min_bytes,
            # under a consumer_byte_rate: at most one second of it (Kafka caps it likewise)
            max_bytes=min(body.max_bytes, FETCH_QUOTA_BYTES.get() or body.max_bytes),
            isolation_level=body.isolation_level,
        )
        results = {
            key: p.FetchResponsePartition(
                partition_index=key[1],
                error_code=error_code(d.error),
                high_watermark=d.high_watermark,
                last_stable_offset=d.last_stable_offset,
                log_start_offset=d.log_start_offset,
                diverging_epoch=p.EpochEndOffset(
                    epoch=d.diverging_epoch[0], end_offset=d.diverging_epoch[1]
                )
                if d.diverging_epoch
                else p.EpochEndOffset(),
                records=d.records,
                aborted_transactions=None
                if d.aborted is None
                else [
                    p.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in d.aborted
                ],
            )
            for key, d in data.items()
        }
        for topic, index, _ in context.partitions():
            if topic in refused:
                results[TopicPartition(topic, index)] = p.FetchResponsePartition(
                    partition_index=index, error_code=refused[topic].code or -1
                )
        by_topic: dict[str, list[p.FetchResponsePartition]] = {}
        for (topic, _), part in context.filter_response(results):
            by_topic.setdefault(topic, []).append(part)
        return p.FetchResponse(
            error_code=context.error_code,
            session_id=context.session_id,
            responses=[p.FetchResponseTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )

    async def handle_list_offsets(self, header: p.RequestHeader, body: p.ListOffsetsRequest) -> Any:
        api = "ListOffsets"
        rm = self.replica_manager

        async def answer(
            topic: str, part: p.ListOffsetsRequestPartition
        ) -> p.ListOffsetsResponsePartition:
            partition = rm.get_partition(topic, part.partition_index)
            partition.check_leader_epoch(part.current_leader_epoch, require_leader=True)
            if part.timestamp != p.EARLIEST_TIMESTAMP:
                partition.check_high_watermark_known()
            upper = (
                partition.last_stable_offset
                if body.isolation_level == 1
                else partition.high_watermark
            )
            plog = partition.log
            timestamp, offset = -1, -1
            if part.timestamp == p.EARLIEST_TIMESTAMP:
                offset = plog.log_start_offset
            elif part.timestamp == p.LATEST_TIMESTAMP:
                offset = upper
            else:
                # as Kafka: a record at or past the last fetchable offset is not named
                found = await asyncio.to_thread(
                    plog.offset_of_max_timestamp
                    if part.timestamp == p.MAX_TIMESTAMP
                    else partial(plog.offset_for_timestamp, part.timestamp)
                )
                if found is not None and found[0] < upper:
                    offset, timestamp = found
            return p.ListOffsetsResponsePartition(
                partition_index=part.partition_index,
                timestamp=timestamp,
                offset=offset,
                leader_epoch=partition.leader_epoch,
            )

        answers = await self.answer_per_partition(
            api,
            _OP.DESCRIBE,
            ((t.name, t.partitions) for t in body.topics),
            answer,
            lambda part, err: p.ListOffsetsResponsePartition(
                partition_index=part.partition_index, error_code=error_code(err)
            ),
        )
        return p.ListOffsetsResponse(
            topics=[p.ListOffsetsResponseTopic(name=n, partitions=ps) for n, ps in answers]
        )

    async def handle_offsets_for_leader_epoch(
        self, header: p.RequestHeader, body: p.OffsetsForLeaderEpochRequest
    ) -> Any:
        # Kafka: ClusterAction on the cluster (a follower), else Describe on each topic (a
        # consumer checking for truncation, KIP-320); TOPIC_AUTHORIZATION_FAILED per partition
        api = "OffsetForLeaderEpoch"
        names = [t.topic for t in body.topics]
        may = (
            set(names)
            if self.auth.allowed(_OP.CLUSTER_ACTION, _RT.CLUSTER, api=api, log_denied=False)
            else self.auth.filter(_OP.DESCRIBE, _RT.TOPIC, names, api=api)
        )
        rm = self.replica_manager

        async def answer(
            topic: str, part: p.OffsetForLeaderPartition
        ) -> p.OffsetForLeaderPartitionResult:
            partition = rm.get_partition(topic, part.partition)
            partition.check_leader_epoch(part.current_leader_epoch, require_leader=True)
            epoch, end = partition.log.end_offset_for_epoch(part.leader_epoch)
            return p.OffsetForLeaderPartitionResult(
                partition=part.partition, leader_epoch=epoch, end_offset=end
            )

        answers = await self.answer_per_partition(
            api,
            _OP.DESCRIBE,
            ((t.topic, t.partitions) for t in body.topics),
            answer,
            lambda part, err: p.OffsetForLeaderPartitionResult(
                partition=part.partition, error_code=error_code(err)
            ),
            may=may,
        )
        return p.OffsetsForLeaderEpochResponse(
            topics=[p.OffsetForLeaderTopicResult(topic=t, partitions=ps) for t, ps in answers]
        )

    async def handle_delete_records(
        self, header: p.RequestHeader, body: p.DeleteRecordsRequest
    ) -> Any:
        """Advance each partition's log start offset on its leader (offset -1: the high
        watermark). Followers follow through the log start offset in their fetches.

        Kafka answers once every replica has deleted (the low watermark of the replicas); here
        the leader's new log start offset is the answer, since no replica serves records below
        it to a consumer once the leader has moved it (followers are not read by consumers)."""
        api = "DeleteRecords"
        rm = self.replica_manager

        async def answer(
            topic: str, part: p.DeleteRecordsPartition
        ) -> p.DeleteRecordsPartitionResult:
            partition = rm.get_partition(topic, part.partition_index)
            partition.check_leader_epoch(-1, require_leader=True)
            plog = partition.log
            offset = plog.high_watermark if part.offset == -1 else part.offset
            if not plog.log_start_offset <= offset <= plog.high_watermark:
                raise OffsetOutOfRangeError(
                    f"{topic}-{part.partition_index}: cannot delete records before "
                    f"offset {part.offset}: it must be between the log start offset "
                    f"{plog.log_start_offset} and the high watermark "
                    f"{plog.high_watermark} (or -1 for the high watermark)"
                )
            low = await asyncio.to_thread(plog.delete_records_before, offset)
            return p.DeleteRecordsPartitionResult(
                partition_index=part.partition_index, low_watermark=low
            )

        answers = await self.answer_per_partition(
            api,
            _OP.DELETE,
            ((t.name, t.partitions) for t in body.topics),
            answer,
            lambda part, err: p.DeleteRecordsPartitionResult(
                partition_index=part.partition_index, error_code=error_code(err)
            ),
        )
        return p.DeleteRecordsResponse(
            topics=[p.DeleteRecordsTopicResult(name=n, partitions=ps) for n, ps in answers]
        )

    async def handle_describe_log_dirs(
        self, header: p.RequestHeader, body: p.DescribeLogDirsRequest
    ) -> Any:
        """The replicas this broker holds. Kafka needs Describe on the cluster
        (CLUSTER_AUTHORIZATION_FAILED); replog also leaves out topics the principal may not
        Read: a log dir is where direct segment reads (Spark) start."""
        api = "DescribeLogDirs"
        err = self.auth.check(_OP.DESCRIBE, _RT.CLUSTER, api=api)
        if err is not None:
            return p.DescribeLogDirsResponse(error_code=err.code or -1)
        rm = self.replica_manager
        wanted = (
            None
            if body.topics is None
            else {(t.topic, i) for t in body.topics for i in t.partitions}
        )
        readable: set[str] | None = None
        if self.auth.enabled:
            readable = self.auth.filter(
                _OP.READ, _RT.TOPIC, (t for t, _ in rm.partitions), api=api, log_denied=False
            )
        by_topic: dict[str, list[p.DescribeLogDirsPartition]] = {}
        for (topic, index), partition in sorted(rm.partitions.items()):
            if wanted is not None and (topic, index) not in wanted:
                continue
            if readable is not None and topic not in readable:
                continue
            plog = partition.log
            by_topic.setdefault(topic, []).append(
                p.DescribeLogDirsPartition(
                    partition_index=index,
                    partition_size=plog.size_in_bytes,
                    log_start_offset=plog.log_start_offset,
                    log_end_offset=plog.log_end_offset,
                    durable_end_offset=plog.durable_end_offset,
                    high_watermark=plog.high_watermark,
                    leader_epoch=partition.leader_epoch,
                    is_leader=partition.is_leader,
                )
            )
        return p.DescribeLogDirsResponse(
            results=[
                p.DescribeLogDirsResult(
                    log_dir=self.config.log_dir,
                    topics=[
                        p.DescribeLogDirsTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                    ],
                )
            ]
        )

    async def handle_describe_log_objects(
        self, header: p.RequestHeader, body: p.DescribeLogObjectsRequest
    ) -> Any:
        """Where this broker's replicas hold offsets ``[start, end)`` on its storage, from the
        logs' extent lists in memory (no storage request): Spark's planner asks this instead of
        listing ``<topic>/<p>/`` per partition per micro-batch, and learns the WAL chunks a
        listing cannot find. Any replica answers (leader or follower): direct reads go to
        whichever in-sync replica the planner chose.

        Authorized as DescribeLogDirs, which it refines: Describe on the cluster (else
        CLUSTER_AUTHORIZATION_FAILED for the whole request), and Read on each topic (else
        TOPIC_AUTHORIZATION_FAILED on its partitions: the answer leads to the topic's bytes).
        Extents end at the replica's durable end: nothing beyond it is in storage yet."""
        api = "DescribeLogObjects"
        err = self.auth.check(_OP.DESCRIBE, _RT.CLUSTER, api=api)
        if err is not None:
            return p.DescribeLogObjectsResponse(
                error_code=err.code or -1, log_dir=self.config.log_dir
            )
        rm = self.replica_manager
        names = {t.name for t in body.topics}
        readable = self.auth.filter(_OP.READ, _RT.TOPIC, names, api=api) if names else set()

        async def answer(
            topic: str, want: p.DescribeLogObjectsPartition
        ) -> p.DescribeLogObjectsPartitionResponse:
            if want.start_offset < 0 or (
                want.end_offset >= 0 and want.end_offset < want.start_offset
            ):
                raise InvalidRequestError(
                    f"DescribeLogObjects of {topic}-{want.partition_index}: the range "
                    f"[{want.start_offset}, {want.end_offset}) is not a range of offsets; "
                    "ask for 0 <= start <= end (end -1: to the log end)"
                )
            return _log_objects(topic, want, rm.get_partition(topic, want.partition_index))

        answers = await self.answer_per_partition(
            api,
            _OP.READ,
            ((t.name, t.partitions) for t in body.topics),
            answer,
            lambda want, failure: p.DescribeLogObjectsPartitionResponse(
                partition_index=want.partition_index,
                error_code=error_code(failure),
                error_message=error_message(failure),
            ),
            may=readable,
        )
        return p.DescribeLogObjectsResponse(
            log_dir=self.config.log_dir,
            topics=[p.DescribeLogObjectsTopicResponse(name=n, partitions=ps) for n, ps in answers],
        )


def _transactional(records: Any) -> bool:
    """Is the (first) batch of a partition's records transactional? (A malformed one is not:
    the log refuses it with its own error.)"""
    if not records:
        return False
    try:
        return parse_header(records).is_transactional
    except (ReplogError, ValueError):
        return False


def _log_objects(
    topic: str, want: p.DescribeLogObjectsPartition, partition: Partition
) -> p.DescribeLogObjectsPartitionResponse:
    """One partition's answer to DescribeLogObjects: the extents of its log that hold offsets
    ``[start, end)`` below its durable end, as paths relative to the broker's storage root
    (segment objects under ``<topic>/<partition>/``, chunks where the WAL put them)."""
    plog = partition.log
    # One snapshot of the extents, and the durable end read before it: every extent listed
    # was written before that end was reached, so none runs past what storage holds.
    durable = plog.durable_end_offset
    extents = plog.extents()
    end = durable if want.end_offset < 0 else min(want.end_offset, durable)
    found = []
    directory = f"{topic}/{want.partition_index}"
    for extent in extents:
        if extent.next_offset <= want.start_offset or extent.base_offset >= end:
            continue
        e = ObjectExtent.of(extent, directory)
        found.append(
            p.LogObjectExtent(
                path=e.path,
                position=e.position,
                size=e.size,
                base_offset=e.base_offset,
                next_offset=e.next_offset,
            )
        )
    return p.DescribeLogObjectsPartitionResponse(
        partition_index=want.partition_index,
        high_watermark=plog.high_watermark,
        durable_end_offset=durable,
        log_start_offset=plog.log_start_offset,
        extents=found,
    )
