"""Request handlers of a broker's APIs, as Kafka's KafkaApis: one method per API, protocol
objects in and out. On a node that is also a controller, the controller's APIs are routed to
:class:`~replication.server.controller_apis.ControllerApis`.

Handlers turn :class:`ReplogError` into per-partition or per-topic error codes with the
error's message; nothing here touches sockets (socket_server.py) or storage (the replica
manager and the controller do).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from logstore.batch import iter_batches
from logstore.errors import OffsetOutOfRangeError, ReplogError
from replication import protocol as p
from replication.broker.fetch_metadata import PartitionFetchState
from replication.broker.fetch_session import FetchSessionCache
from replication.broker.lifecycle import BrokerLifecycle
from replication.broker.partition import Partition
from replication.broker.replica_manager import FetchSpec, ReplicaManager
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.coordinator.group import OFFSETS_TOPIC
from replication.coordinator.transaction import TRANSACTION_TOPIC, TransactionCoordinator
from replication.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    LeaderNotAvailableError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from replication.metadata.image import MetadataImage
from replication.server.configs import describe_configs
from replication.server.controller_apis import (
    FORWARDED_APIS,
    ControllerApis,
    not_controller_answer,
    security_handlers,
)
from replication.server.group_apis import GroupApis
from replication.server.responses import Handler, error_code, error_message

log = logging.getLogger(__name__)


class KafkaApis:
    def __init__(
        self,
        config: BrokerConfig,
        replica_manager: ReplicaManager | None,
        controller_apis: ControllerApis | None,
        lifecycle: BrokerLifecycle | None,
    ) -> None:
        self.config = config
        self._replica_manager = replica_manager
        self.controller_apis = controller_apis
        self.lifecycle = lifecycle
        #: set by the node once its broker side is up
        self.coordinator: TransactionCoordinator | None = None
        self.group_apis: GroupApis | None = None
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)
        self.handlers: dict[int, Handler] = {
            p.ApiKey.API_VERSIONS: self.handle_api_versions,
            p.ApiKey.METADATA: self.handle_metadata,
        }
        if replica_manager is not None:
            self.handlers.update(
                {
                    p.ApiKey.PRODUCE: self.handle_produce,
                    p.ApiKey.FETCH: self.handle_fetch,
                    p.ApiKey.LIST_OFFSETS: self.handle_list_offsets,
                    p.ApiKey.OFFSET_FOR_LEADER_EPOCH: self.handle_offsets_for_leader_epoch,
                    p.ApiKey.DESCRIBE_LOG_DIRS: self.handle_describe_log_dirs,
                    p.ApiKey.DELETE_RECORDS: self.handle_delete_records,
                    p.ApiKey.DESCRIBE_CONFIGS: self.handle_describe_configs,
                    p.ApiKey.FIND_COORDINATOR: self.handle_find_coordinator,
                    p.ApiKey.INIT_PRODUCER_ID: self.handle_init_producer_id,
                    p.ApiKey.ADD_PARTITIONS_TO_TXN: self.handle_add_partitions_to_txn,
                    p.ApiKey.ADD_OFFSETS_TO_TXN: self.handle_add_offsets_to_txn,
                    p.ApiKey.END_TXN: self.handle_end_txn,
                    p.ApiKey.WRITE_TXN_MARKERS: self.handle_write_txn_markers,
                    p.ApiKey.LIST_TRANSACTIONS: self.handle_list_transactions,
                    p.ApiKey.DESCRIBE_TRANSACTIONS: self.handle_describe_transactions,
                    p.ApiKey.DESCRIBE_PRODUCERS: self.handle_describe_producers,
                    p.ApiKey.COMMIT_SINK_BATCH: self.handle_commit_sink_batch,
                    p.ApiKey.DESCRIBE_SINK: self.handle_describe_sink,
                }
            )
        for api_key in FORWARDED_APIS:
            self.handlers[api_key] = self.handle_forwarded
        self.handlers.update(security_handlers(config, lambda: self.image))
        if controller_apis is not None:
            self.handlers.update(controller_apis.handlers)

    @property
    def replica_manager(self) -> ReplicaManager:
        assert self._replica_manager is not None
        return self._replica_manager

    @property
    def image(self) -> MetadataImage:
        if self._replica_manager is not None:
            return self._replica_manager.image
        assert self.controller_apis is not None
        return self.controller_apis.image

    async def handle(self, header: p.RequestHeader, body: Any) -> Any:
        """The response body, or None when no response is sent (Produce with acks=0)."""
        handler = self.handlers.get(header.api_key)
        if handler is None:
            raise UnsupportedVersionError(
                f"API {p.ApiKey(header.api_key).name} is not served by this broker"
            )
        return await handler(header, body)

    # --- ApiVersions, Metadata ---------------------------------------------------------------

    async def handle_api_versions(self, header: p.RequestHeader, body: Any) -> Any:
        return p.ApiVersionsResponse(
            api_keys=[
                p.ApiVersionsResponseKey(api_key=int(k), min_version=lo, max_version=hi)
                for k, (lo, hi) in p.SUPPORTED_VERSIONS.items()
                if k in self.handlers
            ]
        )

    async def _after_controller_change(self) -> None:
        """Make this process's own view of metadata include what the controller just did."""
        if self.lifecycle is not None:
            await self.lifecycle.refresh_metadata()

    async def handle_metadata(self, header: p.RequestHeader, body: p.MetadataRequest) -> Any:
        image = self.image
        if body.topics is None:
            names = [t.name for t in image.topics]
        else:
            names = [t.name for t in body.topics]
            missing = [n for n in names if image.topic(n) is None]
            if missing and body.allow_auto_topic_creation and self.config.auto_create_topics_enable:
                await self.handle_create_topics(
                    header,
                    p.CreateTopicsRequest(
                        topics=[
                            p.CreatableTopic(name=name, num_partitions=-1, replication_factor=-1)
                            for name in missing
                        ]
                    ),
                )
                image = self.image
        topics = []
        for name in names:
            info = image.topic(name)
            if info is None:
                topics.append(
                    p.MetadataResponseTopic(error_code=UnknownTopicOrPartitionError.code, name=name)
                )
                continue
            partitions = []
            for index, state in enumerate(info.partitions):
                leader_ok = state.leader >= 0
                partitions.append(
                    p.MetadataResponsePartition(
                        error_code=0 if leader_ok else LeaderNotAvailableError.code,
                        partition_index=index,
                        leader_id=state.leader,
                        leader_epoch=state.leader_epoch,
                        replica_nodes=list(state.replicas),
                        isr_nodes=list(state.isr),
                        offline_replicas=[
                            r for r in state.replicas if (b := image.broker(r)) is None or b.fenced
                        ],
                    )
                )
            topics.append(
                p.MetadataResponseTopic(
                    name=name, partitions=partitions, is_internal=name.startswith("__")
                )
            )
        return p.MetadataResponse(
            brokers=[
                p.MetadataResponseBroker(node_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
                for b in image.brokers
                if not b.fenced
            ],
            cluster_id=image.cluster_id or None,
            controller_id=image.controller_id,
            topics=topics,
        )

    # --- topics ------------------------------------------------------------------------------

    async def handle_forwarded(self, header: p.RequestHeader, body: Any) -> Any:
        """Topic, config, reassignment, election and unregistration requests: answered by this
        process's controller if it is the active one, else forwarded to the active controller
        (as KRaft brokers forward them, KIP-590). Whatever the controller changed is in this
        process's metadata before the answer goes back."""
        api = p.ApiKey(header.api_key)
        controller = self.controller_apis
        if controller is not None and (controller.active or self.lifecycle is None):
            response = await controller.forwarded_handlers[api](body)
        elif self.lifecycle is not None:
            response = await self.lifecycle.controller_request(api, body)
        else:  # a broker still starting: no way to the controller yet
            response = not_controller_answer(api, body)
        if api != p.ApiKey.LIST_PARTITION_REASSIGNMENTS:
            await self._after_controller_change()
        return response

    async def handle_create_topics(
        self, header: p.RequestHeader, body: p.CreateTopicsRequest
    ) -> p.CreateTopicsResponse:
        return cast(p.CreateTopicsResponse, await self.handle_forwarded(header, body))

    async def handle_delete_records(
        self, header: p.RequestHeader, body: p.DeleteRecordsRequest
    ) -> Any:
        """Advance each partition's log start offset on its leader (offset -1: the high
        watermark). Followers follow through the log start offset in their fetches.

        Kafka answers once every replica has deleted (the low watermark of the replicas); here
        the leader's new log start offset is the answer, since no replica serves records below
        it to a consumer once the leader has moved it (followers are not read by consumers)."""
        rm = self.replica_manager
        topics = []
        for t in body.topics:
            parts = []
            for part in t.partitions:
                try:
                    partition = rm.get_partition(t.name, part.partition_index)
                    partition.check_leader_epoch(-1, require_leader=True)
                    plog = partition.log
                    offset = plog.high_watermark if part.offset == -1 else part.offset
                    if not plog.log_start_offset <= offset <= plog.high_watermark:
                        raise OffsetOutOfRangeError(
                            f"{t.name}-{part.partition_index}: cannot delete records before "
                            f"offset {part.offset}: it must be between the log start offset "
                            f"{plog.log_start_offset} and the high watermark "
                            f"{plog.high_watermark} (or -1 for the high watermark)"
                        )
                    low = await asyncio.to_thread(plog.delete_records_before, offset)
                    parts.append(
                        p.DeleteRecordsPartitionResult(
                            partition_index=part.partition_index, low_watermark=low
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.DeleteRecordsPartitionResult(
                            partition_index=part.partition_index, error_code=error_code(err)
                        )
                    )
            topics.append(p.DeleteRecordsTopicResult(name=t.name, partitions=parts))
        return p.DeleteRecordsResponse(topics=topics)

    async def handle_describe_configs(
        self, header: p.RequestHeader, body: p.DescribeConfigsRequest
    ) -> Any:
        return p.DescribeConfigsResponse(
            results=[describe_configs(self.config, self.image, r) for r in body.resources]
        )

    # --- transactions --------------------------------------------------------------------------

    @property
    def txn_coordinator(self) -> TransactionCoordinator:
        assert self.coordinator is not None
        return self.coordinator

    async def _transaction_partition_leader(self) -> int:
        """The leader of __transaction_state-0, creating the topic on first use (as Kafka)."""
        info = self.image.topic(TRANSACTION_TOPIC)
        if info is None:
            await self.create_internal_topic(TRANSACTION_TOPIC, 1, 3)
            info = self.image.topic(TRANSACTION_TOPIC)
        return info.partitions[0].leader if info is not None else -1

    def serve_groups(self, group_apis: GroupApis) -> None:
        """Serve the consumer group APIs (the node calls this once its broker side is up)."""
        self.group_apis = group_apis
        self.handlers.update(group_apis.handlers)

    async def create_internal_topic(self, name: str, partitions: int, replication: int) -> None:
        """Create an internal topic: ``replication`` replicas, or as many as the controller
        has registered brokers if fewer, min ISR 2 where it can be (the controller decides:
        ``controller_apis.internal_topic_placement``); kept whole (no retention).

        The controller refuses until that many brokers are live: created while one of three
        is restarting, it would get 2 replicas with min ISR 2 and stop taking writes at the
        next failure. Until then nothing is created, and the caller answers
        COORDINATOR_NOT_AVAILABLE, which clients retry (Kafka refuses likewise until
        offsets.topic.replication.factor brokers are up)."""
        response = await self.handle_create_topics(
            p.RequestHeader(api_key=p.ApiKey.CREATE_TOPICS, api_version=0, correlation_id=0),
            p.CreateTopicsRequest(
                topics=[
                    p.CreatableTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=replication,
                        configs=[
                            # Kafka compacts its internal topics; replog has no compaction, so
                            # it keeps them whole (a sink's last committed batch, a group's
                            # offsets must outlive any retention).
                            p.CreatableTopicConfig(name="retention.ms", value="-1"),
                            p.CreatableTopicConfig(name="retention.bytes", value="-1"),
                        ],
                    )
                ]
            ),
        )
        for result in response.topics:
            if result.error_code and result.error_code != TopicAlreadyExistsError.code:
                log.info("not creating %s yet: %s", name, result.error_message)

    async def handle_find_coordinator(
        self, header: p.RequestHeader, body: p.FindCoordinatorRequest
    ) -> Any:
        if body.key_type == p.GROUP_KEY_TYPE:
            if self.group_apis is None:
                return p.FindCoordinatorResponse(
                    error_code=CoordinatorNotAvailableError.code,
                    error_message="this broker is starting; retry",
                )
            return await self.group_apis.find_coordinator(body.key)
        if body.key_type != p.TRANSACTION_KEY_TYPE:
            return p.FindCoordinatorResponse(
                error_code=InvalidRequestError.code,
                error_message=f"key_type {body.key_type} is neither 0 (group) nor 1 (transaction)",
            )
        leader = await self._transaction_partition_leader()
        broker = self.image.broker(leader) if leader >= 0 else None
        if broker is None:
            return p.FindCoordinatorResponse(
                error_code=CoordinatorNotAvailableError.code,
                error_message="the transaction coordinator is not available yet; retry",
            )
        return p.FindCoordinatorResponse(
            node_id=broker.broker_id, host=broker.host, port=broker.port
        )

    async def handle_init_producer_id(
        self, header: p.RequestHeader, body: p.InitProducerIdRequest
    ) -> Any:
        try:
            pid, epoch = await self.txn_coordinator.init_producer_id(
                body.transactional_id, body.transaction_timeout_ms
            )
        except ReplogError as err:
            return p.InitProducerIdResponse(error_code=error_code(err))
        return p.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    async def handle_add_partitions_to_txn(
        self, header: p.RequestHeader, body: p.AddPartitionsToTxnRequest
    ) -> Any:
        code = 0
        try:
            await self.txn_coordinator.add_partitions(
                body.transactional_id,
                body.producer_id,
                body.producer_epoch,
                [TopicPartition(t.name, i) for t in body.topics for i in t.partitions],
            )
        except ReplogError as err:
            code = error_code(err)
        return p.AddPartitionsToTxnResponse(
            results=[
                p.AddPartitionsToTxnTopicResult(
                    name=t.name,
                    results=[
                        p.AddPartitionsToTxnPartitionResult(partition_index=i, error_code=code)
                        for i in t.partitions
                    ],
                )
                for t in body.topics
            ]
        )

    async def handle_add_offsets_to_txn(
        self, header: p.RequestHeader, body: p.AddOffsetsToTxnRequest
    ) -> Any:
        """Add the group's __consumer_offsets partition to the transaction, so its markers
        reach the offsets the transaction commits (Kafka's AddOffsetsToTxn)."""
        if self.group_apis is None:
            return p.AddOffsetsToTxnResponse(error_code=CoordinatorNotAvailableError.code)
        try:
            tp = await self.group_apis.offsets_partition(body.group_id)
            await self.txn_coordinator.add_partitions(
                body.transactional_id, body.producer_id, body.producer_epoch, [tp]
            )
        except ReplogError as err:
            return p.AddOffsetsToTxnResponse(error_code=error_code(err))
        return p.AddOffsetsToTxnResponse()

    async def handle_end_txn(self, header: p.RequestHeader, body: p.EndTxnRequest) -> Any:
        try:
            await self.txn_coordinator.end_txn(
                body.transactional_id, body.producer_id, body.producer_epoch, body.committed
            )
        except ReplogError as err:
            return p.EndTxnResponse(error_code=error_code(err))
        return p.EndTxnResponse()

    async def handle_write_txn_markers(
        self, header: p.RequestHeader | None, body: p.WriteTxnMarkersRequest
    ) -> p.WriteTxnMarkersResponse:
        markers = [
            (m.producer_id, m.producer_epoch, m.transaction_result, m.coordinator_epoch, t.name, i)
            for m in body.markers
            for t in m.topics
            for i in t.partition_indexes
        ]
        results = await self.replica_manager.write_txn_markers(
            markers, self.config.request_timeout_ms
        )
        if self.group_apis is not None:
            # markers on __consumer_offsets settle the offsets of the transaction
            for producer_id, _, result, _, topic, index in markers:
                if topic == OFFSETS_TOPIC and results[(producer_id, topic, index)] is None:
                    self.group_apis.coordinator.complete_txn(index, producer_id, bool(result))
        return p.WriteTxnMarkersResponse(
            markers=[
                p.WritableTxnMarkerResult(
                    producer_id=m.producer_id,
                    topics=[
                        p.WritableTxnMarkerTopicResult(
                            name=t.name,
                            partitions=[
                                p.WritableTxnMarkerPartitionResult(
                                    partition_index=i,
                                    error_code=error_code(results[(m.producer_id, t.name, i)]),
                                )
                                for i in t.partition_indexes
                            ],
                        )
                        for t in m.topics
                    ],
                )
                for m in body.markers
            ]
        )

    async def handle_list_transactions(
        self, header: p.RequestHeader, body: p.ListTransactionsRequest
    ) -> Any:
        try:
            listings = self.txn_coordinator.listings(body.state_filters)
        except ReplogError as err:
            return p.ListTransactionsResponse(error_code=error_code(err))
        return p.ListTransactionsResponse(
            transactions=[
                p.TransactionListing(
                    transactional_id=m.transactional_id,
                    producer_id=m.producer_id,
                    producer_epoch=m.producer_epoch,
                    transaction_state=m.state.value,
                    transaction_timeout_ms=m.timeout_ms,
                    transaction_start_time_ms=m.start_ms,
                    partitions=[
                        p.TransactionPartition(topic=t, partition=i)
                        for t, i in sorted(m.partitions)
                    ],
                )
                for m in listings
            ]
        )

    async def handle_describe_transactions(
        self, header: p.RequestHeader, body: p.DescribeTransactionsRequest
    ) -> Any:
        """The coordinator's state of each transactional id (Kafka's DescribeTransactions)."""
        states = []
        for transactional_id in body.transactional_ids:
            try:
                m = self.txn_coordinator.describe(transactional_id)
            except ReplogError as err:
                states.append(
                    p.TransactionState(
                        error_code=error_code(err), transactional_id=transactional_id
                    )
                )
                continue
            topics: dict[str, list[int]] = {}
            for t, i in sorted(m.partitions):
                topics.setdefault(t, []).append(i)
            states.append(
                p.TransactionState(
                    transactional_id=transactional_id,
                    transaction_state=m.state.value,
                    transaction_timeout_ms=m.timeout_ms,
                    transaction_start_time_ms=m.start_ms,
                    producer_id=m.producer_id,
                    producer_epoch=m.producer_epoch,
                    topics=[p.TopicData(topic=t, partitions=ps) for t, ps in topics.items()],
                )
            )
        return p.DescribeTransactionsResponse(transaction_states=states)

    async def handle_describe_producers(
        self, header: p.RequestHeader, body: p.DescribeProducersRequest
    ) -> Any:
        """The producers each partition's leader knows, with their open transaction's first
        offset (Kafka's DescribeProducers; what kafka-transactions.sh find-hanging reads)."""
        rm = self.replica_manager
        topics = []
        for t in body.topics:
            parts = []
            for index in t.partition_indexes:
                try:
                    partition = rm.get_partition(t.name, index)
                    partition.check_leader_epoch(-1, require_leader=True)
                    producers = await asyncio.to_thread(_active_producers, partition)
                    parts.append(
                        p.DescribeProducersPartitionResponse(
                            partition_index=index, active_producers=producers
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.DescribeProducersPartitionResponse(
                            partition_index=index,
                            error_code=error_code(err),
                            error_message=str(err),
                        )
                    )
            topics.append(p.DescribeProducersTopicResponse(name=t.name, partitions=parts))
        return p.DescribeProducersResponse(topics=topics)

    async def handle_commit_sink_batch(
        self, header: p.RequestHeader, body: p.CommitSinkBatchRequest
    ) -> Any:
        try:
            result = await self.txn_coordinator.commit_sink_batch(
                body.sink_id,
                body.batch_id,
                [(t.transactional_id, t.producer_id, t.producer_epoch) for t in body.transactions],
                abort=body.abort,
            )
        except ReplogError as err:
            return p.CommitSinkBatchResponse(
                error_code=error_code(err), error_message=error_message(err)
            )
        return p.CommitSinkBatchResponse(
            committed=result.committed, last_committed_batch=result.last_committed_batch
        )

    async def handle_describe_sink(
        self, header: p.RequestHeader, body: p.DescribeSinkRequest
    ) -> Any:
        try:
            last = self.txn_coordinator.last_committed_batch(body.sink_id)
        except ReplogError as err:
            return p.DescribeSinkResponse(error_code=error_code(err))
        return p.DescribeSinkResponse(last_committed_batch=last)

    # --- produce and fetch -------------------------------------------------------------------

    async def handle_produce(self, header: p.RequestHeader, body: p.ProduceRequest) -> Any:
        entries = [
            (topic.name, part.index, part.records)
            for topic in body.topic_data
            for part in topic.partition_data
        ]
        results = await self.replica_manager.append_records(body.acks, body.timeout_ms, entries)
        if body.acks == 0:
            return None
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
        ]
        data = await self.replica_manager.fetch(
            body.replica_id,
            specs,
            max_wait_ms=body.max_wait_ms,
            min_bytes=body.min_bytes,
            max_bytes=body.max_bytes,
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
        by_topic: dict[str, list[p.FetchResponsePartition]] = {}
        for (topic, _), part in context.filter_response(results):
            by_topic.setdefault(topic, []).append(part)
        return p.FetchResponse(
            error_code=context.error_code,
            session_id=context.session_id,
            responses=[p.FetchResponseTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )

    async def handle_list_offsets(self, header: p.RequestHeader, body: p.ListOffsetsRequest) -> Any:
        rm = self.replica_manager
        topics = []
        for t in body.topics:
            parts = []
            for part in t.partitions:
                try:
                    partition = rm.get_partition(t.name, part.partition_index)
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
                        found = await asyncio.to_thread(plog.offset_for_timestamp, part.timestamp)
                        if found is not None and found[0] < upper:
                            offset, timestamp = found
                    parts.append(
                        p.ListOffsetsResponsePartition(
                            partition_index=part.partition_index,
                            timestamp=timestamp,
                            offset=offset,
                            leader_epoch=partition.leader_epoch,
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.ListOffsetsResponsePartition(
                            partition_index=part.partition_index, error_code=error_code(err)
                        )
                    )
            topics.append(p.ListOffsetsResponseTopic(name=t.name, partitions=parts))
        return p.ListOffsetsResponse(topics=topics)

    async def handle_describe_log_dirs(
        self, header: p.RequestHeader, body: p.DescribeLogDirsRequest
    ) -> Any:
        rm = self.replica_manager
        wanted = (
            None
            if body.topics is None
            else {(t.topic, i) for t in body.topics for i in t.partitions}
        )
        by_topic: dict[str, list[p.DescribeLogDirsPartition]] = {}
        for (topic, index), partition in sorted(rm.partitions.items()):
            if wanted is not None and (topic, index) not in wanted:
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

    async def handle_offsets_for_leader_epoch(
        self, header: p.RequestHeader, body: p.OffsetsForLeaderEpochRequest
    ) -> Any:
        rm = self.replica_manager
        topics = []
        for t in body.topics:
            parts = []
            for part in t.partitions:
                try:
                    partition = rm.get_partition(t.topic, part.partition)
                    partition.check_leader_epoch(part.current_leader_epoch, require_leader=True)
                    epoch, end = partition.log.end_offset_for_epoch(part.leader_epoch)
                    parts.append(
                        p.OffsetForLeaderPartitionResult(
                            partition=part.partition, leader_epoch=epoch, end_offset=end
                        )
                    )
                except ReplogError as err:
                    parts.append(
                        p.OffsetForLeaderPartitionResult(
                            partition=part.partition, error_code=error_code(err)
                        )
                    )
            topics.append(p.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
        return p.OffsetsForLeaderEpochResponse(topics=topics)


def _active_producers(partition: Partition) -> list[p.ProducerState]:
    """The producers of ``partition``'s producer state; an open transaction's start time is
    the timestamp of its first batch, read from the log."""
    out = []
    for entry in list(partition.producer_state.producers.values()):
        started = -1
        first = entry.current_txn_first_offset
        if first >= 0:
            try:
                data = partition.log.read(first, 1)
                batches = list(iter_batches(data))
                if batches:
                    started = batches[0].first_timestamp
            except ReplogError as err:
                log.warning("%r: reading the transaction at %d failed: %s", partition, first, err)
        out.append(
            p.ProducerState(
                producer_id=entry.producer_id,
                producer_epoch=entry.producer_epoch,
                last_sequence=entry.last_seq,
                last_timestamp=started,
                coordinator_epoch=entry.coordinator_epoch,
                current_txn_start_offset=first,
            )
        )
    return sorted(out, key=lambda s: s.producer_id)
