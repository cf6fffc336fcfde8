"""The handlers of a broker's transaction APIs, a family of
:class:`~replication.server.apis.KafkaApis`: FindCoordinator (of a transactional id, or handed
to the group APIs for a group), InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
WriteTxnMarkers, ListTransactions, DescribeTransactions, DescribeProducers, and the sink's
CommitSinkBatch and DescribeSink.

Each checks the principal's rights on the transactional id (and the topics, the group) and
hands the request to the :class:`~replication.coordinator.transaction.TransactionCoordinator`;
its errors travel as Kafka's codes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from logstore.batch import iter_batches
from logstore.errors import ReplogError
from replication import protocol as p
from replication.broker.partition import Partition
from replication.common import TopicPartition
from replication.coordinator.group_metadata_manager import OFFSETS_TOPIC
from replication.coordinator.transaction import TRANSACTION_TOPIC
from replication.errors import (
    CoordinatorNotAvailableError,
    InvalidRequestError,
    OperationNotAttemptedError,
    TopicAuthorizationFailedError,
)
from replication.security.acl import AclOperation, ResourceType
from replication.security.principal import internal_scope
from replication.server.apis_base import KafkaApisBase
from replication.server.responses import error_code, error_message

__all__ = ["SINK_TRANSACTIONAL_PREFIX", "TransactionApis"]

log = logging.getLogger(__name__)

_OP = AclOperation
_RT = ResourceType

#: the transactional id a sink's batches are committed under (the sink's own id is checked
#: as one, see api_acls)
SINK_TRANSACTIONAL_PREFIX = "replog-sink/"


class TransactionApis(KafkaApisBase):
    """The transaction coordinator's APIs (see the module's docstring)."""

    async def _transaction_partition_leader(self) -> int:
        """The leader of __transaction_state-0, creating the topic on first use (as Kafka)."""
        info = self.image.topic(TRANSACTION_TOPIC)
        if info is None:
            await self.create_internal_topic(TRANSACTION_TOPIC, 1, 3)
            info = self.image.topic(TRANSACTION_TOPIC)
        return info.partitions[0].leader if info is not None else -1

    async def handle_find_coordinator(
        self, header: p.RequestHeader, body: p.FindCoordinatorRequest
    ) -> Any:
        if body.key_type in (p.GROUP_KEY_TYPE, p.TRANSACTION_KEY_TYPE):
            rtype = _RT.GROUP if body.key_type == p.GROUP_KEY_TYPE else _RT.TRANSACTIONAL_ID
            err = self.auth.check(_OP.DESCRIBE, rtype, body.key, api="FindCoordinator")
            if err is not None:
                return p.FindCoordinatorResponse(error_code=err.code or -1, error_message=str(err))
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
        api = "InitProducerId"
        if body.transactional_id is not None:
            err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api=api)
        elif self.auth.allowed(
            _OP.IDEMPOTENT_WRITE, _RT.CLUSTER, api=api, log_denied=False
        ) or self.auth.allowed_any(_OP.WRITE, _RT.TOPIC, api=api):
            err = None
        else:  # KIP-679: IdempotentWrite on the cluster, or Write on some topic
            err = self.auth.error(_OP.IDEMPOTENT_WRITE, _RT.CLUSTER)
        if err is not None:
            return p.InitProducerIdResponse(error_code=err.code or -1)
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
        """Add partitions to the transaction. Without Write on the transactional id, every
        partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED; without Write on a topic, its
        partitions answer TOPIC_AUTHORIZATION_FAILED and the others OPERATION_NOT_ATTEMPTED
        (nothing is added: Kafka's answer)."""
        api = "AddPartitionsToTxn"
        codes: dict[str, int] = {}
        err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api=api)
        if err is not None:
            codes = dict.fromkeys((t.name for t in body.topics), err.code or -1)
        else:
            may = self.auth.filter(_OP.WRITE, _RT.TOPIC, (t.name for t in body.topics), api=api)
            if len(may) < len({t.name for t in body.topics}):
                denied = TopicAuthorizationFailedError.code
                codes = {
                    t.name: OperationNotAttemptedError.code if t.name in may else denied
                    for t in body.topics
                }
        if not codes:
            code = 0
            try:
                await self.txn_coordinator.add_partitions(
                    body.transactional_id,
                    body.producer_id,
                    body.producer_epoch,
                    [TopicPartition(t.name, i) for t in body.topics for i in t.partitions],
                )
            except ReplogError as failure:
                code = error_code(failure)
            codes = dict.fromkeys((t.name for t in body.topics), code)
        return p.AddPartitionsToTxnResponse(
            results=[
                p.AddPartitionsToTxnTopicResult(
                    name=t.name,
                    results=[
                        p.AddPartitionsToTxnPartitionResult(
                            partition_index=i, error_code=codes[t.name]
                        )
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
        api = "AddOffsetsToTxn"
        err = self.auth.check(
            _OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api=api
        ) or self.auth.check(_OP.READ, _RT.GROUP, body.group_id, api=api)
        if err is not None:
            return p.AddOffsetsToTxnResponse(error_code=err.code or -1)
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
        err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, body.transactional_id, api="EndTxn")
        if err is not None:
            return p.EndTxnResponse(error_code=err.code or -1)
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
        """Write transaction markers (from a transaction coordinator: ClusterAction on the
        cluster, else CLUSTER_AUTHORIZATION_FAILED on every partition). The node's own
        coordinator calls this in internal_scope."""
        err = self.auth.check(_OP.CLUSTER_ACTION, _RT.CLUSTER, api="WriteTxnMarkers")
        if err is not None:
            return p.WriteTxnMarkersResponse(
                markers=[
                    p.WritableTxnMarkerResult(
                        producer_id=m.producer_id,
                        topics=[
                            p.WritableTxnMarkerTopicResult(
                                name=t.name,
                                partitions=[
                                    p.WritableTxnMarkerPartitionResult(
                                        partition_index=i, error_code=err.code or -1
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

    async def write_own_txn_markers(
        self, request: p.WriteTxnMarkersRequest
    ) -> p.WriteTxnMarkersResponse:
        """The markers this node's transaction coordinator writes to its own partitions: the
        node's own work (internal_scope), not a request of the client it is serving."""
        with internal_scope():
            return await self.handle_write_txn_markers(None, request)

    async def handle_list_transactions(
        self, header: p.RequestHeader, body: p.ListTransactionsRequest
    ) -> Any:
        try:
            listings = self.txn_coordinator.listings(body.state_filters)
        except ReplogError as err:
            return p.ListTransactionsResponse(error_code=error_code(err))
        if self.auth.enabled:
            visible = self.auth.filter(
                _OP.DESCRIBE,
                _RT.TRANSACTIONAL_ID,
                (m.transactional_id for m in listings),
                api="ListTransactions",
                log_denied=False,
            )
            listings = [m for m in listings if m.transactional_id in visible]
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
        api = "DescribeTransactions"
        for transactional_id in body.transactional_ids:
            denied = self.auth.check(_OP.DESCRIBE, _RT.TRANSACTIONAL_ID, transactional_id, api=api)
            if denied is not None:
                states.append(
                    p.TransactionState(
                        error_code=denied.code or -1, transactional_id=transactional_id
                    )
                )
                continue
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
            if self.auth.enabled:  # the partitions of topics it may not Describe are left out
                visible = self.auth.filter(
                    _OP.DESCRIBE, _RT.TOPIC, topics, api=api, log_denied=False
                )
                topics = {t: ps for t, ps in topics.items() if t in visible}
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
        """The producers each partition's replica here knows, with their open transaction's
        first offset (Kafka's DescribeProducers; what kafka-transactions.sh find-hanging reads).
        Any replica answers, the leader or a follower, as Kafka's does: find-hanging asks one
        broker about every partition it holds."""
        api = "DescribeProducers"
        rm = self.replica_manager

        async def answer(topic: str, index: int) -> p.DescribeProducersPartitionResponse:
            partition = rm.get_partition(topic, index)
            producers = await asyncio.to_thread(_active_producers, partition)
            return p.DescribeProducersPartitionResponse(
                partition_index=index, active_producers=producers
            )

        answers = await self.answer_per_partition(
            api,
            _OP.READ,
            ((t.name, t.partition_indexes) for t in body.topics),
            answer,
            lambda index, err: p.DescribeProducersPartitionResponse(
                partition_index=index, error_code=error_code(err), error_message=str(err)
            ),
        )
        return p.DescribeProducersResponse(
            topics=[p.DescribeProducersTopicResponse(name=n, partitions=ps) for n, ps in answers]
        )

    async def handle_commit_sink_batch(
        self, header: p.RequestHeader, body: p.CommitSinkBatchRequest
    ) -> Any:
        """Commit a sink's batch: Write on every transaction's id and on the sink's own
        (``replog-sink/<sink_id>``), or a producer could mark another sink's batch committed
        with its own transactions and make that sink's replay abort."""
        api = "CommitSinkBatch"
        for name in [
            *(t.transactional_id for t in body.transactions),
            SINK_TRANSACTIONAL_PREFIX + body.sink_id,
        ]:
            err = self.auth.check(_OP.WRITE, _RT.TRANSACTIONAL_ID, name, api=api)
            if err is not None:
                return p.CommitSinkBatchResponse(
                    error_code=err.code or -1, error_message=error_message(err)
                )
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
        name = SINK_TRANSACTIONAL_PREFIX + body.sink_id
        err = self.auth.check(_OP.DESCRIBE, _RT.TRANSACTIONAL_ID, name, api="DescribeSink")
        if err is not None:
            return p.DescribeSinkResponse(error_code=err.code or -1)
        try:
            last = self.txn_coordinator.last_committed_batch(body.sink_id)
        except ReplogError as err:
            return p.DescribeSinkResponse(error_code=error_code(err))
        return p.DescribeSinkResponse(last_committed_batch=last)


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
