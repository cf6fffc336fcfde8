"""The Admin's transaction tools, as Kafka's admin client and kafka-transactions.sh have them:
DescribeTransactions (to the coordinator), DescribeProducers (to a partition's leader), finding
hanging transactions, and aborting one with a WriteTxnMarkers ABORT to the partition's leader.

A hanging transaction is open on a partition (the partition's producer state has its first
offset) while the coordinator does not know it as an ongoing transaction of that producer on
that partition: nothing will ever write its marker, so the partition's last stable offset
(LSO) stays behind it and read_committed consumers stop there. It happens when a produce
reaches a partition after the coordinator wrote the marker, or when the coordinator's state of
it was lost. Kafka's FindHangingTransactions looks for them the same way: DescribeProducers on
a broker's partitions, then ListTransactions and DescribeTransactions for the producers whose
open transaction is older than the longest transaction timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from replication.client.cluster import Cluster
from replication.client.coordinator import CoordinatorClient
from replication.client.types import (
    HangingTransaction,
    ProducerState,
    TopicPartition,
    TransactionListing,
)
from replication.errors import (
    BrokerNotAvailableError,
    InvalidRequestError,
    ReplogError,
    for_code,
    raise_for_code,
)
from replication.protocol import (
    ApiKey,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeProducersTopic,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    WritableTxnMarker,
    WritableTxnMarkerTopic,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

__all__ = ["TransactionAdmin"]

#: coordinator states in which a transaction's partitions may have its records without markers
_ONGOING = "Ongoing"


class TransactionAdmin:
    def __init__(self, cluster: Cluster, coordinator: CoordinatorClient) -> None:
        self._cluster = cluster
        self._coordinator = coordinator

    def describe(
        self, transactional_ids: Iterable[str], deadline: float
    ) -> dict[str, TransactionListing]:
        ids = list(dict.fromkeys(transactional_ids))
        response: DescribeTransactionsResponse = self._coordinator.call(
            ApiKey.DESCRIBE_TRANSACTIONS,
            DescribeTransactionsRequest(transactional_ids=ids),
            what="describing transactions",
            deadline=deadline,
        )
        out: dict[str, TransactionListing] = {}
        for s in response.transaction_states:
            if s.error_code:
                cls = for_code(s.error_code) or ReplogError
                raise cls(f"transactional id {s.transactional_id!r}: {cls()}")
            out[s.transactional_id] = TransactionListing(
                transactional_id=s.transactional_id,
                producer_id=s.producer_id,
                producer_epoch=s.producer_epoch,
                state=s.transaction_state,
                timeout_ms=s.transaction_timeout_ms,
                start_time_ms=s.transaction_start_time_ms,
                partitions=tuple(
                    TopicPartition(t.topic, i) for t in s.topics for i in t.partitions
                ),
            )
        return out

    def describe_producers(
        self, broker_id: int, partitions: Iterable[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers of ``partitions`` as broker ``broker_id`` (their leader) knows them."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        if not by_topic:
            return {}
        request = DescribeProducersRequest(
            topics=[
                DescribeProducersTopic(name=t, partition_indexes=sorted(ps))
                for t, ps in sorted(by_topic.items())
            ]
        )
        response: DescribeProducersResponse = self._cluster.connection(broker_id).send(
            ApiKey.DESCRIBE_PRODUCERS, 0, request, timeout_ms=timeout_ms
        )
        out: dict[TopicPartition, list[ProducerState]] = {}
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if part.error_code:
                    cls = for_code(part.error_code) or ReplogError
                    raise cls(
                        f"describing the producers of {tp} on broker {broker_id}: "
                        f"{part.error_message or cls()}"
                    )
                out[tp] = [
                    ProducerState(
                        producer_id=s.producer_id,
                        producer_epoch=s.producer_epoch,
                        last_sequence=s.last_sequence,
                        last_timestamp=s.last_timestamp,
                        coordinator_epoch=s.coordinator_epoch,
                        current_transaction_start_offset=s.current_txn_start_offset,
                    )
                    for s in part.active_producers
                ]
        return out

    def find_hanging(
        self,
        broker_id: int,
        partitions: Iterable[TopicPartition],
        max_transaction_timeout_ms: int,
        timeout_ms: int,
        deadline: float,
    ) -> list[HangingTransaction]:
        """The hanging transactions of ``partitions`` (those broker ``broker_id`` leads)."""
        now_ms = time.time_ns() // 1_000_000
        candidates = [
            (tp, s)
            for tp, producers in self.describe_producers(broker_id, partitions, timeout_ms).items()
            for s in producers
            if s.current_transaction_start_offset >= 0
            and now_ms - s.last_timestamp >= max_transaction_timeout_ms
        ]
        if not candidates:
            return []
        listed: ListTransactionsResponse = self._coordinator.call(
            ApiKey.LIST_TRANSACTIONS,
            ListTransactionsRequest(),
            what="listing transactions",
            deadline=deadline,
        )
        ids_of: dict[int, str] = {t.producer_id: t.transactional_id for t in listed.transactions}
        described = self.describe(
            sorted({ids_of[s.producer_id] for _, s in candidates if s.producer_id in ids_of}),
            deadline,
        )
        hanging = []
        for tp, s in candidates:
            transactional_id = ids_of.get(s.producer_id)
            txn = described.get(transactional_id) if transactional_id is not None else None
            if (
                txn is not None
                and txn.state == _ONGOING
                and txn.producer_id == s.producer_id
                and tp in txn.partitions
            ):
                continue  # an open transaction the coordinator will end: not hanging
            hanging.append(
                HangingTransaction(
                    partition=tp,
                    producer_id=s.producer_id,
                    producer_epoch=s.producer_epoch,
                    coordinator_epoch=s.coordinator_epoch,
                    start_offset=s.current_transaction_start_offset,
                    start_time_ms=s.last_timestamp,
                    transactional_id=transactional_id,
                )
            )
        return sorted(hanging, key=lambda h: (h.partition, h.start_offset))

    def producer_at(
        self, leader: int, tp: TopicPartition, start_offset: int, timeout_ms: int
    ) -> ProducerState:
        """The producer whose open transaction on ``tp`` starts at ``start_offset``."""
        for s in self.describe_producers(leader, [tp], timeout_ms).get(tp, []):
            if s.current_transaction_start_offset == start_offset:
                return s
        raise InvalidRequestError(
            f"{tp} has no open transaction starting at offset {start_offset}; list them with "
            "`replog transactions find-hanging`"
        )

    def abort(
        self,
        leader: int,
        tp: TopicPartition,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        timeout_ms: int,
    ) -> None:
        """Write an ABORT marker for ``producer_id``'s transaction on ``tp`` to its leader."""
        if leader < 0:
            raise BrokerNotAvailableError(f"{tp} has no leader; retry once it has one")
        request = WriteTxnMarkersRequest(
            markers=[
                WritableTxnMarker(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=False,
                    topics=[
                        WritableTxnMarkerTopic(name=tp.topic, partition_indexes=[tp.partition])
                    ],
                    coordinator_epoch=max(coordinator_epoch, 0),
                )
            ]
        )
        response: WriteTxnMarkersResponse = self._cluster.connection(leader).send(
            ApiKey.WRITE_TXN_MARKERS, 0, request, timeout_ms=timeout_ms
        )
        for marker in response.markers:
            for topic in marker.topics:
                for part in topic.partitions:
                    raise_for_code(
                        part.error_code,
                        f"aborting the transaction of producer {producer_id} on {tp}",
                    )
